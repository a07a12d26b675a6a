/**
 * GRPO and its family (DAPO, Dr. GRPO, GSPO, CISPO, RLOO) on the online loop (loop.ts), with TRL's
 * GRPOConfig names: every round
 *
 *   prompts       batch_size × gradient_accumulation_steps / num_generations of them (a seeded shuffle)
 *   sample        num_generations completions each from the live weights (temperature, top_p, top_k,
 *                 at most max_completion_length tokens; token ids kept, never re-tokenized)
 *   score         every reward function (rewards.ts) on every completion: r = Σ_k w_k·r_k over the
 *                 functions that apply (reward_weights; null answers skipped, none → unscorable)
 *   advantages    group: r − mean of its group; rloo: r − mean of the others in its group (leave one
 *                 out); then ÷ (std + 1e-4) of the group or the batch (scale_rewards), or not (none);
 *                 unscorable completions get 0
 *   old log-probs per token, when num_iterations > 1 (the policy that sampled; else the live one, detached)
 *   ref log-probs per token, when beta > 0 (the starting weights, adapters off)
 *   num_iterations updates on the round, each over its micro-batches of batch_size completions,
 *   of the zoo's `grpo` loss (losses/grpo.ts: loss_type, importance_sampling_level, epsilon,
 *   epsilon_high, delta, beta, top_entropy_quantile)
 *
 * Log-probs, entropies and the sampler all use the logits divided by `temperature`, as TRL does, so
 * the importance ratio compares the distributions completions were drawn from.
 *
 * Metrics (TRL's names): reward, reward_std, rewards/<name>/mean and /std, frac_reward_zero_std,
 * completions/mean_length, min_length, max_length, clipped_ratio, mean_terminated_length, and from
 * the graph loss, kl (beta > 0), entropy, clip_ratio/low_mean, high_mean, region_mean (cispo:
 * cispo_clip_ratio). Every logging_steps the round's first prompt's completions, with their
 * rewards and advantages, go to RUN/completions.jsonl. With eval_data (a prompts file), the live
 * weights are evaluated every eval_steps and at the end: mean rewards of num_generations samples
 * per held-out prompt (eval.json).
 */
import { appendFileSync, existsSync, readFileSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import type { ArtifactSpec } from '../artifacts/build.ts';
import { UserError } from '../errors.ts';
import { Graph, type Tensor } from '../onnx/graph.ts';
import { buildCausalLM, type CausalLM, type LoraConfig } from '../models/index.ts';
import type { ModelConfig } from '../models/config.ts';
import type { FloatTensor } from '../models/checkpoint.ts';
import { sequenceLogps } from '../models/logps.ts';
import { declareParameters, modelParameterShapes } from '../models/params.ts';
import { collate } from '../models/batch.ts';
import type { Decoder } from '../models/generate.ts';
import { samplingOptions } from '../models/sampling.ts';
import { Session, toOrt, type Feeds, type RuntimeOptions } from '../runtime/session.ts';
import type { LoadedTokenizer } from '../tokenize/index.ts';
import { resolveConfig, type TrainConfig } from '../train/config.ts';
import { GRPO_HONOURS, GRPO_SETTINGS, type SettingsOf } from '../train/settings.ts';
import { headChunksOf, modelSegment } from '../train/graph.ts';
import { modelParamSpecs, optimizerOf, type MicroBatch } from '../train/run.ts';
import { resolveLoss, type BoundLoss } from '../../losses/index.ts';
import type { GrpoParams } from '../../losses/grpo.ts';
import type { TokenizedExample } from '../../datasets/examples.ts';
import { sampleWith, type Sample } from './policy.ts';
import { readPromptRows, type PromptRow } from './prompts.ts';
import { loadAllRewards, releaseRewards, scoreAll, type RewardFunction, type RewardRow } from './rewards.ts';
import { runOnline, type OnlineContext, type OnlineMethod, type OnlineOptions } from './loop.ts';

// ---- settings ----------------------------------------------------------------------------------

export { GRPO_SETTINGS, GRPO_HONOURS };
export type GrpoSettings = SettingsOf<typeof GRPO_SETTINGS>;

/** The `grpo` loss bound to the loss parameters given (max_completion_length is GRPO's setting, passed on). */
export function grpoLoss(lossParams: Record<string, unknown>, s: GrpoSettings): BoundLoss {
  return resolveLoss('grpo', { ...lossParams, max_completion_length: s.max_completion_length });
}

/** Weights of the reward functions: reward_weights, or 1 each. */
export function rewardWeights(s: GrpoSettings, names: readonly string[]): number[] {
  if (s.reward_weights.trim() === '') return names.map(() => 1);
  const w = s.reward_weights.split(',').map((x) => Number(x.trim()));
  if (w.some((x) => !Number.isFinite(x))) throw new UserError(`grpo: reward_weights must be comma-separated numbers, got "${s.reward_weights}"`);
  if (w.length !== names.length) throw new UserError(`grpo: reward_weights has ${w.length} weights for ${names.length} reward functions (${names.join(', ')})`);
  return w;
}

// ---- rewards → advantages ---------------------------------------------------------------------

const nanMean = (xs: ArrayLike<number>) => {
  let s = 0;
  let n = 0;
  for (let i = 0; i < xs.length; i++) if (!Number.isNaN(xs[i])) (s += xs[i]), n++;
  return n ? s / n : NaN;
};

/** The sample standard deviation (Bessel-corrected, as TRL's nanstd) of the non-NaN values. */
export function nanStd(xs: ArrayLike<number>): number {
  const m = nanMean(xs);
  let s = 0;
  let n = 0;
  for (let i = 0; i < xs.length; i++) if (!Number.isNaN(xs[i])) (s += (xs[i] - m) ** 2), n++;
  return n > 1 ? Math.sqrt(s / (n - 1)) : n === 1 ? 0 : NaN;
}

/** Σ_k w_k·r_k over the functions that gave a number (NaN when none did: unscorable). */
export function combineRewards(perFunction: readonly ArrayLike<number>[], weights: readonly number[]): Float64Array {
  const n = perFunction[0].length;
  return Float64Array.from({ length: n }, (_, i) => {
    let s = 0;
    let any = false;
    perFunction.forEach((r, k) => {
      if (!Number.isNaN(r[i])) (s += weights[k] * r[i]), (any = true);
    });
    return any ? s : NaN;
  });
}

export interface Advantages {
  advantages: Float64Array;
  /** Per completion: whether the std its advantage is scaled by is (close to) zero. */
  zeroStd: boolean[];
}

/**
 * Advantages of groups of G consecutive completions (TRL's sum_then_normalize): the baseline is the
 * group mean (or, rloo, the mean of the others), scaled by the group or batch std + 1e-4 unless
 * `none`; NaN rewards (unscorable) are left out of means and stds and get advantage 0.
 */
export function computeAdvantages(rewards: ArrayLike<number>, G: number, scale: GrpoSettings['scale_rewards'], baseline: GrpoSettings['advantage']): Advantages {
  const n = rewards.length;
  if (n % G !== 0) throw new Error(`computeAdvantages: ${n} rewards are not groups of ${G}`);
  const adv = new Float64Array(n);
  const std = new Float64Array(n);
  const batchStd = nanStd(rewards);
  for (let g0 = 0; g0 < n; g0 += G) {
    const grp = Array.from({ length: G }, (_, k) => rewards[g0 + k]);
    const mean = nanMean(grp);
    const sd = scale === 'batch' ? batchStd : nanStd(grp);
    const scorable = grp.filter((r) => !Number.isNaN(r));
    const total = scorable.reduce((a, b) => a + b, 0);
    for (let k = 0; k < G; k++) {
      const r = grp[k];
      let a: number;
      if (Number.isNaN(r)) a = NaN;
      else if (baseline === 'rloo') a = scorable.length > 1 ? r - (total - r) / (scorable.length - 1) : 0;
      else a = r - mean;
      if (scale !== 'none') a = a / (sd + 1e-4);
      adv[g0 + k] = Number.isNaN(a) ? 0 : a;
      std[g0 + k] = sd;
    }
  }
  const zeroStd = Array.from(std, (s) => Math.abs(s) <= 1e-8 || Number.isNaN(s));
  return { advantages: adv, zeroStd };
}

// ---- the training graph -----------------------------------------------------------------------

/** The model's hidden rows scaled by 1/temperature: the head then gives logits / temperature. */
function tempered(g: Graph, model: CausalLM, temperature: number): CausalLM {
  return temperature === 1 ? model : { ...model, hidden: g.mul(model.hidden, 1 / temperature) };
}

interface SpecOptions {
  config: ModelConfig;
  init: Map<string, FloatTensor>;
  lora: LoraConfig | null;
  train: TrainConfig;
  loss: BoundLoss;
  settings: GrpoSettings;
}

/** Whether the batch carries each optional column. */
function columnsOf(p: GrpoParams, s: GrpoSettings) {
  return { old: s.num_iterations > 1, ref: p.beta > 0, items: p.loss_type === 'dapo' || p.loss_type === 'cispo', entropies: p.top_entropy_quantile < 1 };
}

/**
 * Training graph: completions [B, T] → per-token log-probs (tempered) → the bound `grpo` loss. The eval
 * graph outputs the per-token log-probs (the old ones of num_iterations > 1).
 */
function grpoSpec(o: SpecOptions): ArtifactSpec {
  const p = o.loss.terms[0].params as GrpoParams;
  const cols = columnsOf(p, o.settings);
  const F = 'float32' as const;
  const recompute = o.train.gradient_checkpointing;
  return {
    params: modelParamSpecs(o.config, o.init, o.lora, false),
    batchInputs: [
      { name: 'input_ids', dtype: 'int64', shape: ['rows', 'len'] },
      { name: 'attention_mask', dtype: 'int64', shape: ['rows', 'len'] },
      { name: 'loss_mask', dtype: F, shape: ['rows', 'len'] },
      { name: 'advantages', dtype: F, shape: ['rows'] },
      ...(cols.old ? [{ name: 'old_token_logps', dtype: F, shape: ['rows', 'len'] }] : []),
      ...(cols.ref ? [{ name: 'ref_token_logps', dtype: F, shape: ['rows', 'len'] }] : []),
      ...(cols.items ? [{ name: 'num_items_in_batch', dtype: F, shape: [] }] : []),
    ] as ArtifactSpec['batchInputs'],
    optimizer: optimizerOf(o.train),
    loss: { name: 'grpo', params: p },
    modelConfig: o.config,
    recompute: recompute ? modelSegment : undefined,
    buildForward(g, params, batch, mode) {
      const base = buildCausalLM(g, o.config, new Map(Object.entries(params)), { inputIds: batch.input_ids, attentionMask: batch.attention_mask }, { lora: o.lora, attentionPieces: recompute ? 4 : undefined });
      const model = tempered(g, base, o.settings.temperature);
      const seq = sequenceLogps(g, model, batch.loss_mask, { perToken: true, stats: mode === 'train', dense: o.train.device === 'webgpu', headChunks: recompute ? headChunksOf(o.config) : 1 });
      const lp = seq.tokenLogps!;
      if (mode === 'eval') return { outputs: { token_logps: lp } };
      const ins: Record<string, Tensor> = {
        policy_token_logps: lp,
        old_token_logps: cols.old ? batch.old_token_logps : g.stopGradient(lp),
        advantages: batch.advantages,
        completion_mask: batch.loss_mask,
      };
      if (cols.ref) ins.ref_token_logps = batch.ref_token_logps;
      if (cols.items) ins.num_items_in_batch = batch.num_items_in_batch;
      if (cols.entropies) ins.token_entropies = seq.tokenEntropies!;
      const r = g.scope('loss', () => o.loss.emit(g, ins, 'grpo'));
      const metrics = { ...r.metrics };
      if (!metrics.entropy && seq.entropySum) {
        const tokens = g.reduceSum(g.stopGradient(seq.tokens), undefined, false);
        metrics.entropy = g.div(g.reduceSum(seq.entropySum, undefined, false), g.max(tokens, g.constant(1, F)));
      }
      return { loss: r.loss, metrics };
    },
  };
}

/** Per-token log-probs of fixed weights (the reference), tempered like the training graph's. */
class TokenScorer {
  private constructor(
    private readonly session: Session,
    private readonly params: Feeds,
  ) {}

  static async create(config: ModelConfig, weights: Map<string, FloatTensor>, runtime: RuntimeOptions, temperature: number): Promise<TokenScorer> {
    const g = new Graph('prefzoo_ref_token_logps');
    const inputIds = g.input('input_ids', 'int64', ['batch', 'seq']);
    const attentionMask = g.input('attention_mask', 'int64', ['batch', 'seq']);
    const lossMask = g.input('loss_mask', 'float32', ['batch', 'seq']);
    const model = buildCausalLM(g, config, declareParameters(g, config), { inputIds, attentionMask });
    g.output(sequenceLogps(g, tempered(g, model, temperature), lossMask, { perToken: true, dense: runtime.ep === 'webgpu' }).tokenLogps!, 'token_logps');
    const params: Feeds = {};
    for (const [name, shape] of modelParameterShapes(config)) params[name] = toOrt('float32', weights.get(name)!.data, shape);
    return new TokenScorer(await Session.fromGraph(g, runtime), params);
  }

  async run(feeds: Feeds): Promise<Float32Array> {
    const out = await this.session.run({ ...this.params, input_ids: feeds.input_ids, attention_mask: feeds.attention_mask, loss_mask: feeds.loss_mask });
    return out.token_logps.data as Float32Array;
  }

  async release(): Promise<void> {
    await this.session.release();
  }
}

// ---- rounds -----------------------------------------------------------------------------------

/** One sampled, scored round (JSON-serialisable: a checkpoint inside it stores it). */
interface GrpoRound {
  promptIds: number[][];
  ids: number[][];
  /** Per completion: 1 when it counts in the loss (0: truncated under mask_truncated_completions). */
  counted: number[];
  advantages: number[];
  /** Per completion, its tokens' old / reference log-probs (only when used). */
  old: number[][] | null;
  ref: number[][] | null;
  metrics: Record<string, number>;
}

/** Collates completions (each: prompt ids + completion ids) as the training graph reads them. */
function collateCompletions(tok: LoadedTokenizer, promptIds: number[][], ids: number[][], idx: readonly number[], padTo: number) {
  const rows: TokenizedExample[] = idx.map((i) => ({ promptIds: promptIds[i], responseIds: [ids[i]], src: { prompt: '', responses: [''] } }));
  return collate(rows, { kind: 'single', padTo, padId: tok.padId ?? tok.eosId ?? 0, dtype: 'float32' });
}

/** Per-token values [B, T] → each completion's values at its completion tokens (loss_mask = 1), in order. */
function gatherTokens(values: Float32Array, mask: Float32Array, B: number, T: number): number[][] {
  return Array.from({ length: B }, (_, b) => {
    const out: number[] = [];
    for (let t = 0; t < T; t++) if (mask[b * T + t] > 0) out.push(values[b * T + t]);
    return out;
  });
}

/** The inverse: each completion's token values placed at its loss_mask positions of [B, T]. */
function scatterTokens(perCompletion: number[][], mask: Float32Array, B: number, T: number): Float32Array {
  const out = new Float32Array(B * T);
  for (let b = 0; b < B; b++) {
    let k = 0;
    for (let t = 0; t < T; t++) if (mask[b * T + t] > 0) out[b * T + t] = perCompletion[b][k++];
  }
  return out;
}

const mean = (xs: readonly number[]) => (xs.length ? xs.reduce((a, b) => a + b, 0) / xs.length : 0);

/** Reward metrics of a set of completions in TRL's names. */
function rewardMetrics(names: readonly string[], perFunction: readonly Float64Array[], rewards: Float64Array): Record<string, number> {
  const m: Record<string, number> = {};
  const put = (k: string, v: number) => {
    if (Number.isFinite(v)) m[k] = v;
  };
  put('reward', nanMean(rewards));
  put('reward_std', nanStd(rewards));
  names.forEach((n, k) => {
    put(`rewards/${n}/mean`, nanMean(perFunction[k]));
    put(`rewards/${n}/std`, nanStd(perFunction[k]));
  });
  return m;
}

function lengthMetrics(samples: readonly Sample[]): Record<string, number> {
  const len = samples.map((s) => s.ids.length);
  const term = samples.filter((s) => s.stopped).map((s) => s.ids.length);
  return {
    'completions/mean_length': mean(len),
    'completions/min_length': Math.min(...len),
    'completions/max_length': Math.max(...len),
    'completions/clipped_ratio': samples.filter((s) => !s.stopped).length / samples.length,
    'completions/mean_terminated_length': mean(term),
  };
}

// ---- evaluation -------------------------------------------------------------------------------

export interface RewardEval {
  /** reward, reward_std, rewards/<name>/mean and /std, completions/…, over n samples per prompt. */
  metrics: Record<string, number>;
  /** Per reward function, the mean over all samples (NaN-free: null answers left out). */
  perFunction: Record<string, number>;
}

/** Samples n completions per prompt row from `decoder` and scores them with the reward functions. */
export async function evaluateRewards(
  tok: LoadedTokenizer, decoder: Decoder, rows: readonly PromptRow[], fns: readonly RewardFunction[], weights: readonly number[],
  o: { n: number; seed: number; maxCompletionLength: number; temperature: number; topK: number; topP: number; timeout: number },
): Promise<RewardEval> {
  const samples = await sampleWith(tok, decoder, rows.map((r) => r.prompt), { n: o.n, seed: o.seed, maxNewTokens: o.maxCompletionLength, temperature: o.temperature, topK: o.topK, topP: o.topP });
  const perFunction = await scoreAll(fns, {
    completions: samples.map((s) => s.response),
    rows: samples.map((s) => rows[s.promptIndex].row as RewardRow),
    lengths: samples.map((s) => s.ids.length),
    maxCompletionLength: o.maxCompletionLength,
  }, (i) => rows[samples[i].promptIndex].at, o.timeout);
  const rewards = combineRewards(perFunction, weights);
  return { metrics: { ...rewardMetrics(fns.map((f) => f.name), perFunction, rewards), ...lengthMetrics(samples) }, perFunction: Object.fromEntries(fns.map((f, k) => [f.name, nanMean(perFunction[k])])) };
}

// ---- the run ----------------------------------------------------------------------------------

export interface GrpoOptions extends OnlineOptions {
  /** The prompts file (any format `convert` reads; a `prompt`, `question` or `problem` column, other columns reach the rewards). */
  prompts: string;
  /** `--reward` specs (rewards.ts), in order; reward_weights follows it. */
  rewards: readonly string[];
}

export interface GrpoResult {
  finalDir: string;
  steps: number;
  seconds: number;
  last: Record<string, number>;
  eval?: Record<string, number>;
}

export async function grpo(o: GrpoOptions): Promise<GrpoResult> {
  const { config, lossParams, own } = resolveConfig({ configFile: o.configFile, params: o.params, base: o.base, command: 'grpo' });
  const s = own as unknown as GrpoSettings;
  const loss = grpoLoss(lossParams, s);
  const p = loss.terms[0].params as GrpoParams;
  const G = s.num_generations;
  const perRound = config.batch_size * config.gradient_accumulation_steps;
  if (perRound % G !== 0) {
    throw new UserError(`grpo: batch_size × gradient_accumulation_steps (${config.batch_size} × ${config.gradient_accumulation_steps} = ${perRound} completions) must be a multiple of num_generations (${G})`);
  }
  const sampling = samplingOptions({ temperature: s.temperature, topK: s.top_k, topP: s.top_p });
  const rows = await readPromptRows(o.prompts);
  const evalRows = config.eval_data ? (await readPromptRows(config.eval_data)).slice(0, config.eval_samples > 0 ? config.eval_samples : undefined) : [];
  const cols = columnsOf(p, s);
  const fns = await loadAllRewards(o.rewards);
  const names = fns.map((f) => f.name);
  let weights: number[];
  try {
    weights = rewardWeights(s, names);
  } catch (e) {
    await releaseRewards(fns);
    throw e;
  }
  let ref: TokenScorer | null = null;
  const samplesFile = join(o.out, 'completions.jsonl');
  const B = config.batch_size;
  const method: OnlineMethod<PromptRow, GrpoRound> = {
    name: 'grpo',
    honours: GRPO_HONOURS,
    spec: (x) => grpoSpec({ config: x.model, init: x.init, lora: x.lora, train: x.config, loss, settings: s }),
    roundSize: () => perRound / G,
    updatesPerRound: () => s.num_iterations,
    async open(ctx) {
      if (cols.ref) ref = await TokenScorer.create(ctx.model, ctx.baseWeights, ctx.runtime, s.temperature);
      // A resumed run writes the samples of the steps after its checkpoint again.
      if (existsSync(samplesFile)) {
        const keep = readFileSync(samplesFile, 'utf8').split('\n').filter((l) => l.trim() && (JSON.parse(l) as { step: number }).step <= ctx.art.step);
        writeFileSync(samplesFile, keep.map((l) => l + '\n').join(''));
      }
    },
    async collect(ctx, items, info) {
      const policy = await ctx.policy();
      const seed = ctx.rng.int(2 ** 31);
      const samples = await sampleWith(ctx.tok, policy, items.map((r) => r.prompt), { n: G, seed, maxNewTokens: s.max_completion_length, ...sampling });
      const place = (i: number) => items[Math.floor(i / G)].at;
      const perFunction = await scoreAll(fns, {
        completions: samples.map((x) => x.response),
        rows: samples.map((x) => items[x.promptIndex].row as RewardRow),
        lengths: samples.map((x) => x.ids.length),
        maxCompletionLength: s.max_completion_length,
      }, place, s.reward_timeout);
      const rewards = combineRewards(perFunction, weights);
      const { advantages, zeroStd } = computeAdvantages(rewards, G, s.scale_rewards, s.advantage);
      const round: GrpoRound = {
        promptIds: samples.map((x) => x.promptIds),
        ids: samples.map((x) => x.ids),
        counted: samples.map((x) => (s.mask_truncated_completions && !x.stopped ? 0 : 1)),
        advantages: Array.from(advantages),
        old: null,
        ref: null,
        metrics: {
          ...rewardMetrics(names, perFunction, rewards),
          frac_reward_zero_std: zeroStd.filter(Boolean).length / zeroStd.length,
          ...lengthMetrics(samples),
        },
      };
      if (cols.old || cols.ref) {
        const old: number[][] = [];
        const refs: number[][] = [];
        for (let at = 0; at < samples.length; at += B) {
          const idx = Array.from({ length: Math.min(B, samples.length - at) }, (_, k) => at + k);
          const c = collateCompletions(ctx.tok, round.promptIds, round.ids, idx, config.pad_to_multiple_of);
          const [n, T] = c.feeds.input_ids.dims as number[];
          const mask = c.feeds.loss_mask.data as Float32Array;
          if (cols.old) old.push(...gatherTokens((await ctx.art.evaluate(c.feeds)).token_logps.data as Float32Array, mask, n, T));
          if (cols.ref) refs.push(...gatherTokens(await ref!.run(c.feeds), mask, n, T));
        }
        round.old = cols.old ? old : null;
        round.ref = cols.ref ? refs : null;
      }
      logSamples(info.step, items, samples, perFunction, rewards, advantages);
      return round;
    },
    async microBatches(ctx, r) {
      const n = r.ids.length;
      // DAPO/CISPO normalise by the completion tokens of the whole round; the loop averages the micro-batches.
      const micro = Math.ceil(n / B);
      const items = r.ids.reduce((a, ids, i) => a + ids.length * r.counted[i], 0) / micro;
      const out: MicroBatch[] = [];
      for (let at = 0; at < n; at += B) {
        const idx = Array.from({ length: Math.min(B, n - at) }, (_, k) => at + k);
        const c = collateCompletions(ctx.tok, r.promptIds, r.ids, idx, config.pad_to_multiple_of);
        const [rowsN, T] = c.feeds.input_ids.dims as number[];
        const mask = c.feeds.loss_mask.data as Float32Array;
        const feeds: Feeds = {
          input_ids: c.feeds.input_ids,
          attention_mask: c.feeds.attention_mask,
          advantages: toOrt('float32', Float32Array.from(idx, (i) => r.advantages[i]), [rowsN]),
        };
        if (r.old) feeds.old_token_logps = toOrt('float32', scatterTokens(idx.map((i) => r.old![i]), mask, rowsN, T), [rowsN, T]);
        if (r.ref) feeds.ref_token_logps = toOrt('float32', scatterTokens(idx.map((i) => r.ref![i]), mask, rowsN, T), [rowsN, T]);
        if (cols.items) feeds.num_items_in_batch = toOrt('float32', Float32Array.of(Math.max(items, 1)), []);
        // Truncated completions under mask_truncated_completions: their tokens leave the loss (after the
        // old and reference log-probs were placed by the full mask).
        const lossMask = Float32Array.from(mask);
        idx.forEach((i, b) => {
          if (!r.counted[i]) lossMask.fill(0, b * T, (b + 1) * T);
        });
        feeds.loss_mask = toOrt('float32', lossMask, [rowsN, T]);
        out.push({ feeds, tokens: c.tokens });
      }
      return out;
    },
    metrics: (r) => r.metrics,
    progressFields: (row) => ({ loss: row.loss, reward: row.reward }),
    evaluate: evalRows.length
      ? async (ctx: OnlineContext) =>
        (await evaluateRewards(ctx.tok, await ctx.policy(), evalRows, fns, weights, {
          n: G, seed: config.seed * 31 + 7, maxCompletionLength: s.max_completion_length, ...sampling, timeout: s.reward_timeout,
        })).metrics
      : undefined,
    async close() {
      await ref?.release();
    },
  };

  /** The round's first prompt's completions with their rewards, when a step of the round is logged. */
  function logSamples(step: number, items: readonly PromptRow[], samples: readonly Sample[], perFunction: readonly Float64Array[], rewards: Float64Array, advantages: Float64Array): void {
    if (s.log_completions === 0) return;
    const logged = Array.from({ length: s.num_iterations }, (_, u) => step + u).some((t) => t % config.logging_steps === 0);
    if (!logged) return;
    const show = Math.min(s.log_completions, G);
    const lines = Array.from({ length: show }, (_, k) => {
      const reward = (x: number) => (Number.isNaN(x) ? null : x);
      return JSON.stringify({
        step,
        prompt: items[0].prompt,
        completion: samples[k].response,
        rewards: Object.fromEntries(names.map((n, f) => [n, reward(perFunction[f][k])])),
        reward: reward(rewards[k]),
        advantage: advantages[k],
      });
    });
    appendFileSync(samplesFile, lines.map((l) => l + '\n').join(''));
  }

  try {
    const r = await runOnline(o, rows, method, {
      config,
      record: { prompts: o.prompts, rewards: o.rewards.join(' --reward '), loss: 'grpo', loss_params: p, grpo: s },
      inputs: [
        { key: 'prompts', now: o.prompts, flag: '--prompts' },
        { key: 'rewards', now: o.rewards.join(' --reward '), flag: '--reward' },
      ],
    });
    return { finalDir: r.finalDir, steps: r.steps, seconds: r.seconds, last: r.last, eval: r.eval };
  } finally {
    await releaseRewards(fns);
  }
}
