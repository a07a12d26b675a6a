/**
 * SPPO's iterations ("Self-Play Preference Optimization for Language Model Alignment", 2024):
 *
 *   for t = 0 … T−1:
 *     sample K responses per prompt from π_t
 *     P̂(y_k ≻ π_t) = mean over the other samples j of P(y_k ≻ y_j)   (the judge)
 *     π_{t+1} = train the `sppo` loss on those lists, with π_t as the reference (and the start)
 *
 * Each iteration is an ordinary run of the offline trainer (train/trainer.ts, whose stages the online
 * loop shares) on listwise rows (responses, win_probs = scores = P̂), so its folder holds the usual
 * metrics, checkpoints (every save_steps) and final model. Run folder:
 *
 *   iter-1/samples.jsonl   the sampled lists and their win-rates (what iteration 1 trained on)
 *   iter-1/train/          the training run; iter-1/train/final is π_1
 *   iter-1/iteration.json  the iteration's summary, written when it is complete
 *   …
 *   final/                 π_T (a copy)
 *   metrics.jsonl          every iteration's training rows (field `iteration`, steps numbered on)
 *   sppo.json              settings and a summary per iteration (written last)
 *
 * --resume continues an unfinished run bit-exact: complete iterations are kept, the samples of the
 * interrupted one are read back from its samples.jsonl (sampling and judging are not repeated) and
 * its training run resumes from its newest checkpoint.
 */
import { cpSync, existsSync, mkdirSync, readdirSync, readFileSync, rmSync } from 'node:fs';
import { join } from 'node:path';
import { makeMeta } from '../../datasets/schema.ts';
import { UserError } from '../errors.ts';
import { resolveConfig, type TrainConfig } from '../train/config.ts';
import type { Example, LoadedData } from '../../datasets/examples.ts';
import type { Text } from '../../datasets/schema.ts';
import { train } from '../train/trainer.ts';
import { joinRunMetrics } from '../train/report.ts';
import { winRates, type Judge } from './judges.ts';
import { Policy } from './policy.ts';
import { runtimeOf, type LoopOptions } from '../train/run.ts';
import { sweepStaleTemps, writeFileAtomic, writeJsonAtomic } from '../io/atomic.ts';
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
  /** Continue the unfinished run in `out` (complete iterations kept, the interrupted one resumed from its checkpoint). */
  resume?: boolean;
  /** Replace the run already in `out`. */
  overwrite?: boolean;
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
  prepareSppoFolder(o.out, o);
  const text = o.prompts.some((p) => typeof p !== 'string') ? 'messages' : 'plain';
  const summary: SppoIteration[] = [];
  let current = o.model;
  for (let t = 1; t <= T; t++) {
    const ti = Date.now();
    const dir = join(o.out, `iter-${t}`);
    const done = join(dir, 'iteration.json');
    if (o.resume && existsSync(done)) {
      // A complete iteration of the interrupted run: its model is π_t.
      const it = JSON.parse(readFileSync(done, 'utf8')) as SppoIteration;
      summary.push(it);
      current = it.model;
      continue;
    }
    mkdirSync(dir, { recursive: true });
    const samplesFile = join(dir, 'samples.jsonl');
    let groups: { prompt: Text; responses: Text[] }[];
    let P: number[][];
    let stopped: number;
    if (o.resume && existsSync(samplesFile)) {
      // The interrupted iteration's samples and win-rates, exactly as it trained on them.
      const lists = readFileSync(samplesFile, 'utf8').trim().split('\n').map((l) => JSON.parse(l) as { prompt: Text; responses: Text[]; win_probs: number[]; stopped: number });
      groups = lists.map((l) => ({ prompt: l.prompt, responses: l.responses }));
      P = lists.map((l) => l.win_probs);
      stopped = lists.reduce((a, l) => a + l.stopped, 0) / (lists.length * K);
    } else {
      const policy = await Policy.load(current, runtimeOf(config));
      const samples = await policy.sample(o.prompts, { ...o, n: K, seed: config.seed * 1000 + t });
      await policy.release();
      groups = o.prompts.map((prompt, i) => ({ prompt, responses: samples.slice(i * K, (i + 1) * K).map((s) => s.response) }));
      P = await winRates(o.judge, groups);
      const stops = o.prompts.map((_, i) => samples.slice(i * K, (i + 1) * K).filter((s) => s.stopped).length);
      stopped = samples.filter((s) => s.stopped).length / samples.length;
      writeFileAtomic(samplesFile, groups.map((g, i) => JSON.stringify({ prompt: g.prompt, responses: g.responses, win_probs: P[i], stopped: stops[i] }) + '\n').join(''));
    }
    const examples: Example[] = groups.map((g, i) => ({ prompt: g.prompt, responses: g.responses, scores: P[i], winProbs: P[i] }));
    const rows: LoadedData = { kind: 'listwise', meta: makeMeta('listwise', text, 'sppo'), examples, files: [] };
    const trainDir = join(dir, 'train');
    const r = await train({
      model: current,
      data: samplesFile,
      rows,
      loss: 'sppo',
      out: trainDir,
      params: o.params,
      configFile: o.configFile,
      base: { ...o.base, seed: config.seed + t },
      progress: o.progress,
      quiet: o.quiet,
      log,
      // Resumed: the interrupted iteration's run continues from its checkpoint. Otherwise each
      // iteration's samples are new: an earlier run's folder here holds nothing to keep.
      ...(o.resume && existsSync(trainDir) ? { resume: true } : { overwrite: true }),
    });
    const spread = P.reduce((a, p) => a + Math.max(...p) - Math.min(...p), 0) / P.length;
    const it: SppoIteration = {
      iteration: t,
      win_rate_spread: spread,
      stopped,
      steps: r.steps,
      loss: r.last.loss,
      seconds: Math.round((Date.now() - ti) / 100) / 10,
      model: r.finalDir,
    };
    writeJsonAtomic(done, it);
    summary.push(it);
    log(`sppo: iteration ${t}/${T}: ${groups.length * K} samples, win-rate spread ${spread.toFixed(3)}, ${r.steps} steps, loss ${r.last.loss?.toPrecision(4)} (${it.seconds}s)`);
    current = r.finalDir;
  }
  const finalDir = join(o.out, 'final');
  rmSync(finalDir, { recursive: true, force: true });
  cpSync(current, finalDir, { recursive: true });
  // Every iteration's rows in RUN/metrics.jsonl (field `iteration`, steps numbered on) for `prefzoo report RUN`.
  joinRunMetrics(o.out, summary.map((it) => ({ dir: join(o.out, `iter-${it.iteration}`, 'train'), tag: { iteration: it.iteration } })));
  const seconds = Math.round((Date.now() - t0) / 100) / 10;
  writeJsonAtomic(join(o.out, 'sppo.json'), { model: o.model, judge: o.judge.name, iterations: T, samples: K, max_new_tokens: o.maxNewTokens, sampling: { temperature: o.temperature, top_k: o.topK, top_p: o.topP }, ...config, summary });
  return { finalDir, iterations: summary, seconds };
}

/**
 * An SPPO run folder: a finished run (sppo.json) is refused, an unfinished one (iter-t folders)
 * continued with `resume`; `overwrite` replaces either (only an SPPO run's own entries are removed).
 */
function prepareSppoFolder(out: string, o: { resume?: boolean; overwrite?: boolean }): void {
  if (!existsSync(out)) {
    mkdirSync(out, { recursive: true });
    return;
  }
  sweepStaleTemps(out, true);
  const entries = readdirSync(out);
  if (entries.length === 0) return;
  const own = /^(iter-\d+|final|metrics\.jsonl|sppo\.json|demo_eval\.json|report\.html)$/;
  if (o.overwrite) {
    const foreign = entries.filter((e) => !own.test(e));
    if (foreign.length) throw new UserError(`${out}: --overwrite removes only an SPPO run's own files, and this folder also holds ${foreign.slice(0, 4).join(', ')}; choose another -o`);
    for (const e of entries) rmSync(join(out, e), { recursive: true, force: true });
    return;
  }
  if (existsSync(join(out, 'sppo.json'))) throw new UserError(`${out} already holds an SPPO run; choose another -o (or replace it with --overwrite)`);
  if (!o.resume) throw new UserError(`${out}: holds an unfinished SPPO run (${entries.slice(0, 4).join(', ')}); continue it with --resume, replace it with --overwrite, or choose another -o`);
}
