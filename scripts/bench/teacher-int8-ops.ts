/**
 * The teacher's prefill-shaped products one op at a time (`M` rows × weight `[N, K]`): float32 Gemm,
 * MatMulNBits q8 (accuracy 4, baked: teacher_dtype=q8), and the W8A8 forms of
 * src/models/quantize-int8.ts — per-tensor activations (`DynamicQuantizeMatMul`), per-token activations
 * through `MatMulIntegerToFloat` plus a row Mul (teacher_dtype=int8), and per-token through plain
 * `MatMulInteger` + Cast + two Muls. Each variant's largest difference from the float32 weights' float64
 * product (relative to the largest output) is printed first, then the fastest and median wall ms of
 * `--runs` runs, the variants alternating run by run so load falls on all alike.
 *
 *   node --import tsx scripts/bench/teacher-int8-ops.ts [--shapes "2752x1024 1024x1024"] [--batch 768] [--runs 20] [--threads 1]
 */
import { parseArgs } from 'node:util';
import { Graph } from '../../src/onnx/graph.ts';
import { Session, toOrt } from '../../src/runtime/session.ts';
import { matmulNBits, quantizeBlocks } from '../../src/models/quantize.ts';
import { int8Initializers, matmulInt8, matmulInt8Unfused, quantizeInt8Columns } from '../../src/models/quantize-int8.ts';

const { values: a } = parseArgs({
  options: {
    shapes: { type: 'string', default: '2752x1024 1024x1024' },
    batch: { type: 'string', default: '768' },
    runs: { type: 'string', default: '20' },
    threads: { type: 'string', default: '1' },
  },
});
const runs = Number(a.runs);
const threads = Number(a.threads);
const list = (s: string) => s.split(/[ ,]+/).filter(Boolean);

type Variant = { name: string; run: (x: Float32Array, M: number) => Promise<Float32Array> };

async function variant(name: string, K: number, build: (g: Graph, x: ReturnType<Graph['input']>) => ReturnType<Graph['input']>, extra: Record<string, ReturnType<typeof toOrt>> = {}): Promise<Variant> {
  const g = new Graph(name.replace(/\W/g, '_'));
  const x = g.input('x', 'float32', ['M', K]);
  g.output(build(g, x), 'y');
  const s = await Session.fromGraph(g, { threads });
  return { name, run: async (xs, M) => (await s.run({ ...extra, x: toOrt('float32', xs, [M, K]) })).y.data as Float32Array };
}

for (const shape of list(a.shapes)) {
  const [N, K] = shape.split('x').map(Number);
  const W = new Float32Array(N * K).map((_, i) => 0.05 * Math.sin(i * 0.7 + 0.3));
  const nb = quantizeBlocks(W, N, K, 8, 32);
  const i8 = quantizeInt8Columns(W, N, K);
  const wt = toOrt('float32', W, [N, K]);
  const variants = [
    await variant('f32 gemm', K, (g, x) => g.gemm(x, g.input('w', 'float32', [N, K]), null, { transB: true }), { w: wt }),
    await variant('q8 nbits acc4', K, (g, x) => matmulNBits(g, x, { packed: g.initializer('wq', { dtype: 'uint8', dims: nb.packedShape, data: nb.packed }), scales: g.initializer('ws', { dtype: 'float32', dims: [nb.scales.length], data: nb.scales }) }, { N, K, bits: 8, block: 32, accuracy: 4 })),
    await variant('int8 per-tensor (DynamicQuantizeMatMul)', K, (g, x) => matmulInt8(g, x, int8Initializers(g, 'w', i8), { N, act: 'tensor' }).y),
    await variant('int8 per-token (MatMulIntegerToFloat)', K, (g, x) => matmulInt8(g, x, int8Initializers(g, 'w', i8), { N, act: 'token' }).y),
    await variant('int8 per-token (MatMulInteger+Cast+Mul)', K, (g, x) => matmulInt8Unfused(g, x, int8Initializers(g, 'w', i8), { N })),
  ];
  for (const M of list(a.batch).map(Number)) {
    // Activations with a few outlier columns, as real models' have.
    const x = new Float32Array(M * K).map((_, i) => Math.cos(i * 1.3) * (i % K < 4 ? 20 : 1));
    const row: Record<string, unknown> = { N, K, M, threads };
    const times = variants.map(() => [] as number[]);
    for (const v of variants) {
      const y = await v.run(x, M);
      let [err, top] = [0, 0];
      for (let m = 0; m < Math.min(M, 4); m++) {
        for (let n = 0; n < N; n++) {
          let s = 0;
          for (let k = 0; k < K; k++) s += x[m * K + k] * W[n * K + k];
          err = Math.max(err, Math.abs(y[m * N + n] - s));
          top = Math.max(top, Math.abs(s));
        }
      }
      row[`${v.name} err`] = +(err / top).toExponential(2);
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
      row[v.name] = { min_ms: +s[0].toFixed(2), median_ms: +s[runs >> 1].toFixed(2) };
    });
    console.log(JSON.stringify(row));
  }
}
