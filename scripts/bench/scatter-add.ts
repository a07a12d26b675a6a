/**
 * The gradient of a gather (a scatter-add of N rows of D into a V-row table) three ways, side by side
 * in one process, alternating: ScatterND(add) (fast, but its rows of a repeated index land in an
 * order that varies with the threads), ScatterElements(add) with indices expanded to [N, D] (repeatable,
 * element by element), and src/autodiff/scatter.ts's sorted segment sums (repeatable). `fill` is the
 * zero table with one row placed: the cost all three share. Prints the median wall and process CPU
 * ms per variant, the median of its per-round ratios to ScatterND's, and the ratio of the medians with the
 * fill subtracted.
 *
 *   node --import tsx scripts/bench/scatter-add.ts [--rows 1536,1024] [--dim 512] [--vocab 32000]
 *                                                  [--repeat 0.1] [--reps 60] [--threads 2]
 *
 * --repeat is the share of rows that carry one index (a pad token); the others are uniform over the vocabulary.
 */
import { parseArgs } from 'node:util';
import { Graph, type Tensor } from '../../src/onnx/graph.ts';
import { Session, toOrt, type Feeds } from '../../src/runtime/session.ts';
import { sortedScatterAdd } from '../../src/autodiff/scatter.ts';
import { zerosLike } from '../../src/autodiff/shape.ts';
import { SeededRandom } from '../../src/random.ts';

const { values: a } = parseArgs({
  options: {
    rows: { type: 'string', default: '1536,1024' },
    dim: { type: 'string', default: '512' },
    vocab: { type: 'string', default: '32000' },
    repeat: { type: 'string', default: '0.1' },
    reps: { type: 'string', default: '60' },
    threads: { type: 'string', default: '2' },
  },
});
const D = Number(a.dim);
const V = Number(a.vocab);
const reps = Number(a.reps);
const threads = Number(a.threads);

type Variant = 'fill' | 'ScatterND' | 'ScatterElements' | 'sorted';
const VARIANTS: Variant[] = ['fill', 'ScatterND', 'ScatterElements', 'sorted'];

/** W [V, D] (only its shape is read: the zero fill is built from it, as zerosLike does in a gradient). */
function graph(v: Variant, N: number): Graph {
  const g = new Graph(v);
  const W = g.input('W', 'float32', [V, D]);
  const idx = g.input('idx', 'int64', [N]);
  const dy = g.input('dy', 'float32', [N, D]);
  const zeros = zerosLike(g, W);
  let out: Tensor;
  if (v === 'fill') out = g.scatterND(zeros, g.constant([0], 'int64', [1, 1]), g.slice(dy, [0], [1], [0]), 'add');
  else if (v === 'ScatterND') out = g.scatterND(zeros, g.unsqueeze(idx, [-1]), dy, 'add');
  else if (v === 'ScatterElements') out = g.scatterElements(zeros, g.expand(g.reshape(idx, [-1, 1]), [1, D]), dy, 0, 'add');
  else out = sortedScatterAdd(g, zeros, idx, dy);
  // One row out: the scatter runs whole, without a table-sized copy to JavaScript per run.
  g.output(g.slice(out, [0], [1], [0]), 'out');
  return g;
}

const median = (xs: number[]) => {
  const s = [...xs].sort((x, y) => x - y);
  return s.length % 2 ? s[(s.length - 1) / 2] : (s[s.length / 2 - 1] + s[s.length / 2]) / 2;
};

for (const N of a.rows!.split(',').map(Number)) {
  const rand = new SeededRandom(N);
  const ids = BigInt64Array.from({ length: N }, () => BigInt(rand.next() < Number(a.repeat) ? 0 : Math.floor(rand.next() * V)));
  const feeds: Feeds = {
    W: toOrt('float32', new Float32Array(V * D), [V, D]),
    idx: toOrt('int64', ids, [N]),
    dy: toOrt('float32', Float32Array.from({ length: N * D }, () => rand.next() - 0.5), [N, D]),
  };
  const sessions = await Promise.all(VARIANTS.map((v) => Session.fromGraph(graph(v, N), { threads })));
  const wall = new Map<Variant, number[]>(VARIANTS.map((v) => [v, []]));
  const cpu = new Map<Variant, number[]>(VARIANTS.map((v) => [v, []]));
  for (let r = -3; r < reps; r++) {
    for (let k = 0; k < VARIANTS.length; k++) {
      const c0 = process.cpuUsage();
      const t0 = performance.now();
      await sessions[k].run(feeds);
      const t = performance.now() - t0;
      const c = process.cpuUsage(c0);
      if (r < 0) continue; // warm-up
      wall.get(VARIANTS[k])!.push(t);
      cpu.get(VARIANTS[k])!.push((c.user + c.system) / 1000);
    }
  }
  // Row 0 is the repeated index's: each variant's sum of its rows against a float64 one.
  const dyv = feeds.dy.data as Float32Array;
  const want = new Float64Array(D);
  ids.forEach((v, i) => {
    if (v === 0n) for (let d = 0; d < D; d++) want[d] += dyv[i * D + d];
  });
  const scale = Math.max(...want.map(Math.abs));
  const row0 = await Promise.all(sessions.map(async (s) => (await s.run(feeds)).out.data as Float32Array));
  const off = (v: Variant) => Math.max(...row0[VARIANTS.indexOf(v)].map((x, i) => Math.abs(x - want[i]))) / scale;
  for (const s of sessions) await s.release();
  const repeats = N - new Set(ids).size;
  console.log(`N=${N} rows of D=${D} into V=${V} (${repeats} rows repeat an index), ${threads} threads, ${reps} rounds: median ms`);
  console.log(`row 0 (index 0, ${ids.filter((v) => v === 0n).length} rows) against a float64 sum: largest error relative to its largest element: ScatterND ${off('ScatterND').toExponential(1)}, ScatterElements ${off('ScatterElements').toExponential(1)}, sorted ${off('sorted').toExponential(1)}`);
  console.log('variant          wall     cpu   wall/ND  cpu/ND  (wall-fill)/(ND-fill)  (cpu-fill)/(ND-fill)');
  const m = (map: Map<Variant, number[]>, v: Variant) => median(map.get(v)!);
  for (const v of VARIANTS) {
    const w = m(wall, v), c = m(cpu, v);
    // The median of the per-round ratios: each round's variants ran back to back, under the same load.
    const perRound = (map: Map<Variant, number[]>) => median(map.get(v)!.map((x, i) => x / map.get('ScatterND')![i]));
    const net = (map: Map<Variant, number[]>) => (m(map, v) - m(map, 'fill')) / (m(map, 'ScatterND') - m(map, 'fill'));
    console.log(`${v.padEnd(16)} ${w.toFixed(2).padStart(6)} ${c.toFixed(2).padStart(7)} ${perRound(wall).toFixed(2).padStart(8)} ${perRound(cpu).toFixed(2).padStart(7)} ${net(wall).toFixed(2).padStart(22)} ${net(cpu).toFixed(2).padStart(21)}`);
  }
}
