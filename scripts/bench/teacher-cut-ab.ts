/**
 * The teacher's top-K scoring as distill ran it before issue 44's `teacher15` change and as it runs
 * now, side by side in one process, the rounds alternating (so load from other work falls on both):
 * before, each row whole and the rest a masked log-sum-exp over the vocabulary
 * (`topKAndRestMasked`); now, `TeacherTopK.score`: each row less its last token, the rest from one
 * TopK of K + 1. The bench's teacher (the small preset widened 2×, filler weights), `rows` rows of
 * `prompt` + `new` tokens, K = 32, at each precision given; median wall and process CPU seconds, and
 * the largest differences between the two paths' outputs.
 *
 *   node --import tsx scripts/bench/teacher-cut-ab.ts [rows] [prompt] [new] [rounds] [dtypes, default f32,q8]
 */
import os from 'node:os';
import { Graph } from '../../src/onnx/graph.ts';
import { collate } from '../../src/models/batch.ts';
import { productQuant } from '../../src/models/quantize.ts';
import { logitsAt, quantizeTeacher, scoreIndex, scoringRuntime, TeacherTopK, topKAndRestMasked, type TeacherRow } from '../../src/train/teacher-topk.ts';
import { Session, toOrt } from '../../src/runtime/session.ts';
import { fillerRows, fillerTeacher } from './teacher-filler.ts';

const [rows, prompt, fresh, rounds] = process.argv.slice(2).map(Number);
const dtypes = (process.argv[6] ?? 'f32,q8').split(',');
const R = rows || 8;
const P = prompt || 32;
const N = fresh || 64;
const ROUNDS = rounds || 3;
const K = 32;

const teacher = fillerTeacher();
const config = teacher.config;
const examples = fillerRows(R, P, N, true);
const V = config.vocab_size;
const median = (xs: number[]) => [...xs].sort((a, b) => a - b)[xs.length >> 1];
const clock = async <T>(f: () => Promise<T>): Promise<{ out: T; wall: number; cpu: number }> => {
  const c0 = process.cpuUsage();
  const t0 = performance.now();
  const out = await f();
  const c = process.cpuUsage(c0);
  return { out, wall: (performance.now() - t0) / 1000, cpu: (c.user + c.system) / 1e6 };
};

for (const dtype of dtypes) {
  const quant = productQuant(dtype, 32, 'cpu', { dtype: 'dtype', block: 'block' });
  // Before: the whole rows in one padded batch, the rest a masked log-sum-exp.
  const g = new Graph('before');
  const model = teacher.forward(g, { inputIds: g.input('input_ids', 'int64', ['batch', 'seq']), attentionMask: g.input('attention_mask', 'int64', ['batch', 'seq']) });
  const t = topKAndRestMasked(g, g.logSoftmax(logitsAt(g, model, g.input('score_index', 'int64', ['scored']), V), -1), K);
  g.output(t.vals, 'topk_logps');
  g.output(t.ids, 'topk_ids');
  g.output(t.rest, 'rest_logp');
  const params = quant ? quantizeTeacher(g, teacher.feeds(), quant, V) : teacher.feeds();
  const session = await Session.fromGraph(g, scoringRuntime({}));
  const c = collate(examples, { kind: 'single', padTo: 1, padId: 0, dtype: 'float32' });
  const index = scoreIndex(c.feeds.loss_mask.data as Float32Array, R, c.length);
  const before = async () => {
    const r = await session.run({ ...params, input_ids: c.feeds.input_ids, attention_mask: c.feeds.attention_mask, score_index: toOrt('int64', index, [index.length]) });
    return { ids: r.topk_ids.data as BigInt64Array, logps: r.topk_logps.data as Float32Array, rest: r.rest_logp.data as Float32Array };
  };
  const scorer = await TeacherTopK.create(teacher, { K, limit: V, runtime: scoringRuntime({}), padId: 0, quant });
  const after = () => scorer.score(examples, { batchSize: 2 * R, padTo: 1 });
  await before();
  await after();
  const times = { before: { wall: [] as number[], cpu: [] as number[] }, after: { wall: [] as number[], cpu: [] as number[] } };
  let a: TeacherRow[] = [];
  let b = await before();
  for (let i = 0; i < ROUNDS; i++) {
    const x1 = await clock(before);
    b = x1.out;
    times.before.wall.push(x1.wall);
    times.before.cpu.push(x1.cpu);
    const x2 = await clock(after);
    a = x2.out;
    times.after.wall.push(x2.wall);
    times.after.cpu.push(x2.cpu);
  }
  await session.release();
  await scorer.release();
  const ids = Int32Array.from(b.ids, Number);
  const flat = { ids: a.flatMap((r) => Array.from(r.ids)), logps: a.flatMap((r) => Array.from(r.logps)), rest: a.flatMap((r) => Array.from(r.rest)) };
  const maxDiff = (p: ArrayLike<number>, q: ArrayLike<number>) => Array.from(p).reduce((m, v, i) => Math.max(m, Math.abs(v - q[i])), 0);
  const r3 = (v: number) => +v.toFixed(3);
  console.log(JSON.stringify({
    dtype, rows: R, tokens: examples.reduce((n, e) => n + e.promptIds.length + e.responseIds[0].length, 0), scored: index.length,
    before: { wall_s: r3(median(times.before.wall)), cpu_s: r3(median(times.before.cpu)), cpu_rounds: times.before.cpu.map(r3) },
    after: { wall_s: r3(median(times.after.wall)), cpu_s: r3(median(times.after.cpu)), cpu_rounds: times.after.cpu.map(r3) },
    cpu_ratio: r3(median(times.before.cpu) / median(times.after.cpu)),
    same_ids: flat.ids.every((id, i) => id === ids[i]), max_logp_diff: maxDiff(flat.logps, b.logps), max_rest_diff: maxDiff(flat.rest, b.rest), load: os.loadavg()[0],
  }));
}
