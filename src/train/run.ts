/**
 * Pieces every training loop shares (the offline trainer, SPPO, Nash-MD, reward training): the
 * optimizer, runtime and LoRA settings of a TrainConfig, artifact parameter specs, and saving a
 * trained model in HF layout (LoRA merged, tokenizer files copied).
 */
import { cpSync, readdirSync, renameSync, rmSync } from 'node:fs';
import { fileError, releaseTemp, removeTemp, tempPath } from '../io/atomic.ts';
import { join } from 'node:path';
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
import type { ProgressFactory } from '../progress.ts';
import { modelParameterShapes, VALUE_HEAD_BIAS, VALUE_HEAD_WEIGHT } from '../models/params.ts';
import { f16BitsToFloat, float32ToF16 } from '../models/safetensors.ts';

/** What every training loop takes besides its own inputs: the trainer, SPPO, Nash-MD, reward training. */
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
  /** Draws the progress of long stages (the CLI passes a terminal bar); none without it. */
  progress?: ProgressFactory;
  /** No progress even when `progress` is given. */
  quiet?: boolean;
  /** Where plain progress and summary lines go (default: nowhere; the CLI passes stderr). */
  log?: (line: string) => void;
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
 * activations go back to the system instead of staying with the session that grew them: the eval
 * session's, or the step's at its peak) and no memory-pattern block on top (RuntimeOptions).
 * Measured in docs/performance.md ("Real sizes").
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
export function builtFor(m: ArtifactsManifest, c: TrainConfig): boolean {
  const want = artifactsOf(c);
  return (m.target ?? 'cpu') === want.target && (m.computeDtype ?? 'float32') === want.computeDtype && (c.gradient_accumulation_steps <= 1 || m.training.accumulation !== null);
}

/** Fails early, in one line, when the settings' device (and float16 products) cannot run here. */
export function checkDeviceOf(c: TrainConfig): Promise<void> {
  return checkDevice(runtimeOf(c), { float16: c.compute_dtype === 'float16' });
}

export function loraOf(c: TrainConfig): LoraConfig | null {
  if (c.lora_r <= 0) return null;
  return { rank: c.lora_r, alpha: c.lora_alpha, targets: c.lora_target_modules.split(',').map((s) => s.trim()).filter(Boolean) };
}

/** Current parameter values of a training run as float tensors (copies). */
export function currentWeights(art: TrainingArtifacts): Map<string, FloatTensor> {
  const out = new Map<string, FloatTensor>();
  for (const p of art.manifest.params) {
    const v = art.param(p.name);
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
 * Artifact parameters of a model: every weight trainable, or only LoRA adapters (and a value head)
 * under LoRA; weight decay on matrices only.
 */
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

export function modelParamSpecs(config: ModelConfig, init: Map<string, FloatTensor>, lora: LoraConfig | null, valueHead: boolean, baseDtype: 'float32' | 'float16' = 'float32'): ParamSpec[] {
  const out: ParamSpec[] = [];
  for (const [name, shape] of modelParameterShapes(config, { lora, valueHead })) {
    const isHead = name === VALUE_HEAD_WEIGHT || name === VALUE_HEAD_BIAS;
    const isAdapter = name.includes('.lora_A.') || name.includes('.lora_B.');
    const w = init.get(name);
    if (!w) throw new Error(`no initial value for parameter ${name}`);
    const trainable = lora ? isAdapter || isHead : true;
    // Frozen base weights may be held in float16 (base_dtype): half the memory, widened where used.
    const half = !trainable && baseDtype === 'float16';
    out.push({ name, dtype: half ? 'float16' : 'float32', shape, trainable, decay: shape.length >= 2, data: half ? float32ToF16(w.data) : w.data });
  }
  return out;
}
