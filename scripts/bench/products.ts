/**
 * The products of a decode step, one kernel at a time: y = x·Wᵀ for `x` [B, in] and a fed weight
 * `W` [out, in] (HF's nn.Linear layout) in the three forms ONNX Runtime's CPU provider can be given —
 * `weight-first` (W·xᵀ, transposed back: the step graph's form for B > 1, see decode.ts
 * `fedWeightFirst`), `x·Wᵀ` (Gemm with transB: the one-row step graph's form; MLAS's M = 1 kernel
 * reads W in place), and `x·Wt` over a pre-transposed `[in, out]` copy (not used: it needs a second
 * copy of the weights) — at each batch size. Prints the fastest and median of `--runs` runs per form
 * (the fastest is the steadier figure on a shared machine) and the weight bytes read per
 * millisecond at the fastest. The forms alternate run by run, so load affects each alike.
 *
 *   node --import tsx scripts/bench/products.ts [--out 32000] [--in 512] [--batch "1 2 8 16 17 32"] [--runs 40] [--threads 1]
 */
import { parseArgs } from 'node:util';
import { Graph } from '../../src/onnx/graph.ts';
import { Session, toOrt } from '../../src/runtime/session.ts';

const { values: a } = parseArgs({
  options: {
    out: { type: 'string', default: '32000' },
    in: { type: 'string', default: '512' },
    batch: { type: 'string', default: '1 2 8 16 17 32' },
    runs: { type: 'string', default: '40' },
    threads: { type: 'string', default: '1' },
  },
});
const [N, K] = [Number(a.out), Number(a.in)];
const runs = Number(a.runs);
const W = new Float32Array(N * K).map((_, i) => Math.sin(i));
const Wt = new Float32Array(N * K);
for (let n = 0; n < N; n++) for (let k = 0; k < K; k++) Wt[k * N + n] = W[n * K + k];
const forms = ['weight-first', 'x·Wᵀ', 'x·Wt'] as const;

async function product(form: (typeof forms)[number]): Promise<(B: number) => Promise<void>> {
  const g = new Graph('product');
  const x = g.input('x', 'float32', ['batch', K]);
  if (form === 'x·Wᵀ') g.output(g.gemm(x, g.input('w', 'float32', [N, K]), null, { transB: true }), 'y');
  else if (form === 'x·Wt') g.output(g.matmul(x, g.input('w', 'float32', [K, N])), 'y');
  else g.output(g.transpose(g.matmul(g.input('w', 'float32', [N, K]), g.transpose(x, [1, 0])), [1, 0]), 'y');
  const s = await Session.fromGraph(g, { threads: Number(a.threads) });
  const w = form === 'x·Wt' ? toOrt('float32', Wt, [K, N]) : toOrt('float32', W, [N, K]);
  return async (B) => {
    await s.run({ x: toOrt('float32', new Float32Array(B * K).map((_, i) => Math.cos(i)), [B, K]), w });
  };
}

const run = await Promise.all(forms.map(product));
for (const B of a.batch.split(/[ ,]+/).map(Number)) {
  const times = forms.map(() => [] as number[]);
  for (let r = 0; r < runs; r++) {
    for (let f = 0; f < forms.length; f++) {
      const t0 = performance.now();
      await run[f](B);
      times[f].push(performance.now() - t0);
    }
  }
  const row: Record<string, unknown> = { out: N, in: K, batch: B };
  forms.forEach((f, i) => {
    const s = times[i].sort((x, y) => x - y);
    row[f] = { min_ms: +s[0].toFixed(3), median_ms: +s[runs >> 1].toFixed(3), gb_per_s: +((N * K * 4) / s[0] / 1e6).toFixed(1) };
  });
  console.log(JSON.stringify(row));
}
