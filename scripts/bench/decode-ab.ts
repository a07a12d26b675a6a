/**
 * Side-by-side decode measurements in one process, alternating: an earlier prefzoo's generateIds
 * (`--base`, a checkout's root, e.g. `git archive <commit> src datasets losses | tar -x -C DIR`, with
 * node_modules linked in; its default path) against this one's, and with `--host` this one's with host
 * sampling (the graph returns the logits; JavaScript samples) — so each change's effect is a ratio
 * taken under the same load. `--threads` sets ONNX Runtime's intra-op threads (1: the process CPU
 * time is then the steadiest figure on a loaded machine).
 * Same shape as `bench --generate`: a random-initialised preset, fed weights, multinomial sampling,
 * no stop ids (`--logprobs`: every variant also returns each token's log-probability, as GRPO asks).
 * Prints the median ms per step (prefill subtracted) per variant and round, wall and process CPU
 * time (the CPU time is the steadier figure on a shared machine).
 *
 *   node --import tsx scripts/bench/decode-ab.ts --base DIR [--preset small] [--batch 32] [--prompt 32] [--new 64] [--rounds 3] [--threads N] [--host] [--logprobs]
 */
import os from 'node:os';
import path from 'node:path';
import { parseArgs } from 'node:util';
import { pathToFileURL } from 'node:url';
import { type Preset, presetArch, presetConfig } from '../../src/models/config.ts';
import { initWeights } from '../../src/models/init.ts';
import * as current from '../../src/models/generate.ts';
import { sampleRandom } from '../../src/models/sampling.ts';

const { values: a } = parseArgs({
  options: {
    base: { type: 'string' },
    preset: { type: 'string', default: 'small' },
    batch: { type: 'string', default: '32' },
    prompt: { type: 'string', default: '32' },
    new: { type: 'string', default: '64' },
    rounds: { type: 'string', default: '3' },
    threads: { type: 'string' },
    host: { type: 'boolean', default: false },
    logprobs: { type: 'boolean', default: false },
  },
});
const B = Number(a.batch);
const P = Number(a.prompt);
const N = Number(a.new);
const config = presetConfig(presetArch(a.preset as Preset) ?? 'llama', a.preset as Preset, {});
const weights = initWeights(config, 0);
type Gen = typeof current;
const base: Gen | null = a.base ? await import(pathToFileURL(path.resolve(a.base, 'src/models/generate.ts')).href) : null;

interface Variant {
  name: string;
  mod: Gen;
  host: boolean;
  dec?: current.Decoder;
}
const variants: Variant[] = [
  ...(base ? [{ name: 'base', mod: base, host: false }] : []),
  ...(a.host ? [{ name: 'host sampling', mod: current, host: true }] : []),
  { name: 'graph picks', mod: current, host: false },
];
const runtime = a.threads ? { threads: Number(a.threads) } : undefined;
for (const v of variants) v.dec = await v.mod.Decoder.create(config, weights as never, { runtime });
const reqs = (seed: number) => Array.from({ length: B }, (_, i) => ({ promptIds: Array.from({ length: P }, (_, t) => 16 + ((i * 7919 + t * 104729) % 4080)), rng: sampleRandom(seed, i, 0) }));
async function gen(v: Variant, n: number): Promise<[number, number]> {
  const c0 = process.cpuUsage();
  const t0 = performance.now();
  await v.mod.generateIds([{ decoder: v.dec! as never, weight: 1 }], reqs(n) as never, { temperature: 1, maxNewTokens: n, stopIds: [], padId: 0, batchSize: B, hostSampling: v.host, logprobs: a.logprobs } as never);
  const c = process.cpuUsage(c0);
  return [performance.now() - t0, (c.user + c.system) / 1000];
}
for (const v of variants) await gen(v, 4); // warm-up: sessions, arenas
const rows = new Map<string, { wall: number[]; cpu: number[] }>(variants.map((v) => [v.name, { wall: [], cpu: [] }]));
for (let r = 0; r < Number(a.rounds); r++) {
  for (const v of variants) {
    const [pw, pc] = await gen(v, 1);
    const [tw, tc] = await gen(v, N);
    rows.get(v.name)!.wall.push((tw - pw) / (N - 1));
    rows.get(v.name)!.cpu.push((tc - pc) / (N - 1));
  }
  process.stderr.write(`round ${r + 1}: ${variants.map((v) => `${v.name} ${rows.get(v.name)!.wall[r].toFixed(1)} ms`).join(', ')} (load ${os.loadavg()[0].toFixed(1)})\n`);
}
const med = (xs: number[]) => [...xs].sort((x, y) => x - y)[xs.length >> 1];
const ref = variants[0].name;
for (const v of variants) {
  const x = rows.get(v.name)!;
  const speed = (k: 'wall' | 'cpu') => (med(rows.get(ref)!.wall.map((_, i) => rows.get(ref)![k][i] / x[k][i]))).toFixed(2);
  console.log(JSON.stringify({ variant: v.name, batch: B, ms_per_step_wall: x.wall.map((t) => +t.toFixed(1)), cpu_ms_per_step: x.cpu.map((t) => +t.toFixed(1)), [`speedup_vs_${ref}_wall`]: +speed('wall'), [`speedup_vs_${ref}_cpu`]: +speed('cpu') }));
}
for (const v of variants) await v.dec!.release();
