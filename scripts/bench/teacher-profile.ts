/**
 * Where the teacher's top-K scoring spends its time: the top-K graph of `prefzoo bench --distill`'s
 * teacher (the small preset widened 2×, filler weights) over `rows` rows of `prompt` + `new` tokens,
 * fed as `TeacherTopK.score` feeds them (each row less its last token), under ONNX Runtime's profiler; kernel time summed per op type and per node (each node's fastest
 * timed run), and the wall and process CPU seconds of each run.
 *
 *   node --import tsx scripts/bench/teacher-profile.ts [rows] [prompt] [new] [runs] [dtype]
 */
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { collate } from '../../src/models/batch.ts';
import { productQuant } from '../../src/models/quantize.ts';
import { buildTopKGraph, quantizeTeacher, scoreIndex, scoringRuntime } from '../../src/train/teacher-topk.ts';
import { Session, toOrt } from '../../src/runtime/session.ts';
import { fillerRows, fillerTeacher } from './teacher-filler.ts';

const [rows, prompt, fresh, runsArg] = process.argv.slice(2).map(Number);
const dtype = process.argv[6] ?? 'f32';
const R = rows || 8;
const P = prompt || 32;
const N = fresh || 64;
const RUNS = runsArg || 2;

const teacher = fillerTeacher();
const config = teacher.config;
const examples = fillerRows(R, P, N);

const g = buildTopKGraph(teacher, 32, config.vocab_size);
let params = teacher.feeds();
const quant = productQuant(dtype, 32, 'cpu', { dtype: 'dtype', block: 'block' });
if (quant) params = quantizeTeacher(g, params, quant, config.vocab_size);
const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'prefzoo-teacher-profile-'));
const session = await Session.fromGraph(g, { ...scoringRuntime({}), profilePrefix: path.join(dir, 'p') });
// As TeacherTopK.score feeds it: the rows (all P + N long) less their last token, the positions scored of the whole rows.
const c = collate(examples, { kind: 'single', padTo: 1, padId: 0, dtype: 'float32' });
const T = c.length;
const cut = (t: BigInt64Array) => toOrt('int64', BigInt64Array.from({ length: R * (T - 1) }, (_, i) => t[Math.floor(i / (T - 1)) * T + (i % (T - 1))]), [R, T - 1]);
const index = scoreIndex(c.feeds.loss_mask.data as Float32Array, R, T, T - 1);
const feeds = { ...params, input_ids: cut(c.feeds.input_ids.data as BigInt64Array), attention_mask: cut(c.feeds.attention_mask.data as BigInt64Array), score_index: toOrt('int64', index, [index.length]) };
await session.run(feeds);
for (let i = 0; i < RUNS; i++) {
  const c0 = process.cpuUsage();
  const t0 = performance.now();
  await session.run(feeds);
  const cu = process.cpuUsage(c0);
  console.log(`run ${i}: wall ${((performance.now() - t0) / 1000).toFixed(3)} s, cpu ${((cu.user + cu.system) / 1e6).toFixed(3)} s`);
}
session.endProfiling();
await session.release();
const file = fs.readdirSync(dir).map((f) => path.join(dir, f)).find((f) => f.endsWith('.json'))!;
interface Ev { cat: string; name: string; dur: number; args?: { op_name?: string; output_type_shape?: unknown } }
const events = (JSON.parse(fs.readFileSync(file, 'utf8')) as Ev[]).filter((e) => e.cat === 'Node' && e.name.endsWith('_kernel_time'));
const perNode = new Map<string, { op: string; durs: number[]; shape: unknown }>();
for (const e of events) {
  const name = e.name.slice(0, -'_kernel_time'.length);
  const n = perNode.get(name) ?? { op: e.args?.op_name ?? '?', durs: [], shape: e.args?.output_type_shape };
  n.durs.push(e.dur);
  perNode.set(name, n);
}
const nodeMs = new Map([...perNode].map(([k, v]) => [k, Math.min(...v.durs.slice(-RUNS)) / 1000]));
const total = [...nodeMs.values()].reduce((a, b) => a + b, 0);
console.log(`${R} rows × (${P} + ${N}), ${dtype}: sum of per-node fastest kernels ${total.toFixed(0)} ms, ${perNode.size} nodes; load ${os.loadavg()[0].toFixed(1)}`);
const table = (title: string, key: (name: string, op: string) => string, top: number) => {
  const sums = new Map<string, { ms: number; n: number }>();
  for (const [name, t] of nodeMs) {
    const k = key(name, perNode.get(name)!.op);
    const s = sums.get(k) ?? { ms: 0, n: 0 };
    s.ms += t;
    s.n++;
    sums.set(k, s);
  }
  console.log(`\n${title}`);
  for (const [k, s] of [...sums].sort((a, b) => b[1].ms - a[1].ms).slice(0, top)) console.log(`  ${s.ms.toFixed(1).padStart(8)} ms ${((100 * s.ms) / total).toFixed(1).padStart(5)} %  ${String(s.n).padStart(4)}×  ${k}`);
};
table('by op type', (_, op) => op, 20);
table('by node (matmuls by layer kind)', (name, op) => (/Gemm|MatMul/.test(op) ? `${op} ${name.replace(/\d+/g, '#')}` : `${op}  ${name.replace(/layers\.\d+/g, 'layers.#')}`), 30);
fs.rmSync(dir, { recursive: true, force: true });
