/**
 * SPPO's iterations ("Self-Play Preference Optimization for Language Model Alignment", 2024):
 *
 *   for t = 0 … T−1:
 *     sample K responses per prompt from π_t
 *     P̂(y_k ≻ π_t) = mean over the other samples j of P(y_k ≻ y_j)   (the judge)
 *     π_{t+1} = train the `sppo` loss on those lists, with π_t as the reference (and the start)
 *
 * Each iteration is an ordinary training run on listwise rows (responses, win_probs = scores = P̂),
 * so its folder holds the usual metrics, checkpoints and final model. Run folder:
 *
 *   iter-1/samples.jsonl  the sampled lists and their win-rates (what iteration 1 trained on)
 *   iter-1/train/         the training run; iter-1/train/final is π_1
 *   …
 *   final/                π_T (a copy)
 *   sppo.json             settings and a summary per iteration
 */
import { cpSync, existsSync, mkdirSync, rmSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { makeMeta } from '../../datasets/schema.ts';
import { UserError } from '../errors.ts';
import { resolveConfig, type TrainConfig } from '../train/config.ts';
import type { Example, LoadedData } from '../../datasets/examples.ts';
import type { Text } from '../../datasets/schema.ts';
import { train } from '../train/trainer.ts';
import { winRates, type Judge } from './judges.ts';
import { Policy } from './policy.ts';
import { runtimeOf, type LoopOptions } from '../train/run.ts';
import { writeJsonAtomic } from '../io/atomic.ts';
import type { SamplingOptions } from '../models/sampling.ts';

/** `params`: trainer settings and the loss's `beta`, as `key=value`. */
export interface SppoOptions extends SamplingOptions, LoopOptions {
  prompts: readonly Text[];
  judge: Judge;
  /** T (default 3). */
  iterations?: number;
  /** K responses per prompt and iteration (default 4). */
  samples?: number;
  maxNewTokens: number;
}

export interface SppoIteration {
  iteration: number;
  /** Mean over prompts of the spread max P̂ − min P̂ (0 when every sample ties). */
  win_rate_spread: number;
  /** Share of samples that ended with a stop token. */
  stopped: number;
  steps: number;
  loss: number;
  seconds: number;
  model: string;
}

export interface SppoResult {
  finalDir: string;
  iterations: SppoIteration[];
  seconds: number;
}

export async function runSppo(o: SppoOptions): Promise<SppoResult> {
  const t0 = Date.now();
  const log = o.log ?? (() => {});
  const T = o.iterations ?? 3;
  const K = o.samples ?? 4;
  if (!(Number.isInteger(T) && T >= 1)) throw new UserError(`--iterations must be a positive integer, got ${o.iterations}`);
  if (!(Number.isInteger(K) && K >= 2)) throw new UserError(`--samples must be an integer ≥ 2 (win-rates compare samples with each other), got ${o.samples}`);
  if (o.prompts.length === 0) throw new UserError('sppo: no prompts');
  const { config } = resolveConfig({ configFile: o.configFile, params: o.params, base: o.base, command: 'sppo' });
  if (existsSync(join(o.out, 'sppo.json'))) throw new UserError(`${o.out} already holds an SPPO run; choose another -o`);
  mkdirSync(o.out, { recursive: true });
  const text = o.prompts.some((p) => typeof p !== 'string') ? 'messages' : 'plain';
  const summary: SppoIteration[] = [];
  let current = o.model;
  for (let t = 1; t <= T; t++) {
    const ti = Date.now();
    const dir = join(o.out, `iter-${t}`);
    mkdirSync(dir, { recursive: true });
    const policy = await Policy.load(current, runtimeOf(config));
    const samples = await policy.sample(o.prompts, { ...o, n: K, seed: config.seed * 1000 + t });
    await policy.release();
    const groups = o.prompts.map((prompt, i) => ({ prompt, responses: samples.slice(i * K, (i + 1) * K).map((s) => s.response) }));
    const P = await winRates(o.judge, groups);
    const examples: Example[] = groups.map((g, i) => ({ prompt: g.prompt, responses: g.responses, scores: P[i], winProbs: P[i] }));
    writeFileSync(join(dir, 'samples.jsonl'), groups.map((g, i) => JSON.stringify({ prompt: g.prompt, responses: g.responses, win_probs: P[i] }) + '\n').join(''));
    const rows: LoadedData = { kind: 'listwise', meta: makeMeta('listwise', text, 'sppo'), examples, files: [] };
    const r = await train({
      model: current,
      data: join(dir, 'samples.jsonl'),
      rows,
      loss: 'sppo',
      out: join(dir, 'train'),
      params: o.params,
      configFile: o.configFile,
      base: { ...o.base, seed: config.seed + t },
      progress: o.progress,
      quiet: o.quiet,
      log,
      // Each iteration's samples are new: an earlier run's folder here holds nothing to keep.
      overwrite: true,
    });
    const spread = P.reduce((a, p) => a + Math.max(...p) - Math.min(...p), 0) / P.length;
    const it: SppoIteration = {
      iteration: t,
      win_rate_spread: spread,
      stopped: samples.filter((s) => s.stopped).length / samples.length,
      steps: r.steps,
      loss: r.last.loss,
      seconds: Math.round((Date.now() - ti) / 100) / 10,
      model: r.finalDir,
    };
    summary.push(it);
    log(`sppo: iteration ${t}/${T}: ${samples.length} samples, win-rate spread ${spread.toFixed(3)}, ${r.steps} steps, loss ${r.last.loss?.toPrecision(4)} (${it.seconds}s)`);
    current = r.finalDir;
  }
  const finalDir = join(o.out, 'final');
  rmSync(finalDir, { recursive: true, force: true });
  cpSync(current, finalDir, { recursive: true });
  const seconds = Math.round((Date.now() - t0) / 100) / 10;
  writeJsonAtomic(join(o.out, 'sppo.json'), { model: o.model, judge: o.judge.name, iterations: T, samples: K, max_new_tokens: o.maxNewTokens, sampling: { temperature: o.temperature, top_k: o.topK, top_p: o.topP }, ...config, summary });
  return { finalDir, iterations: summary, seconds };
}
