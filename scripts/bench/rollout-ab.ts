/**
 * The GRPO-shaped round of `prefzoo bench --rollout` (shared prompts and continuous batching on, as
 * the online loops run it) side by side: an earlier prefzoo's GenerationSession (`--base`, a
 * checkout's root with node_modules linked in, as for decode-ab.ts) against this one's, alternating
 * round by round in one process. Prints each round's process CPU and wall time per variant and
 * whether both drew the same tokens.
 *
 *   node --import tsx scripts/bench/rollout-ab.ts --base DIR [--prompts 8] [--generations 8] [--prompt 160] [--new 128] [--batch 32] [--rounds 3] [--threads N] [--logprobs]
 */
import path from 'node:path';
import { parseArgs } from 'node:util';
import { pathToFileURL } from 'node:url';
import { type Preset, presetArch, presetConfig } from '../../src/models/config.ts';
import { initWeights } from '../../src/models/init.ts';
import * as current from '../../src/models/generate.ts';
import { sampleRandom } from '../../src/models/sampling.ts';
import { SeededRandom } from '../../src/random.ts';
import { generatedVocabSize } from './decode-bench.ts';

const { values: a } = parseArgs({
  options: {
    base: { type: 'string' },
    preset: { type: 'string', default: 'small' },
    prompts: { type: 'string', default: '8' },
    generations: { type: 'string', default: '8' },
    prompt: { type: 'string', default: '160' },
    new: { type: 'string', default: '128' },
    batch: { type: 'string', default: '32' },
    rounds: { type: 'string', default: '3' },
    threads: { type: 'string' },
    logprobs: { type: 'boolean', default: false },
  },
});
if (!a.base) throw new Error('rollout-ab: --base DIR (an earlier checkout) is required');
const [np, G, P, N, B] = [a.prompts, a.generations, a.prompt, a.new, a.batch].map(Number);
type Gen = typeof current;
const base: Gen = await import(pathToFileURL(path.resolve(a.base, 'src/models/generate.ts')).href);
const config = presetConfig(presetArch(a.preset as Preset) ?? 'llama', a.preset as Preset, a.preset === 'tiny' ? { vocabSize: generatedVocabSize() } : {});
const weights = initWeights(config, 0);
// The prompts and budgets of rollout-bench.ts (seed 0).
const draw = new SeededRandom(0);
const prompts = Array.from({ length: np }, (_, i) => Array.from({ length: P }, (_, t) => 16 + ((i * 7919 + t * 104729) % (Math.min(config.vocab_size, 4096) - 16))));
const budgets = Array.from({ length: np * G }, () => Math.max(1, Math.ceil(N / 8) + Math.floor(draw.next() * (N - Math.ceil(N / 8) + 1))));
const runtime = a.threads ? { threads: Number(a.threads) } : undefined;
const variants = await Promise.all(
  [
    ['base', base],
    ['current', current],
  ].map(async ([name, mod]) => ({ name: name as string, mod: mod as Gen, dec: await (mod as Gen).Decoder.create(config, weights as never, { runtime }), cpu: [] as number[], wall: [] as number[], ids: [] as string[] })),
);
for (let r = 0; r < Number(a.rounds); r++) {
  for (const v of variants) {
    const s = v.mod.GenerationSession.open(v.dec as never, { temperature: 1, maxBatch: B, slots: P + N, logprobs: a.logprobs });
    const c0 = process.cpuUsage();
    const t0 = performance.now();
    const out = await Promise.all(
      budgets.map(async (n, j) => {
        const p = Math.floor(j / G);
        const row = s.start(prompts[p], sampleRandom(0, p, j % G), n);
        const seg = await row.generate();
        row.close();
        return seg.ids;
      }),
    );
    const c = process.cpuUsage(c0);
    v.wall.push((performance.now() - t0) / 1000);
    v.cpu.push((c.user + c.system) / 1e6);
    await s.close();
    v.ids.push(JSON.stringify(out));
    process.stderr.write(`round ${r + 1} ${v.name}: cpu ${v.cpu[r].toFixed(2)} s, wall ${v.wall[r].toFixed(2)} s\n`);
  }
}
const same = variants[0].ids.every((x) => x === variants[1].ids[0]) && variants[1].ids.every((x) => x === variants[1].ids[0]);
for (const v of variants) console.log(JSON.stringify({ variant: v.name, rows: budgets.length, new_tokens: budgets.reduce((x, y) => x + y, 0), batch: B, cpu_s: v.cpu.map((t) => +t.toFixed(2)), wall_s: v.wall.map((t) => +t.toFixed(2)) }));
console.log(JSON.stringify({ same_tokens: same }));
for (const v of variants) await v.dec.release();
