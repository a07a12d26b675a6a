/**
 * The training loop every training command runs on: the offline trainer (`prefzoo train`, trainer.ts:
 * rows of a dataset) and the online methods (Nash-MD, reward training, GRPO/RLOO, SPPO: prompts
 * sampled with the live weights). Items (rows, prompts) → a round collected (rows batched; or
 * sampled, judged, scored with the live weights) → one or more optimizer updates on it, each over
 * micro-batches → metrics, progress, evaluation, checkpoints → the trained model.
 *
 *   for each round:                                  (rounds: `draws` × draw size items of a seeded shuffle)
 *     r = method.collect(ctx, items, info)           (sampling from ctx.policy(): this step's weights)
 *     for u in 0 … updatesPerRound−1:                (one optimizer step each)
 *       micro = method.microBatches(ctx, r, u)       (summed gradients, one update: optimizerUpdate)
 *       NaN stop · method.stepped (a per-step controller) · metrics row · progress · method.afterUpdate (TR-DPO's reference sync)
 *       eval every eval_steps (the best checkpoint) · checkpoint every save_steps
 *   final/ (or method.save; the best checkpoint's weights with load_best_model_at_end) · final eval
 *
 * The stages are in run.ts and checkpoints.ts: run folder, artifacts, `optimizerUpdate`,
 * `MetricsLog`, `saveCheckpointAt`, `nonFiniteLoss`, `saveTrained`, and the step plan (`stepPlan`:
 * max_steps, else num_epochs over the items), unless the method plans its own (`plan`: SPPO's
 * iterations, each a plan of its own with its own learning-rate schedule).
 *
 * Resume is bit-exact: a checkpoint holds the parameters, the optimizer state and step, and in
 * state.json the item order (epoch, cursor), the rounds collected so far, the sampling RNG's words
 * (`ctx.rng`), the method's own `state()` and files (`checkpointFiles`: TR-DPO's moving reference),
 * the best evaluation so far, and — when it falls inside a round (updatesPerRound > 1) — the
 * collected round itself, so a resumed run takes the same updates on the same samples. A method's
 * sampling must therefore depend only on that state (ctx.rng, the round's info, the live weights),
 * never on the clock or a global generator.
 *
 * Settings a method does not use are refused in one line (`refuseUnhonoured`), never ignored.
 */
import { join, relative } from 'node:path';
import { TrainingArtifacts } from '../artifacts/training.ts';
import type { ArtifactSpec } from '../artifacts/build.ts';
import type { CheckpointTensor } from '../artifacts/checkpoint.ts';
import { UserError } from '../errors.ts';
import { SILENT, type ProgressFields } from '../progress.ts';
import { loadModel } from '../models/load.ts';
import { countParameters, type ModelConfig } from '../models/config.ts';
import type { FloatTensor } from '../models/checkpoint.ts';
import type { LoraConfig } from '../models/index.ts';
import { Decoder } from '../models/generate.ts';
import { lrAt } from '../optim/schedule.ts';
import type { RuntimeOptions } from '../runtime/session.ts';
import { productQuant, type ProductQuant } from '../models/quantize.ts';
import { collectGarbage } from '../runtime/gc.ts';
import type { LoadedTokenizer } from '../tokenize/index.ts';
import { SeededRandom } from '../random.ts';
import { writeJsonAtomic } from '../io/atomic.ts';
import { resolveConfig, type TrainConfig } from './config.ts';
import { declareCommand, declaredCommands, ONLINE_LOOP_SETTINGS } from './settings.ts';
import { completeCheckpoints, improves, lastCheckpoint, metricValue, nonFiniteLoss, saveCheckpointAt, stepDir, type Best } from './checkpoints.ts';
import { currentWeights, ensureArtifacts, inRunFolder, ItemOrder, loraOf, lowMemoryFor, MetricsLog, optimizerUpdate, runtimeOf, saveTrained, startingParams, StepRows, stepPlan, type LoopOptions, type MicroBatch, type RunInput } from './run.ts';

export type { MicroBatch } from './run.ts';

/** What a method sees while the loop runs. */
export interface OnlineContext {
  /** The run folder. */
  readonly run: string;
  readonly config: TrainConfig;
  /** The starting model folder and its architecture. */
  readonly modelDir: string;
  readonly model: ModelConfig;
  /** The starting weights (no adapters): the reference of most methods (empty when the method's `needsBaseWeights` says false). */
  readonly baseWeights: Map<string, FloatTensor>;
  readonly tok: LoadedTokenizer;
  /** Session settings of the run (device, threads, memory mode). */
  readonly runtime: RuntimeOptions;
  readonly lora: LoraConfig | null;
  /** The training artifacts: parameters, optimizer state, `step` (updates applied so far), `evaluate`. */
  readonly art: TrainingArtifacts;
  /** The loop's random stream for sampling: seeded from `seed`, its words saved in every checkpoint and restored on --resume. */
  readonly rng: SeededRandom;
  /** A decoder over the live weights: the parameters of the update about to be taken (made on first use, re-pointed at each call). */
  policy(): Promise<Decoder>;
  /** Notes on what the run does (the reporter's). */
  info(line: string): void;
}

/** Where a round stands when it is collected. */
export interface RoundInfo {
  /** Rounds collected before this one in the run (0-based). */
  index: number;
  /** The first optimizer step this round feeds (1-based). */
  step: number;
  /** Passes over the items completed before this round. */
  epoch: number;
  /** With `draws`: how many items each draw gave, in order (the last draw of an epoch may be short). */
  draws?: number[];
}

/** A round's items cut into its draws (`RoundInfo.draws`, in order): the micro-batches of a method whose draws are its micro-batches. */
export function splitDraws<T>(items: readonly T[], info: RoundInfo): T[][] {
  const out: T[][] = [];
  let k = 0;
  for (const n of info.draws!) {
    out.push(items.slice(k, k + n));
    k += n;
  }
  return out;
}

/** What the spec of the training graph is built from. */
export interface SpecInput {
  model: ModelConfig;
  /** The starting parameters: the model's weights, plus fresh (or loaded) LoRA adapters and a value head when asked. */
  init: Map<string, FloatTensor>;
  lora: LoraConfig | null;
  config: TrainConfig;
  /** The tokenizer's vocabulary size: samplers draw only ids below it (embeddings are often padded past it). */
  vocabLimit: number;
}

/**
 * An online method: the training graph it needs, how a round is collected, the updates it takes on a
 * round, and its metrics. `Item` is what the loop hands out (a prompt, a data row); `Round` what
 * `collect` returns, which must be JSON-serialisable (plain numbers, strings and arrays; no typed
 * arrays): a checkpoint inside a round (updatesPerRound > 1) stores it in state.json.
 */
export interface OnlineMethod<Item, Round> {
  /** The command's name: progress label, prefix of its messages, `method` in config.json. */
  readonly name: string;
  /** Prefix of the loop's error messages (default `${name}: `; the offline trainer, prefzoo's main command, has none). */
  readonly errorPrefix?: string;
  /**
   * Settings this method uses beyond the loop's own (`LOOP_HONOURS`), e.g. eval_data with `evaluate`,
   * when its command is not declared in train/settings.ts (`declareCommand`, which then decides); any
   * other setting given with --param or --config is refused by `runOnline` before anything is written.
   */
  readonly honours?: readonly (keyof TrainConfig)[];
  /** Start with a fresh scalar head on the model (reward models). */
  readonly valueHead?: boolean;
  /**
   * Whether the last round of an epoch may be short (rows of a dataset: every row once per epoch) or
   * the next epoch starts when a whole round no longer fits (sampling: every round the same size). Default false.
   */
  readonly partialRounds?: boolean;
  /** The training graph (params from `modelParamSpecs(s.model, s.init, s.lora, …)`). */
  spec(s: SpecInput): ArtifactSpec;
  /** Items per round (default batch_size × gradient_accumulation_steps), capped at the number of items. */
  roundSize?(config: TrainConfig): number;
  /**
   * A round drawn as `count` draws of `size` items each (capped at the number of items) instead of
   * one draw of `roundSize`: each draw starts the next epoch on its own when the items run out, so a
   * round may span two epochs, and `RoundInfo.draws` gives the draws' sizes. The offline trainer's
   * rounds are gradient_accumulation_steps micro-batches of batch_size rows. One pass over the items
   * then makes ⌊draws per epoch / count⌋ rounds (at least one).
   */
  draws?(config: TrainConfig): { size: number; count: number };
  /**
   * The LoRA adapters the run trains (default `loraOf(config)`: fresh ones of rank lora_r, or none),
   * and their starting values when they are not fresh (the trainer's --adapter). Asked once the items are read.
   */
  lora?(config: TrainConfig): { lora: LoraConfig | null; weights?: Map<string, FloatTensor> };
  /**
   * Whether `ctx.baseWeights` is read once the artifacts are built (default true). When false the
   * loop lets go of the loaded starting weights before the artifacts load their own copy (one
   * parameter-sized copy less at the peak) and `ctx.baseWeights` is empty.
   */
  needsBaseWeights?(): boolean;
  /**
   * The run's step plan, given the steps one pass over the items takes: the total and each step's
   * learning rate. Default `stepPlan`: max_steps, else num_epochs passes, one schedule over the run.
   */
  plan?(config: TrainConfig, stepsPerEpoch: number): { total: number; lr: (step: number) => number };
  /** Optimizer updates per round (default 1; GRPO's num_iterations). */
  updatesPerRound?(config: TrainConfig): number;
  /** Opens what the method needs beside the artifacts (reference decoders and scorers, …); called once, before the first round. */
  open?(ctx: OnlineContext): Promise<void>;
  /** Samples and scores one round with the live weights (`ctx.policy()`). */
  collect(ctx: OnlineContext, items: readonly Item[], info: RoundInfo): Promise<Round>;
  /** The micro-batches of update `u` (0-based) of a round: their gradients are summed into one update. */
  microBatches(ctx: OnlineContext, round: Round, u: number): Promise<MicroBatch[]>;
  /**
   * Whether a round may give more micro-batches than gradient_accumulation_steps (GRPO --agent: an
   * agent's rollouts make as many rows as their calls fork): the artifacts then sum gradients.
   */
  variableMicroBatches?: boolean;
  /**
   * Called after each optimizer update, its metrics row and progress, before that step's evaluation
   * and checkpoint (TR-DPO's reference moving toward the policy every ref_model_sync_steps).
   */
  afterUpdate?(ctx: OnlineContext, step: number): Promise<void>;
  /** Metrics of update `u` of a round, added to its metrics.jsonl row beside the graph's. */
  metrics?(round: Round, u: number): Record<string, number>;
  /**
   * Called once after each optimizer update, before its metrics row, with the graph's metrics (the
   * means over the update's micro-batches, those named `_…` included: they are the method's and never
   * written to a row). A controller that moves with every step (GRPO's adaptive entropy coefficient)
   * updates here — its state then belongs in `state()`; what it returns joins the row.
   */
  stepped?(graph: Readonly<Record<string, number>>): Record<string, number>;
  /** The progress bar's fields for a row (default: loss). */
  progressFields?(row: Record<string, number>): ProgressFields;
  /**
   * Held-out evaluation of the live weights (called every eval_steps and at the end when eval_data is
   * set); its metrics become a `split: "eval"` row. With load_best_model_at_end every evaluation is a
   * candidate for the best checkpoint (by `bestMetric`), the last step is evaluated in the loop, the
   * final model is the best checkpoint's weights, and the final evaluation (eval.json, with
   * `best_step`) adds no row.
   */
  evaluate?(ctx: OnlineContext): Promise<Record<string, number>>;
  /** Called after each evaluation that writes a metrics row, at its step (the trainer's eval samples). */
  evaluated?(ctx: OnlineContext, step: number): Promise<void>;
  /** The evaluation metric that picks the best checkpoint (load_best_model_at_end); needed by a method whose command honours that setting. */
  bestMetric?(config: TrainConfig): string;
  /** The method's own state, saved in every checkpoint (JSON) and given back to `restore` on --resume. */
  state?(): unknown;
  /** Tensors saved beside every checkpoint's parameters, by file name (TR-DPO's moving reference); the method reads them back itself on --resume. */
  checkpointFiles?(): Record<string, Map<string, CheckpointTensor>>;
  restore?(state: unknown): void;
  /** Saves the trained model (default: RUN/final in HF layout, RUN/adapter with save_adapter); returns its folder. */
  save?(ctx: OnlineContext, weights: Map<string, FloatTensor>): Promise<string>;
  /** Releases what `open` made. */
  close?(): Promise<void>;
}

export interface OnlineOptions extends LoopOptions {
  /** Continue from the newest checkpoint of `out`. */
  resume?: boolean;
  /** Replace the contents of a non-empty run folder. */
  overwrite?: boolean;
  /**
   * Asked after each update (its metrics row, afterUpdate and evaluation done) with the step and a
   * decoder over the live weights: true ends the run at that step, which is then saved as a last step
   * is (checkpoint, final model, final evaluation); `steps` in the result is that step. The demos'
   * run-until-an-accuracy (src/demos/distill.ts). A --resume continues toward the planned total.
   */
  until?: (step: number, policy: () => Promise<Decoder>) => Promise<boolean>;
}

/**
 * Items read once the run folder is ready (a data stage writing converted files under RUN/data),
 * tokenized with the run's tokenizer.
 */
export type ItemLoader<Item> = (s: {
  run: string;
  tok: LoadedTokenizer;
  info: (line: string) => void;
  /** The starting model's architecture and weights (the trainer's reference and adapter are built from them). */
  model: ModelConfig;
  baseWeights: Map<string, FloatTensor>;
  /** Whether the run continues from a checkpoint (--resume found one). */
  resuming: boolean;
}) => Promise<readonly Item[]>;

/** Everything the command resolved before the loop: its settings and what config.json records. */
export interface OnlineRun {
  config: TrainConfig;
  /** Written to config.json beside the settings (loss parameters, sampling, judge, …); a function is asked once the items are read. */
  record: Record<string, unknown> | (() => Record<string, unknown>);
  /** Inputs a --resume must be given again (the model is always one), e.g. the prompts file and the judge. */
  inputs?: readonly RunInput[];
}

export interface OnlineResult {
  /** The trained model's folder. */
  finalDir: string;
  steps: number;
  seconds: number;
  /** The last step's metrics row. */
  last: Record<string, number>;
  /** The final evaluation, when the method has one and eval_data is set. */
  eval?: Record<string, number>;
}

/**
 * The products of the policy's generation graphs under rollout_dtype: null (f32), or q8/q4 blocks of
 * rollout_block_size; f16, a block size that is no power of two, and a device other than the CPU
 * are refused in one line.
 */
export function rolloutQuant(config: Pick<TrainConfig, 'rollout_dtype' | 'rollout_block_size'>, runtime: RuntimeOptions): ProductQuant | null {
  return productQuant(config.rollout_dtype ?? 'f32', config.rollout_block_size ?? 32, runtime.ep ?? 'cpu', { dtype: 'rollout_dtype', block: 'rollout_block_size' });
}

/** Settings every online method honours through the loop itself (declared in train/settings.ts). */
export const LOOP_HONOURS: readonly (keyof TrainConfig)[] = ONLINE_LOOP_SETTINGS;

/**
 * Refuses, in one line, a setting given with --param or --config that `command` does not honour,
 * through the settings table (train/settings.ts): `resolveConfig` with the command's declaration
 * (`declareCommand`: honoured settings, its own settings, its loss's parameters). A command not
 * declared there is declared here with the loop's settings and the method's `honours`.
 */
function refuseUnhonouredBy(command: string, o: { params?: readonly string[]; configFile?: string; base?: Partial<TrainConfig> }, honours: readonly (keyof TrainConfig)[]): void {
  if (!declaredCommands().some((c) => c.name === command)) declareCommand(command, { honours: [...new Set([...LOOP_HONOURS, ...honours])] });
  resolveConfig({ params: o.params, configFile: o.configFile, base: o.base, command });
}

/** `stepPlan` as a method's `plan`: max_steps, else num_epochs passes; one learning-rate schedule over the run. */
export function defaultPlan(config: TrainConfig, stepsPerEpoch: number): { total: number; lr: (step: number) => number } {
  const { total, schedule } = stepPlan(config, stepsPerEpoch);
  return { total, lr: (step) => lrAt(step, schedule) };
}

/** The loop's part of state.json (`online`). */
interface LoopState {
  rounds: number;
  rng: number[];
  /** The round being worked through and its next update, when the checkpoint fell inside it. */
  pending: { round: unknown; next: number; info: RoundInfo } | null;
  method?: unknown;
}

/**
 * Runs `method` over `items` (or the items `items(…)` reads once the run folder is ready) in the run
 * folder `o.out`: settings the method does not honour refused, the folder prepared (refused when it
 * holds a run, unless --resume or --overwrite), the artifacts built (kept by a resumed run), the
 * rounds and updates, checkpoints every save_steps and at the end, the trained model saved, and the
 * final evaluation (eval.json) when the method has one and eval_data is set.
 */
export async function runOnline<Item, Round>(o: OnlineOptions, items: readonly Item[] | ItemLoader<Item>, method: OnlineMethod<Item, Round>, r: OnlineRun): Promise<OnlineResult> {
  refuseUnhonouredBy(method.name, o, method.honours ?? []);
  if (Array.isArray(items) && items.length === 0) throw new UserError(`${method.name}: nothing to train on (no prompts or rows)`);
  return inRunFolder(o, r.config, r.inputs ?? [], (base, tok) => runIn(o, items, method, r, base, tok));
}

async function runIn<Item, Round>(o: OnlineOptions, given: readonly Item[] | ItemLoader<Item>, method: OnlineMethod<Item, Round>, r: OnlineRun, base: ReturnType<typeof loadModel>, tok: LoadedTokenizer): Promise<OnlineResult> {
  const t0 = Date.now();
  const run = o.out;
  const { config } = r;
  const reporter = o.reporter ?? SILENT;
  const info = reporter.info;
  const prefix = method.errorPrefix ?? `${method.name}: `;
  const resuming = !!o.resume && lastCheckpoint(run) !== null;
  if (o.resume && !resuming) info(`no checkpoint in ${run}; starting from the beginning`);
  const items = typeof given === 'function' ? await given({ run, tok, info, model: base.config, baseWeights: base.weights, resuming }) : given;
  if (items.length === 0) throw new UserError(`${method.name}: nothing to train on (no prompts or rows)`);
  const runtime = runtimeOf(config, base.config);
  const adapters = method.lora ? method.lora(config) : { lora: loraOf(config) };
  const lora = adapters.lora;
  if (config.save_adapter && !lora && !method.save) throw new UserError('save_adapter=true needs LoRA (set lora_r)');
  writeJsonAtomic(join(run, 'config.json'), { model: o.model, method: method.name, ...(o.hub ? { hub: o.hub } : {}), ...(typeof r.record === 'function' ? r.record() : r.record), ...config });

  // Step plan: whole rounds per epoch (or every item once, with a short last draw), each giving updatesPerRound steps.
  const drawn = method.draws?.(config);
  const drawSize = Math.max(1, Math.min(items.length, drawn ? drawn.size : method.roundSize ? method.roundSize(config) : config.batch_size * config.gradient_accumulation_steps));
  const drawsPerRound = drawn ? drawn.count : 1;
  if (!(Number.isInteger(drawsPerRound) && drawsPerRound >= 1)) throw new Error(`${method.name}: draws' count must be a positive integer, got ${drawsPerRound}`);
  const updates = method.updatesPerRound ? method.updatesPerRound(config) : 1;
  if (!(Number.isInteger(updates) && updates >= 1)) throw new Error(`${method.name}: updatesPerRound must be a positive integer, got ${updates}`);
  const drawsPerEpoch = method.partialRounds ? Math.ceil(items.length / drawSize) : Math.floor(items.length / drawSize);
  const roundsPerEpoch = Math.max(1, Math.floor(drawsPerEpoch / drawsPerRound));
  const { total, lr: lrOf } = method.plan ? method.plan(config, roundsPerEpoch * updates) : defaultPlan(config, roundsPerEpoch * updates);

  const artDir = join(run, 'artifacts');
  ensureArtifacts(artDir, config, resuming, () => {
    const init = startingParams(base.config, base.weights, { lora, adapter: adapters.weights, valueHead: method.valueHead, seed: config.seed });
    return method.spec({ model: base.config, init, lora, config, vocabLimit: tok.vocabSize });
  }, config.gradient_accumulation_steps > 1 || (method.variableMicroBatches ?? false));
  // The artifacts' checkpoint holds the starting weights now: a method that does not read them
  // again lets go of the loaded copy before the store takes its own.
  if (method.needsBaseWeights && !method.needsBaseWeights()) {
    base.weights.clear();
    if (lowMemoryFor(config.gradient_checkpointing, countParameters(base.config))) collectGarbage();
  }
  const quant = rolloutQuant(config, runtime);
  const art = await TrainingArtifacts.load(artDir, runtime);
  let decoder: Decoder | null = null;
  const liveWeights = () => new Map(art.manifest.params.map((p) => [p.name, { shape: p.shape, data: art.param(p.name) as Float32Array }]));
  let at = { epoch: 0, index: 0 };
  let rounds = 0;
  let numTokens = 0;
  let pending: LoopState['pending'] = null;
  let rng = new SeededRandom(config.seed);
  let methodState: unknown;
  let best: Best | null = null;
  if (resuming) {
    const ck = lastCheckpoint(run)!;
    const state = art.loadCheckpoint(ck);
    at = state.dataCursor as { epoch: number; index: number };
    numTokens = typeof state.num_tokens === 'number' ? state.num_tokens : 0;
    best = (state.best as Best | undefined) ?? null;
    const s = state.online as LoopState | undefined;
    if (!s) throw new UserError(`${ck}: not a checkpoint of an online run (no "online" state); start again with --overwrite`);
    rounds = s.rounds;
    pending = s.pending;
    rng = new SeededRandom(s.rng);
    methodState = s.method;
    info(`resuming from ${ck} (step ${state.step})`);
  }
  const ctx: OnlineContext = {
    run,
    config,
    modelDir: o.model,
    model: base.config,
    baseWeights: base.weights,
    tok,
    runtime,
    lora,
    art,
    rng,
    info,
    async policy() {
      if (art.store.device) {
        // On the GPU the decoder feeds the training session's parameters where they are (GPU
        // buffers, valid until the next update: every round asks again); host values only to create it.
        if (!decoder) {
          await art.toHost();
          decoder = await Decoder.create(base.config, liveWeights(), { runtime, lora });
        }
        await art.store.toDevice();
        decoder.setWeightTensors((name) => art.store.tensor(name));
        return decoder;
      }
      await art.toHost();
      // Quantized rollouts: weights no update changes (a LoRA run's base) are quantized into the
      // sessions once; an update then feeds the new adapters without new sessions.
      if (!decoder) decoder = await Decoder.create(base.config, liveWeights(), { runtime, lora, quant, frozen: new Set(art.manifest.params.filter((p) => !p.trainable).map((p) => p.name)) });
      else decoder.setWeights((name) => art.param(name) as Float32Array);
      return decoder;
    },
  };
  if (resuming) method.restore?.(methodState);
  const metrics = MetricsLog.open(run, { step: art.step, tensorboard: config.report_to === 'tensorboard', resuming });
  await method.open?.(ctx);
  const evaluating = !!method.evaluate && !!config.eval_data;
  const evalEvery = evaluating && config.eval_steps > 0 ? config.eval_steps : 0;
  // The best checkpoint: every evaluation a candidate, the last step's included.
  const keepBest = evalEvery > 0 && config.load_best_model_at_end;
  if (keepBest && !method.bestMetric) throw new Error(`${method.name}: load_best_model_at_end needs the method's bestMetric`);
  const bestMetric = keepBest ? method.bestMetric!(config) : '';
  /** Evaluates the live weights at `step`: a metrics row, the method's `evaluated`, and the best checkpoint so far. */
  const evaluateAt = async (step: number): Promise<void> => {
    const ev = await method.evaluate!(ctx);
    metrics.row({ step, split: 'eval', ...ev });
    await method.evaluated?.(ctx, step);
    if (keepBest) {
      const value = metricValue(ev, bestMetric);
      if (improves(value, best, bestMetric)) best = { step, metric: bestMetric, value, checkpoint: relative(run, stepDir(run, step)) };
    }
  };

  const order = new ItemOrder(items.length, config.seed, at.epoch, at.index);
  const nextRound = (): { items: Item[]; info: RoundInfo } => {
    const idx: number[] = [];
    const sizes: number[] = [];
    for (let k = 0; k < drawsPerRound; k++) {
      const d = order.take(drawSize, !method.partialRounds);
      sizes.push(d.length);
      idx.push(...d);
    }
    const info: RoundInfo = { index: rounds++, step: art.step + 1, epoch: order.epoch, ...(drawn ? { draws: sizes } : {}) };
    return { items: idx.map((i) => items[i]), info };
  };

  const progress = reporter.progress(method.name, total);
  let last: Record<string, number> = {};
  const stepRows = new StepRows(numTokens);
  /** The step `o.until` ended the run at, if it did. */
  let stoppedAt: number | null = null;
  const release = async () => {
    await art.release();
    await decoder?.release();
    await method.close?.();
  };
  try {
    while (art.step < total) {
      if (!pending) {
        const next = nextRound();
        pending = { round: await method.collect(ctx, next.items, next.info), next: 0, info: next.info };
      }
      const round = pending.round as Round;
      const u = pending.next;
      const step = art.step + 1;
      const lr = lrOf(step);
      const micro = await method.microBatches(ctx, round, u);
      const up = await optimizerUpdate(art, { step, lr, micro: micro.length, batch: async (i) => micro[i] });
      if (!Number.isFinite(up.metrics.loss)) {
        progress.stop();
        throw nonFiniteLoss(run, art, up.metrics.loss, step, prefix);
      }
      pending.next++;
      if (pending.next >= updates) pending = null;
      const own = method.stepped ? method.stepped(up.metrics) : {};
      for (const k of Object.keys(up.metrics)) if (k.startsWith('_')) delete up.metrics[k];
      const row = stepRows.row(step, order.epochs, up, lr, { ...(method.metrics ? method.metrics(round, u) : {}), ...own });
      last = row;
      const logged = step % config.logging_steps === 0 || step === total;
      if (logged) metrics.row(row);
      progress.update(step, method.progressFields ? method.progressFields(row) : { loss: row.loss });
      await method.afterUpdate?.(ctx, step);
      // The last step is evaluated after the final model is saved, unless the best checkpoint is
      // being kept: then it is a candidate like any other evaluation.
      const evalNow = evalEvery > 0 && step % evalEvery === 0 && (step !== total || keepBest);
      if (evalNow) await evaluateAt(step);
      const stop = step < total && !!o.until && (await o.until(step, () => ctx.policy()));
      if (stop && !logged) metrics.row(row);
      if ((config.save_steps > 0 && step % config.save_steps === 0) || step === total || stop || (evalNow && keepBest)) {
        const online: LoopState = { rounds, rng: ctx.rng.state, pending, ...(method.state ? { method: method.state() } : {}) };
        await saveCheckpointAt(
          run,
          art,
          { epoch: order.epoch, dataCursor: order.cursor, rng: { seed: config.seed }, config, num_tokens: stepRows.numTokens, online },
          { limit: config.save_total_limit, best, files: method.checkpointFiles?.() },
        );
      }
      if (stop) {
        stoppedAt = step;
        break;
      }
    }
    progress.stop();
    const ended = stoppedAt ?? total;
    await art.toHost();
    const chosen = keepBest ? best : null;
    if (chosen && chosen.step !== art.step) {
      const dir = stepDir(run, chosen.step);
      if (!completeCheckpoints(run).includes(dir)) throw new UserError(`${dir}: the best checkpoint is missing; cannot load it`);
      art.loadCheckpoint(dir);
      info(`final model: the best checkpoint (step ${chosen.step}, ${chosen.metric} ${chosen.value})`);
    }
    const weights = currentWeights(art);
    const finalDir = method.save ? await method.save(ctx, weights) : saveTrained(run, weights, { config, model: base.config, lora, sourceDir: o.model });
    let evalSummary: Record<string, number> | undefined;
    if (evaluating) {
      evalSummary = await method.evaluate!(ctx);
      writeJsonAtomic(join(run, 'eval.json'), { ...evalSummary, ...(chosen ? { best_step: chosen.step } : {}) });
      // With the best checkpoint kept, the last step was evaluated in the loop.
      if (!keepBest) {
        metrics.row({ step: ended, split: 'eval', ...evalSummary });
        await method.evaluated?.(ctx, ended);
      }
    }
    return { finalDir, steps: ended, seconds: Math.round((Date.now() - t0) / 100) / 10, last, eval: evalSummary };
  } finally {
    progress.stop();
    await release();
  }
}
