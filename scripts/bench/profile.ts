/**
 * Where a bench step spends its time: runs the bench's training, eval, optimizer or fused-step graph under ONNX
 * Runtime's profiler and sums kernel time per op type, per graph region (forward layers, gradient, log-probs)
 * and per node (each node's fastest of the timed runs).
 *
 *   npx tsx scripts/bench/profile.ts [--preset small] [--runs 2] [--threads N] [--opt-level extended]
 *                                    [--graph training|eval|optimizer|step] [--top 25] [--keep DIR]
 *                                    [--seq 256] [--gradient-checkpointing] [--layers N] [--lora R]
 *
 * --gradient-checkpointing profiles the recomputing graph under the runtime the trainer gives it
 * (no arena, no memory pattern), as the bench does with the same flag. --layers keeps the first N
 * decoder layers of the preset (a cheap proxy that keeps its width and vocabulary); --lora R puts
 * rank-R adapters on every projection, as `bench --lora`. --big MIB lists the nodes whose outputs
 * exceed MIB MiB (glibc maps a block above 32 MiB afresh: docs/performance.md, issue 46).
 */
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { parseArgs } from 'node:util';
import { prepareBench } from './step.ts';
import { readManifest } from '../../src/artifacts/manifest.ts';
import { type Feeds, type OptLevel, Session, toOrt } from '../../src/runtime/session.ts';
import { collate } from '../../src/models/batch.ts';
import { OPTIM_IO, gradName, stateName } from '../../src/optim/config.ts';
import { type Preset } from '../../src/models/config.ts';
import { LOW_MEMORY_RUNTIME } from '../../src/train/run.ts';

const { values: a } = parseArgs({
  options: {
    preset: { type: 'string', default: 'small' },
    runs: { type: 'string', default: '2' },
    threads: { type: 'string' },
    'opt-level': { type: 'string', default: 'extended' },
    graph: { type: 'string', default: 'training' },
    top: { type: 'string', default: '25' },
    keep: { type: 'string' },
    seq: { type: 'string', default: '256' },
    'gradient-checkpointing': { type: 'boolean', default: false },
    layers: { type: 'string' },
    lora: { type: 'string' },
    arena: { type: 'string' },
    big: { type: 'string' },
  },
});
const preset = a.preset as Preset;
const checkpointing = a['gradient-checkpointing'] === true;
const runs = Number(a.runs);
const runtime = { threads: a.threads ? Number(a.threads) : undefined, optLevel: a['opt-level'] as OptLevel, ...(checkpointing ? LOW_MEMORY_RUNTIME : {}), ...(a.arena ? { arena: a.arena === 'on' } : {}) };
const dir = a.keep ?? fs.mkdtempSync(path.join(os.tmpdir(), 'prefzoo-profile-'));
fs.mkdirSync(dir, { recursive: true });

const setup = prepareBench(dir, preset, 4, Number(a.seq), true, 'cpu', 'float32', { gradientCheckpointing: checkpointing, layers: a.layers ? Number(a.layers) : undefined, loraRank: a.lora ? Number(a.lora) : undefined });
const manifest = readManifest(setup.artDir);
const c = collate(setup.rows, { kind: 'pairwise', padTo: 64, padId: setup.padId, dtype: 'float32', refLogps: () => [-1000, -1000], packed: setup.packed });
const feeds: Feeds = { ...c.feeds };
for (const p of manifest.params) feeds[p.name] = toOrt('float32', setup.initial.get(p.name)!, p.shape);
const graphInfo = { eval: manifest.eval, optimizer: manifest.optimizer, training: manifest.training, step: manifest.step! }[a.graph!];
if (!graphInfo) throw new Error(`--graph must be training, eval, optimizer or step, got ${a.graph}`);
const zeros = (shape: number[]) => toOrt('float32', new Float32Array(shape.reduce((x, y) => x * y, 1)), shape);
if (a.graph === 'optimizer' || a.graph === 'step') {
  for (const p of manifest.params.filter((q) => q.trainable)) {
    if (a.graph === 'optimizer') feeds[gradName(p.name)] = toOrt('float32', setup.initial.get(p.name)!, p.shape); // any finite values
    for (const slot of manifest.optimizer.stateSlots) feeds[stateName(slot, p.name)] = zeros(p.shape);
  }
  feeds[OPTIM_IO.step] = toOrt('int64', BigInt64Array.of(1n), []);
  feeds[OPTIM_IO.lr] = toOrt('float32', Float32Array.of(1e-5), []);
  feeds[OPTIM_IO.gradScale] = toOrt('float32', Float32Array.of(1), []);
} else if (a.graph === 'training' && manifest.training.accumulation) {
  // A fresh accumulation: the running sums are zeros.
  for (const p of manifest.params.filter((q) => q.trainable)) {
    feeds[manifest.training.accumulation.inputs[p.name]] = zeros(p.shape);
  }
}
const prefix = path.join(dir, `profile_${a.graph}`);
const session = await Session.create(path.join(setup.artDir, graphInfo.file), { ...runtime, profilePrefix: prefix });
const only: Feeds = Object.fromEntries(graphInfo.inputs.map((n) => [n, feeds[n]]));
await session.run(only); // warm-up (allocations, first-run kernel choices)
const wall: number[] = [];
const cpu: number[] = [];
const sys: number[] = [];
for (let i = 0; i < runs; i++) {
  const c0 = process.cpuUsage();
  const t0 = performance.now();
  await session.run(only);
  wall.push(performance.now() - t0);
  const c = process.cpuUsage(c0);
  cpu.push((c.user + c.system) / 1000);
  sys.push(c.system / 1000);
}
session.endProfiling();
await session.release();

const file = fs.readdirSync(dir).filter((f) => f.startsWith(`profile_${a.graph}`) && f.endsWith('.json')).map((f) => path.join(dir, f)).sort().pop()!;
interface Ev { cat: string; name: string; dur: number; args?: { op_name?: string; output_size?: string; output_type_shape?: unknown; mem_bytes_in_use?: string; mem_peak_bytes?: string } }
const allEvents = JSON.parse(fs.readFileSync(file, 'utf8')) as Ev[];
const events = allEvents.filter((e) => e.cat === 'Node' && e.name.endsWith('_kernel_time'));
// The bytes ONNX Runtime's allocator holds for live tensors after each node: reported only where it
// keeps statistics (its arena). Beside peak RSS it separates live tensors from what the heap keeps.
const liveGB = allEvents.reduce((m, e) => Math.max(m, Number(e.args?.mem_bytes_in_use ?? 0)), 0) / 2 ** 30;
const bigOutputs = new Map<string, { op: string; mib: number; shape: string }>();
// The first run in the file is the warm-up: keep the last `runs` occurrences of each node.
const perNode = new Map<string, { op: string; durs: number[] }>();
for (const e of events) {
  const name = e.name.slice(0, -'_kernel_time'.length);
  const n = perNode.get(name) ?? { op: e.args?.op_name ?? '?', durs: [] };
  n.durs.push(e.dur);
  perNode.set(name, n);
  const mib = Number(e.args?.output_size ?? 0) / 2 ** 20;
  if (a.big && mib > Number(a.big)) bigOutputs.set(name, { op: n.op, mib, shape: JSON.stringify(e.args?.output_type_shape ?? []) });
}
const ms = (us: number) => us / 1000;
// Each node's fastest run: on a shared machine a kernel is only ever slowed down by others, so the
// per-node minimum estimates the undisturbed step (the wall times show the disturbed ones).
const nodeMs = new Map([...perNode].map(([k, v]) => [k, ms(Math.min(...v.durs.slice(-runs)))]));
const total = [...nodeMs.values()].reduce((x, y) => x + y, 0);

function table(title: string, key: (node: string, op: string) => string, top: number) {
  const sums = new Map<string, { ms: number; n: number }>();
  for (const [name, t] of nodeMs) {
    const k = key(name, perNode.get(name)!.op);
    const s = sums.get(k) ?? { ms: 0, n: 0 };
    s.ms += t;
    s.n++;
    sums.set(k, s);
  }
  const rows = [...sums].sort((x, y) => y[1].ms - x[1].ms).slice(0, top);
  console.log(`\n${title}`);
  for (const [k, s] of rows) console.log(`  ${s.ms.toFixed(1).padStart(9)} ms ${((100 * s.ms) / total).toFixed(1).padStart(5)} %  ${String(s.n).padStart(5)}×  ${k}`);
}

const median = (xs: number[]) => [...xs].sort((x, y) => x - y)[Math.floor(xs.length / 2)];
console.log(`${a.graph} graph, ${preset}, opt ${runtime.optLevel}, threads ${runtime.threads ?? 'default'}: wall ${median(wall).toFixed(0)} ms/run, cpu ${median(cpu).toFixed(0)} ms/run of which system ${median(sys).toFixed(0)} ms (medians of ${runs}; with --threads 1 the cpu time is the work, whatever else runs), sum of per-node fastest kernels ${total.toFixed(0)} ms, ${perNode.size} nodes after optimisation; arena ${runtime.arena === false ? 'off' : 'on'}; peak RSS ${(process.resourceUsage().maxRSS / 2 ** 20).toFixed(2)} GB${liveGB > 0 ? `, ONNX Runtime's peak bytes in use ${liveGB.toFixed(2)} GB` : ''}; load average ${os.loadavg()[0].toFixed(1)}`);
const region = (name: string) => {
  if (name.startsWith('optimizer/')) return 'optimizer';
  const grad = name.includes('grad/') ? 'grad ' : 'fwd  ';
  const m = name.match(/(scatter_add)/) ?? name.match(/layers\.\d+\/(attn|mlp)/) ?? name.match(/(lm_head|logps|loss_\w+|rope|embed|batch|grad_out)/);
  return grad + (m ? m[1] : 'other');
};
table('by op type', (_, op) => op, Number(a.top));
table('by region', (name) => region(name), 30);
table('by node', (name, op) => `${op}  ${name}`, Number(a.top));
table('by node, matmuls left out', (name, op) => (/Gemm|MatMul/.test(op) ? 'matmuls' : `${op}  ${name}`), Number(a.top));
if (a.big) {
  const byOp = new Map<string, { n: number; mib: number; shapes: Set<string> }>();
  for (const b of bigOutputs.values()) {
    const s = byOp.get(b.op) ?? { n: 0, mib: 0, shapes: new Set<string>() };
    s.n++;
    s.mib = Math.max(s.mib, b.mib);
    s.shapes.add(b.shape);
    byOp.set(b.op, s);
  }
  console.log(`\nnodes with outputs over ${a.big} MiB: ${bigOutputs.size}`);
  for (const [op, s] of [...byOp].sort((x, y) => y[1].n - x[1].n)) console.log(`  ${String(s.n).padStart(5)}×  ${op.padEnd(20)} largest ${s.mib.toFixed(1)} MiB  ${[...s.shapes].slice(0, 4).join(' ')}`);
  for (const [name, b] of [...bigOutputs].slice(0, Number(a.top))) console.log(`  ${b.mib.toFixed(1).padStart(8)} MiB  ${b.op}  ${name}`);
}
if (!a.keep) fs.rmSync(dir, { recursive: true, force: true });
