import { Graph } from '../../src/onnx/graph.ts';
import { Session, toOrt } from '../../src/runtime/session.ts';
import { matmulNBits, quantizeBlocks } from '../../src/models/quantize.ts';
const threads = Number(process.env.T ?? 2), runs = 40;
const shapes = (process.argv[2] ?? '3072x1024 1024x1024 5504x1024 1024x2752 32000x1024').split(' ');
const M = Number(process.argv[3] ?? 768);
for (const shape of shapes) {
  const [N, K] = shape.split('x').map(Number);
  const W = new Float32Array(N * K).map((_, i) => 0.05 * Math.sin(i * 0.7 + 0.3));
  const x = new Float32Array(M * K).map((_, i) => Math.cos(i * 1.3));
  const vs: [string, () => Promise<unknown>][] = [];
  { // f32 baked gemm transB
    const g = new Graph('f32'); const xi = g.input('x', 'float32', ['M', K]);
    const w = g.initializer('w', { dtype: 'float32', dims: [N, K], data: W });
    g.output(g.gemm(xi, w, null, { transB: true }), 'y');
    const s = await Session.fromGraph(g, { threads }); vs.push(['f32', () => s.run({ x: toOrt('float32', x, [M, K]) })]);
  }
  { // f32 baked matmul with W^T stored
    const WT = new Float32Array(N * K); for (let n = 0; n < N; n++) for (let k = 0; k < K; k++) WT[k * N + n] = W[n * K + k];
    const g = new Graph('f32t'); const xi = g.input('x', 'float32', ['M', K]);
    const w = g.initializer('w', { dtype: 'float32', dims: [K, N], data: WT });
    g.output(g.matmul(xi, w), 'y');
    const s = await Session.fromGraph(g, { threads }); vs.push(['f32 matmul', () => s.run({ x: toOrt('float32', x, [M, K]) })]);
  }
  for (const bits of [8, 4] as const) {
    const g = new Graph('nb'); const xi = g.input('x', 'float32', ['M', K]);
    const q = quantizeBlocks(W, N, K, bits, 32);
    const inputs = { packed: g.initializer('w_q', { dtype: 'uint8', dims: q.packedShape, data: q.packed }), scales: g.initializer('w_scales', { dtype: 'float32', dims: [q.scales.length], data: q.scales }) };
    g.output(matmulNBits(g, xi, inputs, { N, K, bits, block: 32, accuracy: 4 }), 'y');
    const s = await Session.fromGraph(g, { threads }); vs.push([`nbits q${bits} acc4`, () => s.run({ x: toOrt('float32', x, [M, K]) })]);
  }
  { // DynamicQuantizeMatMul: B int8 [K,N], per-column scale
    const B = new Int8Array(K * N); const sc = new Float32Array(N);
    for (let n = 0; n < N; n++) { let mx = 0; for (let k = 0; k < K; k++) mx = Math.max(mx, Math.abs(W[n * K + k])); sc[n] = mx / 127 || 1; for (let k = 0; k < K; k++) B[k * N + n] = Math.round(W[n * K + k] / sc[n]); }
    const g = new Graph('dq'); const xi = g.input('x', 'float32', ['M', K]);
    const b = g.initializer('b', { dtype: 'int8', dims: [K, N], data: B });
    const bs = g.initializer('bs', { dtype: 'float32', dims: [N], data: sc });
    const y = g.op('DynamicQuantizeMatMul', [xi, b, bs], {}, [{ dtype: 'float32', shape: ['M', N] }], undefined, 'com.microsoft')[0];
    g.output(y, 'y');
    try { const s = await Session.fromGraph(g, { threads }); vs.push(['DQMatMul s8', () => s.run({ x: toOrt('float32', x, [M, K]) })]); } catch (e) { console.log('DQ fail', String(e).slice(0, 300)); }
  }
  const t: number[][] = vs.map(() => []);
  for (const [, f] of vs) await f();
  for (let r = 0; r < runs; r++) for (const [i, [, f]] of vs.entries()) { const t0 = performance.now(); await f(); t[i].push(performance.now() - t0); }
  const row: Record<string, number> = {};
  vs.forEach(([n], i) => { const s = t[i].sort((a, b) => a - b); row[n] = +s[runs >> 1].toFixed(2); });
  const gf = 2 * M * N * K / 1e6;
  console.log(shape, 'M', M, JSON.stringify(row), 'GFLOP/s f32', (gf / row['f32']).toFixed(0), 'dq', (gf / row['DQMatMul s8']).toFixed(0));
}
