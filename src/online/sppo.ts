/**
 * SPPO's iterations ("Self-Play Preference Optimization for Language Model Alignment", Wu et al. 2024):
 *
 *   for t = 1 … T:
 *     sample K responses per prompt from π_t                          (the live weights)
 *     P̂(y_k ≻ π_t) = mean over the other samples j of P(y_k ≻ y_j)   (the judge)
 *     log π_t(y_k | x)                                                 (the reference of this iteration)
 *     π_{t+1} = the `sppo` loss on those lists, num_epochs passes (or max_steps steps), from π_t
 *
 * It runs on the training loop (src/train/loop.ts) as an OnlineMethod: the items are the prompts, a round is one
 * training batch (batch_size × gradient_accumulation_steps lists, one optimizer update), and the first
 * round of iteration t samples and judges every prompt with the live weights, which are π_t then, and
 * scores the samples' log-probs with them through the training artifacts' eval graph: the reference
 * of iteration t is π_t. The loop's step plan is SPPO's (`plan`): each iteration takes S steps
 * (max_steps, else num_epochs passes over the prompts) with a learning-rate schedule of its own, as a
 * separate training run would; the optimizer's moments carry over from one iteration to the next.
 * Samples are token ids, so each step trains on exactly what was generated (no re-tokenization).
 *
 * Run folder (the loop's, plus the samples):
 *   config.json, artifacts/, checkpoints/step-N (every save_steps and at the end)
 *   iter-t/samples.jsonl   the lists iteration t trains on: prompt, responses, win_probs, ref_logps, stopped
 *   metrics.jsonl          one row per logging step, with the field `iteration`
 *   final/                 π_{T+1} in HF layout (adapter/ with LoRA and save_adapter)
 *   sppo.json              settings and a summary per iteration (written last)
 *
 * --resume continues bit-exact: a checkpoint holds, besides the loop's state, the iteration under way
 * (its samples, win-rates and reference log-probs), so a resumed run trains on the same lists; an
 * iteration not begun yet is sampled from the checkpoint's weights with the seed of its number.
 */
import { mkdirSync, readFileSync } from 'node:fs';
import { join } from 'node:path';
import { UserError } from '../errors.ts';
import { resolveConfig, type TrainConfig } from '../train/config.ts';
import type { Example, TokenizedExample } from '../../datasets/examples.ts';
import type { Text } from '../../datasets/schema.ts';
import { resolveLoss } from '../../losses/index.ts';
import { collate, sequenceIndex } from '../models/batch.ts';
import { lrAt } from '../optim/schedule.ts';
import { loraOf, runtimeOf, stepPlan } from '../train/run.ts';
import { declareCommand, ONLINE_LOOP_SETTINGS, ROLLOUT, type SettingsOf } from '../train/settings.ts';
import { fromAliases, samplerOptions, samplingSettings, type SamplingAliases } from './sampling.ts';

/** SPPO's own settings: K = num_generations samples per prompt (4 unless told), 64 tokens at most unless told. */
export const SPPO_SETTINGS = samplingSettings(['num_generations', 'max_completion_length', 'temperature', 'top_p', 'top_k'], { num_generations: 4, max_completion_length: 64 });
/**
 * SPPO runs on the online loop with the trainer's listwise graphs (share_prompt packing, recomputation,
 * float16 base weights); its reference is π_t by definition (no ref_on_the_fly, sync_ref_model) and it
 * trains on the sampled token ids (no max_length truncation), without held-out evaluation.
 */
declareCommand('sppo', { honours: [...ONLINE_LOOP_SETTINGS, ...ROLLOUT, 'share_prompt', 'gradient_checkpointing', 'base_dtype'], own: SPPO_SETTINGS, lossParams: 'sppo' });
import { problemOf, problemSpec } from '../train/problem.ts';
import { winRates, withJudge, type Judge } from './judges.ts';
import { sampleWith } from './policy.ts';
import { writeFileAtomic, writeJsonAtomic } from '../io/atomic.ts';
import { runOnline, type OnlineContext, type OnlineMethod, type OnlineOptions } from '../train/loop.ts';

/** `params`: settings of the loop (docs/settings.md, `sppo`) and the loss's `beta`, as `key=value`. */
export interface SppoOptions extends SamplingAliases, OnlineOptions {
  prompts: readonly Text[];
  /** The judge, or its spec (`task`, `reward:DIR`, `cmd:COMMAND`): then loaded on the run's device and released at the end. */
  judge: Judge | string;
  /** Settings by name, typed (as `--param` takes them, after `params`). */
  settings?: Readonly<Record<string, unknown>>;
  /** T (default 3). */
  iterations?: number;
  /** The prompts file, recorded in config.json (a --resume must name the same). */
  promptsFile?: string;
}

export interface SppoIteration {
  iteration: number;
  /** Mean over prompts of the spread max P̂ − min P̂ (0 when every sample ties). */
  win_rate_spread: number;
  /** Share of samples that ended with a stop token. */
  stopped: number;
  steps: number;
  /** The loss of the iteration's last logged step. */
  loss: number;
  /** Wall-clock seconds from the iteration's sampling to the next one's (in the process that finished it). */
  seconds: number;
}

export interface SppoResult {
  finalDir: string;
  iterations: SppoIteration[];
  seconds: number;
}

/** The iteration under way: every prompt's K samples (token ids), their win-rates and their log-probs under π_t. */
interface IterationData {
  t: number;
  promptIds: number[][];
  ids: number[][][];
  responses: string[][];
  winProbs: number[][];
  refLogps: number[][];
}

/** What a checkpoint holds of SPPO (state.json `online.method`). */
interface SppoState {
  iterations: number;
  samples: number;
  steps_per_iteration: number;
  current: IterationData | null;
  summary: SppoIteration[];
}

/** A round: the iteration it belongs to and its prompts (indices). */
interface SppoRound {
  t: number;
  idx: number[];
}

export async function runSppo(o: SppoOptions): Promise<SppoResult> {
  // The older names (--samples, --max-new-tokens, …) are the sampling settings under another name.
  const settings = { ...fromAliases(o), ...o.settings };
  const runtime = () => runtimeOf(resolveConfig({ configFile: o.configFile, params: o.params, settings, base: o.base, command: 'sppo' }).config);
  return withJudge(o.judge, runtime, (judge) => sppoWith({ ...o, settings, judge }));
}

async function sppoWith(o: SppoOptions & { judge: Judge }): Promise<SppoResult> {
  const t0 = Date.now();
  const T = o.iterations ?? 3;
  if (!(Number.isInteger(T) && T >= 1)) throw new UserError(`--iterations must be a positive integer, got ${o.iterations}`);
  if (o.prompts.length === 0) throw new UserError('sppo: no prompts');
  const { config, lossParams, own } = resolveConfig({ configFile: o.configFile, params: o.params, settings: o.settings, base: o.base, command: 'sppo' });
  const s = own as unknown as SettingsOf<typeof SPPO_SETTINGS>;
  const K = s.num_generations;
  const sampling = samplerOptions(s);
  const loss = resolveLoss('sppo', lossParams);
  // The model is the run's: its problem is worked out once, not every round.
  let solved: ReturnType<typeof problemOf> | undefined;
  const problem = (model: Parameters<typeof problemOf>[1]['model']) => (solved ??= problemOf(config, { model, kind: 'listwise', loss, lora: loraOf(config), dataKeys: new Set(['win_probs']) }));
  const B = config.batch_size;
  let S = 0;
  let current: IterationData | null = null;
  let summary: SppoIteration[] = [];
  let started = Date.now();
  const endIteration = () => {
    const last = summary[summary.length - 1];
    if (last) last.seconds = Math.round((Date.now() - started) / 100) / 10;
  };

  /** Samples and judges iteration t's lists with the live weights (π_t) and scores them under π_t. */
  const begin = async (ctx: OnlineContext, t: number): Promise<IterationData> => {
    endIteration();
    started = Date.now();
    const policy = await ctx.policy();
    // Each iteration's samples are fixed by (seed, t): a resumed run draws the same.
    const samples = await sampleWith(ctx.tok, policy, o.prompts, { ...sampling, n: K, seed: (config.seed * 1000 + t) >>> 0 });
    const of = (i: number) => samples.slice(i * K, (i + 1) * K);
    const responses = o.prompts.map((_, i) => of(i).map((s) => s.response));
    const P = await winRates(o.judge, o.prompts.map((prompt, i) => ({ prompt, responses: responses[i] })));
    const data: IterationData = { t, promptIds: o.prompts.map((_, i) => of(i)[0].promptIds), ids: o.prompts.map((_, i) => of(i).map((s) => s.ids)), responses, winProbs: P, refLogps: [] };
    // log π_t(y_k | x): the eval graph of the training artifacts on the weights of this step.
    const packed = !!problem(ctx.model).packed;
    for (let s = 0; s < o.prompts.length; s += B) {
      const idx = Array.from({ length: Math.min(B, o.prompts.length - s) }, (_, j) => s + j);
      const c = collate(rowsOf(data, idx), { kind: 'listwise', padTo: config.pad_to_multiple_of, padId: ctx.tok.padId ?? 0, dtype: 'float32', packed });
      const logp = (await ctx.art.evaluate(c.feeds)).logp.data as Float32Array;
      for (let j = 0; j < idx.length; j++) data.refLogps.push(Array.from({ length: K }, (_, k) => logp[sequenceIndex('listwise', idx.length, K, j, k)]));
    }
    const spread = P.reduce((a, p) => a + Math.max(...p) - Math.min(...p), 0) / P.length;
    const stopped = samples.filter((x) => x.stopped).length / samples.length;
    mkdirSync(join(ctx.run, `iter-${t}`), { recursive: true });
    writeFileAtomic(
      join(ctx.run, `iter-${t}`, 'samples.jsonl'),
      o.prompts.map((prompt, i) => JSON.stringify({ prompt, responses: responses[i], win_probs: P[i], ref_logps: data.refLogps[i], stopped: of(i).filter((x) => x.stopped).length }) + '\n').join(''),
    );
    summary = [...summary.filter((x) => x.iteration < t), { iteration: t, win_rate_spread: spread, stopped, steps: S, loss: NaN, seconds: 0 }];
    ctx.info(`sppo: iteration ${t}/${T}: ${samples.length} samples, win-rate spread ${spread.toFixed(3)}, stopped ${stopped.toFixed(3)}; ${S} steps`);
    return data;
  };

  const method: OnlineMethod<number, SppoRound> = {
    name: 'sppo',
    partialRounds: true,
    spec: (s) => problemSpec(problem(s.model), s.init, s.config),
    plan(c, stepsPerEpoch) {
      // An iteration's steps: max_steps, else num_epochs passes over the prompts (at least 1). Each
      // iteration is a training run of its own: its warmup and decay restart with it.
      const { total, schedule } = stepPlan(c, stepsPerEpoch);
      S = total;
      return { total: T * S, lr: (step) => lrAt(((step - 1) % S) + 1, schedule) };
    },
    async collect(ctx, idx, info) {
      const t = Math.floor((info.step - 1) / S) + 1;
      if (!current || current.t !== t) current = await begin(ctx, t);
      return { t, idx: [...idx] };
    },
    async microBatches(ctx, r) {
      const data = current!;
      const packed = !!problem(ctx.model).packed;
      const out = [];
      for (let s = 0; s < r.idx.length; s += B) {
        const idx = r.idx.slice(s, s + B);
        const c = collate(rowsOf(data, idx), { kind: 'listwise', padTo: config.pad_to_multiple_of, padId: ctx.tok.padId ?? 0, dtype: 'float32', packed, refLogps: (_, j) => data.refLogps[idx[j]] });
        out.push({ feeds: c.feeds, tokens: c.tokens });
      }
      return out;
    },
    metrics: (r) => ({ iteration: r.t }),
    progressFields: (row) => ({ loss: row.loss, iter: row.iteration }),
    state: (): SppoState => ({ iterations: T, samples: K, steps_per_iteration: S, current, summary }),
    restore(state) {
      const s = state as SppoState;
      if (s.iterations !== T || s.samples !== K || s.steps_per_iteration !== S) {
        throw new UserError(`--resume: ${o.out} was started with --iterations ${s.iterations} --samples ${s.samples} and ${s.steps_per_iteration} steps per iteration; resume it with those, or start a new run (another -o, or --overwrite)`);
      }
      current = s.current;
      summary = s.summary.map((x) => ({ ...x, loss: x.loss ?? NaN }));
    },
  };
  const r = await runOnline(o, o.prompts.map((_, i) => i), method, {
    config,
    record: { prompts: o.promptsFile ?? null, judge: o.judge.name, loss: 'sppo', loss_params: loss.terms[0].params, iterations: T, samples: K, max_new_tokens: sampling.maxNewTokens, sampling: { temperature: sampling.temperature, top_k: sampling.topK, top_p: sampling.topP } },
    inputs: [...(o.promptsFile ? [{ key: 'prompts', now: o.promptsFile, flag: '--prompts' }] : []), { key: 'judge', now: o.judge.name, flag: '--judge' }],
  });
  endIteration();
  // Each iteration's loss: its last logged training row.
  const rows = readFileSync(join(o.out, 'metrics.jsonl'), 'utf8').trim().split('\n').map((l) => JSON.parse(l) as Record<string, unknown>);
  for (const it of summary) {
    const mine = rows.filter((x) => x.split === undefined && x.iteration === it.iteration);
    if (mine.length) it.loss = mine[mine.length - 1].loss as number;
  }
  const seconds = Math.round((Date.now() - t0) / 100) / 10;
  writeJsonAtomic(join(o.out, 'sppo.json'), { model: o.model, judge: o.judge.name, iterations: T, samples: K, max_new_tokens: sampling.maxNewTokens, sampling: { temperature: sampling.temperature, top_k: sampling.topK, top_p: sampling.topP }, ...config, steps: r.steps, summary });
  o.reporter?.info(`sppo: ${T} iterations, ${r.steps} steps in ${seconds}s; final policy in ${r.finalDir}`);
  return { finalDir: r.finalDir, iterations: summary, seconds };
}

/** The listwise rows of prompts `idx` of an iteration: the sampled ids, P̂ as the win-rates (and scores). */
function rowsOf(d: IterationData, idx: readonly number[]): TokenizedExample[] {
  return idx.map((i) => {
    const src: Example = { prompt: '', responses: d.responses[i], scores: d.winProbs[i], winProbs: d.winProbs[i] };
    return { promptIds: d.promptIds[i], responseIds: d.ids[i], src };
  });
}
