/**
 * The products of one QLoRA projection on ONNX Runtime's CPU provider, each form against a float64
 * product over the dequantized weight (`err`, relative to the largest output) and timed:
 *
 *   forward  y = x·Ŵᵀ:   float32 Gemm on Ŵ (the LoRA baseline) · Gemm on GatherBlockQuantized(W) (what
 *                        load_in_4bit builds) · MatMulNBits(x, W) at accuracy 0 (float32 arithmetic)
 *   backward dx = dy·Ŵ:  MatMul on GatherBlockQuantized(W) (what the backward builds) · MatMulNBits on
 *                        a second 4-bit copy of Ŵᵀ (blocks along the other axis: a copy quantized again,
 *                        so its err is that of a different weight)
 *
 * Ŵ is the weight the 4-bit blocks stand for. The forms alternate run by run so that load from other
 * processes falls on all alike; prints the median of `--runs`.
 *
 *   node --import tsx scripts/bench/qlora-matmul.ts [--n 4864] [--k 896] [--m 1536] [--block 64] [--runs 5]
 */
import { parseArgs } from 'node:util';
import { attr, Graph, type Tensor } from '../../src/onnx/graph.ts';
import { Session, toOrt, type Feeds } from '../../src/runtime/session.ts';
import { dequantizeNode, dequantizeQ4, quantizeQ4, type Q4Tensor } from '../../src/models/quantize-base.ts';
import { Normal } from '../../src/random.ts';

const { values: a } = parseArgs({ options: { n: { type: 'string', default: '4864' }, k: { type: 'string', default: '896' }, m: { type: 'string', default: '1536' }, block: { type: 'string', default: '64' }, runs: { type: 'string', default: '5' } } });
const [N, K, M, block, runs] = [a.n, a.k, a.m, a.block, a.runs].map(Number);
const rng = new Normal(1);
const W = { shape: [N, K], data: rng.fill(N * K, 0.02) };
const q = quantizeQ4(W, block);
const Wd = dequantizeQ4(q).data;
const Wt: Q4Tensor = quantizeQ4({ shape: [K, N], data: Float32Array.from({ length: K * N }, (_, i) => Wd[(i % N) * K + Math.floor(i / N)]) }, block);
const x = rng.fill(M * K, 1);
const dy = rng.fill(M * N, 1);

function nbits(g: Graph, input: Tensor, w: Q4Tensor, name: string): Tensor {
  const [R, C] = w.shape;
  const packed = g.input(`${name}_p`, 'uint8', [R, C / block, block / 2]);
  const scales = g.input(`${name}_s`, 'float32', [R * (C / block)]);
  const attrs = { K: attr.int(C), N: attr.int(R), bits: attr.int(4), block_size: attr.int(block), accuracy_level: attr.int(0) };
  return g.op('MatMulNBits', [input, packed, scales], attrs, [{ dtype: 'float32', shape: [M, R] }], undefined, 'com.microsoft')[0];
}
const q4Feeds = (w: Q4Tensor, name: string): Feeds => ({
  [`${name}_p`]: toOrt('uint8', w.packed, [w.shape[0], w.shape[1] / block, block / 2]),
  [`${name}_s`]: toOrt('float32', w.scales, [w.scales.length]),
});
const gbqFeeds = (w: Q4Tensor): Feeds => ({ p: toOrt('uint8', w.packed, [w.shape[0], w.shape[1] / 2]), s: toOrt('float32', w.scales, [w.shape[0], w.shape[1] / block]) });

type Form = { name: string; s: Session; feeds: Feeds; ref: Float64Array; times: number[]; err: number };
async function form(name: string, build: (g: Graph) => Tensor, feeds: Feeds, ref: Float64Array): Promise<Form> {
  const g = new Graph(name);
  g.output(build(g), 'y');
  return { name, s: await Session.fromGraph(g), feeds, ref, times: [], err: 0 };
}

// float64 references over Ŵ.
const yRef = new Float64Array(M * N);
const dxRef = new Float64Array(M * K);
for (let i = 0; i < M; i++) {
  for (let n = 0; n < N; n++) {
    let s = 0;
    for (let k = 0; k < K; k++) s += x[i * K + k] * Wd[n * K + k];
    yRef[i * N + n] = s;
  }
  for (let k = 0; k < K; k++) {
    let s = 0;
    for (let n = 0; n < N; n++) s += dy[i * N + n] * Wd[n * K + k];
    dxRef[i * K + k] = s;
  }
}
const xF = { x: toOrt('float32', x, [M, K]) };
const dyF = { dy: toOrt('float32', dy, [M, N]) };
const forms = [
  await form('forward: float32 Gemm', (g) => g.gemm(g.input('x', 'float32', [M, K]), g.input('w', 'float32', [N, K]), null, { transB: true }), { ...xF, w: toOrt('float32', Wd, [N, K]) }, yRef),
  await form('forward: Gemm on GatherBlockQuantized', (g) => g.gemm(g.input('x', 'float32', [M, K]), dequantizeNode(g, g.input('p', 'uint8', [N, K / 2]), g.input('s', 'float32', [N, K / block])), null, { transB: true }), { ...xF, ...gbqFeeds(q) }, yRef),
  await form('forward: MatMulNBits', (g) => nbits(g, g.input('x', 'float32', [M, K]), q, 'w'), { ...xF, ...q4Feeds(q, 'w') }, yRef),
  await form('backward: float32 MatMul', (g) => g.matmul(g.input('dy', 'float32', [M, N]), g.input('w', 'float32', [N, K])), { ...dyF, w: toOrt('float32', Wd, [N, K]) }, dxRef),
  await form('backward: MatMul on GatherBlockQuantized', (g) => g.matmul(g.input('dy', 'float32', [M, N]), dequantizeNode(g, g.input('p', 'uint8', [N, K / 2]), g.input('s', 'float32', [N, K / block]))), { ...dyF, ...gbqFeeds(q) }, dxRef),
  await form('backward: MatMulNBits on a 4-bit Ŵᵀ', (g) => nbits(g, g.input('dy', 'float32', [M, N]), Wt, 't'), { ...dyF, ...q4Feeds(Wt, 't') }, dxRef),
];
for (let r = 0; r <= runs; r++) {
  for (const f of forms) {
    const t0 = performance.now();
    const y = (await f.s.run(f.feeds)).y.data as Float32Array;
    if (r === 0) {
      let d = 0;
      let s = 0;
      for (let i = 0; i < y.length; i++) {
        d = Math.max(d, Math.abs(y[i] - f.ref[i]));
        s = Math.max(s, Math.abs(f.ref[i]));
      }
      f.err = d / s;
    } else f.times.push(performance.now() - t0);
  }
}
const median = (xs: number[]) => [...xs].sort((p, r) => p - r)[Math.floor(xs.length / 2)];
console.log(`[${M}, ${K}] × [${N}, ${K}]ᵀ, blocks of ${block}, median of ${runs} runs`);
for (const f of forms) console.log(`${f.name.padEnd(42)} ${median(f.times).toFixed(1).padStart(8)} ms   err ${f.err.toExponential(1)}`);
for (const f of forms) await f.s.release();
