/**
 * The gradient of a gather (a scatter-add of N rows of D into a V-row table) three ways, side by side:
 * ScatterND(add) (fast, but the rows of a repeated index land in an order that varies with the
 * threads, and some are lost), ScatterElements(add) with indices expanded to [N, D] (repeatable,
 * element by element), and src/autodiff/scatter.ts's sorted segment sums (repeatable). All three
 * sit in one graph, run by one session (one thread pool, as in a training step), under ONNX
 * Runtime's profiler: each run executes the three in turn, and each variant's time is the sum of its
 * nodes' kernel times in that run. Prints, per variant, the median over the runs of that time, of
 * its ratio to ScatterND's in the same run, and the same with the copy of the zero table that every
 * variant's final scatter makes subtracted (`fill`: ScatterND placing a single row).
 * Also checks the repeated index's row against a float64 sum.
 *
 *   node --import tsx scripts/bench/scatter-add.ts [--rows 1536,1024] [--dim 512] [--vocab 32000]
 *                                                  [--repeat 0.1] [--runs 100] [--threads 2]
 *
 * --repeat is the share of rows that carry index 0 (a pad token); the others are uniform over the vocabulary.
 */
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { parseArgs } from 'node:util';
import { Graph, type Tensor } from '../../src/onnx/graph.ts';
import { Session, toOrt, type Feeds } from '../../src/runtime/session.ts';
import { serializeModel } from '../../src/onnx/proto.ts';
import { sortedScatterAdd } from '../../src/autodiff/scatter.ts';
import { zerosLike } from '../../src/autodiff/shape.ts';
import { SeededRandom } from '../../src/random.ts';

const { values: a } = parseArgs({
  options: {
    rows: { type: 'string', default: '1536,1024' },
    dim: { type: 'string', default: '512' },
    vocab: { type: 'string', default: '32000' },
    repeat: { type: 'string', default: '0.1' },
    runs: { type: 'string', default: '100' },
    threads: { type: 'string', default: '2' },
  },
});
const D = Number(a.dim);
const V = Number(a.vocab);
const runs = Number(a.runs);
const threads = Number(a.threads);

const VARIANTS = ['fill', 'ScatterND', 'ScatterElements', 'sorted'] as const;
type Variant = (typeof VARIANTS)[number];

/** Each variant in scope `<variant>/`, from a zero table shaped like W [V, D] (as zerosLike does in a gradient); one row of each out. */
function graph(N: number): Graph {
  const g = new Graph('scatter-add');
  const W = g.input('W', 'float32', [V, D]);
  const idx = g.input('idx', 'int64', [N]);
  const dy = g.input('dy', 'float32', [N, D]);
  for (const v of VARIANTS) {
    g.scope(v, () => {
      const zeros = zerosLike(g, W);
      let out: Tensor;
      if (v === 'fill') out = g.scatterND(zeros, g.constant([0], 'int64', [1, 1]), g.slice(dy, [0], [1], [0]), 'add');
      else if (v === 'ScatterND') out = g.scatterND(zeros, g.unsqueeze(idx, [-1]), dy, 'add');
      else if (v === 'ScatterElements') out = g.scatterElements(zeros, g.expand(g.reshape(idx, [-1, 1]), [1, D]), dy, 0, 'add');
      else out = sortedScatterAdd(g, zeros, idx, dy);
      // Row 0 out: the scatter runs whole, without a table-sized copy to JavaScript per run.
      g.output(g.slice(out, [0], [1], [0]), `row0_${v}`);
    });
  }
  return g;
}

const median = (xs: number[]) => {
  const s = [...xs].sort((x, y) => x - y);
  return s.length % 2 ? s[(s.length - 1) / 2] : (s[s.length / 2 - 1] + s[s.length / 2]) / 2;
};

const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'prefzoo-scatter-add-'));
try {
  for (const N of a.rows!.split(',').map(Number)) {
    const rand = new SeededRandom(N);
    const ids = BigInt64Array.from({ length: N }, () => BigInt(rand.next() < Number(a.repeat) ? 0 : Math.floor(rand.next() * V)));
    const dyv = Float32Array.from({ length: N * D }, () => rand.next() - 0.5);
    const feeds: Feeds = { W: toOrt('float32', new Float32Array(V * D), [V, D]), idx: toOrt('int64', ids, [N]), dy: toOrt('float32', dyv, [N, D]) };
    const prefix = path.join(dir, `n${N}`);
    const s = await Session.create(serializeModel(graph(N)), { threads, profilePrefix: prefix });
    const first = await s.run(feeds);
    for (let r = 0; r < runs; r++) await s.run(feeds);
    s.endProfiling();
    await s.release();

    // Kernel time per variant and run; the first run (allocations) is left out.
    interface Ev { cat: string; name: string; dur: number; ts: number }
    const file = fs.readdirSync(dir).filter((f) => f.startsWith(`n${N}`) && f.endsWith('.json')).map((f) => path.join(dir, f))[0];
    const events = JSON.parse(fs.readFileSync(file, 'utf8')) as Ev[];
    const starts = events.filter((e) => e.name === 'model_run').map((e) => e.ts).sort((x, y) => x - y);
    const per = new Map<Variant, number[]>(VARIANTS.map((v) => [v, starts.map(() => 0)]));
    for (const e of events) {
      if (e.cat !== 'Node' || !e.name.endsWith('_kernel_time')) continue;
      const v = VARIANTS.find((x) => e.name.startsWith(`${x}/`));
      if (!v) continue;
      let k = starts.length - 1;
      while (k > 0 && starts[k] > e.ts) k--;
      per.get(v)![k] += e.dur / 1000;
    }
    for (const v of VARIANTS) per.set(v, per.get(v)!.slice(1));

    const want = new Float64Array(D);
    ids.forEach((x, i) => {
      if (x === 0n) for (let d = 0; d < D; d++) want[d] += dyv[i * D + d];
    });
    const scale = Math.max(...want.map(Math.abs));
    const off = (v: Variant) => Math.max(...(first[`row0_${v}`].data as Float32Array).map((x, i) => Math.abs(x - want[i]))) / scale;

    const repeats = N - new Set(ids).size;
    console.log(`N=${N} rows of D=${D} into V=${V} (${repeats} rows repeat an index), ${threads} threads, ${runs} runs: kernel ms per run, medians`);
    console.log(`row 0 (index 0, ${ids.filter((x) => x === 0n).length} rows) against a float64 sum, largest error over its largest element: ScatterND ${off('ScatterND').toExponential(1)}, ScatterElements ${off('ScatterElements').toExponential(1)}, sorted ${off('sorted').toExponential(1)}`);
    console.log('variant            ms   /ScatterND   ms-fill   (ms-fill)/(ScatterND-fill)');
    const nd = per.get('ScatterND')!;
    const fill = per.get('fill')!;
    for (const v of VARIANTS) {
      const t = per.get(v)!;
      const ratio = median(t.map((x, i) => x / nd[i]));
      const net = t.map((x, i) => x - fill[i]);
      const netRatio = v === 'fill' ? 0 : median(net.map((x, i) => x / (nd[i] - fill[i])));
      console.log(`${v.padEnd(16)} ${median(t).toFixed(2).padStart(6)} ${ratio.toFixed(2).padStart(11)} ${median(net).toFixed(2).padStart(9)} ${netRatio.toFixed(2).padStart(27)}`);
    }
  }
} finally {
  fs.rmSync(dir, { recursive: true, force: true });
}
