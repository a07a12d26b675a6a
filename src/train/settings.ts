/**
 * The one declaration of every training setting: name, type, default, range or choices, a one-line
 * meaning, and the TRL (or paper) name where one exists. `TrainConfig` (config.ts), `--help` of the
 * training commands, docs/settings.md (scripts/settings-doc.ts) and the validation of
 * `--param`/`--config` values all come from these tables.
 *
 * A command says which settings it honours (`declareCommand`); a setting it cannot honour, given
 * through --param or --config, is refused in one line (`refuseUnhonoured`). A command with settings
 * of its own declares them as a table beside TRAIN_SETTINGS (`defineSettings`) and passes it as `own`.
 */
import { BadInputError, UserError } from '../errors.ts';
import { DEFAULT_TRUNCATION } from '../../datasets/examples.ts';
import { getLoss } from '../../losses/index.ts';
import { describeRange } from '../../losses/core/params.ts';

interface Common {
  /** One line: what the setting does. */
  doc: string;
  /** The heading it is listed under in --help and docs/settings.md. */
  group: string;
  /** TRL's name of the same setting (in its *Config or TrainingArguments), where one exists. */
  trl?: string;
  /** The paper the setting comes from, where one does. */
  paper?: string;
  /** More than one line, where the setting needs it: docs/settings.md prints it under the group's table. */
  more?: string;
}
export interface NumberSetting extends Common {
  /** 'int' accepts integers only. */
  type: 'number' | 'int';
  default: number;
  min?: number;
  max?: number;
  /** The bound itself is excluded. */
  minOpen?: boolean;
  maxOpen?: boolean;
}
export interface BooleanSetting extends Common {
  type: 'boolean';
  default: boolean;
}
export interface EnumSetting extends Common {
  type: 'enum';
  choices: readonly string[];
  default: string;
}
export interface StringSetting extends Common {
  type: 'string';
  default: string;
}
export type SettingDecl = NumberSetting | BooleanSetting | EnumSetting | StringSetting;
export type SettingTable = Readonly<Record<string, SettingDecl>>;

/** The TypeScript type of one declared setting's value. */
export type ValueOf<D> = D extends { type: 'number' | 'int' }
  ? number
  : D extends { type: 'boolean' }
    ? boolean
    : D extends { type: 'enum'; choices: readonly (infer C)[] }
      ? C
      : string;

/** The settings object a table describes: one typed field per declared setting. */
export type SettingsOf<T extends SettingTable> = { -readonly [K in keyof T]: ValueOf<T[K]> };

/** Declares a table of settings, keeping its literal types (enum choices become unions). */
export function defineSettings<const T extends SettingTable>(table: T): T {
  for (const [name, d] of Object.entries(table)) {
    if (d.type === 'enum' && !d.choices.includes(d.default)) throw new Error(`setting ${name}: default ${d.default} is not one of its choices`);
  }
  return table;
}

const G = {
  opt: 'Optimization',
  steps: 'Steps and schedule',
  data: 'Data and tokenization',
  lora: 'LoRA',
  ref: 'Reference model',
  eval: 'Evaluation and logging',
  save: 'Checkpoints and saving',
  device: 'Device and memory',
} as const;

/** The settings of `prefzoo train` (and, as each command declares, of the other training commands). */
export const TRAIN_SETTINGS = defineSettings({
  learning_rate: { type: 'number', default: 5e-6, min: 0, max: 10, group: G.opt, trl: 'learning_rate', doc: 'peak learning rate of the optimizer' },
  optimizer: { type: 'enum', choices: ['adamw', 'sgd'], default: 'adamw', group: G.opt, trl: 'optim', doc: 'AdamW or SGD with momentum' },
  adam_beta1: { type: 'number', default: 0.9, min: 0, max: 0.999999, group: G.opt, trl: 'adam_beta1', doc: "AdamW's first-moment decay" },
  adam_beta2: { type: 'number', default: 0.999, min: 0, max: 0.9999999, group: G.opt, trl: 'adam_beta2', doc: "AdamW's second-moment decay" },
  adam_epsilon: { type: 'number', default: 1e-8, min: 0, max: 1, group: G.opt, trl: 'adam_epsilon', doc: "AdamW's ε added to the root of the second moment" },
  momentum: { type: 'number', default: 0.9, min: 0, max: 0.999999, group: G.opt, doc: 'SGD momentum' },
  weight_decay: { type: 'number', default: 0, min: 0, max: 10, group: G.opt, trl: 'weight_decay', doc: 'decoupled weight decay (not applied to norms and biases)' },
  max_grad_norm: { type: 'number', default: 1, min: 0, max: 1e9, group: G.opt, trl: 'max_grad_norm', doc: 'global gradient-norm clip; 0 disables clipping' },
  batch_size: { type: 'int', default: 4, min: 1, max: 1 << 20, group: G.steps, trl: 'per_device_train_batch_size', doc: 'pairs (or lists, or single rows) per micro-batch' },
  gradient_accumulation_steps: { type: 'int', default: 1, min: 1, max: 1 << 20, group: G.steps, trl: 'gradient_accumulation_steps', doc: 'micro-batches summed into one optimizer step' },
  num_epochs: { type: 'number', default: 1, min: 0, max: 1e6, group: G.steps, trl: 'num_train_epochs', doc: 'passes over the training data (ignored when max_steps > 0)' },
  max_steps: { type: 'int', default: 0, min: 0, max: 1e12, group: G.steps, trl: 'max_steps', doc: 'optimizer steps to run; 0 means num_epochs over the data' },
  warmup_ratio: { type: 'number', default: 0, min: 0, max: 1, group: G.steps, trl: 'warmup_ratio', doc: 'linear warm-up as a share of all steps (used when warmup_steps is 0)' },
  warmup_steps: { type: 'int', default: 0, min: 0, max: 1e12, group: G.steps, trl: 'warmup_steps', doc: 'linear warm-up length in steps' },
  lr_scheduler: { type: 'enum', choices: ['constant', 'linear', 'cosine'], default: 'linear', group: G.steps, trl: 'lr_scheduler_type', doc: 'shape of the learning rate after warm-up' },
  seed: { type: 'int', default: 42, min: 0, max: 2 ** 32 - 1, group: G.steps, trl: 'seed', doc: 'seed of the data order, LoRA and value-head initialisation' },
  max_length: { type: 'int', default: DEFAULT_TRUNCATION.max_length, min: 2, max: 1 << 20, group: G.data, trl: 'max_length', doc: 'longest prompt + response in tokens; longer rows are truncated (and counted)' },
  max_prompt_length: { type: 'int', default: DEFAULT_TRUNCATION.max_prompt_length, min: 1, max: 1 << 20, group: G.data, trl: 'max_prompt_length', doc: 'longest prompt in tokens (smaller than max_length)' },
  truncation: { type: 'enum', choices: ['keep_start', 'keep_end'], default: DEFAULT_TRUNCATION.truncation, group: G.data, trl: 'truncation_mode', doc: 'which end of an over-long prompt to keep' },
  pad_to_multiple_of: { type: 'int', default: 64, min: 1, max: 4096, group: G.data, doc: 'sequence lengths are padded to a multiple of this, so the runtime sees few shapes' },
  chat_template: { type: 'string', default: '', group: G.data, doc: "a Jinja chat-template file used instead of the model's own ('' = the model's)" },
  share_prompt: { type: 'boolean', default: true, group: G.data, doc: "run each example's prompt once for all its responses (same results, less work)", more: "Pairwise and listwise data: the prompt runs once per example, shared by its responses, with the same log-probs and gradients as one sequence per response. false: one sequence per response." },
  ld_alpha: { type: 'number', default: 1, min: 0, max: 1, group: G.data, trl: 'ld_alpha', paper: 'LD-DPO (2024)', doc: 'LD-DPO: weight of policy tokens past the shorter response of a pair (1: off)', more: "LD-DPO (\"Length Desensitization in Direct Preference Optimization\", 2024), pairwise data: the policy's log-prob of a response counts its first min(n_w, n_l) tokens fully and the tokens past that weighted by ld_alpha; reference log-probs and token counts are unchanged, as in TRL and LLaMA-Factory." },
  max_samples: { type: 'int', default: 0, min: 0, max: 1e12, group: G.data, doc: 'train on the first N rows of the data only (0: all)' },
  lora_r: { type: 'int', default: 0, min: 0, max: 4096, group: G.lora, trl: 'lora_r', doc: 'LoRA rank; 0 trains all parameters' },
  lora_alpha: { type: 'number', default: 16, min: 0, max: 1e6, group: G.lora, trl: 'lora_alpha', doc: 'LoRA scale numerator (updates scaled by lora_alpha / lora_r)' },
  lora_target_modules: { type: 'string', default: 'q_proj,v_proj', group: G.lora, trl: 'lora_target_modules', doc: "comma-separated module names LoRA adapts ('all-linear': every projection)" },
  base_dtype: { type: 'enum', choices: ['float32', 'float16'], default: 'float32', group: G.lora, doc: 'LoRA only: the type the frozen base weights are held in', more: "float16 halves the frozen weights' memory; each is widened to float32 where a layer uses it (and widened again in the backward rather than kept). bfloat16 cannot be fed through onnxruntime-node's JavaScript API, so it is not offered. Needs lora_r > 0." },
  load_in_4bit: { type: 'boolean', default: false, group: G.lora, trl: 'load_in_4bit', paper: 'QLoRA (Dettmers et al. 2023)', doc: 'LoRA only: hold the frozen projection weights in 4 bits (QLoRA)', more: "QLoRA (\"QLoRA: Efficient Finetuning of Quantized LLMs\", Dettmers et al. 2023): every projection weight of the frozen base is quantized once, when the artifacts are built, to 4 bits in blocks of quant_block_size values with a float32 scale each (MatMulNBits' int4, ggml's Q4_0 rule: 0.5 + 4/block bytes a weight); embeddings, the output head, norms and biases stay as base_dtype says. Each layer dequantizes its weights where it uses them, and again in the backward rather than keeping them. The reference model and the saved merged model are the dequantized base (plus the adapters); the adapters are saved in PEFT's layout as without it. CPU only. Needs lora_r > 0." },
  bnb_4bit_quant_type: { type: 'enum', choices: ['int4'], default: 'int4', group: G.lora, trl: 'bnb_4bit_quant_type', doc: "load_in_4bit: the 4-bit format; only 'int4' (MatMulNBits' blocks), not bitsandbytes' nf4 or fp4", more: "bitsandbytes' and PEFT's name. prefzoo holds the base in ONNX Runtime's int4 blocks (see load_in_4bit), which its kernels dequantize in one pass; nf4 and fp4 are refused rather than silently replaced." },
  quant_block_size: { type: 'int', default: 64, min: 16, max: 256, group: G.lora, doc: 'load_in_4bit: values per quantization block (16, 32, 64, 128 or 256; each has one float32 scale)', more: "64 is bitsandbytes' block. Smaller blocks are more exact and cost more scales (4/block bytes a weight). It must divide the input width of every projection." },
  ref_on_the_fly: { type: 'boolean', default: false, group: G.ref, doc: 'score the reference for every batch instead of caching it once (a loss that reads none — sft, simpo, orpo — refuses it)' },
  sync_ref_model: { type: 'boolean', default: false, group: G.ref, trl: 'sync_ref_model', paper: 'TR-DPO (Gorbatovski et al. 2024)', doc: 'TR-DPO: every ref_model_sync_steps steps ref ← α·policy + (1−α)·ref', more: "TR-DPO (\"Learn Your Reference Model for Real Good Alignment\", Gorbatovski et al. 2024): every ref_model_sync_steps optimizer steps the reference becomes ref ← α·policy + (1 − α)·ref with α = ref_model_mixup_alpha (LoRA merged into the policy first). Reference log-probs are then computed for every batch, never cached. The reference needs the policy's shapes. A loss that reads no reference (sft, simpo, orpo) refuses it." },
  ref_model_mixup_alpha: { type: 'number', default: 0.6, min: 0, max: 1, group: G.ref, trl: 'ref_model_mixup_alpha', paper: 'TR-DPO', doc: 'TR-DPO: α of that soft update (1: the reference becomes the policy)' },
  ref_model_sync_steps: { type: 'int', default: 512, min: 1, max: 1e12, group: G.ref, trl: 'ref_model_sync_steps', paper: 'TR-DPO', doc: 'TR-DPO: optimizer steps between reference updates' },
  eval_data: { type: 'string', default: '', group: G.eval, doc: 'held-out data evaluated every eval_steps and at the end' },
  eval_steps: { type: 'int', default: 0, min: 0, max: 1e12, group: G.eval, trl: 'eval_steps', doc: 'optimizer steps between evaluations (0: only at the end)' },
  eval_samples: { type: 'int', default: 0, min: 0, max: 1e12, group: G.eval, doc: 'evaluate on the first N rows of eval_data only (0: all)' },
  eval_generate: { type: 'int', default: 0, min: 0, max: 1e6, group: G.eval, doc: "at each evaluation write N prompts' greedy completions of policy and reference to RUN/samples/" },
  eval_generate_max_new_tokens: { type: 'int', default: 32, min: 1, max: 1 << 20, group: G.eval, doc: 'longest eval_generate completion in tokens' },
  logging_steps: { type: 'int', default: 1, min: 1, max: 1e12, group: G.eval, trl: 'logging_steps', doc: 'write a metrics.jsonl row every logging_steps steps' },
  report_to: { type: 'enum', choices: ['none', 'tensorboard'], default: 'none', group: G.eval, trl: 'report_to', doc: "'tensorboard' also writes event files to RUN/runs/" },
  metric_for_best_model: { type: 'string', default: '', group: G.eval, trl: 'metric_for_best_model', doc: "eval metric that picks the best checkpoint ('': accuracy, ndcg or roc_auc by data kind)", more: "Empty: accuracy for pairwise data, ndcg for listwise, roc_auc for single. Higher is better unless the name ends in \"loss\"." },
  save_steps: { type: 'int', default: 0, min: 0, max: 1e12, group: G.save, trl: 'save_steps', doc: 'checkpoint every save_steps optimizer steps (0: only at the end)' },
  save_total_limit: { type: 'int', default: 0, min: 0, max: 1e9, group: G.save, trl: 'save_total_limit', doc: 'keep at most this many checkpoints (the best is kept); 0 keeps all' },
  load_best_model_at_end: { type: 'boolean', default: false, group: G.save, trl: 'load_best_model_at_end', doc: 'save the best checkpoint by metric_for_best_model as RUN/final', more: "Needs eval_data and eval_steps > 0; a checkpoint is written at every evaluation." },
  save_adapter: { type: 'boolean', default: false, group: G.save, doc: 'with LoRA: also write RUN/adapter/ in PEFT layout', more: "Writes adapter_model.safetensors with `base_model.model.<module>.lora_A.weight` names and adapter_config.json, as PEFT loads them." },
  save_merged: { type: 'boolean', default: true, group: G.save, doc: 'write the merged model to RUN/final/ (false with save_adapter: adapter only)' },
  save_dtype: { type: 'enum', choices: ['F32', 'BF16'], default: 'F32', group: G.save, doc: 'type of the saved final weights' },
  device: { type: 'enum', choices: ['cpu', 'webgpu', 'cuda'], default: 'cpu', group: G.device, doc: 'where the model runs (webgpu: any Vulkan GPU, bundled; cuda: CUDA build of onnxruntime-node)', more: "webgpu runs on any Vulkan GPU through the WebGPU provider bundled with onnxruntime-node, nothing to install; cuda needs onnxruntime-node's CUDA binaries." },
  compute_dtype: { type: 'enum', choices: ['float32', 'float16'], default: 'float32', group: G.device, doc: 'GPU only: float16 matrix products, float32 weights, reductions and loss', more: "float16 runs every MatMul/Gemm (forward and backward) on float16 copies and widens the result at once; master weights, optimizer state, norms, softmax, reductions, log-prob sums and the loss stay float32 (src/onnx/half.ts)." },
  threads: { type: 'int', default: 0, min: 0, max: 1024, group: G.device, doc: 'ONNX Runtime intra-op threads; 0 lets the runtime choose' },
  rollout_dtype: { type: 'enum', choices: ['f32', 'f16', 'q8', 'q4'], default: 'f32', group: G.device, doc: "online methods: the precision the rollouts decode in (q8/q4: the live weights block-quantized each step; CPU only)", more: "q8 and q4 quantize every linear weight of the live policy (the output head included) into blocks of rollout_block_size values when the policy is next sampled, as ggml's Q8_0 / Q4_0 do (with LoRA the frozen base is quantized once and the adapters are fed in float32, so an update makes no new session), and the generation graphs multiply through ONNX Runtime's MatMulNBits with int8 activations (src/models/quantize.ts); embeddings, norms and biases stay float32. Training, scoring and reference log-probs stay float32. In grpo the sampler's log-probs of the drawn tokens feed the importance-sampling correction (vllm_importance_sampling_correction, on by default) and, unless it is given, off_policy_mask_threshold defaults to 0.5 under q8/q4: TRL's use_vllm=True semantics. f16 is refused: ONNX Runtime's CPU provider has no fast float16 product. WebGPU is refused (the op runs prepacked on the CPU provider only)." },
  rollout_block_size: { type: 'int', default: 32, min: 16, max: 256, group: G.device, doc: 'values per quantization block of rollout_dtype q8/q4 (a power of two, 16–256)' },
  gradient_checkpointing: { type: 'boolean', default: false, group: G.device, trl: 'gradient_checkpointing', doc: "recompute each layer's activations in the backward (less memory, same gradients)", more: "The backward recomputes each layer's activations from the layer's input (about a third more forward work). It also switches on the rest of the memory-saving mode: attention in pieces over the key/value heads, gradient sessions without ONNX Runtime's memory arena (forward-only ones, eval and scoring, keep it), gradients let go of after each update (docs/performance.md, \"Real sizes\"); models of 200M parameters or more get the arena-free gradient sessions whatever this says (train/run.ts LOW_MEMORY_PARAMS). On the CPU, `train` builds the forward for the longest micro-batch its rows make: where a tensor of that batch passes glibc's 32 MiB mmap bound (long sequences at real widths), the MLP runs over runs of rows and attention over blocks of queries, each block against the keys up to its last query, and the gradient sessions of that graph keep the arena (artifacts.json `inPieces`; docs/performance.md, issue 46); the reference scoring is cut the same way." },
});

export type TrainSettings = SettingsOf<typeof TRAIN_SETTINGS>;

/** A table's defaults as a settings object. */
export function defaultsOf<T extends SettingTable>(table: T): SettingsOf<T> {
  return Object.fromEntries(Object.entries(table).map(([k, d]) => [k, d.default])) as SettingsOf<T>;
}

/** The values a setting takes, as its error message and the docs say them. */
export function describeAllowed(d: SettingDecl): string {
  switch (d.type) {
    case 'boolean':
      return 'true or false';
    case 'enum':
      return `one of ${d.choices.join(', ')}`;
    case 'string':
      return 'text';
    default: {
      const lo = d.min === undefined ? '(-∞' : `${d.minOpen ? '(' : '['}${num(d.min)}`;
      const hi = d.max === undefined ? '∞)' : `${num(d.max)}${d.maxOpen ? ')' : ']'}`;
      return `${d.type === 'int' ? 'an integer' : 'a number'} in ${lo}, ${hi}`;
    }
  }
}

/** Converts one given value (a --param string or a config file's value) to the setting's type, or throws one line naming it. */
export function coerceSetting(name: string, d: SettingDecl, raw: unknown, where: string): number | boolean | string {
  const bad = () => new BadInputError(`${where}: ${name} must be ${describeAllowed(d)}, got ${JSON.stringify(raw)}`, { setting: name });
  switch (d.type) {
    case 'boolean':
      if (raw === true || raw === 'true' || raw === '1' || raw === 1) return true;
      if (raw === false || raw === 'false' || raw === '0' || raw === 0) return false;
      throw bad();
    case 'enum':
      if (typeof raw === 'string' && d.choices.includes(raw)) return raw;
      throw bad();
    case 'string':
      if (typeof raw === 'string' || typeof raw === 'number') return String(raw);
      throw bad();
    default: {
      const v = typeof raw === 'number' ? raw : typeof raw === 'string' && raw.trim() !== '' ? Number(raw) : NaN;
      const low = d.min !== undefined && (d.minOpen ? v <= d.min : v < d.min);
      const high = d.max !== undefined && (d.maxOpen ? v >= d.max : v > d.max);
      if (!Number.isFinite(v) || low || high || (d.type === 'int' && !Number.isInteger(v))) throw bad();
      return v;
    }
  }
}

/** Edit distance (insertions, deletions, substitutions, adjacent swaps). */
function distance(a: string, b: string): number {
  const d: number[][] = Array.from({ length: a.length + 1 }, (_, i) => [i, ...new Array<number>(b.length).fill(0)]);
  for (let j = 1; j <= b.length; j++) d[0][j] = j;
  for (let i = 1; i <= a.length; i++) {
    for (let j = 1; j <= b.length; j++) {
      d[i][j] = Math.min(d[i - 1][j] + 1, d[i][j - 1] + 1, d[i - 1][j - 1] + (a[i - 1] === b[j - 1] ? 0 : 1));
      if (i > 1 && j > 1 && a[i - 1] === b[j - 2] && a[i - 2] === b[j - 1]) d[i][j] = Math.min(d[i][j], d[i - 2][j - 2] + 1);
    }
  }
  return d[a.length][b.length];
}

/** The valid name closest to `name`, when one is close enough to be a slip (a third of its letters, at least 2). */
export function nearestName(name: string, candidates: Iterable<string>): string | undefined {
  let best: string | undefined;
  let bestD = Infinity;
  const lower = name.toLowerCase();
  for (const c of candidates) {
    const dd = distance(lower, c);
    if (dd < bestD) [best, bestD] = [c, dd];
  }
  return bestD <= Math.max(2, Math.floor(name.length / 3)) ? best : undefined;
}

/** The one-line error of an unknown key: the nearest valid name when there is one. */
export function unknownSetting(name: string, candidates: Iterable<string>, where?: string): UserError {
  const near = nearestName(name, candidates);
  return new BadInputError(`${where ? `${where}: ` : ''}unknown setting '${name}'${near ? `; did you mean '${near}'?` : ''}`, { setting: name });
}

// --- Commands and the settings they honour ---

export interface CommandDecl {
  name: string;
  /** Names of TRAIN_SETTINGS the command honours. */
  honours: readonly string[];
  /** Settings of the command's own, declared with `defineSettings`. */
  own?: SettingTable;
  /** Loss parameters it takes besides settings: those of any loss (train, artifacts), of one loss (nash-md: 'nash_md'), or none. */
  lossParams: 'any' | 'none' | string;
  /** The command's own defaults of honoured TRAIN_SETTINGS (grpo: learning_rate 1e-6, as TRL's GRPOConfig); the rest keep the table's. */
  defaults: Partial<TrainSettings>;
}

const COMMANDS = new Map<string, CommandDecl>();

/**
 * Declares which settings a command honours (and its own settings, and its own defaults of the
 * honoured ones); returns the declaration. `--help`, docs/settings.md and resolveConfig (config.ts)
 * all read a command's defaults from here (`commandDefaults`).
 */
export function declareCommand(name: string, o: { honours: readonly (keyof typeof TRAIN_SETTINGS)[] | 'all'; own?: SettingTable; lossParams?: CommandDecl['lossParams']; defaults?: Partial<TrainSettings> }): CommandDecl {
  const honours = o.honours === 'all' ? Object.keys(TRAIN_SETTINGS) : [...o.honours];
  for (const k of honours) if (!(k in TRAIN_SETTINGS)) throw new Error(`declareCommand ${name}: no setting ${k}`);
  const defaults: Partial<TrainSettings> = {};
  for (const [k, v] of Object.entries(o.defaults ?? {})) {
    if (!honours.includes(k)) throw new Error(`declareCommand ${name}: a default for ${k}, which it does not honour`);
    // The table's checks (type, range, choices) hold for a command's default as for a given value.
    (defaults as Record<string, unknown>)[k] = coerceSetting(k, TRAIN_SETTINGS[k as keyof typeof TRAIN_SETTINGS], v, `declareCommand ${name}`);
  }
  const decl: CommandDecl = { name, honours, own: o.own, lossParams: o.lossParams ?? 'any', defaults };
  COMMANDS.set(name, decl);
  return decl;
}

export function commandDecl(name: string): CommandDecl {
  const c = COMMANDS.get(name);
  if (!c) throw new Error(`no settings declared for command ${name}`);
  return c;
}

/** A command's defaults of every TRAIN_SETTINGS entry: the table's, with the command's own defaults over them. */
export function commandDefaults(command: string): TrainSettings {
  return { ...defaultsOf(TRAIN_SETTINGS), ...commandDecl(command).defaults };
}

/** Every declared command, in declaration order. */
export function declaredCommands(): CommandDecl[] {
  return [...COMMANDS.values()];
}

/** Every setting name a command takes (honoured shared settings and its own). */
export function settingNames(command: string): string[] {
  const c = commandDecl(command);
  return [...c.honours, ...Object.keys(c.own ?? {})];
}

/** Refuses, in one line, the given settings a command cannot honour (names it and the command). */
export function refuseUnhonoured(command: string, given: Iterable<string>): void {
  const c = commandDecl(command);
  const ok = new Set(settingNames(command));
  const refused = [...new Set(given)].filter((k) => k in TRAIN_SETTINGS && !ok.has(k));
  if (refused.length) {
    throw new BadInputError(`${refused.length > 1 ? 'settings' : 'setting'} ${refused.join(', ')} cannot be honoured by prefzoo ${command} (it honours ${c.honours.length === Object.keys(TRAIN_SETTINGS).length ? 'every training setting' : settingNames(command).join(', ')})`, { setting: refused[0] });
  }
}

// The commands that take training settings. A new command declares itself here (or in its own
// module with `declareCommand`), with the settings of its own as a `defineSettings` table.

const OPTIMIZER = ['learning_rate', 'optimizer', 'adam_beta1', 'adam_beta2', 'adam_epsilon', 'momentum', 'weight_decay', 'max_grad_norm'] as const;
const SCHEDULE = ['max_steps', 'num_epochs', 'warmup_ratio', 'warmup_steps', 'lr_scheduler', 'seed', 'logging_steps'] as const;
const LORA = ['lora_r', 'lora_alpha', 'lora_target_modules'] as const;
const RUNTIME = ['device', 'compute_dtype', 'threads'] as const;
/** The rollouts' precision: the commands that sample from the live policy (ctx.policy()) honour these. */
export const ROLLOUT = ['rollout_dtype', 'rollout_block_size'] as const;

declareCommand('train', { honours: 'all' });
/** The artifacts are the training problem and its optimizer: what the graphs are built from, nothing that runs steps. */
declareCommand('artifacts', {
  honours: [...OPTIMIZER.filter((k) => k !== 'learning_rate'), ...LORA, 'seed', 'share_prompt', 'ld_alpha', 'gradient_checkpointing', 'base_dtype', 'load_in_4bit', 'bnb_4bit_quant_type', 'quant_block_size', 'device', 'compute_dtype', 'gradient_accumulation_steps'],
});
/**
 * What the training loop (src/train/loop.ts) honours for every online method on it: the optimizer and its
 * schedule, micro-batches and accumulation, LoRA, the device, checkpoints, logging and saving.
 */
export const ONLINE_LOOP_SETTINGS = [
  ...OPTIMIZER, ...SCHEDULE, ...LORA, ...RUNTIME,
  'batch_size', 'gradient_accumulation_steps', 'pad_to_multiple_of', 'save_steps', 'save_total_limit', 'report_to', 'chat_template', 'save_dtype', 'save_merged', 'save_adapter',
] as const satisfies readonly (keyof typeof TRAIN_SETTINGS)[];
// The online methods declare themselves beside their code (src/online: grpo/settings.ts, sppo.ts,
// nash-md.ts, reward-model.ts), with ONLINE_LOOP_SETTINGS and their own tables.

// --- Help text and docs ---

/** A number as a person writes it: 5e-6, 1e12, 0.9, 1048576. */
function num(v: number): string {
  const p = Math.log10(Math.abs(v));
  if (v !== 0 && Number.isInteger(p) && (p <= -4 || p >= 7)) return `1e${p}`;
  return v !== 0 && Math.abs(v) < 1e-3 ? v.toExponential() : String(v);
}

function shown(v: number | boolean | string): string {
  return typeof v === 'string' ? (v === '' ? "''" : v) : typeof v === 'number' ? num(v) : String(v);
}

function groups(table: SettingTable, names: readonly string[]): Map<string, string[]> {
  const out = new Map<string, string[]>();
  for (const k of names) {
    const g = table[k].group;
    out.set(g, [...(out.get(g) ?? []), k]);
  }
  return out;
}

/** The `--help` block of a command's settings: `key=default  meaning`, grouped. */
export function settingsHelp(command: string): string {
  const c = commandDecl(command);
  const table: SettingTable = { ...TRAIN_SETTINGS, ...c.own };
  const defaults: Record<string, number | boolean | string> = { ...defaultsOf(table), ...c.defaults };
  const given = new Set(settingNames(command));
  const names = Object.keys(table).filter((k) => given.has(k));
  const width = Math.max(...names.map((k) => `${k}=${shown(defaults[k])}`.length)) + 2;
  const lines: string[] = [];
  for (const [g, keys] of groups(table, names)) {
    lines.push(`  ${g}:`);
    // A command's own settings also name TRL's setting (the shared table's are in docs/settings.md).
    for (const k of keys) lines.push(`    ${`${k}=${shown(defaults[k])}`.padEnd(width)}${table[k].doc}${c.own?.[k]?.trl ? ` (TRL ${c.own[k].trl})` : ''}`);
  }
  return lines.join('\n');
}

/** docs/settings.md, as scripts/settings-doc.ts writes it. */
export function settingsMarkdown(): string {
  const cell = (s: string) => s.replace(/\|/g, '\\|');
  const out: string[] = [
    '# Settings',
    '',
    '<!-- Generated by `node --import tsx scripts/settings-doc.ts` from src/train/settings.ts; do not edit by hand. -->',
    '',
    'Every setting of the training commands, as `--param key=value` or a key of `--config FILE` (JSON,',
    "or YAML with TRL's names: see the end of this page). A command refuses, in one line, a",
    'setting it cannot honour; an unknown key gets the nearest valid name. Loss parameters (`beta`, …)',
    'are declared by each loss ([losses.md](losses.md)).',
    '',
  ];
  const all = Object.keys(TRAIN_SETTINGS);
  for (const [g, keys] of groups(TRAIN_SETTINGS, all)) {
    out.push(`## ${g}`, '', '| setting | type | default | allowed | meaning | TRL / paper |', '|---|---|---|---|---|---|');
    for (const k of keys) {
      const d: SettingDecl = TRAIN_SETTINGS[k as keyof typeof TRAIN_SETTINGS];
      const src = [d.trl ? `\`${d.trl}\`` : '', d.paper ?? ''].filter(Boolean).join('; ');
      out.push(`| \`${k}\` | ${d.type} | \`${shown(d.default)}\` | ${cell(describeAllowed(d))} | ${cell(d.doc)} | ${cell(src)} |`);
    }
    out.push('');
    const table: SettingTable = TRAIN_SETTINGS;
    const notes = keys.filter((k) => table[k].more);
    for (const k of notes) out.push(`- \`${k}\`: ${table[k].more}`);
    if (notes.length) out.push('');
  }
  out.push('## What each command honours', '');
  for (const c of declaredCommands()) {
    const n = c.honours.length === all.length ? 'every setting above' : c.honours.length === 0 ? 'none of the settings above' : c.honours.map((k) => `\`${k}\``).join(', ');
    const loss = c.lossParams === 'any' ? "the loss's parameters" : c.lossParams === 'none' ? 'no loss parameters' : `the parameters of loss \`${c.lossParams}\``;
    const own = Object.entries(c.defaults);
    const defaults = own.length ? ` Its defaults: ${own.map(([k, v]) => `\`${k}=${shown(v)}\``).join(', ')} (the table's for the rest).` : '';
    out.push(`- \`${c.name}\`: ${n}; ${loss}.${defaults}${c.own ? ` Its own: ${Object.keys(c.own).map((k) => `\`${k}\``).join(', ')}.` : ''}`);
    if (c.own) {
      for (const [k, d] of Object.entries(c.own)) out.push(`  - \`${k}=${shown(d.default)}\` (${cell(describeAllowed(d))}): ${d.doc}${d.trl ? ` (TRL \`${d.trl}\`)` : ''}`);
    }
    // A command with one loss of its own lists that loss's parameters too (they are --param keys like its settings).
    if (c.lossParams !== 'any' && c.lossParams !== 'none') {
      for (const p of getLoss(c.lossParams).params) out.push(`  - \`${p.name}=${p.default === null ? 'unset' : shown(p.default)}\` (loss parameter, ${cell(describeRange(p))}): ${cell(p.doc)}${p.trl ? ` (TRL \`${p.trl}\`)` : ''}`);
    }
  }
  out.push(
    '',
    '## TRL configs',
    '',
    "`prefzoo train --config dpo.yaml` takes the YAML `trl dpo --config dpo.yaml` takes: DPOConfig and",
    "TrainingArguments keys, and the script's `model_name_or_path`, `dataset_name`, `output_dir` (they stand",
    'for `--model`, `--data`, `-o`; a flag given as well must agree). Settings are renamed as the table',
    "above says (TRL / paper column). TRL's conventions are converted (src/train/settings-trl.ts):",
    '',
    '- `loss_type` is `--loss`: `sigmoid` is `dpo`, `aot_pair` (TRL\'s unpaired AOT) is `aot_unpaired`, other names',
    '  are the same; a list with `loss_weights` is a mixture (`dpo:0.8,sft:0.2`); absent, `dpo` (TRL\'s default).',
    '- `f_alpha_divergence_coef` = 1 − `f_alpha` (read under `f_divergence_type: alpha_divergence` only);',
    '  `f_divergence_type: js_divergence` is `js`.',
    '- `beta`, `label_smoothing`, `rpo_alpha` (`null`: 0), `discopop_tau`, `use_weighting` (`wpo`) are loss parameters;',
    '  `ld_alpha: null` is 1 (off).',
    '- `optim: adamw_torch` (also `adamw_torch_fused`, `adamw_hf`) is `adamw`; `lr_scheduler_type: constant_with_warmup`',
    '  is `constant`; `report_to` may be a list of `none` and `tensorboard`.',
    "- `lora_r`, `lora_alpha`, `lora_target_modules` apply under `use_peft: true` only (then TRL's defaults r 16, alpha 32).",
    '- Keys that change only speed or memory in TRL are accepted (`precompute_ref_log_probs`, `dataset_num_proc`,',
    '  `per_device_eval_batch_size`, …), as are neutral values (`bf16: false`, `disable_dropout: true`, …).',
    '',
    "Keys the file leaves out take prefzoo's defaults (the tables above, with a command's own defaults from \"What each command",
    "honours\"), not TRL's (DPOConfig's learning_rate is 1e-6).",
    '',
    'Every other key, and a value prefzoo cannot honour (`bf16: true`, `lr_scheduler_type: polynomial`), is',
    'named in one refusal line listing them all.',
    '',
  );
  return out.join('\n');
}
