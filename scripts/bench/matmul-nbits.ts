/**
 * What ONNX Runtime's CPU provider does with `MatMulNBits` (com.microsoft), measured before building on
 * it: for each weight shape `[N, K]` (HF's nn.Linear `[out, in]`) and batch M, y = x·Wᵀ as float32
 * (the decode graph's two forms: `Gemm(x, W, transB)`, its M ≤ 2 form, and the weight-first
 * `(W·xᵀ)ᵀ`, its larger batches' form) against `MatMulNBits` at 4 and 8 bits with the weight's blocks
 * in its packed layout, at each `--accuracy` level (0: float32 arithmetic on the dequantized weight;
 * 4: the activations quantized to int8 per block and int8 dot products), with the quantized weight fed
 * as a graph input and `baked` as an initializer (which the provider prepacks when the session is
 * made; the session's creation time is printed too). Each variant first runs on
 * the same x and W and its largest difference from a float64 product over the dequantized weight is
 * printed (`err`), so a variant the provider lacks or computes wrong shows before its time does.
 * Prints the fastest and median of `--runs` runs; the variants alternate run by run so that load from
 * other processes falls on all alike.
 *
 *   node --import tsx scripts/bench/matmul-nbits.ts [--shapes "1376x512 512x1376 32000x512"] [--batch "1 8"] [--block 32] [--bits "4 8"] [--accuracy "0 4"] [--runs 30] [--threads 2] [--baked-only]
 *   (the 0.5B widths: --shapes "4864x896 896x4864 151936x896")
 */
import { parseArgs } from 'node:util';
import { Graph } from '../../src/onnx/graph.ts';
import { type Feeds, Session, toOrt } from '../../src/runtime/session.ts';
import { dequantizeBlocks, matmulNBits, quantizeBlocks, type QuantBits } from '../../src/models/quantize.ts';

const { values: a } = parseArgs({
  options: {
    shapes: { type: 'string', default: '1376x512 512x1376 32000x512' },
    batch: { type: 'string', default: '1 8' },
    block: { type: 'string', default: '32' },
    bits: { type: 'string', default: '4 8' },
    accuracy: { type: 'string', default: '0 4' },
    /** Leave out the fed quantized weights (their unpacked path is 4–1,000× slower: minutes at 30 runs). */
    'baked-only': { type: 'boolean', default: false },
    runs: { type: 'string', default: '30' },
    threads: { type: 'string', default: '2' },
  },
});
const runs = Number(a.runs);
const block = Number(a.block);
const threads = Number(a.threads);
const list = (s: string) => s.split(/[ ,]+/).filter(Boolean);

type Variant = { name: string; run: (x: Float32Array, M: number) => Promise<Float32Array> };

async function float32(N: number, K: number, W: Float32Array, form: 'gemm' | 'weight-first'): Promise<Variant> {
  const g = new Graph('f32');
  const x = g.input('x', 'float32', ['M', K]);
  const w = g.input('w', 'float32', [N, K]);
  g.output(form === 'gemm' ? g.gemm(x, w, null, { transB: true }) : g.transpose(g.matmul(w, g.transpose(x, [1, 0])), [1, 0]), 'y');
  const s = await Session.fromGraph(g, { threads });
  const wt = toOrt('float32', W, [N, K]);
  return { name: `f32 ${form}`, run: async (xs, M) => (await s.run({ x: toOrt('float32', xs, [M, K]), w: wt })).y.data as Float32Array };
}

async function nbits(N: number, K: number, W: Float32Array, bits: QuantBits, accuracy: number, baked: boolean): Promise<Variant & { q: ReturnType<typeof quantizeBlocks> }> {
  const g = new Graph('nbits');
  const x = g.input('x', 'float32', ['M', K]);
  const q = quantizeBlocks(W, N, K, bits, block);
  const inputs = baked
    ? { packed: g.initializer('w_q', { dtype: 'uint8', dims: q.packedShape, data: q.packed }), scales: g.initializer('w_scales', { dtype: 'float32', dims: [q.scales.length], data: q.scales }) }
    : { packed: g.input('w_q', 'uint8', q.packedShape), scales: g.input('w_scales', 'float32', [q.scales.length]) };
  g.output(matmulNBits(g, x, inputs, { N, K, bits, block, accuracy }), 'y');
  const t0 = performance.now();
  const s = await Session.fromGraph(g, { threads });
  sessionMs[`q${bits} acc${accuracy}${baked ? ' baked' : ''}`] = +(performance.now() - t0).toFixed(1);
  const feeds: Feeds = baked ? {} : { w_q: toOrt('uint8', q.packed, q.packedShape), w_scales: toOrt('float32', q.scales, [q.scales.length]) };
  return { name: `q${bits} acc${accuracy}${baked ? ' baked' : ''}`, q, run: async (xs, M) => (await s.run({ ...feeds, x: toOrt('float32', xs, [M, K]) })).y.data as Float32Array };
}
const sessionMs: Record<string, number> = {};

/** The largest |y − x·Ŵᵀ| over the float64 product with Ŵ (the weight as the variant reads it), relative to the largest |x·Ŵᵀ|. */
function relErr(y: Float32Array, x: Float32Array, What: Float32Array, M: number, N: number, K: number): number {
  let [err, top] = [0, 0];
  for (let m = 0; m < M; m++) {
    for (let n = 0; n < N; n++) {
      let s = 0;
      for (let k = 0; k < K; k++) s += x[m * K + k] * What[n * K + k];
      err = Math.max(err, Math.abs(y[m * N + n] - s));
      top = Math.max(top, Math.abs(s));
    }
  }
  return err / top;
}

for (const shape of list(a.shapes)) {
  const [N, K] = shape.split('x').map(Number);
  const W = new Float32Array(N * K).map((_, i) => 0.05 * Math.sin(i * 0.7 + 0.3));
  const variants: (Variant & { q?: ReturnType<typeof quantizeBlocks> })[] = [await float32(N, K, W, 'gemm'), await float32(N, K, W, 'weight-first')];
  for (const bits of list(a.bits).map(Number) as QuantBits[]) for (const acc of list(a.accuracy).map(Number)) for (const baked of a['baked-only'] ? [true] : [false, true]) variants.push(await nbits(N, K, W, bits, acc, baked));
  for (const M of list(a.batch).map(Number)) {
    const x = new Float32Array(M * K).map((_, i) => Math.cos(i * 1.3));
    const row: Record<string, unknown> = { N, K, M, block };
    const times = variants.map(() => [] as number[]);
    for (const [i, v] of variants.entries()) {
      const y = await v.run(x, M);
      const What = v.q ? dequantizeBlocks(v.q) : W;
      row[`${v.name} err`] = +relErr(y, x, What, Math.min(M, 2), N, K).toExponential(2);
      times[i].push(0);
      times[i].length = 0;
    }
    for (let r = 0; r < runs; r++) {
      for (const [i, v] of variants.entries()) {
        const t0 = performance.now();
        await v.run(x, M);
        times[i].push(performance.now() - t0);
      }
    }
    variants.forEach((v, i) => {
      const s = times[i].sort((p, q) => p - q);
      row[v.name] = { min_ms: +s[0].toFixed(3), median_ms: +s[runs >> 1].toFixed(3) };
    });
    console.log(JSON.stringify(row));
  }
  console.log(JSON.stringify({ N, K, session_create_ms: sessionMs }));
}
