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
import { existsSync, mkdirSync, readdirSync, readFileSync, rmSync } from 'node:fs';
import { join, relative, resolve } from 'node:path';
import { appendLine, sweepStaleTemps, writeFileAtomic } from '../io/atomic.ts';
import type { Kind } from '../../datasets/schema.ts';
import { UserError } from '../errors.ts';
import { startProgress } from '../progress.ts';
import { buildArtifacts } from '../artifacts/build.ts';
import { collectGarbage } from '../runtime/gc.ts';
import { mallocAdvice } from '../runtime/malloc.ts';
import { TrainingArtifacts } from '../artifacts/training.ts';
import { loadModel } from '../models/load.ts';
import { countParameters } from '../models/config.ts';
import type { FloatTensor } from '../models/checkpoint.ts';
import { mergeLora, type LoraConfig } from '../models/index.ts';
import { loadAdapter, saveAdapter } from '../models/peft.ts';
import { readSafetensors, tensorToFloat32 } from '../models/safetensors.ts';
import type { CheckpointTensor } from '../artifacts/checkpoint.ts';
import { copyWeights, loadReferenceModel, sameParameters, softUpdate, type ReferenceModel } from './reference.ts';
import { identityDiff, readIdentity, refCacheIdentity, writeIdentity } from './identity.ts';
import { tokenizeRationales } from './rationale.ts';
import { loadTokenizer } from '../tokenize/index.ts';
import { lrAt } from '../optim/schedule.ts';
import type { OptimizerConfig } from '../optim/config.ts';
import { describePlacement, placement } from '../runtime/placement.ts';
import { resolveConfig, type TrainConfig } from './config.ts';
import { currentWeights as artifactWeights, artifactsOf, builtFor, checkDeviceOf, loraOf, lowMemoryFor, runtimeOf, saveModelFolder, startingParams, stepPlan, type LoopOptions } from './run.ts';
import { writeJsonAtomic } from '../io/atomic.ts';
import { loadData, tokenizeExamples, type LoadedData, type TokenizedExample } from '../../datasets/examples.ts';
import { canPack, collate } from '../models/batch.ts';
import { readManifest } from '../artifacts/manifest.ts';
import { readRefColumns, writeRefColumns } from '../../datasets/tokenized.ts';
import { PROVIDED_KEYS } from './graph.ts';
import { problemOf, problemSpec } from './problem.ts';
import { f16BitsToFloat, float32ToF16 } from '../models/safetensors.ts';
import { resolveLoss } from '../../losses/index.ts';
import { SeededRandom } from '../random.ts';
import { Scorer } from '../models/scorer.ts';
import { Evaluator, type EvalSummary } from '../eval/evaluate.ts';
import { CKPT_DIR, bestMetricName, completeCheckpoints, improves, metricValue, pruneCheckpoints, stepDir, type Best } from './checkpoints.ts';
import { TensorBoardWriter } from './tensorboard.ts';
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

/** The newest complete checkpoint (state.json present: it is written last, then the folder renamed). */
export function lastCheckpoint(run: string): string | null {
  const all = completeCheckpoints(run);
  return all.length ? all[all.length - 1] : null;
}

/** Order of examples in an epoch: a seeded shuffle, the same on resume. */
function epochOrder(n: number, seed: number, epoch: number): number[] {
  return new SeededRandom(seed * 1000003 + epoch).shuffle(Array.from({ length: n }, (_, i) => i));
}

/** A fault hook for tests: poisons the reference log-probs of one step so the loss turns NaN. */
function faultStep(): number {
  const v = process.env.PREFZOO_FAULT_NAN_AT_STEP;
  return v ? Number(v) : -1;
}

/** What a run folder may hold (what `train` and MPO's stages write); --overwrite removes only these. */
const RUN_ENTRIES = /^(config\.json|data|artifacts|checkpoints|metrics\.jsonl|runs|samples|best\.json|final|adapter|eval\.json|report\.html|stage[12])$/;

/**
 * Makes `run` ready for a run: created when missing; a folder holding an earlier run is refused
 * unless the call resumes it or `overwrite` clears it (only a run's own entries are removed).
 * Temporaries a killed process left are swept first. Returns whether the folder is new (empty).
 */
export function prepareRunFolder(run: string, o: { resume?: boolean; overwrite?: boolean }): boolean {
  if (!existsSync(run)) {
    mkdirSync(run, { recursive: true });
    return true;
  }
  sweepStaleTemps(run, true);
  const entries = readdirSync(run);
  if (entries.length === 0) return true;
  if (o.resume) return false;
  if (!o.overwrite) {
    throw new UserError(`${run}: not empty (holds ${entries.slice(0, 4).join(', ')}${entries.length > 4 ? ', …' : ''}); continue that run with --resume, replace it with --overwrite, or choose another -o`);
  }
  const foreign = entries.filter((e) => !RUN_ENTRIES.test(e));
  if (foreign.length) throw new UserError(`${run}: --overwrite removes only a run's own files, and this folder also holds ${foreign.slice(0, 4).join(', ')}; choose another -o`);
  for (const e of entries) rmSync(join(run, e), { recursive: true, force: true });
  return true;
}

/** --resume continues a run only with the model, data, loss and reference it was started with. */
function checkSameRun(run: string, o: TrainOptions): void {
  const file = join(run, 'config.json');
  if (!existsSync(file)) return;
  let was: { model?: string; data?: string; loss?: string; ref?: string | null };
  try {
    was = JSON.parse(readFileSync(file, 'utf8'));
  } catch {
    throw new UserError(`${file}: not valid JSON; the run cannot be resumed (start it again with --overwrite)`);
  }
  const same = (a: string | null | undefined, b: string | null | undefined) => (a ?? null) === (b ?? null) || (!!a && !!b && resolve(a) === resolve(b));
  const diff = [
    !same(was.model, o.model) ? `--model ${was.model}` : null,
    !o.rows && !same(was.data, o.data) ? `--data ${was.data}` : null,
    (was.loss ?? '').trim() !== o.loss.trim() ? `--loss ${was.loss}` : null,
    'ref' in was && !same(was.ref, o.refModel) ? (was.ref ? `--ref ${was.ref}` : 'no --ref') : null,
  ].filter(Boolean);
  if (diff.length) throw new UserError(`--resume: ${run} was started with ${diff.join(', ')}; resume it with those, or start a new run (another -o, or --overwrite)`);
}

export async function train(o: TrainOptions): Promise<TrainResult> {
  const run = o.out;
  const { config, lossParams } = resolveConfig({ configFile: o.configFile, params: o.params, base: o.base });
  const loss = resolveLoss(o.loss, lossParams);
  // A device that cannot run here stops the run before anything is read or written.
  await checkDeviceOf(config);
  // Model and tokenizer first: a bad model folder leaves no run folder behind.
  const base = loadModel(o.model);
  const tok = loadTokenizer(o.model, { chatTemplateFile: config.chat_template || undefined });
  const fresh = prepareRunFolder(run, o);
  if (o.resume && !fresh) checkSameRun(run, o);
  try {
    return await trainIn(o, { config, lossParams, loss, base, tok });
  } catch (e) {
    // A run that failed before its first checkpoint holds nothing to resume: leave no folder behind.
    if (fresh && lastCheckpoint(run) === null) rmSync(run, { recursive: true, force: true });
    throw e;
  }
}

async function trainIn(
  o: TrainOptions,
  c0: { config: TrainConfig; lossParams: Record<string, string | number | boolean>; loss: ReturnType<typeof resolveLoss>; base: ReturnType<typeof loadModel>; tok: ReturnType<typeof loadTokenizer> },
): Promise<TrainResult> {
  const t0 = Date.now();
  const log = o.log ?? (() => {});
  // Notes on what the run does: --quiet silences them on stderr (errors still speak); a caller's own
  // `log` still receives them.
  const info = o.quiet && !o.log ? () => {} : log;
  const run = o.out;
  const { config, lossParams, loss, base, tok } = c0;
  const resuming = !!o.resume && lastCheckpoint(run) !== null;
  if (o.resume && !resuming) info(`no checkpoint in ${run}; starting from the beginning`);
  const kinds = new Set(loss.kinds);
  const data: LoadedData = o.rows ?? (await loadData(o.data, join(run, 'data'), { seed: config.seed, maxRows: config.max_samples }));
  if (!kinds.has(data.kind)) {
    throw new UserError(`${o.data}: is ${data.kind} data; loss ${o.loss} needs ${[...kinds].join(' or ')} data`);
  }
  const kind: Kind = data.kind;
  const { rows, truncated } = tokenizeExamples(data.examples, tok, config, data.tokens);
  info(`data: ${rows.length} ${kind} rows from ${o.data}${truncated ? `, ${truncated} truncated to max_length ${config.max_length} / max_prompt_length ${config.max_prompt_length}` : ''}`);
  if (rows.some((r) => r.responseIds.some((x) => x.length === 0))) {
    throw new UserError(`${o.data}: a response is empty after tokenization and truncation (max_length ${config.max_length} leaves no room); raise max_length or lower max_prompt_length`);
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

  // The reference: --ref's model, else the starting policy (the base model with --adapter's adapter
  // merged in, LoRA's fresh adapters being zero). Its log-probs are scored once and cached in the run,
  // or for every batch (ref_on_the_fly, and always under TR-DPO, whose reference moves).
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
      const mismatched = rows.map((r) => ({ ...r, responseIds: [r.klResponseIds!] }));
      const refKl = (await scorer.score(kind, mismatched, { batchSize: config.batch_size * 2, padTo: config.pad_to_multiple_of, label: 'reference log-probs (KL pairs)', progress: o.quiet ? undefined : o.progress })).logps;
      ref = ref.map((r, i) => [r[0], refKl[i][0]]);
    }
    await scorer.release();
    mkdirSync(join(run, 'data'), { recursive: true });
    await writeRefColumns(refFile, kind, ref);
    writeIdentity(idFile, identity);
  }

  // Steps.
  const perEpoch = Math.ceil(rows.length / config.batch_size);
  const stepsPerEpoch = Math.max(1, Math.floor(perEpoch / config.gradient_accumulation_steps));
  const { total: totalSteps, schedule } = stepPlan(config, stepsPerEpoch);

  // Artifacts: built once per run (a resumed run reuses them).
  const artDir = join(run, 'artifacts');
  // Graphs are written for the device (WebGPU's are lowered; they run on the CPU too). A resumed run
  // on another device gets graphs for it; its checkpoints carry over, being stored by name.
  if (!resuming || !existsSync(join(artDir, 'artifacts.json')) || !builtFor(readManifest(artDir), config)) {
    const init = startingParams(base.config, base.weights, { lora, adapter: adapter?.weights, valueHead: valueHeadOn, seed: config.seed });
    rmSync(artDir, { recursive: true, force: true });
    buildArtifacts(problemSpec(problem, init, config), artDir, artifactsOf(config));
  }
  // The artifacts' checkpoint holds the starting weights now: unless a reference scorer, the held-out
  // evaluation or TR-DPO reads the loaded copy again, drop it before the store takes its own (a parameter-sized copy).
  if (!refScorer && !config.eval_data && !sync) {
    base.weights.clear();
    if (lowMemoryFor(config.gradient_checkpointing, countParameters(base.config))) collectGarbage();
  }
  const art = await TrainingArtifacts.load(artDir, runtimeOf(config, base.config));
  info(`steps: ${packed ? 'each prompt computed once for all its responses' : 'one sequence per response'}; optimizer update ${art.updater === 'host' ? 'in place in this process' : 'in the optimizer graph'}`);
  const advice = mallocAdvice(config.gradient_checkpointing, config.device);
  if (advice) info(advice);
  if (config.device !== 'cpu') {
    const graph = join(artDir, (art.manifest.step ?? art.manifest.training).file);
    info(`device ${config.device}: step graph nodes ${describePlacement(await placement(graph, runtimeOf(config, base.config)))}; parameters, optimizer state and gradients stay on the device`);
  }

  let epoch = 0;
  let cursor = 0;
  // Issue 17 (items 6, 7): cumulative tokens, the best checkpoint so far, TensorBoard, eval samples.
  let numTokens = 0;
  let best: Best | null = null;
  const bestMetric = bestMetricName(kind, config.metric_for_best_model);
  if (resuming) {
    const ck = lastCheckpoint(run)!;
    const state = art.loadCheckpoint(ck);
    const c = state.dataCursor as { epoch: number; index: number };
    epoch = c.epoch;
    cursor = c.index;
    numTokens = typeof state.num_tokens === 'number' ? state.num_tokens : 0;
    best = (state.best as Best | undefined) ?? null;
    info(`resuming from ${ck} (step ${state.step})`);
  }
  const tb = config.report_to === 'tensorboard' ? TensorBoardWriter.open(join(run, 'runs'), resuming ? { resumeStep: art.step } : {}) : null;

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
  const metricsFile = join(run, 'metrics.jsonl');
  /** One metrics.jsonl row (and the same scalars under train/ or eval/ in TensorBoard). */
  const logRow = (row: Record<string, unknown>) => {
    appendLine(metricsFile, JSON.stringify(row));
    const { step: at, split, ...values } = row;
    tb?.scalars(at as number, Object.fromEntries(Object.entries(values).map(([k, v]) => [`${split === 'eval' ? 'eval' : 'train'}/${k}`, v])));
  };
  /** Evaluates the current weights at `step`: a metrics row, samples, and the best checkpoint so far. */
  const evaluateAt = async (step: number): Promise<void> => {
    await art.toHost();
    const weights = { config: base.config, weights: currentWeights() };
    const ev = await evaluator!.evaluate(weights, { quiet: true });
    logRow({ step, split: 'eval', ...ev.overall });
    if (sampler) await sampler.write(step, weights);
    if (config.load_best_model_at_end) {
      const value = metricValue(ev.overall, bestMetric);
      if (improves(value, best, bestMetric)) best = { step, metric: bestMetric, value, checkpoint: relative(run, stepDir(run, step)) };
    }
  };
  if (existsSync(metricsFile)) {
    // Drop rows logged after the checkpoint we resume from (all of them when a --resume found no
    // complete checkpoint and starts over): they will be logged again.
    const kept = readFileSync(metricsFile, 'utf8').split('\n').filter((l) => l.trim() && JSON.parse(l).step <= art.step);
    writeFileAtomic(metricsFile, kept.map((l) => l + '\n').join(''));
  }
  let order = epochOrder(rows.length, config.seed, epoch);
  const nextBatch = (): TokenizedExample[] => {
    if (cursor >= rows.length) {
      epoch++;
      cursor = 0;
      order = epochOrder(rows.length, config.seed, epoch);
    }
    const idx = order.slice(cursor, cursor + config.batch_size);
    cursor += idx.length;
    return idx.map((i) => rows[i]);
  };
  const refOf = new Map(config.ref_on_the_fly ? [] : rows.map((r, i) => [r, ref[i]]));
  const fault = faultStep();
  const progress = startProgress(o.progress, 'train', totalSteps, o.quiet);
  let last: Record<string, number> = {};
  let tokensSeen = 0;
  const tStart = Date.now();
  while (art.step < totalSteps) {
    const step = art.step + 1;
    const sums: Record<string, number> = {};
    let tokens = 0;
    const lr = lrAt(step, schedule);
    let gradNorm = NaN;
    for (let micro = 0; micro < config.gradient_accumulation_steps; micro++) {
      const batch = nextBatch();
      if (refScorer) {
        const fresh = await refScorer.score(kind, batch, { batchSize: batch.length, padTo: config.pad_to_multiple_of });
        const freshKl = kl ? await refScorer.score(kind, batch.map((r) => ({ ...r, responseIds: [r.klResponseIds!] })), { batchSize: batch.length, padTo: config.pad_to_multiple_of }) : null;
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
      if (step === fault) (c.feeds.ref_logps.data as Float32Array).fill(NaN);
      // The last micro-batch applies the update (one fused graph run when nothing was accumulated);
      // ONNX Runtime keeps the old parameters when that batch's loss is not finite.
      const final = micro === config.gradient_accumulation_steps - 1;
      const m = await art.trainStep(c.feeds, { lr, accumulate: !final });
      if (final) gradNorm = m.grad_norm;
      delete m.grad_norm;
      for (const [k, v] of Object.entries(m)) sums[k] = (sums[k] ?? 0) + v;
      tokens += c.tokens;
      // A non-finite micro-batch poisons the sum: stop before any update is applied.
      if (!Number.isFinite(m.loss)) {
        sums.loss = m.loss;
        break;
      }
    }
    const micro = config.gradient_accumulation_steps;
    const metrics: Record<string, number> = {};
    for (const [k, v] of Object.entries(sums)) metrics[k] = v / micro;
    if (!Number.isFinite(metrics.loss)) {
      progress.stop();
      await art.release();
      const good = lastCheckpoint(run);
      // Before any update the learning rate cannot be the cause: the inputs to the first step are.
      const advice =
        art.step === 0
          ? 'No update had been applied yet, so the learning rate is not the cause: the starting weights, the reference log-probs or a loss parameter give a non-finite loss.'
          : good
            ? `The last good checkpoint is ${good} (resume with --resume after lowering learning_rate).`
            : 'No checkpoint was written yet (lower learning_rate and start again).';
      throw new UserError(`loss is ${metrics.loss} at step ${step}: stopping without applying the update. ${advice}`);
    }
    tokensSeen += tokens;
    numTokens += tokens;
    const row = {
      step,
      epoch: Math.round((epoch + cursor / rows.length) * 1e4) / 1e4,
      ...metrics,
      grad_norm: gradNorm,
      learning_rate: lr,
      tokens: tokens,
      num_tokens: numTokens,
      'tokens/s': Math.round(tokensSeen / ((Date.now() - tStart) / 1000)),
    };
    last = row;
    if (step % config.logging_steps === 0 || step === totalSteps) logRow(row);
    const acc = metrics['rewards/accuracies'];
    progress.update(step, { loss: metrics.loss, ...(acc !== undefined ? { acc } : {}), 'tok/s': row['tokens/s'] });
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
      const dir = stepDir(run, step);
      mkdirSync(join(run, CKPT_DIR), { recursive: true });
      await art.toHost();
      const bestNow = best as Best | null;
      const files: Record<string, Map<string, CheckpointTensor>> = sync ? { [REFERENCE_FILE]: new Map([...reference.weights].map(([k, t]) => [k, { dtype: 'float32' as const, shape: t.shape, data: t.data }])) } : {};
      art.saveCheckpoint(dir, { epoch, dataCursor: { epoch, index: cursor }, rng: { seed: config.seed }, config, num_tokens: numTokens, ...(bestNow ? { best: bestNow } : {}) }, files);
      if (bestNow) writeJsonAtomic(join(run, 'best.json'), bestNow);
      pruneCheckpoints(run, config.save_total_limit, bestNow ? stepDir(run, bestNow.step) : null);
    }
  }
  progress.stop();
  await refScorer?.release();

  // Final model in HF layout: base weights with adapters merged (the value head saved beside), with
  // load_best_model_at_end the weights of the best checkpoint; the adapter alone in PEFT's layout on request.
  await art.toHost();
  const chosen = config.load_best_model_at_end ? (best as Best | null) : null;
  if (chosen && chosen.step !== art.step) {
    const dir = stepDir(run, chosen.step);
    if (!completeCheckpoints(run).includes(dir)) throw new UserError(`${dir}: the best checkpoint is missing; cannot load it`);
    art.loadCheckpoint(dir);
    info(`final model: the best checkpoint (step ${chosen.step}, ${chosen.metric} ${chosen.value})`);
  }
  const weightsNow = artifactWeights(art);
  let finalDir = join(run, 'final');
  if (config.save_merged) saveModelFolder(finalDir, weightsNow, { config: base.config, lora, sourceDir: o.model, dtype: config.save_dtype });
  if (config.save_adapter && lora) {
    const adapterDir = join(run, 'adapter');
    saveAdapter(adapterDir, weightsNow, { config: base.config, lora, baseModel: o.model });
    if (!config.save_merged) finalDir = adapterDir;
  }
  await art.release();

  let evalSummary: EvalSummary | undefined;
  if (evaluator) {
    const finalModel = { config: base.config, weights: lora ? mergeLora(weightsNow, base.config, lora) : weightsNow };
    evalSummary = await evaluator.evaluate(finalModel, { quiet: true });
    writeJsonAtomic(join(run, 'eval.json'), { ...evalSummary.overall, ...(chosen ? { best_step: chosen.step } : {}) });
    // With load_best_model_at_end the last step was evaluated in the loop (when it is an eval step).
    if (!config.load_best_model_at_end) {
      logRow({ step: totalSteps, split: 'eval', ...evalSummary.overall });
      if (sampler) await sampler.write(totalSteps, finalModel);
    }
  }
  return { steps: totalSteps, seconds: (Date.now() - t0) / 1000, finalDir, config, last, eval: evalSummary };
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
