/**
 * The step graph's draw alone (`drawToken` over [B, V] logits), an earlier checkout's (`--base`, a
 * checkout's root with node_modules linked in, e.g. `git archive main | tar -x -C DIR`) against this
 * one's, side by side in one process, alternating; with `--profile`, ONNX Runtime's kernel time per
 * node of each. Prints whether the two draw the same ids, their largest log-probability difference,
 * and the median wall and process CPU ms a run (with 1 thread the CPU figure is the steady one on a
 * shared machine).
 *
 * `--limit` is the vocabulary limit (default the vocabulary: a real model's tokenizer uses nearly all
 * of it; the presets' generated tokenizer 461 ids of `small`'s 32,000).
 *
 *   node --import tsx scripts/bench/decode-draw-ab.ts --base DIR [--batch 16] [--vocab 32000] [--limit V] [--threads 2] [--rounds 8] [--temperature 1] [--profile]
 */
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { parseArgs } from 'node:util';
import { pathToFileURL } from 'node:url';
import { Graph } from '../../src/onnx/graph.ts';
import * as current from '../../src/models/decode.ts';
import { type Feeds, Session, toOrt } from '../../src/runtime/session.ts';
import { SeededRandom } from '../../src/random.ts';

const { values: a } = parseArgs({
  options: {
    base: { type: 'string' },
    batch: { type: 'string', default: '16' },
    vocab: { type: 'string', default: '32000' },
    limit: { type: 'string' },
    threads: { type: 'string', default: '2' },
    rounds: { type: 'string', default: '8' },
    temperature: { type: 'string', default: '1' },
    profile: { type: 'boolean', default: false },
  },
});
if (!a.base) throw new Error('--base DIR is required (a checkout to compare against)');
const B = Number(a.batch), V = Number(a.vocab), L = Number(a.limit ?? a.vocab), threads = Number(a.threads), temperature = Number(a.temperature);
type Draw = typeof current.drawToken;
const base: Draw = (await import(pathToFileURL(path.resolve(a.base, 'src/models/decode.ts')).href)).drawToken;
const rng = new SeededRandom([B, V, 3]);
// Logits of a random model's scale: a few units, a sharp head.
const logits = Float32Array.from({ length: B * V }, () => 4 * (rng.next() * 2 - 1) ** 3);
const feeds: Feeds = {
  logits: toOrt('float32', logits, [B, V]),
  vocab_limit: toOrt('int64', BigInt64Array.of(BigInt(L)), [1]),
  uniform: toOrt('float64', Float64Array.from({ length: B }, () => rng.next()), [B, 1]),
  ...(temperature === 1 ? {} : { temperature: toOrt('float64', Float64Array.of(temperature), []) }),
};
const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'prefzoo-draw-ab-'));
const names = ['base', 'this'];
const sessions: Session[] = [];
for (const [j, draw] of [base, current.drawToken].entries()) {
  const g = new Graph('draw');
  const x = g.input('logits', 'float32', ['batch', V]);
  const t = temperature === 1 ? null : g.input('temperature', 'float64', []);
  const d = draw(g as never, x as never, g.input('vocab_limit', 'int64', [1]) as never, t as never);
  g.output(d.token as never, 'token');
  g.output(d.logprob as never, 'logprob');
  sessions.push(await Session.fromGraph(g, { threads, profilePrefix: a.profile ? path.join(dir, names[j]) : undefined }));
}
const outs = [await sessions[0].run(feeds), await sessions[1].run(feeds)];
const same = (outs[0].token.data as BigInt64Array).every((x, i) => x === (outs[1].token.data as BigInt64Array)[i]);
const lb = outs[0].logprob.data as Float64Array, lt = outs[1].logprob.data as Float64Array;
let d = 0;
for (let i = 0; i < lb.length; i++) d = Math.max(d, Math.abs(lb[i] - lt[i]));
console.log(`this vs base: same tokens ${same}, max |Δlogprob| ${d.toExponential(2)}`);
const wall = names.map(() => [] as number[]), cpu = names.map(() => [] as number[]);
for (let r = 0; r < Number(a.rounds); r++) {
  for (let j = 0; j < names.length; j++) {
    const c0 = process.cpuUsage();
    const t0 = performance.now();
    for (let i = 0; i < 20; i++) await sessions[j].run(feeds);
    const c = process.cpuUsage(c0);
    wall[j].push((performance.now() - t0) / 20);
    cpu[j].push((c.user + c.system) / 1000 / 20);
  }
}
const med = (x: number[]) => [...x].sort((p, q) => p - q)[x.length >> 1];
console.log(`B ${B}, V ${V}, limit ${L}, threads ${threads}, temperature ${temperature}, load ${os.loadavg()[0].toFixed(2)}: ` + names.map((n, j) => `${n} ${med(wall[j]).toFixed(3)} ms wall (min ${Math.min(...wall[j]).toFixed(3)}), ${med(cpu[j]).toFixed(3)} ms cpu`).join(' | '));
if (a.profile) {
  for (const [j, s] of sessions.entries()) {
    await s.endProfiling();
    const file = fs.readdirSync(dir).find((f) => f.startsWith(names[j]) && f.endsWith('.json'))!;
    const ev = JSON.parse(fs.readFileSync(path.join(dir, file), 'utf8')) as { cat: string; name: string; dur: number; args?: { op_name?: string } }[];
    const runs = 1 + 20 * Number(a.rounds);
    const per = new Map<string, number>();
    for (const e of ev) if (e.cat === 'Node' && e.name.endsWith('_kernel_time')) per.set(`${e.args?.op_name} ${e.name.replace('_kernel_time', '')}`, (per.get(`${e.args?.op_name} ${e.name.replace('_kernel_time', '')}`) ?? 0) + e.dur);
    const rows = [...per].sort((x, y) => y[1] - x[1]);
    const total = rows.reduce((x, [, v]) => x + v, 0);
    console.log(`${names[j]}: ${(total / runs / 1000).toFixed(3)} ms of kernels a run; ` + rows.slice(0, 8).map(([k, v]) => `${k} ${(v / runs / 1000).toFixed(3)}`).join(', '));
  }
}
fs.rmSync(dir, { recursive: true, force: true });
