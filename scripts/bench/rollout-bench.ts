/**
 * A GRPO-shaped generation round (`prefzoo bench --rollout`): `--prompts` prompts of `--prompt`
 * tokens, each sampled `--generations` times, every row with its own token budget drawn from a
 * seeded distribution (uniform between an eighth of `--new` and `--new`), so rows end at different
 * lengths as real completions do (random weights have no stop token to end them). The same round
 * runs twice in one process, alternating `--runs` times: with the generation session's shared
 * prompts and continuous batching (each prompt prefilled once, a finished row's slot taken at once
 * by a waiting one, prompts at their own length) and without them (batches of `--batch` rows
 * left-padded and prefilled row by row, one batch after the other: the generation before sessions).
 * Prints prefill, decode and total seconds of each (medians) and the ratio; the tokens drawn are the
 * same both ways (checked). Each round starts with a weight update, as an online round does
 * (`setWeights` with the same values: under q8/q4 every weight is quantized again and the sessions
 * made again; with `--lora` the frozen base stays quantized and only the adapters are fed anew);
 * `update_s` is what that costs the round (quantizing and making sessions), inside its total.
 *
 *   prefzoo bench --rollout [--preset small] [--prompts 8] [--generations 8] [--prompt 160] [--new 128] [--batch 32] [--runs 1] [--dtype q4] [--lora 16]
 */
import os from 'node:os';
import { type Preset, presetArch, presetConfig } from '../../src/models/config.ts';
import { initWeights } from '../../src/models/init.ts';
import { Decoder, GenerationSession, setGenerateTimer } from '../../src/models/generate.ts';
import { sampleRandom } from '../../src/models/sampling.ts';
import { SeededRandom } from '../../src/random.ts';
import type { RuntimeOptions } from '../../src/runtime/session.ts';
import type { ProductQuant } from '../../src/models/quantize.ts';
import { initLora } from '../../src/models/lora.ts';
import { generatedVocabSize } from './decode-bench.ts';

export interface RolloutBenchOptions {
  preset: Preset;
  prompts: number;
  generations: number;
  prompt: number;
  newTokens: number;
  batch: number;
  runs: number;
  seed?: number;
  runtime?: RuntimeOptions;
  /** The rollout's products over block-quantized weights (rollout_dtype q8/q4; `--dtype`); default f32. */
  quant?: ProductQuant | null;
  /** LoRA adapters of this rank on every projection (alpha = 2·rank), the base frozen: a LoRA run's policy. */
  lora?: number;
  log?: (line: string) => void;
}

interface Timing {
  prefill_s: number;
  decode_s: number;
  total_s: number;
  /** Process CPU time of the round (user + system, every thread): steadier than the wall on a shared machine. */
  cpu_s: number;
  /** Of the total: the round's weight update (quantizing, making sessions; nothing else to do at f32). */
  update_s: number;
}

export interface RolloutBenchResult {
  engine: 'prefzoo';
  preset: string;
  device: string;
  /** f32, or q8/q4 with its block size. */
  dtype: string;
  /** LoRA rank on every projection (0: the whole model is the policy's weights). */
  lora: number;
  prompts: number;
  generations: number;
  rows: number;
  prompt_tokens: number;
  max_new_tokens: number;
  new_tokens: number;
  batch: number;
  /** Shared prompts and continuous batching (the session's defaults). */
  session: Timing;
  /** Neither: left-padded batches one after the other. */
  padded_batches: Timing;
  speedup: number;
  load_average: number;
}

const median = (xs: number[]) => [...xs].sort((a, b) => a - b)[xs.length >> 1];
const r3 = (x: number) => Math.round(x * 1000) / 1000;

export async function runRolloutBench(o: RolloutBenchOptions): Promise<RolloutBenchResult> {
  const log = o.log ?? (() => {});
  const config = presetConfig(presetArch(o.preset) ?? 'llama', o.preset, o.preset === 'tiny' ? { vocabSize: generatedVocabSize() } : {});
  const base = initWeights(config, 0);
  const lora = o.lora ? { rank: o.lora, alpha: 2 * o.lora, targets: ['all-linear'] } : null;
  const weights = lora ? new Map([...base, ...initLora(config, lora, 1)]) : base;
  const dec = await Decoder.create(config, weights, { runtime: o.runtime, quant: o.quant, lora, frozen: lora ? new Set(base.keys()) : undefined });
  const seed = o.seed ?? 0;
  const V = Math.min(config.vocab_size, 4096);
  const draw = new SeededRandom(seed);
  const prompts = Array.from({ length: o.prompts }, (_, i) => Array.from({ length: o.prompt }, (_, t) => 16 + ((i * 7919 + t * 104729) % (V - 16))));
  const budgets = Array.from({ length: o.prompts * o.generations }, () => Math.max(1, Math.ceil(o.newTokens / 8) + Math.floor(draw.next() * (o.newTokens - Math.ceil(o.newTokens / 8) + 1))));
  const round = async (shared: boolean) => {
    let prefill = 0;
    setGenerateTimer((label, ms) => label === 'prefill' && (prefill += ms));
    const t0 = performance.now();
    const c0 = process.cpuUsage();
    const u0 = dec.quantizeMs + dec.sessionMs;
    // The update before the round: the sessions it drops are made again at first use, inside the round.
    dec.setWeights((name) => weights.get(name)?.data);
    const s = GenerationSession.open(dec, { temperature: 1, maxBatch: o.batch, sharePrompts: shared, continuous: shared, slots: o.prompt + o.newTokens });
    try {
      const segs = await Promise.all(
        budgets.map(async (n, j) => {
          const p = Math.floor(j / o.generations);
          const row = s.start(prompts[p], sampleRandom(seed, p, j % o.generations), n);
          const seg = await row.generate();
          row.close();
          return seg.ids;
        }),
      );
      const total = (performance.now() - t0) / 1000;
      const c = process.cpuUsage(c0);
      const update = (dec.quantizeMs + dec.sessionMs - u0) / 1000;
      return { timing: { prefill_s: r3(prefill / 1000), decode_s: r3(total - prefill / 1000), total_s: r3(total), cpu_s: r3((c.user + c.system) / 1e6), update_s: r3(update) }, ids: segs };
    } finally {
      setGenerateTimer(null);
      await s.close();
    }
  };
  log(`${o.preset}: ${o.prompts} prompts × ${o.generations} of ${o.prompt} tokens, up to ${o.newTokens} new, batch ${o.batch}: warming up`);
  // Every graph both rounds run, built before either is timed: the prefill picking in the graph and
  // the one returning logits (a shared prompt), the step of several rows and the one-row step (a
  // cache of at most two rows has its own step graph: without the three-row session the padded
  // round's first batch made the many-row step inside its time).
  for (const shared of [false, true]) {
    for (const rows of [2, 3]) {
      const warm = GenerationSession.open(dec, { temperature: 1, maxBatch: rows, sharePrompts: shared, continuous: shared });
      await Promise.all([3, 5, 4].slice(0, rows).map((n, k) => warm.start(prompts[0].slice(0, 8), new SeededRandom(k), n).generate()));
      await warm.close();
    }
  }
  const with_: Timing[] = [];
  const without: Timing[] = [];
  for (let r = 0; r < o.runs; r++) {
    const a = await round(false);
    log(`run ${r + 1}/${o.runs}: padded batches ${a.timing.total_s} s`);
    const b = await round(true);
    log(`run ${r + 1}/${o.runs}: shared prompts + continuous batching ${b.timing.total_s} s`);
    if (JSON.stringify(a.ids) !== JSON.stringify(b.ids)) log('note: the two rounds drew different tokens (a float rounding near a draw boundary)');
    without.push(a.timing);
    with_.push(b.timing);
  }
  await dec.release();
  const med = (ts: Timing[]): Timing => ({ prefill_s: median(ts.map((t) => t.prefill_s)), decode_s: median(ts.map((t) => t.decode_s)), total_s: median(ts.map((t) => t.total_s)), cpu_s: median(ts.map((t) => t.cpu_s)), update_s: median(ts.map((t) => t.update_s)) });
  const session = med(with_);
  const padded = med(without);
  return {
    engine: 'prefzoo',
    preset: o.preset,
    device: o.runtime?.ep ?? 'cpu',
    dtype: o.quant ? `q${o.quant.bits} (block ${o.quant.block})` : 'f32',
    lora: o.lora ?? 0,
    prompts: o.prompts,
    generations: o.generations,
    rows: budgets.length,
    prompt_tokens: o.prompt,
    max_new_tokens: o.newTokens,
    new_tokens: budgets.reduce((a, b) => a + b, 0),
    batch: o.batch,
    session,
    padded_batches: padded,
    speedup: Math.round((padded.total_s / session.total_s) * 100) / 100,
    load_average: Math.round(os.loadavg()[0] * 100) / 100,
  };
}

export function formatRolloutBench(r: RolloutBenchResult): string {
  const t = (x: Timing) => `prefill ${x.prefill_s} s, decode ${x.decode_s} s, total ${x.total_s} s (process CPU ${x.cpu_s} s; the weight update ${x.update_s} s of it)`;
  const lines: [string, string][] = [
    ['model', `${r.preset} (random weights), ${r.dtype}, ${r.lora ? `LoRA r=${r.lora} on every projection (base frozen)` : 'every weight live'}, ${r.device}`],
    ['round', `${r.prompts} prompts × ${r.generations} generations = ${r.rows} rows, prompts of ${r.prompt_tokens} tokens, budgets up to ${r.max_new_tokens} (${r.new_tokens} new tokens in all), batch ${r.batch}`],
    ['padded_batches', t(r.padded_batches)],
    ['session', `${t(r.session)} (shared prompts, continuous batching)`],
    ['speedup', `${r.speedup}× end to end`],
    ['load_average', `${r.load_average} (other work on the machine slows every figure)`],
  ];
  const w = Math.max(...lines.map(([k]) => k.length));
  return lines.map(([k, v]) => `${k.padEnd(w)}  ${v}`).join('\n') + '\n';
}
