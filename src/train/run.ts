/**
 * Pieces of the training loop (loop.ts: the offline trainer, SPPO, Nash-MD, GRPO, reward training): the
 * optimizer, runtime and LoRA settings of a TrainConfig, artifact parameter specs, and saving a
 * trained model in HF layout (LoRA merged, tokenizer files copied).
 */
import type { HubSnapshot } from '../hub/index.ts';
import { cpSync, existsSync, mkdirSync, readdirSync, readFileSync, renameSync, rmSync } from 'node:fs';
import { appendLine, fileError, releaseTemp, removeTemp, sweepStaleTemps, tempPath, writeFileAtomic } from '../io/atomic.ts';
import { join, resolve } from 'node:path';
import { UserError } from '../errors.ts';
import { buildArtifacts, type ArtifactSpec } from '../artifacts/build.ts';
import { readManifest } from '../artifacts/manifest.ts';
import type { Feeds } from '../runtime/session.ts';
import { saveAdapter } from '../models/peft.ts';
import { TensorBoardWriter } from './tensorboard.ts';
import { faultStep, lastCheckpoint } from './checkpoints.ts';
import { loadModel } from '../models/load.ts';
import { loadTokenizer, type LoadedTokenizer } from '../tokenize/index.ts';
import { SeededRandom } from '../random.ts';
import type { TrainConfig } from '../train/config.ts';
import type { OptimizerConfig } from '../optim/config.ts';
import type { LrScheduleConfig } from '../optim/schedule.ts';
import { checkDevice, type RuntimeOptions } from '../runtime/session.ts';
import type { ArtifactTarget, ArtifactsManifest } from '../artifacts/manifest.ts';
import { countParameters, type ModelConfig } from '../models/config.ts';
import { saveCheckpoint, type FloatTensor } from '../models/checkpoint.ts';
import { initLora, initValueHead, mergeLora, type LoraConfig } from '../models/index.ts';
import type { TrainingArtifacts } from '../artifacts/training.ts';
import type { ParamSpec } from '../artifacts/build.ts';
import type { Reporter } from '../progress.ts';
import { modelParameterShapes, VALUE_HEAD_BIAS, VALUE_HEAD_WEIGHT } from '../models/params.ts';
import { f16BitsToFloat, float32ToF16 } from '../models/safetensors.ts';
import { type BaseTensor, dequantizeQ4, isQ4, q4Names, quantizeQ4, quantizedWeights } from '../models/quantize-base.ts';

/** What every command on the training loop takes besides its own inputs: the trainer, SPPO, Nash-MD, GRPO, reward training. */
export interface LoopOptions {
  /** The starting model folder (HF layout). */
  model: string;
  /** The run folder. */
  out: string;
  /** Trainer settings and loss parameters, as `key=value`. */
  params?: string[];
  /** A JSON file of settings; `params` override it. */
  configFile?: string;
  /** Settings applied under --config and --param (the demos' defaults). */
  base?: Partial<TrainConfig>;
  /** The progress of long stages and notes on the run (the CLI's: bars and lines on stderr); none without it. */
  reporter?: Reporter;
  /** The Hub snapshots the inputs were resolved to (by flag: model, data, ref, adapter), written into config.json. */
  hub?: Record<string, HubSnapshot>;
}

export function optimizerOf(c: TrainConfig): OptimizerConfig {
  const clip = c.max_grad_norm > 0 ? c.max_grad_norm : null;
  return c.optimizer === 'sgd'
    ? { type: 'sgd', momentum: c.momentum, weightDecay: c.weight_decay, maxGradNorm: clip }
    : { type: 'adamw', betas: [c.adam_beta1, c.adam_beta2], eps: c.adam_epsilon, weightDecay: c.weight_decay, maxGradNorm: clip };
}

/** A loop's step count (max_steps, else epochs × steps per epoch, at least 1) and its learning-rate schedule. */
export function stepPlan(c: TrainConfig, stepsPerEpoch: number): { total: number; schedule: LrScheduleConfig } {
  const total = c.max_steps > 0 ? c.max_steps : Math.max(1, Math.round(stepsPerEpoch * c.num_epochs));
  const warmup = Math.min(total, c.warmup_steps > 0 ? c.warmup_steps : Math.round(c.warmup_ratio * total));
  return { total, schedule: { type: c.lr_scheduler, lr: c.learning_rate, warmupSteps: warmup, totalSteps: total } };
}

/**
 * Session settings of the memory-saving mode (gradient_checkpointing=true): no CPU arena (freed
 * activations go back to the system instead of staying with the step's session at its peak) and no
 * memory-pattern block on top (RuntimeOptions). Forward-only sessions (the eval graph, the scorers)
 * keep the arena (runtime/session.ts `forwardRuntime`); the eval session is let go before a gradient
 * run. Measured in docs/performance.md ("Real sizes", "Real sequence lengths").
 */
export const LOW_MEMORY_RUNTIME: RuntimeOptions = { arena: false, memPattern: false };

/**
 * Models with at least this many parameters get LOW_MEMORY_RUNTIME even without recomputation: the
 * arena grows by doubling and keeps what it took, and at the Qwen2.5-0.5B shape the default settings
 * were killed for memory on the second step (docs/performance.md, "Speed at 0.5B against PyTorch").
 */
export const LOW_MEMORY_PARAMS = 200_000_000;

/** Whether a step of this model runs with LOW_MEMORY_RUNTIME (recomputation asked for, or a large model). */
export function lowMemoryFor(gradientCheckpointing: boolean, params: number): boolean {
  return gradientCheckpointing || params >= LOW_MEMORY_PARAMS;
}

/** Session settings of a loop: its device and threads, and the memory-saving runtime where `lowMemoryFor` says (pass the model's config). */
export function runtimeOf(c: TrainConfig, model?: ModelConfig): RuntimeOptions {
  const low = lowMemoryFor(c.gradient_checkpointing, model ? countParameters(model) : 0);
  return { ep: c.device, threads: c.threads > 0 ? c.threads : undefined, ...(low ? LOW_MEMORY_RUNTIME : {}) };
}

/** How a loop's artifacts are written for its settings: lowered for WebGPU, float16 products on request. */
export function artifactsOf(c: TrainConfig): { target: ArtifactTarget; computeDtype: 'float32' | 'float16' } {
  return { target: c.device === 'webgpu' ? 'webgpu' : 'cpu', computeDtype: c.compute_dtype };
}

/** Whether an artifacts manifest was written for these settings (see `artifactsOf`). */
export function builtFor(m: ArtifactsManifest, c: TrainConfig, accumulates = c.gradient_accumulation_steps > 1): boolean {
  const want = artifactsOf(c);
  return (m.target ?? 'cpu') === want.target && (m.computeDtype ?? 'float32') === want.computeDtype && (!accumulates || m.training.accumulation !== null);
}

/** Fails early, in one line, when the settings' device (and float16 products) cannot run here. */
export function checkDeviceOf(c: TrainConfig): Promise<void> {
  return checkDevice(runtimeOf(c), { float16: c.compute_dtype === 'float16' });
}

export function loraOf(c: TrainConfig): LoraConfig | null {
  if (c.lora_r <= 0) return null;
  return { rank: c.lora_r, alpha: c.lora_alpha, targets: c.lora_target_modules.split(',').map((s) => s.trim()).filter(Boolean) };
}

/** Current parameter values of a training run as float tensors (copies); a 4-bit weight dequantized under its own name. */
export function currentWeights(art: TrainingArtifacts): Map<string, FloatTensor> {
  const out = new Map<string, FloatTensor>();
  const params = new Map(art.manifest.params.map((p) => [p.name, p]));
  for (const p of art.manifest.params) {
    const v = art.param(p.name);
    if (p.dtype === 'uint8' && p.name.endsWith('_q4')) {
      const name = p.name.slice(0, -'_q4'.length);
      const scales = params.get(q4Names(name).scales)!;
      const q = { shape: [p.shape[0], 2 * p.shape[1]], block: (2 * p.shape[1]) / scales.shape[1], packed: v as Uint8Array, scales: art.param(scales.name) as Float32Array };
      out.set(name, dequantizeQ4(q));
      continue;
    }
    if (p.name.endsWith('_q4_scale') && params.get(p.name.slice(0, -'_scale'.length))?.dtype === 'uint8') continue;
    // float16 parameters (frozen base weights under base_dtype) are held as bit patterns.
    out.set(p.name, { shape: p.shape, data: p.dtype === 'float16' ? Float32Array.from(v as Uint16Array, f16BitsToFloat) : Float32Array.from(v as Float32Array) });
  }
  return out;
}

/**
 * Writes `weights` to `dir` in HF layout (adapters merged into their base weights; a value head is
 * kept) with the tokenizer files of `sourceDir`, through a temporary folder renamed at the end.
 * With `into`, the files are moved into an existing `dir` one by one and its other files stay.
 */
export function saveModelFolder(
  dir: string,
  weights: Map<string, FloatTensor>,
  o: { config: ModelConfig; lora: LoraConfig | null; sourceDir: string; dtype: 'F32' | 'BF16'; into?: boolean },
): void {
  // mergeLora keeps every non-adapter tensor, the value head included.
  const out = o.lora ? mergeLora(weights, o.config, o.lora) : weights;
  const tmp = tempPath(dir);
  try {
    saveCheckpoint(tmp, out, { dtype: o.dtype, config: o.config });
    for (const f of readdirSync(o.sourceDir)) {
      if (/^(tokenizer.*|special_tokens_map\.json|generation_config\.json|chat_template\.jinja|vocab\.json|merges\.txt)$/.test(f)) cpSync(join(o.sourceDir, f), join(tmp, f));
    }
    if (o.into) {
      for (const f of readdirSync(tmp)) renameSync(join(tmp, f), join(dir, f));
      removeTemp(tmp);
      return;
    }
    rmSync(dir, { recursive: true, force: true });
    renameSync(tmp, dir);
    releaseTemp(tmp);
  } catch (e) {
    removeTemp(tmp);
    throw fileError(e, dir);
  }
}

/**
 * A loop's starting parameters: the model's weights plus LoRA adapters (loaded ones, `adapter`, or
 * fresh) and a fresh value head where the loop has them.
 */
export function startingParams(config: ModelConfig, weights: Map<string, FloatTensor>, o: { lora: LoraConfig | null; adapter?: Map<string, FloatTensor>; valueHead?: boolean; seed: number }): Map<string, FloatTensor> {
  const init = new Map(weights);
  if (o.lora) for (const [k, v] of o.adapter ?? initLora(config, o.lora, o.seed)) init.set(k, v);
  if (o.valueHead) for (const [k, v] of initValueHead(config, o.seed)) init.set(k, v);
  return init;
}

/**
 * Artifact parameters of a model: every weight trainable, or only LoRA adapters (and a value head)
 * under LoRA; weight decay on matrices only. Under LoRA the frozen base may be held in float16
 * (`baseDtype`) and its projection weights in 4 bits (`base4bit`, QLoRA: each as `<name>_q4` and
 * `<name>_q4_scale`, src/models/quantize-base.ts; `init` may hold them quantized already).
 */
export function modelParamSpecs(config: ModelConfig, init: ReadonlyMap<string, BaseTensor>, lora: LoraConfig | null, valueHead: boolean, baseDtype: 'float32' | 'float16' = 'float32', base4bit?: { block: number }): ParamSpec[] {
  const out: ParamSpec[] = [];
  const quantized = new Set(base4bit ? quantizedWeights(config) : []);
  for (const [name, shape] of modelParameterShapes(config, { lora, valueHead })) {
    const isHead = name === VALUE_HEAD_WEIGHT || name === VALUE_HEAD_BIAS;
    const isAdapter = name.includes('.lora_A.') || name.includes('.lora_B.');
    const w = init.get(name);
    if (!w) throw new Error(`no initial value for parameter ${name}`);
    const trainable = lora ? isAdapter || isHead : true;
    if (quantized.has(name) && !trainable) {
      const q = isQ4(w) ? w : quantizeQ4(w, base4bit!.block);
      if (q.block !== base4bit!.block) throw new Error(`${name}: quantized in blocks of ${q.block}, the artifacts want ${base4bit!.block}`);
      const n = q4Names(name);
      out.push({ name: n.packed, dtype: 'uint8', shape: [shape[0], shape[1] / 2], trainable: false, data: q.packed });
      out.push({ name: n.scales, dtype: 'float32', shape: [shape[0], shape[1] / q.block], trainable: false, data: q.scales });
      continue;
    }
    if (isQ4(w)) throw new Error(`${name}: a 4-bit weight where the artifacts want a float one`);
    // Frozen base weights may be held in float16 (base_dtype): half the memory, widened where used.
    const half = !trainable && baseDtype === 'float16';
    out.push({ name, dtype: half ? 'float16' : 'float32', shape, trainable, decay: shape.length >= 2, data: half ? float32ToF16(w.data) : w.data });
  }
  return out;
}

// ---------------------------------------------------------------------------------------------
// The stages of the training loop (loop.ts, which the offline trainer and the online methods run on):
// the run folder, the artifacts, one optimizer update over micro-batches, the metrics writer, the
// final save. Checkpoints and the NaN stop are in checkpoints.ts.

/** What a run folder may hold (what `train`, MPO's stages, the online loops and SPPO's iterations write); --overwrite removes only these. */
const RUN_ENTRIES = /^(config\.json|data|artifacts|checkpoints|metrics\.jsonl|completions\.jsonl|tool-journal\.jsonl|agent_calls\.jsonl|runs|samples|best\.json|final|adapter|eval\.json|report\.html|demo_eval\.json|stage[12]|iter-\d+|sppo\.json)$/;

/**
 * Run-folder stage: makes `run` ready for a run: created when missing; a folder holding an earlier
 * run is refused unless the call resumes it or `overwrite` clears it (only a run's own entries are
 * removed). Temporaries a killed process left are swept first. Returns whether the folder is new (empty).
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

/** One input a run must be resumed with: `key` of config.json, its value now, and how to name the old one. */
export interface RunInput {
  key: string;
  now: string | null | undefined;
  /** How the value it was started with is named in the message, e.g. `--model`. */
  flag: string;
  /** Checked only when config.json records the key (older runs did not). */
  optional?: boolean;
  /** The message for a run started without it (default: `no FLAG`). */
  absent?: string;
}

/** --resume continues a run only with the inputs (model, data, loss, …) it was started with, as config.json records them. */
export function checkSameRun(run: string, inputs: readonly RunInput[]): void {
  const file = join(run, 'config.json');
  if (!existsSync(file)) return;
  let was: Record<string, string | null | undefined>;
  try {
    was = JSON.parse(readFileSync(file, 'utf8'));
  } catch {
    throw new UserError(`${file}: not valid JSON; the run cannot be resumed (start it again with --overwrite)`);
  }
  const norm = (a: string | null | undefined) => (typeof a === 'string' ? a.trim() : null);
  const same = (a: string | null | undefined, b: string | null | undefined) => norm(a) === norm(b) || (!!a && !!b && resolve(a) === resolve(b));
  const diff = inputs
    .filter((i) => !(i.optional && !(i.key in was)) && !same(was[i.key], i.now))
    .map((i) => (was[i.key] ? `${i.flag} ${was[i.key]}` : (i.absent ?? `no ${i.flag}`)));
  if (diff.length) throw new UserError(`--resume: ${run} was started with ${diff.join(', ')}; resume it with those, or start a new run (another -o, or --overwrite)`);
}

/**
 * Opening stage of a run: the device checked, the starting model and tokenizer loaded (a bad model
 * folder leaves no run folder behind), the run folder prepared (`prepareRunFolder`; a resumed run
 * checked to have the `inputs` it was started with, the model always one), then `body`. A run that
 * fails before its first checkpoint holds nothing to resume: its new folder is removed.
 */
export async function inRunFolder<T>(
  o: { model: string; out: string; resume?: boolean; overwrite?: boolean },
  config: TrainConfig,
  inputs: readonly RunInput[],
  body: (base: ReturnType<typeof loadModel>, tok: LoadedTokenizer) => Promise<T>,
): Promise<T> {
  // A device that cannot run here stops the run before anything is read or written.
  await checkDeviceOf(config);
  const base = loadModel(o.model);
  const tok = loadTokenizer(o.model, { chatTemplateFile: config.chat_template || undefined });
  const fresh = prepareRunFolder(o.out, o);
  if (o.resume && !fresh) checkSameRun(o.out, [{ key: 'model', now: o.model, flag: '--model' }, ...inputs]);
  try {
    return await body(base, tok);
  } catch (e) {
    if (fresh && lastCheckpoint(o.out) === null) rmSync(o.out, { recursive: true, force: true });
    throw e;
  }
}

/**
 * Artifacts stage: the training graphs of `spec()` are written to `dir` unless a resumed run already
 * has them for these settings (`builtFor`); a resumed run on another device gets graphs for it, its
 * checkpoints carrying over. Returns whether they were (re)built.
 */
export function ensureArtifacts(dir: string, config: TrainConfig, resuming: boolean, spec: () => ArtifactSpec, accumulates = config.gradient_accumulation_steps > 1): boolean {
  if (resuming && existsSync(join(dir, 'artifacts.json')) && builtFor(readManifest(dir), config, accumulates)) return false;
  rmSync(dir, { recursive: true, force: true });
  // Running sums of gradients only when micro-batches are accumulated: otherwise every step would
  // feed parameter-sized zeros (545 MB for Qwen's embedding alone) into them.
  buildArtifacts({ ...spec(), gradientAccumulation: accumulates }, dir, artifactsOf(config));
  return true;
}

/** A micro-batch of one optimizer update: its feeds and the tokens it holds. */
export interface MicroBatch {
  feeds: Feeds;
  tokens: number;
}

/** What one optimizer update gave: the graph's metrics averaged over the micro-batches, the pre-clip gradient norm, the tokens. */
export interface UpdateResult {
  metrics: Record<string, number>;
  gradNorm: number;
  tokens: number;
}

/**
 * Loop stage, one optimizer update: `micro` micro-batches (made by `batch(i)` when they are needed)
 * whose gradients are summed, then one update with `lr`. The last micro-batch applies it (one fused
 * graph run when nothing was accumulated); a non-finite micro-batch stops before any update, with
 * `metrics.loss` non-finite (the caller stops: `nonFiniteLoss`). The fault hook (PREFZOO_FAULT_NAN_AT_STEP)
 * poisons `ref_logps` (else every float32 input) of the batch of that step.
 */
export async function optimizerUpdate(art: TrainingArtifacts, o: { step: number; lr: number; micro: number; batch: (i: number) => Promise<MicroBatch> }): Promise<UpdateResult> {
  const sums: Record<string, number> = {};
  let tokens = 0;
  let gradNorm = NaN;
  const fault = faultStep();
  for (let micro = 0; micro < o.micro; micro++) {
    const b = await o.batch(micro);
    if (o.step === fault) {
      const poisoned = b.feeds.ref_logps ? [b.feeds.ref_logps] : Object.values(b.feeds).filter((t) => t.type === 'float32');
      for (const t of poisoned) (t.data as Float32Array).fill(NaN);
    }
    // ONNX Runtime keeps the old parameters when the final batch's loss is not finite.
    const final = micro === o.micro - 1;
    const m = await art.trainStep(b.feeds, { lr: o.lr, accumulate: !final });
    if (final) gradNorm = m.grad_norm;
    delete m.grad_norm;
    for (const [k, v] of Object.entries(m)) sums[k] = (sums[k] ?? 0) + v;
    tokens += b.tokens;
    // A non-finite micro-batch poisons the sum: stop before any update is applied.
    if (!Number.isFinite(m.loss)) {
      sums.loss = m.loss;
      break;
    }
  }
  const metrics: Record<string, number> = {};
  for (const [k, v] of Object.entries(sums)) metrics[k] = v / o.micro;
  return { metrics, gradNorm, tokens };
}

/**
 * The metrics row of each optimizer step, with the trainer's conventions: step, epoch, the graph's
 * metrics (and a loop's `extra`), grad_norm, learning_rate, tokens, the cumulative num_tokens (kept
 * in checkpoints) and tokens/s since the loop started (the only wall-clock field).
 */
export class StepRows {
  private seen = 0;
  private readonly t0 = Date.now();
  constructor(public numTokens = 0) {}

  row(step: number, epoch: number, up: UpdateResult, lr: number, extra: Record<string, number> = {}): Record<string, number> {
    this.seen += up.tokens;
    this.numTokens += up.tokens;
    return { step, epoch, ...up.metrics, ...extra, grad_norm: up.gradNorm, learning_rate: lr, tokens: up.tokens, num_tokens: this.numTokens, 'tokens/s': Math.round(this.seen / ((Date.now() - this.t0) / 1000)) };
  }
}

/**
 * The metrics writer: metrics.jsonl rows (one per logging step, `split: "eval"` rows for
 * evaluations) and the same scalars under train/ or eval/ in TensorBoard (report_to=tensorboard).
 * Opened at step `step`, it drops rows logged after it (a resumed run logs them again).
 */
export class MetricsLog {
  readonly file: string;
  private constructor(
    run: string,
    private readonly tb: TensorBoardWriter | null,
  ) {
    this.file = join(run, 'metrics.jsonl');
  }

  static open(run: string, o: { step: number; tensorboard: boolean; resuming: boolean }): MetricsLog {
    const log = new MetricsLog(run, o.tensorboard ? TensorBoardWriter.open(join(run, 'runs'), o.resuming ? { resumeStep: o.step } : {}) : null);
    if (existsSync(log.file)) {
      // Drop rows logged after the checkpoint we resume from (all of them when a --resume found no
      // complete checkpoint and starts over): they will be logged again.
      const kept = readFileSync(log.file, 'utf8').split('\n').filter((l) => l.trim() && JSON.parse(l).step <= o.step);
      writeFileAtomic(log.file, kept.map((l) => l + '\n').join(''));
    }
    return log;
  }

  row(row: Record<string, unknown>): void {
    appendLine(this.file, JSON.stringify(row));
    const { step: at, split, ...values } = row;
    this.tb?.scalars(at as number, Object.fromEntries(Object.entries(values).map(([k, v]) => [`${split === 'eval' ? 'eval' : 'train'}/${k}`, v])));
  }
}

/**
 * Save stage: the trained weights in HF layout under RUN/final (adapters merged; not with
 * save_merged=false) and, with LoRA and save_adapter, the adapter alone in PEFT's layout under
 * RUN/adapter. Returns the folder of the model (final/, or adapter/ when only it is saved).
 */
export function saveTrained(run: string, weights: Map<string, FloatTensor>, o: { config: TrainConfig; model: ModelConfig; lora: LoraConfig | null; sourceDir: string }): string {
  let finalDir = join(run, 'final');
  if (o.config.save_merged) saveModelFolder(finalDir, weights, { config: o.model, lora: o.lora, sourceDir: o.sourceDir, dtype: o.config.save_dtype });
  if (o.config.save_adapter && o.lora) {
    const adapterDir = join(run, 'adapter');
    saveAdapter(adapterDir, weights, { config: o.model, lora: o.lora, baseModel: o.sourceDir });
    if (!o.config.save_merged) finalDir = adapterDir;
  }
  return finalDir;
}

/** Order of `n` items in an epoch: a seeded shuffle, the same on resume. */
function epochOrder(n: number, seed: number, epoch: number): number[] {
  return new SeededRandom(seed * 1000003 + epoch).shuffle(Array.from({ length: n }, (_, i) => i));
}

/**
 * Data stage's cursor: where a loop is in its items, a seeded shuffle per epoch. Saved in checkpoints
 * as `dataCursor` ({ epoch, index }) and restored from it, so a resumed run takes the same batches.
 */
export class ItemOrder {
  private order: number[];
  constructor(
    readonly n: number,
    private readonly seed: number,
    public epoch = 0,
    public index = 0,
  ) {
    this.order = epochOrder(n, seed, epoch);
  }

  /**
   * The next `size` item indices. The next epoch starts when the last one is used up, or with `whole`
   * when fewer than `size` are left (every batch the same size; the rest of the epoch is skipped).
   */
  take(size: number, whole = false): number[] {
    if (this.index >= this.n || (whole && this.index + size > this.n)) {
      this.epoch++;
      this.index = 0;
      this.order = epochOrder(this.n, this.seed, this.epoch);
    }
    const idx = this.order.slice(this.index, this.index + size);
    this.index += idx.length;
    return idx;
  }

  /** The checkpoint's `dataCursor`. */
  get cursor(): { epoch: number; index: number } {
    return { epoch: this.epoch, index: this.index };
  }

  /** Epochs done, as the metrics rows' `epoch` (4 decimals). */
  get epochs(): number {
    return Math.round((this.epoch + this.index / this.n) * 1e4) / 1e4;
  }
}
