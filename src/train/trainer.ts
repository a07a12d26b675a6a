/**
 * `prefzoo train`: data → tokens → reference log-prob cache → training artifacts → optimizer steps
 * with gradient accumulation, TRL-named metrics, atomic checkpoints, bit-identical resume, and the
 * final model in HF layout. The steps run on the training loop (loop.ts), the trainer being a method
 * on it whose items are the dataset's rows: a round is gradient_accumulation_steps micro-batches of
 * batch_size rows (`draws`), one optimizer update.
 *
 * Run folder:
 *   config.json            the resolved TrainConfig + loss + model
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
 * ref_model_sync_steps steps (the method's `afterUpdate`) and its log-probs are computed for every batch.
 */
import { existsSync, mkdirSync, rmSync } from 'node:fs';
import { join, resolve } from 'node:path';
import type { Kind } from '../../datasets/schema.ts';
import { UserError } from '../errors.ts';
import { mallocAdvice } from '../runtime/malloc.ts';
import type { ArtifactSpec } from '../artifacts/build.ts';
import type { ModelConfig } from '../models/config.ts';
import type { FloatTensor } from '../models/checkpoint.ts';
import { mergeLora, type LoraConfig } from '../models/index.ts';
import { loadAdapter } from '../models/peft.ts';
import { readSafetensors, tensorToFloat32 } from '../models/safetensors.ts';
import type { CheckpointTensor } from '../artifacts/checkpoint.ts';
import { copyWeights, loadReferenceModel, sameParameters, softUpdate, type ReferenceModel } from './reference.ts';
import { identityDiff, readIdentity, refCacheIdentity, writeIdentity } from './identity.ts';
import { tokenizeRationales } from './rationale.ts';
import type { LoadedTokenizer } from '../tokenize/index.ts';
import { describePlacement, placement } from '../runtime/placement.ts';
import { resolveConfig, type TrainConfig } from './config.ts';
import { currentWeights, loraOf, runtimeOf, type LoopOptions, type MicroBatch, type RunInput } from './run.ts';
import { runOnline, splitDraws, type OnlineContext, type OnlineMethod, type RoundInfo, type SpecInput } from './loop.ts';
import { loadData, tokenizeExamples, type LoadedData, type TokenizedExample } from '../../datasets/examples.ts';
import { canPack, collate, longestBatch } from '../models/batch.ts';
import { readManifest } from '../artifacts/manifest.ts';
import { readRefColumns, writeRefColumns } from '../../datasets/tokenized.ts';
import { PROVIDED_KEYS, type TrainProblem } from './graph.ts';
import { problemOf, problemSpec } from './problem.ts';
import { f16BitsToFloat, float32ToF16 } from '../models/safetensors.ts';
import { dequantizedBase, quantizedWeights } from '../models/quantize-base.ts';
import { resolveLoss } from '../../losses/index.ts';
import { Scorer, scoredLongest } from '../models/scorer.ts';
import { Evaluator, type EvalSummary } from '../eval/evaluate.ts';
import { bestMetricName, lastCheckpoint } from './checkpoints.ts';
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

export async function train(o: TrainOptions): Promise<TrainResult> {
  const t0 = Date.now();
  const { config, lossParams } = resolveConfig({ configFile: o.configFile, params: o.params, base: o.base });
  const loss = resolveLoss(o.loss, lossParams);
  // --resume continues a run only with the model, data, loss and reference it was started with.
  const inputs: RunInput[] = [
    ...(o.rows ? [] : [{ key: 'data', now: o.data, flag: '--data' }]),
    { key: 'loss', now: o.loss, flag: '--loss' },
    { key: 'ref', now: o.refModel, flag: '--ref', optional: true, absent: 'no --ref' },
  ];
  const method = new OfflineTraining(o, { config, lossParams, loss });
  const r = await runOnline(o, (s) => method.load(s), method, { config, record: () => method.record(), inputs });
  return { steps: r.steps, seconds: (Date.now() - t0) / 1000, finalDir: r.finalDir, config, last: r.last, eval: method.finalEval };
}

/** What `train` resolved before the run: settings and loss. */
interface Resolved {
  config: TrainConfig;
  lossParams: Record<string, string | number | boolean>;
  loss: ReturnType<typeof resolveLoss>;
}

/** `Resolved` with the starting model and its tokenizer, once the run folder is ready. */
interface Setup extends Resolved {
  base: { config: ModelConfig; weights: Map<string, FloatTensor> };
  tok: LoadedTokenizer;
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
  const built = resuming ? builtInputs(join(run, 'artifacts')) : null;
  const packed = built ? built.has('segment_ids') : config.share_prompt && canPack(kind, kl) && !valueHeadOn;
  // On the CPU the training forward is built for the longest micro-batch these rows make: under
  // recomputation its MLP and attention then run in pieces under glibc's mmap bound (train/graph.ts).
  const longest = config.device === 'cpu' ? longestBatch(rows, config.batch_size, { kind, padTo: config.pad_to_multiple_of, kl, packed, rationale }) : undefined;
  const problem = problemOf(config, { model: base.config, kind, loss, lora, dataKeys, packed, longest });
  // A run of a loss that reads no reference, begun by a version that still scored one, has artifacts
  // that take ref_logps: they are rebuilt (its checkpoints carry over, as on a resume on another device).
  if (problem.noReference && built?.has('ref_logps')) rmSync(join(run, 'artifacts'), { recursive: true, force: true });
  return { kind, rows, adapter, lora, valueHeadOn, kl, packed, lengthWeighted, rationale, problem };
}

/** The reference stage's result: the reference model, and its log-probs cached per row or scored per batch. */
interface ReferenceStage {
  /** Null when nothing reads it: a loss that reads no reference, without eval_data. */
  reference: ReferenceModel | null;
  /**
   * The reference the held-out evaluation scores against: the starting one, also under TR-DPO (the
   * evaluation's reference log-probs are scored once, before the first step of a fresh run, so a
   * resumed run scores them with the reference it started from, not where it had moved).
   */
  evalReference: { config: ModelConfig; weights: Map<string, FloatTensor> } | null;
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
 * reads where it had moved from its checkpoint).
 */
async function referenceStage(o: TrainOptions, c0: Setup, d: DataStage, resuming: boolean): Promise<ReferenceStage> {
  const { config, base, tok } = c0;
  const { kind, rows, adapter, kl } = d;
  const run = o.out;
  const referenceModel = (): ReferenceModel => o.refModel
    ? loadReferenceModel(o.refModel, o.model, base.config)
    : adapter
      ? { config: base.config, weights: mergeLora(new Map([...base.weights, ...adapter.weights]), base.config, adapter.lora), identity: `model:${resolve(o.model)}+adapter:${resolve(o.adapter!)}` }
      : config.load_in_4bit || config.base_dtype === 'float16'
        ? // The reference is the base as the artifacts hold it (adapters off), as PEFT's is: rounded to float16, 4-bit weights dequantized.
          { config: base.config, weights: heldBase(base.config, base.weights, config), identity: `model:${resolve(o.model)}${config.load_in_4bit ? `+int4/${config.quant_block_size}` : ''}${config.base_dtype === 'float16' ? '+float16' : ''}` }
        : { config: base.config, weights: base.weights, identity: `model:${resolve(o.model)}` };
  if (d.problem.noReference) {
    // SFT, SimPO, ORPO: nothing in the loss reads the reference, so no pass over the data scores it,
    // and it is loaded (or merged, or rounded: a parameter-sized copy) only for eval_data's evaluation.
    for (const k of ['sync_ref_model', 'ref_on_the_fly'] as const) {
      if (config[k]) throw new UserError(`${k}: the loss ${o.loss} reads no reference log-probs, so there is no reference to ${k === 'sync_ref_model' ? 'sync' : 'score'}; leave ${k} out`);
    }
    if (o.refModel && !config.eval_data) throw new UserError(`--ref ${o.refModel}: the loss ${o.loss} reads no reference log-probs, and without eval_data nothing else does; leave --ref out`);
    const reference = config.eval_data ? referenceModel() : null;
    return { reference, evalReference: reference && { config: reference.config, weights: reference.weights }, sync: false, ref: [], refScorer: null };
  }
  const reference = referenceModel();
  const sync = config.sync_ref_model;
  // Held only when there is an evaluation (under TR-DPO a second reference-sized set of weights).
  const evalReference = config.eval_data ? { config: reference.config, weights: reference.weights } : null;
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
  // The cache records what made it (identity.ts) and is reused only when all of it is the same.
  const refFile = join(run, 'data', 'reference.parquet');
  const idFile = join(run, 'data', 'reference.json');
  const identity = refCacheIdentity({ reference: reference.identity, model: o.model, refModel: o.refModel, adapter: o.adapter, data: o.data, truncation: config, rows, loss: o.loss, kind, kl });
  const cached = !(config.ref_on_the_fly || sync) && existsSync(refFile) ? readIdentity(idFile) : null;
  let ref: number[][] = [];
  let refScorer: Scorer | null = null;
  // The scorer's forward built for the largest batch it will score (Scorer.create's `longest`): the
  // rows, and KTO's mismatched pairs, unpacked, batch_size of them per batch (× 2 for the cache).
  const mismatched = kl ? rows.map((r) => ({ ...r, responseIds: [r.klResponseIds!], responseMasks: undefined })) : [];
  const scoredShape = (batchSize: number) => {
    const at = (xs: TokenizedExample[]) => scoredLongest(kind, xs, { batchSize, padTo: config.pad_to_multiple_of });
    const a = at(rows);
    return kl ? { rows: a.rows, len: Math.max(a.len, at(mismatched).len) } : a;
  };
  if (config.ref_on_the_fly || sync) {
    refScorer = await Scorer.create(reference.config, reference.weights, runtimeOf(config, reference.config), tok.padId ?? 0, scoredShape(config.batch_size));
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
    const scorer = await Scorer.create(reference.config, reference.weights, runtimeOf(config, reference.config), tok.padId ?? 0, scoredShape(config.batch_size * 2));
    ref = (await scorer.score(kind, rows, { batchSize: config.batch_size * 2, padTo: config.pad_to_multiple_of, label: 'reference log-probs', progress: o.reporter?.progress })).logps;
    if (kl) {
      // The KL sequences are scored whole (the other row's mask does not travel with its ids).
      const refKl = (await scorer.score(kind, mismatched, { batchSize: config.batch_size * 2, padTo: config.pad_to_multiple_of, label: 'reference log-probs (KL pairs)', progress: o.reporter?.progress })).logps;
      ref = ref.map((r, i) => [r[0], refKl[i][0]]);
    }
    await scorer.release();
    mkdirSync(join(run, 'data'), { recursive: true });
    await writeRefColumns(refFile, kind, ref);
    writeIdentity(idFile, identity);
  }
  return { reference, evalReference, sync, ref, refScorer };
}


/** A data row's micro-batches: row indices, one array per micro-batch. */
type Round = number[][];

/**
 * The offline trainer as a method of the training loop. Its items are row indices; `load` runs the
 * data and reference stages once the run folder is ready; a round is gradient_accumulation_steps
 * micro-batches of batch_size rows (each draw crossing into the next epoch on its own), collated
 * with their reference log-probs (cached, or scored per batch); evaluation on eval_data through
 * `Evaluator` (and its samples, and the best checkpoint), TR-DPO's reference sync after each update.
 */
class OfflineTraining implements OnlineMethod<number, Round> {
  readonly name = 'train';
  readonly errorPrefix = '';
  // Every row once per epoch, the last micro-batch of an epoch short.
  readonly partialRounds = true;
  valueHead = false;
  private s!: Setup;
  private d!: DataStage;
  private r!: ReferenceStage;
  private evaluator: Evaluator | null = null;
  private sampler: EvalSampler | null = null;
  /** The weights the last evaluation scored (merged), until its samples are written. */
  private evaluatedWeights: { config: ModelConfig; weights: Map<string, FloatTensor> } | null = null;
  /** The last evaluation's full summary: after the run, the final one. */
  finalEval: EvalSummary | undefined;

  constructor(
    private readonly o: TrainOptions,
    private readonly resolved: Resolved,
  ) {}

  /** The data and reference stages; the items are the rows' indices. */
  async load(x: { run: string; tok: LoadedTokenizer; info: (line: string) => void; model: ModelConfig; baseWeights: Map<string, FloatTensor>; resuming: boolean }): Promise<number[]> {
    this.s = { ...this.resolved, base: { config: x.model, weights: x.baseWeights }, tok: x.tok };
    this.d = await dataStage(this.o, this.s, x.resuming, x.info);
    this.r = await referenceStage(this.o, this.s, this.d, x.resuming);
    this.valueHead = this.d.valueHeadOn;
    return this.d.rows.map((_, i) => i);
  }

  /** What config.json records beside the settings. */
  record(): Record<string, unknown> {
    const o = this.o;
    return { data: o.data, loss: o.loss, kind: this.d.kind, ref: o.refModel ?? null, adapter: o.adapter ?? null, loss_params: this.s.lossParams };
  }

  draws(config: TrainConfig): { size: number; count: number } {
    return { size: config.batch_size, count: config.gradient_accumulation_steps };
  }

  lora(): { lora: LoraConfig | null; weights?: Map<string, FloatTensor> } {
    return { lora: this.d.lora, weights: this.d.adapter?.weights };
  }

  needsBaseWeights(): boolean {
    // A per-batch reference scorer, the held-out evaluation and TR-DPO read the loaded weights again.
    return !!this.r.refScorer || !!this.s.config.eval_data || this.r.sync;
  }

  spec(s: SpecInput): ArtifactSpec {
    return problemSpec(this.d.problem, s.init, s.config);
  }

  async open(ctx: OnlineContext): Promise<void> {
    const { config } = this.s;
    const { reference, evalReference } = this.r;
    const art = ctx.art;
    ctx.info(`steps: ${this.d.packed ? 'each prompt computed once for all its responses' : 'one sequence per response'}; optimizer update ${art.updater === 'host' ? 'in place in this process' : 'in the optimizer graph'}`);
    const advice = mallocAdvice(config.gradient_checkpointing, config.device);
    if (advice) ctx.info(advice);
    if (config.device !== 'cpu') {
      const graph = join(ctx.run, 'artifacts', (art.manifest.step ?? art.manifest.training).file);
      ctx.info(`device ${config.device}: step graph nodes ${describePlacement(await placement(graph, ctx.runtime))}; parameters, optimizer state and gradients stay on the device`);
    }
    // Held-out evaluation: data and reference scores prepared once, the policy scored every eval_steps.
    if (evalReference) {
      this.evaluator = await Evaluator.create({
        ref: evalReference,
        tokenizer: this.o.model,
        data: config.eval_data,
        workDir: join(ctx.run, 'data'),
        params: this.s.lossParams,
        runtime: runtimeOf(config, evalReference.config),
        truncation: config,
        batchSize: config.batch_size * 2,
        maxRows: config.eval_samples,
      });
      if (config.eval_generate > 0) {
        // evalReference implies a reference (ReferenceStage).
        const ref = reference!;
        this.sampler = new EvalSampler({ run: ctx.run, prompts: this.evaluator.prompts(config.eval_generate), tok: this.s.tok, ref: { config: ref.config, weights: ref.weights }, maxNewTokens: config.eval_generate_max_new_tokens, runtime: runtimeOf(config, ref.config) });
      }
    }
  }

  async collect(_ctx: OnlineContext, idx: readonly number[], info: RoundInfo): Promise<Round> {
    return splitDraws(idx, info);
  }

  async microBatches(_ctx: OnlineContext, round: Round): Promise<MicroBatch[]> {
    const out: MicroBatch[] = [];
    for (const idx of round) out.push(await this.microBatch(idx));
    return out;
  }

  /** One micro-batch of rows, with their reference log-probs (scored now when they are not cached). */
  private async microBatch(idx: readonly number[]): Promise<MicroBatch> {
    const { config, tok } = this.s;
    const { kind, rows, kl, packed, lengthWeighted, rationale, valueHeadOn } = this.d;
    const { ref, refScorer } = this.r;
    const batch = idx.map((i) => rows[i]);
    const refOf = new Map<TokenizedExample, number[]>();
    if (refScorer) {
      const fresh = await refScorer.score(kind, batch, { batchSize: batch.length, padTo: config.pad_to_multiple_of });
      const freshKl = kl ? await refScorer.score(kind, batch.map((row) => ({ ...row, responseIds: [row.klResponseIds!], responseMasks: undefined })), { batchSize: batch.length, padTo: config.pad_to_multiple_of }) : null;
      batch.forEach((ex, i) => refOf.set(ex, freshKl ? [fresh.logps[i][0], freshKl.logps[i][0]] : fresh.logps[i]));
    } else {
      batch.forEach((ex, i) => refOf.set(ex, ref[idx[i]]));
    }
    const c = collate(batch, {
      kind,
      padTo: config.pad_to_multiple_of,
      padId: tok.padId ?? 0,
      dtype: 'float32',
      refLogps: this.d.problem.noReference ? undefined : (ex) => refOf.get(ex)!,
      valueIndex: valueHeadOn,
      kl,
      packed,
      ldAlpha: lengthWeighted ? config.ld_alpha : undefined,
      rationale,
    });
    return { feeds: c.feeds, tokens: c.tokens };
  }

  progressFields(row: Record<string, number>): Record<string, number> {
    const acc = row['rewards/accuracies'];
    return { loss: row.loss, ...(acc !== undefined ? { acc } : {}), 'tok/s': row['tokens/s'] };
  }

  /** The live weights as an HF model: adapters merged. */
  private async weightsNow(ctx: OnlineContext): Promise<Map<string, FloatTensor>> {
    await ctx.art.toHost();
    const w = currentWeights(ctx.art);
    return ctx.lora ? mergeLora(w, ctx.model, ctx.lora) : w;
  }

  async afterUpdate(ctx: OnlineContext, step: number): Promise<void> {
    const { config } = this.s;
    if (!this.r.sync || step % config.ref_model_sync_steps !== 0) return;
    // In place: the reference scorer's parameter feeds are views of these arrays, so its next batch
    // already sees the updated reference.
    softUpdate(this.r.reference!.weights, await this.weightsNow(ctx), config.ref_model_mixup_alpha);
  }

  async evaluate(ctx: OnlineContext): Promise<Record<string, number>> {
    const weights = { config: ctx.model, weights: await this.weightsNow(ctx) };
    this.finalEval = await this.evaluator!.evaluate(weights);
    // Kept for the samples of this evaluation only (a parameter-sized copy).
    this.evaluatedWeights = this.sampler ? weights : null;
    return this.finalEval.overall;
  }

  async evaluated(_ctx: OnlineContext, step: number): Promise<void> {
    if (this.sampler && this.evaluatedWeights) await this.sampler.write(step, this.evaluatedWeights);
    this.evaluatedWeights = null;
  }

  bestMetric(config: TrainConfig): string {
    return bestMetricName(this.d.kind, config.metric_for_best_model);
  }

  checkpointFiles(): Record<string, Map<string, CheckpointTensor>> {
    if (!this.r.sync) return {};
    return { [REFERENCE_FILE]: new Map([...this.r.reference!.weights].map(([k, t]) => [k, { dtype: 'float32' as const, shape: t.shape, data: t.data }])) };
  }

  async close(): Promise<void> {
    this.evaluatedWeights = null;
    await this.r?.refScorer?.release();
  }
}

/** The batch inputs the artifacts in `dir` were built with (`segment_ids`: packed batches); null when there are none yet. */
function builtInputs(dir: string): Set<string> | null {
  if (!existsSync(join(dir, 'artifacts.json'))) return null;
  return new Set(readManifest(dir).batchInputs.map((b) => b.name));
}

/**
 * The base weights as the artifacts hold them, in float32: under base_dtype=float16 rounded to float16
 * precision, under load_in_4bit its projection weights quantized and dequantized (quantize-base.ts).
 */
function heldBase(c: ModelConfig, w: Map<string, FloatTensor>, config: TrainConfig): Map<string, FloatTensor> {
  const quantized = new Set(config.load_in_4bit ? quantizedWeights(c) : []);
  const out = config.load_in_4bit ? dequantizedBase(c, w, config.quant_block_size) : new Map(w);
  if (config.base_dtype === 'float16') {
    for (const [k, t] of out) if (!quantized.has(k)) out.set(k, { shape: t.shape, data: Float32Array.from(float32ToF16(t.data), f16BitsToFloat) });
  }
  return out;
}
