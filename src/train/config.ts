/**
 * The one documented configuration of `prefzoo train`, with its defaults. Values come from, in
 * increasing priority: these defaults, `--config FILE.json`, then `--param key=value` (keys not
 * listed here are the loss's parameters, such as `beta`).
 */
import { readFileSync } from 'node:fs';
import { UserError } from '../errors.ts';
import { DEFAULT_TRUNCATION } from '../../datasets/examples.ts';

export interface TrainConfig {
  /** Peak learning rate of the optimizer. */
  learning_rate: number;
  /** Pairs (or lists, or single rows) per micro-batch. */
  batch_size: number;
  /** Micro-batches summed into one optimizer step. */
  gradient_accumulation_steps: number;
  /** Passes over the training data (ignored when max_steps > 0). */
  num_epochs: number;
  /** Optimizer steps to run; 0 means num_epochs over the data. */
  max_steps: number;
  /** Linear warm-up length, as a share of all steps (used when warmup_steps is 0). */
  warmup_ratio: number;
  /** Linear warm-up length in steps. */
  warmup_steps: number;
  /** Shape of the learning rate after warm-up. */
  lr_scheduler: 'constant' | 'linear' | 'cosine';
  optimizer: 'adamw' | 'sgd';
  adam_beta1: number;
  adam_beta2: number;
  adam_epsilon: number;
  /** SGD momentum. */
  momentum: number;
  /** Decoupled weight decay (not applied to norms and biases). */
  weight_decay: number;
  /** Global gradient-norm clip; 0 disables clipping. */
  max_grad_norm: number;
  /** Longest prompt + response in tokens; longer rows are truncated (and counted). */
  max_length: number;
  /** Longest prompt in tokens. */
  max_prompt_length: number;
  /** Which end of an over-long prompt to keep. */
  truncation: 'keep_start' | 'keep_end';
  /** Sequence lengths are padded up to a multiple of this, so the runtime sees few shapes. */
  pad_to_multiple_of: number;
  seed: number;
  /** Held-out data evaluated every eval_steps (and at the end). */
  eval_data: string;
  eval_steps: number;
  /** Checkpoint every save_steps optimizer steps (0: only at the end). */
  save_steps: number;
  /** Write a metrics.jsonl row every logging_steps steps. */
  logging_steps: number;
  /** LoRA rank; 0 trains all parameters. */
  lora_r: number;
  lora_alpha: number;
  /** Comma-separated module names LoRA adapts. */
  lora_target_modules: string;
  /** Recompute reference log-probs every step instead of caching them once. */
  ref_on_the_fly: boolean;
  /**
   * TR-DPO ("Learn Your Reference Model for Real Good Alignment", Gorbatovski et al. 2024): every
   * ref_model_sync_steps optimizer steps the reference becomes ref ← α·policy + (1 − α)·ref with
   * α = ref_model_mixup_alpha (LoRA merged into the policy first). Reference log-probs are then
   * computed for every batch, never read from a cache. The reference needs the policy's shapes.
   */
  sync_ref_model: boolean;
  /** α of the TR-DPO soft update (1: the reference becomes the policy). */
  ref_model_mixup_alpha: number;
  /** Optimizer steps between two TR-DPO reference updates. */
  ref_model_sync_steps: number;
  /**
   * LD-DPO ("Length Desensitization in Direct Preference Optimization", 2024), pairwise data: the
   * policy's log-prob of a response counts its first min(n_w, n_l) tokens fully and the tokens past
   * that weighted by ld_alpha (reference log-probs and token counts are unchanged, as in TRL and
   * LLaMA-Factory). 1 turns it off.
   */
  ld_alpha: number;
  /**
   * With LoRA: also write the trained adapter to RUN/adapter/ in PEFT's layout
   * (adapter_model.safetensors with `base_model.model.<module>.lora_A.weight` names, adapter_config.json).
   */
  save_adapter: boolean;
  /** Write the merged model to RUN/final/ (false together with save_adapter: the adapter only). */
  save_merged: boolean;
  /**
   * Pairwise and listwise data: run each prompt once per example, shared by its responses (same
   * log-probs and gradients as one sequence per response, less work). false: one sequence per response.
   */
  share_prompt: boolean;
  /**
   * Activation recomputation: the backward pass recomputes each layer's activations from the layer's
   * input instead of keeping them from the forward (less memory, about a third more forward work).
   * Same gradients. It also switches on the rest of the memory-saving mode: attention in pieces over
   * the key/value heads, sessions without ONNX Runtime's memory arena, gradients let go of after
   * each update (docs/performance.md, "Real sizes"); models of 200M parameters or more get the
   * arena-free sessions whatever this says (train/run.ts LOW_MEMORY_PARAMS). Default false.
   */
  gradient_checkpointing: boolean;
  /**
   * LoRA only: the type the frozen base weights are held in. float16 halves their memory; each is
   * widened to float32 where a layer uses it (and widened again in the backward rather than kept).
   * bfloat16 cannot be fed through onnxruntime-node's JavaScript API, so it is not offered. Default float32.
   */
  base_dtype: 'float32' | 'float16';
  /** A Jinja chat-template file used instead of the model's own ('' = the model's). */
  chat_template: string;
  /** Save the final weights as F32 or BF16. */
  save_dtype: 'F32' | 'BF16';
  /**
   * Where the model runs: 'cpu'; 'webgpu' (any Vulkan GPU through the WebGPU provider bundled with
   * onnxruntime-node, nothing to install); 'cuda' (needs onnxruntime-node's CUDA binaries).
   */
  device: 'cpu' | 'webgpu' | 'cuda';
  /**
   * Precision of the matrix products on the GPU: 'float16' runs every MatMul/Gemm (forward and
   * backward) on float16 copies and widens the result at once; master weights, optimizer state,
   * norms, softmax, reductions, log-prob sums and the loss stay float32 (src/onnx/half.ts).
   */
  compute_dtype: 'float32' | 'float16';
  /** ONNX Runtime intra-op threads; 0 lets the runtime choose. */
  threads: number;

  // --- Logging, checkpoints kept, eval samples, data size (issue 17, items 6–8) ---
  /** Where metrics go besides metrics.jsonl: 'tensorboard' also writes event files to RUN/runs/. */
  report_to: 'none' | 'tensorboard';
  /** Keep at most this many checkpoints (the oldest are removed; the best one is kept); 0 keeps all. */
  save_total_limit: number;
  /**
   * Save the checkpoint with the best metric_for_best_model as RUN/final instead of the last one
   * (needs eval_data and eval_steps; a checkpoint is written at every evaluation).
   */
  load_best_model_at_end: boolean;
  /**
   * Eval metric that picks the best checkpoint ('' : accuracy for pairwise data, ndcg for listwise,
   * roc_auc for single). Higher is better unless its name ends in "loss".
   */
  metric_for_best_model: string;
  /** At every evaluation, write N eval prompts' greedy completions of policy and reference to RUN/samples/step-K.jsonl. */
  eval_generate: number;
  /** Longest eval_generate completion in tokens. */
  eval_generate_max_new_tokens: number;
  /** Train on the first N rows of the data only (0: all); the reference scores only those. */
  max_samples: number;
  /** Evaluate on the first N rows of eval_data only (0: all). */
  eval_samples: number;
}

export const DEFAULT_CONFIG: TrainConfig = {
  learning_rate: 5e-6,
  batch_size: 4,
  gradient_accumulation_steps: 1,
  num_epochs: 1,
  max_steps: 0,
  warmup_ratio: 0,
  warmup_steps: 0,
  lr_scheduler: 'linear',
  optimizer: 'adamw',
  adam_beta1: 0.9,
  adam_beta2: 0.999,
  adam_epsilon: 1e-8,
  momentum: 0.9,
  weight_decay: 0,
  max_grad_norm: 1,
  ...DEFAULT_TRUNCATION,
  pad_to_multiple_of: 64,
  seed: 42,
  eval_data: '',
  eval_steps: 0,
  save_steps: 0,
  logging_steps: 1,
  lora_r: 0,
  lora_alpha: 16,
  lora_target_modules: 'q_proj,v_proj',
  ref_on_the_fly: false,
  sync_ref_model: false,
  ref_model_mixup_alpha: 0.6,
  ref_model_sync_steps: 512,
  ld_alpha: 1,
  save_adapter: false,
  save_merged: true,
  share_prompt: true,
  gradient_checkpointing: false,
  base_dtype: 'float32',
  chat_template: '',
  save_dtype: 'F32',
  device: 'cpu',
  compute_dtype: 'float32',
  threads: 0,

  report_to: 'none',
  save_total_limit: 0,
  load_best_model_at_end: false,
  metric_for_best_model: '',
  eval_generate: 0,
  eval_generate_max_new_tokens: 32,
  max_samples: 0,
  eval_samples: 0,
};

const CHOICES: Partial<Record<keyof TrainConfig, readonly string[]>> = {
  lr_scheduler: ['constant', 'linear', 'cosine'],
  optimizer: ['adamw', 'sgd'],
  truncation: ['keep_start', 'keep_end'],
  save_dtype: ['F32', 'BF16'],
  base_dtype: ['float32', 'float16'],
  device: ['cpu', 'webgpu', 'cuda'],
  compute_dtype: ['float32', 'float16'],
  report_to: ['none', 'tensorboard'],
};

/** Range checks: [min, max, integer?]. */
const RANGES: Partial<Record<keyof TrainConfig, [number, number, boolean]>> = {
  learning_rate: [0, 10, false],
  batch_size: [1, 1 << 20, true],
  gradient_accumulation_steps: [1, 1 << 20, true],
  num_epochs: [0, 1e6, false],
  max_steps: [0, 1e12, true],
  warmup_ratio: [0, 1, false],
  warmup_steps: [0, 1e12, true],
  adam_beta1: [0, 0.999999, false],
  adam_beta2: [0, 0.9999999, false],
  adam_epsilon: [0, 1, false],
  momentum: [0, 0.999999, false],
  weight_decay: [0, 10, false],
  max_grad_norm: [0, 1e9, false],
  max_length: [2, 1 << 20, true],
  max_prompt_length: [1, 1 << 20, true],
  pad_to_multiple_of: [1, 4096, true],
  seed: [0, 2 ** 32 - 1, true],
  eval_steps: [0, 1e12, true],
  save_steps: [0, 1e12, true],
  logging_steps: [1, 1e12, true],
  lora_r: [0, 4096, true],
  lora_alpha: [0, 1e6, false],
  ref_model_mixup_alpha: [0, 1, false],
  ref_model_sync_steps: [1, 1e12, true],
  ld_alpha: [0, 1, false],
  threads: [0, 1024, true],
  save_total_limit: [0, 1e9, true],
  eval_generate: [0, 1e6, true],
  eval_generate_max_new_tokens: [1, 1 << 20, true],
  max_samples: [0, 1e12, true],
  eval_samples: [0, 1e12, true],
};

function coerce(key: keyof TrainConfig, raw: unknown, where: string): TrainConfig[keyof TrainConfig] {
  const def = DEFAULT_CONFIG[key];
  if (typeof def === 'number') {
    const v = typeof raw === 'number' ? raw : typeof raw === 'string' && raw.trim() !== '' ? Number(raw) : NaN;
    const [lo, hi, int] = RANGES[key] ?? [-Infinity, Infinity, false];
    if (!Number.isFinite(v) || v < lo || v > hi || (int && !Number.isInteger(v))) {
      throw new UserError(`${where}: ${key} must be ${int ? 'an integer' : 'a number'} in [${lo}, ${hi}], got ${JSON.stringify(raw)}`);
    }
    return v;
  }
  if (typeof def === 'boolean') {
    if (raw === true || raw === 'true' || raw === '1') return true;
    if (raw === false || raw === 'false' || raw === '0') return false;
    throw new UserError(`${where}: ${key} must be true or false, got ${JSON.stringify(raw)}`);
  }
  const s = String(raw);
  const choices = CHOICES[key];
  if (choices && !choices.includes(s)) throw new UserError(`${where}: ${key} must be one of ${choices.join(', ')}, got ${JSON.stringify(raw)}`);
  return s as TrainConfig[keyof TrainConfig];
}

export function isConfigKey(k: string): k is keyof TrainConfig {
  return Object.prototype.hasOwnProperty.call(DEFAULT_CONFIG, k);
}

/** Splits `k=v` strings; a missing `=` is an error naming the flag. */
export function parseParams(pairs: readonly string[]): Record<string, string> {
  const out: Record<string, string> = {};
  for (const p of pairs) {
    const i = p.indexOf('=');
    if (i <= 0) throw new UserError(`--param expects key=value, got "${p}"`);
    out[p.slice(0, i).trim()] = p.slice(i + 1).trim();
  }
  return out;
}

export interface ResolvedConfig {
  config: TrainConfig;
  /** Everything that is not a trainer key: the loss's parameters, validated by the loss. */
  lossParams: Record<string, string | number | boolean>;
}

/** Merges defaults, a JSON config file and --param overrides. */
export function resolveConfig(opts: { configFile?: string; params?: readonly string[]; base?: Partial<TrainConfig> }): ResolvedConfig {
  const config: TrainConfig = { ...DEFAULT_CONFIG };
  const lossParams: Record<string, string | number | boolean> = {};
  const apply = (src: Record<string, unknown>, where: string) => {
    for (const [k, v] of Object.entries(src)) {
      if (k === 'loss_params' && v && typeof v === 'object') {
        Object.assign(lossParams, v);
      } else if (isConfigKey(k)) {
        (config as unknown as Record<string, unknown>)[k] = coerce(k, v, where);
      } else {
        lossParams[k] = v as string | number | boolean;
      }
    }
  };
  if (opts.base) apply(opts.base as Record<string, unknown>, 'defaults');
  if (opts.configFile) {
    let parsed: unknown;
    try {
      parsed = JSON.parse(readFileSync(opts.configFile, 'utf8'));
    } catch (e) {
      throw new UserError(`${opts.configFile}: ${(e as Error).message.split('\n')[0]}`);
    }
    if (!parsed || typeof parsed !== 'object' || Array.isArray(parsed)) throw new UserError(`${opts.configFile}: expected a JSON object of settings`);
    apply(parsed as Record<string, unknown>, opts.configFile);
  }
  apply(parseParams(opts.params ?? []), '--param');
  if (config.base_dtype !== 'float32' && config.lora_r === 0) {
    throw new UserError(`base_dtype=${config.base_dtype} needs LoRA (lora_r > 0): without adapters every weight is trained and stays float32`);
  }
  if (!config.save_merged && !config.save_adapter) {
    throw new UserError('save_merged=false needs save_adapter=true (otherwise the run would save no model)');
  }
  if (config.max_prompt_length >= config.max_length) {
    throw new UserError(`max_prompt_length (${config.max_prompt_length}) must be smaller than max_length (${config.max_length})`);
  }
  if (config.load_best_model_at_end && !(config.eval_data && config.eval_steps > 0)) {
    throw new UserError('load_best_model_at_end needs eval_data and eval_steps > 0 (the best checkpoint is chosen by evaluation)');
  }
  if (config.compute_dtype === 'float16' && config.device === 'cpu') {
    throw new UserError('compute_dtype=float16 is for the GPU (device=webgpu or cuda); on the CPU float32 is faster and exact');
  }
  if (config.eval_generate > 0 && !config.eval_data) throw new UserError('eval_generate needs eval_data (its prompts are generated from)');
  return { config, lossParams };
}
