/**
 * The online loop every online method runs on (Nash-MD, reward training, GRPO/RLOO, SPPO): items (prompts, or rows) → a round collected with the live
 * weights (sampled, judged, scored) → one or more optimizer updates on it, each over micro-batches →
 * metrics, progress, checkpoints, evaluation → the trained model.
 *
 *   for each round:                                  (rounds: roundSize items of a seeded shuffle)
 *     r = method.collect(ctx, items, info)           (sampling from ctx.policy(): this step's weights)
 *     for u in 0 … updatesPerRound−1:                (one optimizer step each)
 *       micro = method.microBatches(ctx, r, u)       (summed gradients, one update: optimizerUpdate)
 *       NaN stop · metrics row · progress · eval every eval_steps · checkpoint every save_steps
 *   final/ (or method.save)
 *
 * The stages are the offline trainer's (src/train/run.ts, checkpoints.ts): run folder, artifacts,
 * `optimizerUpdate`, `MetricsLog`, `saveCheckpointAt`, `nonFiniteLoss`, `saveTrained`, and its step
 * plan (`stepPlan`: max_steps, else num_epochs over the items), unless the method plans its own
 * (`plan`: SPPO's iterations, each a plan of its own with its own learning-rate schedule).
 *
 * Resume is bit-exact: a checkpoint holds the parameters, the optimizer state and step, and in
 * state.json the item order (epoch, cursor), the rounds collected so far, the sampling RNG's words
 * (`ctx.rng`), the method's own `state()`, and — when it falls inside a round (updatesPerRound > 1)
 * — the collected round itself, so a resumed run takes the same updates on the same samples. A
 * method's sampling must therefore depend only on that state (ctx.rng, the round's info, the live
 * weights), never on the clock or a global generator.
 *
 * Settings a method does not use are refused in one line (`refuseUnhonoured`), never ignored.
 */
import { join } from 'node:path';
import { TrainingArtifacts } from '../artifacts/training.ts';
import type { ArtifactSpec } from '../artifacts/build.ts';
import { UserError } from '../errors.ts';
import { startProgress, type ProgressFields } from '../progress.ts';
import { loadModel } from '../models/load.ts';
import type { ModelConfig } from '../models/config.ts';
import type { FloatTensor } from '../models/checkpoint.ts';
import type { LoraConfig } from '../models/index.ts';
import { Decoder } from '../models/generate.ts';
import { lrAt } from '../optim/schedule.ts';
import type { RuntimeOptions } from '../runtime/session.ts';
import type { LoadedTokenizer } from '../tokenize/index.ts';
import { SeededRandom } from '../random.ts';
import { writeJsonAtomic } from '../io/atomic.ts';
import { resolveConfig, type TrainConfig } from '../train/config.ts';
import { declareCommand, declaredCommands, ONLINE_LOOP_SETTINGS } from '../train/settings.ts';
import { lastCheckpoint, nonFiniteLoss, saveCheckpointAt } from '../train/checkpoints.ts';
import { currentWeights, ensureArtifacts, inRunFolder, ItemOrder, loraOf, MetricsLog, optimizerUpdate, runtimeOf, saveTrained, startingParams, StepRows, stepPlan, type LoopOptions, type MicroBatch, type RunInput } from '../train/run.ts';

export type { MicroBatch } from '../train/run.ts';

/** What a method sees while the loop runs. */
export interface OnlineContext {
  /** The run folder. */
  readonly run: string;
  readonly config: TrainConfig;
  /** The starting model folder and its architecture. */
  readonly modelDir: string;
  readonly model: ModelConfig;
  /** The starting weights (no adapters): the reference of most methods. */
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
  /** Notes on what the run does (stderr unless --quiet). */
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
}

/** What the spec of the training graph is built from. */
export interface SpecInput {
  model: ModelConfig;
  /** The starting parameters: the model's weights, plus fresh (or loaded) LoRA adapters and a value head when asked. */
  init: Map<string, FloatTensor>;
  lora: LoraConfig | null;
  config: TrainConfig;
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
  /** Metrics of update `u` of a round, added to its metrics.jsonl row beside the graph's. */
  metrics?(round: Round, u: number): Record<string, number>;
  /** The progress bar's fields for a row (default: loss). */
  progressFields?(row: Record<string, number>): ProgressFields;
  /** Held-out evaluation of the live weights (called every eval_steps and at the end when eval_data is set); its metrics become a `split: "eval"` row. */
  evaluate?(ctx: OnlineContext): Promise<Record<string, number>>;
  /** The method's own state, saved in every checkpoint (JSON) and given back to `restore` on --resume. */
  state?(): unknown;
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
}

/**
 * Items read once the run folder is ready (a data stage writing converted files under RUN/data),
 * tokenized with the run's tokenizer.
 */
export type ItemLoader<Item> = (s: { run: string; tok: LoadedTokenizer; info: (line: string) => void }) => Promise<readonly Item[]>;

/** Everything the command resolved before the loop: its settings and what config.json records. */
export interface OnlineRun {
  config: TrainConfig;
  /** Written to config.json beside the settings (loss parameters, sampling, judge, …). */
  record: Record<string, unknown>;
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

/** Settings every online method honours through the loop itself (declared in train/settings.ts). */
export const LOOP_HONOURS: readonly (keyof TrainConfig)[] = ONLINE_LOOP_SETTINGS;

/**
 * Refuses, in one line, a setting given with --param or --config that `command` does not honour,
 * through the settings table (train/settings.ts): `resolveConfig` with the command's declaration
 * (`declareCommand`: honoured settings, its own settings, its loss's parameters). A command not
 * declared there is declared here with the loop's settings and the method's `honours`.
 */
function refuseUnhonouredBy(command: string, o: { params?: readonly string[]; configFile?: string }, honours: readonly (keyof TrainConfig)[]): void {
  if (!declaredCommands().some((c) => c.name === command)) declareCommand(command, { honours: [...new Set([...LOOP_HONOURS, ...honours])] });
  resolveConfig({ params: o.params, configFile: o.configFile, command });
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
  const log = o.log ?? (() => {});
  const info = o.quiet && !o.log ? () => {} : log;
  const resuming = !!o.resume && lastCheckpoint(run) !== null;
  if (o.resume && !resuming) info(`no checkpoint in ${run}; starting from the beginning`);
  const items = typeof given === 'function' ? await given({ run, tok, info }) : given;
  if (items.length === 0) throw new UserError(`${method.name}: nothing to train on (no prompts or rows)`);
  const runtime = runtimeOf(config, base.config);
  const lora = loraOf(config);
  if (config.save_adapter && !lora && !method.save) throw new UserError('save_adapter=true needs LoRA (set lora_r)');
  writeJsonAtomic(join(run, 'config.json'), { model: o.model, method: method.name, ...(o.hub ? { hub: o.hub } : {}), ...r.record, ...config });

  // Step plan: whole rounds per epoch (or every item once, with a short last round), each giving updatesPerRound steps.
  const roundSize = Math.max(1, Math.min(items.length, method.roundSize ? method.roundSize(config) : config.batch_size * config.gradient_accumulation_steps));
  const updates = method.updatesPerRound ? method.updatesPerRound(config) : 1;
  if (!(Number.isInteger(updates) && updates >= 1)) throw new Error(`${method.name}: updatesPerRound must be a positive integer, got ${updates}`);
  const roundsPerEpoch = method.partialRounds ? Math.ceil(items.length / roundSize) : Math.floor(items.length / roundSize);
  const { total, lr: lrOf } = method.plan ? method.plan(config, roundsPerEpoch * updates) : defaultPlan(config, roundsPerEpoch * updates);

  const artDir = join(run, 'artifacts');
  ensureArtifacts(artDir, config, resuming, () => {
    const init = startingParams(base.config, base.weights, { lora, valueHead: method.valueHead, seed: config.seed });
    return method.spec({ model: base.config, init, lora, config });
  });
  const art = await TrainingArtifacts.load(artDir, runtime);
  let decoder: Decoder | null = null;
  const liveWeights = () => new Map(art.manifest.params.map((p) => [p.name, { shape: p.shape, data: art.param(p.name) as Float32Array }]));
  let at = { epoch: 0, index: 0 };
  let rounds = 0;
  let numTokens = 0;
  let pending: LoopState['pending'] = null;
  let rng = new SeededRandom(config.seed);
  let methodState: unknown;
  if (resuming) {
    const ck = lastCheckpoint(run)!;
    const state = art.loadCheckpoint(ck);
    at = state.dataCursor as { epoch: number; index: number };
    numTokens = typeof state.num_tokens === 'number' ? state.num_tokens : 0;
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
      if (!decoder) decoder = await Decoder.create(base.config, liveWeights(), { runtime, lora });
      else decoder.setWeights((name) => art.param(name) as Float32Array);
      return decoder;
    },
  };
  if (resuming) method.restore?.(methodState);
  const metrics = MetricsLog.open(run, { step: art.step, tensorboard: config.report_to === 'tensorboard', resuming });
  await method.open?.(ctx);
  const evalEvery = method.evaluate && config.eval_data && config.eval_steps > 0 ? config.eval_steps : 0;

  const order = new ItemOrder(items.length, config.seed, at.epoch, at.index);
  const nextRound = (): { items: Item[]; info: RoundInfo } => {
    const idx = order.take(roundSize, !method.partialRounds);
    const info: RoundInfo = { index: rounds++, step: art.step + 1, epoch: order.epoch };
    return { items: idx.map((i) => items[i]), info };
  };

  const progress = startProgress(o.progress, method.name, total, o.quiet);
  let last: Record<string, number> = {};
  const stepRows = new StepRows(numTokens);
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
        throw nonFiniteLoss(run, art, up.metrics.loss, step, `${method.name}: `);
      }
      pending.next++;
      if (pending.next >= updates) pending = null;
      const row = stepRows.row(step, order.epochs, up, lr, method.metrics ? method.metrics(round, u) : {});
      last = row;
      if (step % config.logging_steps === 0 || step === total) metrics.row(row);
      progress.update(step, method.progressFields ? method.progressFields(row) : { loss: row.loss });
      if (evalEvery && step % evalEvery === 0 && step !== total) metrics.row({ step, split: 'eval', ...(await method.evaluate!(ctx)) });
      if ((config.save_steps > 0 && step % config.save_steps === 0) || step === total) {
        const online: LoopState = { rounds, rng: ctx.rng.state, pending, ...(method.state ? { method: method.state() } : {}) };
        await saveCheckpointAt(run, art, { epoch: order.epoch, dataCursor: order.cursor, rng: { seed: config.seed }, config, num_tokens: stepRows.numTokens, online }, { limit: config.save_total_limit });
      }
    }
    progress.stop();
    await art.toHost();
    const weights = currentWeights(art);
    const finalDir = method.save ? await method.save(ctx, weights) : saveTrained(run, weights, { config, model: base.config, lora, sourceDir: o.model });
    let evalSummary: Record<string, number> | undefined;
    if (method.evaluate && config.eval_data) {
      evalSummary = await method.evaluate(ctx);
      metrics.row({ step: total, split: 'eval', ...evalSummary });
      writeJsonAtomic(join(run, 'eval.json'), evalSummary);
    }
    return { finalDir, steps: total, seconds: Math.round((Date.now() - t0) / 100) / 10, last, eval: evalSummary };
  } finally {
    progress.stop();
    await release();
  }
}
