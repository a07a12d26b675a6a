/**
 * Where a generation step spends its time: one batched generation of a random-initialised preset
 * (weights fed, as `bench --generate`), timed piece by piece on the host — the step session's run,
 * the sampling of every row, everything else (masks, ids, cache bookkeeping) — with the step graph
 * under ONNX Runtime's profiler, whose kernel times are summed per op type and per node. The gap
 * between a run's wall time and its kernels is the runtime's own cost (feeding inputs, allocating
 * and copying outputs into JavaScript).
 *
 *   node --import tsx scripts/bench/decode-profile.ts [--preset small] [--batch 32] [--prompt 32] [--new 32] [--top 15] [--threads N] [--baked | --dtype q8|q4 [--block-size 32] [--accuracy 4]]
 */
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { parseArgs } from 'node:util';
import { type Preset, presetArch, presetConfig } from '../../src/models/config.ts';
import { initWeights } from '../../src/models/init.ts';
import { Decoder, generateIds } from '../../src/models/generate.ts';
import { sampleRandom } from '../../src/models/sampling.ts';
import { setGenerateTimer } from '../../src/models/generate.ts';
import { productQuant } from '../../src/models/quantize.ts';

const { values: a } = parseArgs({
  options: {
    preset: { type: 'string', default: 'small' },
    batch: { type: 'string', default: '32' },
    prompt: { type: 'string', default: '32' },
    new: { type: 'string', default: '32' },
    top: { type: 'string', default: '15' },
    threads: { type: 'string' },
    baked: { type: 'boolean', default: false },
    dtype: { type: 'string', default: 'f32' },
    'block-size': { type: 'string', default: '32' },
    accuracy: { type: 'string' },
  },
});
const preset = a.preset as Preset;
const B = Number(a.batch);
const P = Number(a.prompt);
const N = Number(a.new);
const config = presetConfig(presetArch(preset) ?? 'llama', preset, {});
const weights = initWeights(config, 0);
const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'prefzoo-decode-profile-'));
const pq = productQuant(a.dtype!, Number(a['block-size']), 'cpu', { dtype: '--dtype', block: '--block-size' });
const quant = pq && a.accuracy !== undefined ? { ...pq, accuracy: Number(a.accuracy) } : pq;
const dec = await Decoder.create(config, weights, { bake: a.baked, quant, runtime: { profilePrefix: path.join(dir, 'decode'), threads: a.threads ? Number(a.threads) : undefined } });
const reqs = () => Array.from({ length: B }, (_, i) => ({ promptIds: Array.from({ length: P }, (_, t) => 16 + ((i * 7919 + t * 104729) % 4080)), rng: sampleRandom(1, i, 0) }));
const opts = { temperature: 1, stopIds: [], padId: 0, batchSize: B };
await generateIds([{ decoder: dec, weight: 1 }], reqs(), { ...opts, maxNewTokens: 4 }); // warm-up
const spans = new Map<string, number[]>();
setGenerateTimer((label, ms) => spans.set(label, [...(spans.get(label) ?? []), ms]));
const c0 = process.cpuUsage();
const t0 = performance.now();
await generateIds([{ decoder: dec, weight: 1 }], reqs(), { ...opts, maxNewTokens: N });
const wall = performance.now() - t0;
const cpu = process.cpuUsage(c0);
setGenerateTimer(null);
await dec.endProfiling();
await dec.release();

const sum = (xs: number[]) => xs.reduce((x, y) => x + y, 0);
console.log(`${preset} ${a.baked ? 'baked' : a.dtype}${quant ? ` block ${quant.block} accuracy ${quant.accuracy ?? 4}` : ''}, batch ${B}, prompt ${P}, ${N} new: ${wall.toFixed(0)} ms wall, ${((cpu.user + cpu.system) / 1000).toFixed(0)} ms cpu, load ${os.loadavg()[0].toFixed(2)}`);
console.log('host spans (ms per step, median; total ms):');
for (const [k, v] of spans) console.log(`  ${k.padEnd(16)} ${[...v].sort((x, y) => x - y)[v.length >> 1].toFixed(2).padStart(8)}  ${sum(v).toFixed(0).padStart(7)}  (${v.length}×)`);

interface Ev { cat: string; name: string; dur: number; ts: number; args?: { op_name?: string } }
// The step session's trace: the one with the most runs (the prefill runs a few rows at a time, so it has several too).
const traces = fs.readdirSync(dir).filter((x) => x.endsWith('.json')).map((f) => JSON.parse(fs.readFileSync(path.join(dir, f), 'utf8')) as Ev[]);
const runsOf = (ev: Ev[]) => ev.filter((e) => e.cat === 'Session' && e.name === 'model_run');
for (const ev of traces.sort((x, y) => runsOf(y).length - runsOf(x).length).slice(0, 1)) {
  const runs = runsOf(ev);
  // The timed generation's runs: the last N − 1 (the warm-up's came first).
  const timed = runs.slice(-(N - 1));
  const from = timed[0].ts;
  const kernels = ev.filter((e) => e.cat === 'Node' && e.name.endsWith('_kernel_time') && e.ts >= from);
  const kms = sum(kernels.map((e) => e.dur)) / 1000 / timed.length;
  console.log(`step session: ${(sum(timed.map((e) => e.dur)) / 1000 / timed.length).toFixed(2)} ms per run inside ORT, ${kms.toFixed(2)} ms of kernels (${(kernels.length / timed.length).toFixed(0)} kernels a run)`);
  const table = (title: string, key: (e: Ev) => string) => {
    const m = new Map<string, number>();
    const count = new Map<string, number>();
    for (const e of kernels) {
      m.set(key(e), (m.get(key(e)) ?? 0) + e.dur);
      count.set(key(e), (count.get(key(e)) ?? 0) + 1);
    }
    console.log(title);
    for (const [k, v] of [...m].sort((x, y) => y[1] - x[1]).slice(0, Number(a.top))) console.log(`  ${(v / 1000 / timed.length).toFixed(2).padStart(8)} ms ${((100 * v) / 1000 / timed.length / kms).toFixed(1).padStart(5)} % ${(count.get(k)! / timed.length).toFixed(0).padStart(4)}×  ${k}`);
  };
  table('by op type (ms per step):', (e) => e.args?.op_name ?? '?');
  // Each layer's part (attention, MLP, norms) summed over the layers; the rest is the head and the draw.
  table('by part of a layer (ms per step):', (e) => {
    const m = /^layers\.\d+\/([^/_]+)/.exec(e.name);
    return m ? `layers.*/${m[1]} ${e.args?.op_name}` : `outside the layers ${e.args?.op_name}`;
  });
  table('by node (ms per step):', (e) => `${e.args?.op_name}  ${e.name.slice(0, -'_kernel_time'.length)}`);
}
fs.rmSync(dir, { recursive: true, force: true });
