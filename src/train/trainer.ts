/**
 * `prefzoo train`: data → tokens → reference log-prob cache → training artifacts → optimizer steps
 * with gradient accumulation, TRL-named metrics, atomic checkpoints, bit-identical resume, and the
 * final model in HF layout.
 *
 * Run folder:
 *   config.json            the resolved TrainConfig + loss + model (written first)
 *   data/                  the converted input (when it was not canonical Parquet) and the
 *                          reference cache `reference.parquet` (ref_chosen_logp, ref_rejected_logp, …
 *                          one row per training example, in data order) with `reference.json`
 *                          beside it: what made it (identity.ts: the reference, `model:DIR` or with
 *                          --adapter `model:DIR+adapter:DIR`, its files, the data, the token ids,
 *                          the loss); a cache made by anything else is refused
 *   artifacts/             training_model.onnx, eval_model.onnx, optimizer_model.onnx, artifacts.json
 *   checkpoints/step-N/    params + optimizer state + state.json, every save_steps (and
 *                          `reference.safetensors` under TR-DPO: the moving reference)
 *   metrics.jsonl          one row per logging step (and `split: "eval"` rows)
 *   runs/                  TensorBoard event files (report_to=tensorboard)
 *   samples/step-K.jsonl   greedy completions of policy and reference at each evaluation (eval_generate)
 *   best.json              the best checkpoint by metric_for_best_model (load_best_model_at_end)
 *   final/                 the trained model in HF layout (LoRA merged; not with save_merged=false;
 *                          with load_best_model_at_end, the best checkpoint's weights)
 *   adapter/               with LoRA and save_adapter=true: the adapter in PEFT's layout (src/models/peft.ts)
 *
 * The reference is the starting policy (the base model, merged with --adapter's adapter when one is
 * given), or `--ref DIR`. Under TR-DPO (sync_ref_model) it moves toward the policy every
 * ref_model_sync_steps steps and its log-probs are computed for every batch.
 */
import { existsSync, mkdirSync, rmSync } from 'node:fs';
import { join, relative, resolve } from 'node:path';
import type { Kind } from '../../datasets/schema.ts';
import { UserError } from '../errors.ts';
import { startProgress } from '../progress.ts';
import { collectGarbage } from '../runtime/gc.ts';
import { mallocAdvice } from '../runtime/malloc.ts';
import { TrainingArtifacts } from '../artifacts/training.ts';
import { loadModel } from '../models/load.ts';
import { countParameters } from '../models/config.ts';
import type { FloatTensor } from '../models/checkpoint.ts';
import { mergeLora, type LoraConfig } from '../models/index.ts';
import { loadAdapter } from '../models/peft.ts';
import { readSafetensors, tensorToFloat32 } from '../models/safetensors.ts';
import type { CheckpointTensor } from '../artifacts/checkpoint.ts';
import { copyWeights, loadReferenceModel, sameParameters, softUpdate, type ReferenceModel } from './reference.ts';
import { identityDiff, readIdentity, refCacheIdentity, writeIdentity } from './identity.ts';
import { tokenizeRationales } from './rationale.ts';
import { loadTokenizer } from '../tokenize/index.ts';
import { lrAt } from '../optim/schedule.ts';
import { describePlacement, placement } from '../runtime/placement.ts';
import { resolveConfig, type TrainConfig } from './config.ts';
import { currentWeights as artifactWeights, ensureArtifacts, inRunFolder, ItemOrder, loraOf, lowMemoryFor, MetricsLog, optimizerUpdate, runtimeOf, saveTrained, startingParams, StepRows, stepPlan, type LoopOptions, type MicroBatch, type RunInput } from './run.ts';
import { writeJsonAtomic } from '../io/atomic.ts';
import { loadData, tokenizeExamples, type LoadedData, type TokenizedExample } from '../../datasets/examples.ts';
import { canPack, collate } from '../models/batch.ts';
import { readManifest } from '../artifacts/manifest.ts';
import { readRefColumns, writeRefColumns } from '../../datasets/tokenized.ts';
import { PROVIDED_KEYS, type TrainProblem } from './graph.ts';
import { problemOf, problemSpec } from './problem.ts';
import { f16BitsToFloat, float32ToF16 } from '../models/safetensors.ts';
import { resolveLoss } from '../../losses/index.ts';
import { Scorer } from '../models/scorer.ts';
import { Evaluator, type EvalSummary } from '../eval/evaluate.ts';
import { bestMetricName, completeCheckpoints, improves, lastCheckpoint, metricValue, nonFiniteLoss, saveCheckpointAt, stepDir, type Best } from './checkpoints.ts';
import { EvalSampler } from './samples.ts';

export interface TrainOptions extends LoopOptions {
  /** Canonical Parquet (a file, its shards, a folder of shards, a glob) or any file `convert` accepts. */
  data: string;
  /** A loss of the zoo (`dpo`, `ipo`, …) or a weighted mixture (`dpo:0.8,sft:0.2`). */
  loss: string;
  /** Continue from the last complete checkpoint in the run folder. */
  resume?: boolean;
  /** Replace the contents of a non-empty run folder (otherwise it is refused unless resuming). */
  overwrite?: boolean;
  /** Use this reference model folder instead of the starting weights (`train --ref DIR`). */
  refModel?: string;
  /** Start the LoRA adapters from this PEFT adapter folder (`train --adapter DIR`). */
  adapter?: string;
  /** Train on these rows instead of reading `data` (MPO's stages train on subsets); `data` names them in messages. */
  rows?: LoadedData;
}

export interface TrainResult {
  steps: number;
  seconds: number;
  finalDir: string;
  config: TrainConfig;
  last: Record<string, number>;
  eval?: EvalSummary;
}

/** TR-DPO's moving reference, saved with each checkpoint so a resumed run continues it. */
const REFERENCE_FILE = 'reference.safetensors';

export { lastCheckpoint } from './checkpoints.ts';
export { prepareRunFolder } from './run.ts';

export async function train(o: TrainOptions): Promise<TrainResult> {
  const { config, lossParams } = resolveConfig({ configFile: o.configFile, params: o.params, base: o.base });
  const loss = resolveLoss(o.loss, lossParams);
  // --resume continues a run only with the model, data, loss and reference it was started with.
  const inputs: RunInput[] = [
    ...(o.rows ? [] : [{ key: 'data', now: o.data, flag: '--data' }]),
    { key: 'loss', now: o.loss, flag: '--loss' },
    { key: 'ref', now: o.refModel, flag: '--ref', optional: true, absent: 'no --ref' },
  ];
  return inRunFolder(o, config, inputs, (base, tok) => trainIn(o, { config, lossParams, loss, base, tok }));
}

/** What `train` resolved before the stages: settings, loss, the starting model and its tokenizer. */
interface Setup {
  config: TrainConfig;
  lossParams: Record<string, string | number | boolean>;
  loss: ReturnType<typeof resolveLoss>;
  base: ReturnType<typeof loadModel>;
  tok: ReturnType<typeof loadTokenizer>;
}

/** The run's stages, in order: data → reference → artifacts → loop → save. */
async function trainIn(o: TrainOptions, c0: Setup): Promise<TrainResult> {
  const t0 = Date.now();
  const log = o.log ?? (() => {});
  // Notes on what the run does: --quiet silences them on stderr (errors still speak); a caller's own
  // `log` still receives them.
  const info = o.quiet && !o.log ? () => {} : log;
  const resuming = !!o.resume && lastCheckpoint(o.out) !== null;
  if (o.resume && !resuming) info(`no checkpoint in ${o.out}; starting from the beginning`);
  const data = await dataStage(o, c0, resuming, info);
  const ref = await referenceStage(o, c0, data, resuming);
  const art = await artifactsStage(o, c0, data, ref, resuming, info);
  const done = await loopStage(o, c0, data, ref, art, resuming, info);
  const saved = await saveStage(o, c0, data, art, done, info);
  return { steps: saved.steps, seconds: (Date.now() - t0) / 1000, finalDir: saved.finalDir, config: c0.config, last: done.last, eval: saved.eval };
}

/** The data stage's result: tokenized rows and the training problem they make. */
interface DataStage {
  kind: Kind;
  rows: TokenizedExample[];
  adapter: ReturnType<typeof loadAdapter> | null;
  lora: LoraConfig | null;
  valueHeadOn: boolean;
  kl: boolean;
  packed: boolean;
  lengthWeighted: boolean;
  rationale: boolean;
  problem: TrainProblem;
}

/**
 * Data stage: the rows read (converted under RUN/data) and tokenized, checked against what the loss
 * needs (kind, columns, rationales, KTO's mismatched pairs), and the training problem (LoRA, value
 * head, packing) they make.
 */
async function dataStage(o: TrainOptions, c0: Setup, resuming: boolean, info: (l: string) => void): Promise<DataStage> {
  const { config, loss, base, tok } = c0;
  const run = o.out;
  const kinds = new Set(loss.kinds);
  const data: LoadedData = o.rows ?? (await loadData(o.data, join(run, 'data'), { seed: config.seed, maxRows: config.max_samples }));
  // SFT on conversations (single rows without reward or label, docs/data.md): the sft loss reads the
  // chosen side of a pair, so each row becomes a pair whose rejected response is empty — it scores
  // nothing, and with shared prompts computes nothing.
  const sftOnSingle = data.kind === 'single' && kinds.has('pairwise') && loss.terms.every((t) => t.loss.name === 'sft');
  if (!kinds.has(data.kind) && !sftOnSingle) {
    throw new UserError(`${o.data}: is ${data.kind} data; loss ${o.loss} needs ${[...kinds].join(' or ')} data`);
  }
  const kind: Kind = sftOnSingle ? 'pairwise' : data.kind;
  let { rows, truncated } = tokenizeExamples(data.examples, tok, config, data.tokens);
  const masked = rows.filter((r) => r.responseMasks).length;
  info(`data: ${rows.length} ${data.kind} rows from ${o.data}${sftOnSingle ? ' (conversations: sft on the assistant turns)' : ''}${masked ? `, ${masked} with tool calls or several turns (only the assistant's own tokens trained)` : ''}${truncated ? `, ${truncated} truncated to max_length ${config.max_length} / max_prompt_length ${config.max_prompt_length}` : ''}`);
  if (rows.some((r) => r.responseIds.some((x) => x.length === 0))) {
    throw new UserError(`${o.data}: a response is empty after tokenization and truncation (max_length ${config.max_length} leaves no room); raise max_length or lower max_prompt_length`);
  }
  if (sftOnSingle) {
    rows = rows.map((r) => ({ ...r, responseIds: [r.responseIds[0], []], ...(r.responseMasks ? { responseMasks: [r.responseMasks[0], []] } : {}) }));
  }

  const adapter = o.adapter ? loadAdapter(o.adapter, base.config) : null;
  if (adapter && config.lora_r > 0 && config.lora_r !== adapter.lora.rank) {
    throw new UserError(`--adapter ${o.adapter} has r=${adapter.lora.rank}; lora_r=${config.lora_r} contradicts it (leave lora_r unset)`);
  }
  const lora = adapter ? adapter.lora : loraOf(config);
  if (config.save_adapter && !lora) throw new UserError('save_adapter=true needs LoRA (set lora_r, or continue an adapter with --adapter)');
  const gamma = Math.max(0, ...loss.terms.map((t) => Number(t.params.rationale_weight ?? 0)));
  const rationale = kind === 'pairwise' && gamma > 0;
  if (rationale) {
    const r = tokenizeRationales(rows, tok, config);
    if (r.withRationale === 0) throw new UserError(`${o.data}: rationale_weight is ${gamma}, but no row has a rationale (column "rationale"; convert maps rationale/explanation fields, or --map rationale=FIELD)`);
    info(`rationales: ${r.withRationale} of ${rows.length} rows have one (the others add nothing to the rationale term)${r.truncated ? `, ${r.truncated} truncated` : ''}`);
  }
  const lengthWeighted = config.ld_alpha !== 1;
  if (lengthWeighted && kind !== 'pairwise') throw new UserError(`ld_alpha weights the tokens past the shorter response of a pair; ${o.data} is ${kind} data`);
  const valueHeadOn = loss.keys(kind).required.includes('values');
  const dataKeys = new Set<string>();
  const all = (f: (r: TokenizedExample) => boolean) => rows.every(f);
  if (all((r) => !!r.src.responseScores)) dataKeys.add('chosen_scores').add('rejected_scores');
  if (all((r) => !!r.src.winProbs)) dataKeys.add(kind === 'listwise' ? 'win_probs' : 'chosen_probs').add('rejected_probs');
  if (all((r) => r.src.reward !== undefined || r.src.label !== undefined)) dataKeys.add('rewards');
  if (all((r) => r.src.label !== undefined)) dataKeys.add('labels');
  {
    const missing = loss.keys(kind).required.filter((k) => !PROVIDED_KEYS.has(k) && !dataKeys.has(k));
    // Name the data's columns (docs/data.md), not the batch keys the loss reads.
    const column: Record<string, string> = { chosen_probs: 'chosen_prob', rejected_probs: 'rejected_prob', chosen_scores: 'chosen_score', rejected_scores: 'rejected_score', rewards: 'reward', labels: 'label' };
    const cols = [...new Set(missing.map((k) => column[k] ?? k))];
    if (missing.length) throw new UserError(`${o.data}: loss ${o.loss} needs column${cols.length > 1 ? 's' : ''} ${cols.join(', ')}, which the data does not have in every row`);
  }
  // KTO's KL estimate: each row's prompt with the next row's response (fixed pairing, so cacheable).
  const kl = kind === 'single' && (loss.keys(kind).oneOf ?? []).some((set) => set.includes('policy_kl_logps'));
  if (kl) {
    if (rows.length < 2) throw new UserError(`${o.data}: loss ${o.loss} needs at least 2 rows (its KL estimate pairs each prompt with another row's response)`);
    rows.forEach((r, i) => {
      const other = rows[(i + 1) % rows.length].responseIds[0];
      r.klResponseIds = other.slice(0, Math.max(1, config.max_length - r.promptIds.length));
    });
  }
  // A resumed run keeps the batch layout its artifacts were built with.
  const builtWith = resuming ? readBuiltLayout(join(run, 'artifacts')) : null;
  const packed = builtWith ?? (config.share_prompt && canPack(kind, kl) && !valueHeadOn);
  const problem = problemOf(config, { model: base.config, kind, loss, lora, dataKeys, packed });
  return { kind, rows, adapter, lora, valueHeadOn, kl, packed, lengthWeighted, rationale, problem };
}

/** The reference stage's result: the reference model, and its log-probs cached per row or scored per batch. */
interface ReferenceStage {
  reference: ReferenceModel;
  /** TR-DPO: the reference moves toward the policy. */
  sync: boolean;
  /** Cached log-probs per row (data order); empty when they are scored per batch. */
  ref: number[][];
  /** Scores every batch (ref_on_the_fly, TR-DPO). */
  refScorer: Scorer | null;
}

/**
 * Reference stage: --ref's model, else the starting policy (the base model with --adapter's adapter
 * merged in, LoRA's fresh adapters being zero). Its log-probs are scored once and cached in the run,
 * or for every batch (ref_on_the_fly, and always under TR-DPO, whose reference moves: a resumed run
 * reads where it had moved from its checkpoint). Writes config.json.
 */
async function referenceStage(o: TrainOptions, c0: Setup, d: DataStage, resuming: boolean): Promise<ReferenceStage> {
  const { config, lossParams, base, tok } = c0;
  const { kind, rows, adapter, kl } = d;
  const run = o.out;
  const reference: ReferenceModel = o.refModel
    ? loadReferenceModel(o.refModel, o.model, base.config)
    : adapter
      ? { config: base.config, weights: mergeLora(new Map([...base.weights, ...adapter.weights]), base.config, adapter.lora), identity: `model:${resolve(o.model)}+adapter:${resolve(o.adapter!)}` }
      : config.base_dtype === 'float16'
        ? // With float16 base weights the reference is that same rounded base (adapters off), as PEFT's is.
          { config: base.config, weights: roundedToF16(base.weights), identity: `model:${resolve(o.model)}+float16` }
        : { config: base.config, weights: base.weights, identity: `model:${resolve(o.model)}` };
  const sync = config.sync_ref_model;
  if (sync) {
    if (!sameParameters(reference.config, base.config)) {
      throw new UserError(`sync_ref_model: the reference ${o.refModel} and the policy ${o.model} have different parameters, so ref ← α·policy + (1 − α)·ref is undefined; use a reference of the policy's architecture and size`);
    }
    reference.weights = copyWeights(reference.weights);
    const ck = resuming ? lastCheckpoint(run) : null;
    if (ck) {
      const f = join(ck, REFERENCE_FILE);
      if (!existsSync(f)) throw new UserError(`${ck}: no ${REFERENCE_FILE}; this run was checkpointed without sync_ref_model, so it cannot resume with it`);
      for (const [name, t] of readSafetensors(f).tensors) {
        const w = reference.weights.get(name);
        if (!w || w.data.length !== t.shape.reduce((a, b) => a * b, 1)) throw new UserError(`${f}: tensor "${name}" is not a parameter of the reference`);
        w.data.set(tensorToFloat32(t));
      }
    }
  }
  writeJsonAtomic(join(run, 'config.json'), { model: o.model, data: o.data, loss: o.loss, kind, ref: o.refModel ?? null, adapter: o.adapter ?? null, ...config, loss_params: lossParams });
  // The cache records what made it (identity.ts) and is reused only when all of it is the same.
  const refFile = join(run, 'data', 'reference.parquet');
  const idFile = join(run, 'data', 'reference.json');
  const identity = refCacheIdentity({ reference: reference.identity, model: o.model, refModel: o.refModel, adapter: o.adapter, data: o.data, truncation: config, rows, loss: o.loss, kind, kl });
  const cached = !(config.ref_on_the_fly || sync) && existsSync(refFile) ? readIdentity(idFile) : null;
  let ref: number[][] = [];
  let refScorer: Scorer | null = null;
  if (config.ref_on_the_fly || sync) {
    refScorer = await Scorer.create(reference.config, reference.weights, runtimeOf(config, reference.config), tok.padId ?? 0);
  } else if (cached) {
    const diff = identityDiff(cached, identity);
    if (diff.length) {
      throw new UserError(`${refFile}: cached by a run with different ${diff.join(', ')}; a run keeps its reference: resume with the inputs it was started with, or start again with --overwrite`);
    }
    ref = (await readRefColumns(refFile, kind)) ?? [];
    if (ref.length !== rows.length) throw new UserError(`${refFile}: ${ref.length} rows cached, the data has ${rows.length}; start again with --overwrite`);
  } else {
    // No cache, or one without its record (the run stopped between the two writes): compute it.
    rmSync(idFile, { force: true });
    const scorer = await Scorer.create(reference.config, reference.weights, runtimeOf(config, reference.config), tok.padId ?? 0);
    ref = (await scorer.score(kind, rows, { batchSize: config.batch_size * 2, padTo: config.pad_to_multiple_of, label: 'reference log-probs', progress: o.quiet ? undefined : o.progress })).logps;
    if (kl) {
      // The KL sequences are scored whole (the other row's mask does not travel with its ids).
      const mismatched = rows.map((r) => ({ ...r, responseIds: [r.klResponseIds!], responseMasks: undefined }));
      const refKl = (await scorer.score(kind, mismatched, { batchSize: config.batch_size * 2, padTo: config.pad_to_multiple_of, label: 'reference log-probs (KL pairs)', progress: o.quiet ? undefined : o.progress })).logps;
      ref = ref.map((r, i) => [r[0], refKl[i][0]]);
    }
    await scorer.release();
    mkdirSync(join(run, 'data'), { recursive: true });
    await writeRefColumns(refFile, kind, ref);
    writeIdentity(idFile, identity);
  }
  return { reference, sync, ref, refScorer };
}

/**
 * Artifacts stage: the training graphs built once per run (a resumed run reuses them; written for
 * the device, WebGPU's lowered), then loaded. The loaded starting weights are let go of first when
 * nothing reads them again.
 */
async function artifactsStage(o: TrainOptions, c0: Setup, d: DataStage, r: ReferenceStage, resuming: boolean, info: (l: string) => void): Promise<TrainingArtifacts> {
  const { config, base } = c0;
  const artDir = join(o.out, 'artifacts');
  ensureArtifacts(artDir, config, resuming, () => {
    const init = startingParams(base.config, base.weights, { lora: d.lora, adapter: d.adapter?.weights, valueHead: d.valueHeadOn, seed: config.seed });
    return problemSpec(d.problem, init, config);
  });
  // The artifacts' checkpoint holds the starting weights now: unless a reference scorer, the held-out
  // evaluation or TR-DPO reads the loaded copy again, drop it before the store takes its own (a parameter-sized copy).
  if (!r.refScorer && !config.eval_data && !r.sync) {
    base.weights.clear();
    if (lowMemoryFor(config.gradient_checkpointing, countParameters(base.config))) collectGarbage();
  }
  const art = await TrainingArtifacts.load(artDir, runtimeOf(config, base.config));
  info(`steps: ${d.packed ? 'each prompt computed once for all its responses' : 'one sequence per response'}; optimizer update ${art.updater === 'host' ? 'in place in this process' : 'in the optimizer graph'}`);
  const advice = mallocAdvice(config.gradient_checkpointing, config.device);
  if (advice) info(advice);
  if (config.device !== 'cpu') {
    const graph = join(artDir, (art.manifest.step ?? art.manifest.training).file);
    info(`device ${config.device}: step graph nodes ${describePlacement(await placement(graph, runtimeOf(config, base.config)))}; parameters, optimizer state and gradients stay on the device`);
  }
  return art;
}

/** What the loop stage hands to the save stage. */
interface LoopDone {
  totalSteps: number;
  last: Record<string, number>;
  best: Best | null;
  metrics: MetricsLog;
  evaluator: Evaluator | null;
  sampler: EvalSampler | null;
}

/**
 * Loop stage: optimizer steps (`optimizerUpdate` over gradient_accumulation_steps micro-batches of a
 * seeded shuffle) until the step plan's total, with metrics rows, progress, the NaN stop, TR-DPO's
 * reference updates, held-out evaluations (and the best checkpoint), checkpoints every save_steps
 * and at the end. A resumed run continues from its newest checkpoint.
 */
async function loopStage(o: TrainOptions, c0: Setup, d: DataStage, r: ReferenceStage, art: TrainingArtifacts, resuming: boolean, info: (l: string) => void): Promise<LoopDone> {
  const { config, lossParams, base, tok } = c0;
  const { kind, rows, lora, kl, packed, lengthWeighted, rationale, valueHeadOn } = d;
  const { reference, sync, ref, refScorer } = r;
  const run = o.out;
  const perEpoch = Math.ceil(rows.length / config.batch_size);
  const stepsPerEpoch = Math.max(1, Math.floor(perEpoch / config.gradient_accumulation_steps));
  const { total: totalSteps, schedule } = stepPlan(config, stepsPerEpoch);

  // Issue 17 (items 6, 7): cumulative tokens, the best checkpoint so far, TensorBoard, eval samples.
  let numTokens = 0;
  let best: Best | null = null;
  let at = { epoch: 0, index: 0 };
  const bestMetric = bestMetricName(kind, config.metric_for_best_model);
  if (resuming) {
    const ck = lastCheckpoint(run)!;
    const state = art.loadCheckpoint(ck);
    at = state.dataCursor as { epoch: number; index: number };
    numTokens = typeof state.num_tokens === 'number' ? state.num_tokens : 0;
    best = (state.best as Best | undefined) ?? null;
    info(`resuming from ${ck} (step ${state.step})`);
  }
  const order = new ItemOrder(rows.length, config.seed, at.epoch, at.index);

  // Held-out evaluation: data and reference scores prepared once, the policy scored every eval_steps.
  const evaluator = config.eval_data
    ? await Evaluator.create({
        ref: { config: reference.config, weights: reference.weights },
        tokenizer: o.model,
        data: config.eval_data,
        workDir: join(run, 'data'),
        params: lossParams,
        runtime: runtimeOf(config, reference.config),
        quiet: true,
        truncation: config,
        batchSize: config.batch_size * 2,
        maxRows: config.eval_samples,
      })
    : null;
  /** The current weights as an HF model: adapters merged. */
  const currentWeights = (): Map<string, FloatTensor> => {
    const w = artifactWeights(art);
    return lora ? mergeLora(w, base.config, lora) : w;
  };
  const sampler =
    evaluator && config.eval_generate > 0
      ? new EvalSampler({ run, prompts: evaluator.prompts(config.eval_generate), tok, ref: { config: reference.config, weights: reference.weights }, maxNewTokens: config.eval_generate_max_new_tokens, runtime: runtimeOf(config, reference.config) })
      : null;
  const metrics = MetricsLog.open(run, { step: art.step, tensorboard: config.report_to === 'tensorboard', resuming });
  /** Evaluates the current weights at `step`: a metrics row, samples, and the best checkpoint so far. */
  const evaluateAt = async (step: number): Promise<void> => {
    await art.toHost();
    const weights = { config: base.config, weights: currentWeights() };
    const ev = await evaluator!.evaluate(weights, { quiet: true });
    metrics.row({ step, split: 'eval', ...ev.overall });
    if (sampler) await sampler.write(step, weights);
    if (config.load_best_model_at_end) {
      const value = metricValue(ev.overall, bestMetric);
      if (improves(value, best, bestMetric)) best = { step, metric: bestMetric, value, checkpoint: relative(run, stepDir(run, step)) };
    }
  };
  const refOf = new Map(config.ref_on_the_fly ? [] : rows.map((row, i) => [row, ref[i]]));
  /** One micro-batch: the next batch_size rows (reference log-probs scored now when they are not cached). */
  const microBatch = async (): Promise<MicroBatch> => {
    const batch = order.take(config.batch_size).map((i) => rows[i]);
    if (refScorer) {
      const fresh = await refScorer.score(kind, batch, { batchSize: batch.length, padTo: config.pad_to_multiple_of });
      const freshKl = kl ? await refScorer.score(kind, batch.map((row) => ({ ...row, responseIds: [row.klResponseIds!], responseMasks: undefined })), { batchSize: batch.length, padTo: config.pad_to_multiple_of }) : null;
      batch.forEach((ex, i) => refOf.set(ex, freshKl ? [fresh.logps[i][0], freshKl.logps[i][0]] : fresh.logps[i]));
    }
    const c = collate(batch, {
      kind,
      padTo: config.pad_to_multiple_of,
      padId: tok.padId ?? 0,
      dtype: 'float32',
      refLogps: (ex) => refOf.get(ex)!,
      valueIndex: valueHeadOn,
      kl,
      packed,
      ldAlpha: lengthWeighted ? config.ld_alpha : undefined,
      rationale,
    });
    return { feeds: c.feeds, tokens: c.tokens };
  };
  const progress = startProgress(o.progress, 'train', totalSteps, o.quiet);
  let last: Record<string, number> = {};
  const stepRows = new StepRows(numTokens);
  while (art.step < totalSteps) {
    const step = art.step + 1;
    const lr = lrAt(step, schedule);
    const up = await optimizerUpdate(art, { step, lr, micro: config.gradient_accumulation_steps, batch: microBatch });
    if (!Number.isFinite(up.metrics.loss)) {
      progress.stop();
      await art.release();
      throw nonFiniteLoss(run, art, up.metrics.loss, step);
    }
    const row = stepRows.row(step, order.epochs, up, lr);
    last = row;
    if (step % config.logging_steps === 0 || step === totalSteps) metrics.row(row);
    const acc = up.metrics['rewards/accuracies'];
    progress.update(step, { loss: up.metrics.loss, ...(acc !== undefined ? { acc } : {}), 'tok/s': row['tokens/s'] });
    if (sync && step % config.ref_model_sync_steps === 0) {
      // In place: the reference scorer's parameter feeds are views of these arrays, so its next batch
      // already sees the updated reference.
      await art.toHost();
      softUpdate(reference.weights, currentWeights(), config.ref_model_mixup_alpha);
    }
    // The last step is evaluated after the final model is saved, unless the best checkpoint is
    // being tracked: then it is a candidate like any other evaluation.
    const evalNow = evaluator && config.eval_steps > 0 && step % config.eval_steps === 0 && (step !== totalSteps || config.load_best_model_at_end);
    if (evalNow) await evaluateAt(step);
    if ((config.save_steps > 0 && step % config.save_steps === 0) || step === totalSteps || (evalNow && config.load_best_model_at_end)) {
      const files: Record<string, Map<string, CheckpointTensor>> = sync ? { [REFERENCE_FILE]: new Map([...reference.weights].map(([k, t]) => [k, { dtype: 'float32' as const, shape: t.shape, data: t.data }])) } : {};
      await saveCheckpointAt(run, art, { epoch: order.epoch, dataCursor: order.cursor, rng: { seed: config.seed }, config, num_tokens: stepRows.numTokens }, { limit: config.save_total_limit, best, files });
    }
  }
  progress.stop();
  await refScorer?.release();
  return { totalSteps, last, best, metrics, evaluator, sampler };
}

/**
 * Save stage: the final model in HF layout (base weights with adapters merged, the value head saved
 * beside; with load_best_model_at_end the weights of the best checkpoint), the adapter alone in PEFT's
 * layout on request, then the final held-out evaluation (eval.json and its metrics row).
 */
async function saveStage(o: TrainOptions, c0: Setup, d: DataStage, art: TrainingArtifacts, done: LoopDone, info: (l: string) => void): Promise<{ steps: number; finalDir: string; eval?: EvalSummary }> {
  const { config, base } = c0;
  const { lora } = d;
  const { totalSteps, evaluator, sampler, metrics } = done;
  const run = o.out;
  await art.toHost();
  const chosen = config.load_best_model_at_end ? done.best : null;
  if (chosen && chosen.step !== art.step) {
    const dir = stepDir(run, chosen.step);
    if (!completeCheckpoints(run).includes(dir)) throw new UserError(`${dir}: the best checkpoint is missing; cannot load it`);
    art.loadCheckpoint(dir);
    info(`final model: the best checkpoint (step ${chosen.step}, ${chosen.metric} ${chosen.value})`);
  }
  const weightsNow = artifactWeights(art);
  const finalDir = saveTrained(run, weightsNow, { config, model: base.config, lora, sourceDir: o.model });
  await art.release();

  let evalSummary: EvalSummary | undefined;
  if (evaluator) {
    const finalModel = { config: base.config, weights: lora ? mergeLora(weightsNow, base.config, lora) : weightsNow };
    evalSummary = await evaluator.evaluate(finalModel, { quiet: true });
    writeJsonAtomic(join(run, 'eval.json'), { ...evalSummary.overall, ...(chosen ? { best_step: chosen.step } : {}) });
    // With load_best_model_at_end the last step was evaluated in the loop (when it is an eval step).
    if (!config.load_best_model_at_end) {
      metrics.row({ step: totalSteps, split: 'eval', ...evalSummary.overall });
      if (sampler) await sampler.write(totalSteps, finalModel);
    }
  }
  return { steps: totalSteps, finalDir, eval: evalSummary };
}

/** Whether the artifacts in `dir` take packed (shared-prompt) batches; null when there are none yet. */
function readBuiltLayout(dir: string): boolean | null {
  if (!existsSync(join(dir, 'artifacts.json'))) return null;
  return readManifest(dir).batchInputs.some((b) => b.name === 'segment_ids');
}

/** Weights rounded to float16 precision (and back to float32). */
function roundedToF16(w: Map<string, FloatTensor>): Map<string, FloatTensor> {
  return new Map([...w].map(([k, t]) => [k, { shape: t.shape, data: Float32Array.from(float32ToF16(t.data), f16BitsToFloat) }]));
}
