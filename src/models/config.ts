/**
 * Hugging Face `config.json` of the architectures prefzoo builds: the llama family (`llama`, `qwen2`)
 * and `gpt2`. Fields keep their HF names so a config read from a model folder is written back
 * unchanged (unknown keys such as `rope_scaling` or `transformers_version` are preserved as-is).
 */
import fs from 'node:fs';
import path from 'node:path';
import { UserError } from '../errors.ts';
import { writeFileAtomic } from '../io/atomic.ts';

export type Arch = 'llama' | 'qwen2' | 'gpt2';
export const ARCHES: readonly Arch[] = ['llama', 'qwen2', 'gpt2'];

/** Activations the HF configs name (`hidden_act` / `activation_function`). */
export const ACTIVATIONS = ['silu', 'gelu', 'gelu_new', 'gelu_pytorch_tanh', 'gelu_fast', 'quick_gelu', 'relu'] as const;
export type Activation = (typeof ACTIVATIONS)[number];

interface CommonConfig {
  architectures?: string[];
  vocab_size: number;
  tie_word_embeddings: boolean;
  bos_token_id?: number | null;
  eos_token_id?: number | number[] | null;
  pad_token_id?: number | null;
  torch_dtype?: string;
  /** Unknown keys from the file, kept so that saving writes them back. */
  [key: string]: unknown;
}

/**
 * `llama` and `qwen2` (decoder with RMSNorm, rotary embeddings, grouped-query attention, SwiGLU MLP).
 * Llama's `attention_bias` puts biases on q, k, v and o; Qwen2 always has q/k/v biases and never an
 * o bias — use {@link attentionBiases} rather than reading the field directly.
 */
export interface LlamaConfig extends CommonConfig {
  model_type: 'llama' | 'qwen2';
  hidden_size: number;
  intermediate_size: number;
  num_attention_heads: number;
  num_key_value_heads: number;
  num_hidden_layers: number;
  /** Per-head dimension; defaults to hidden_size / num_attention_heads. */
  head_dim: number;
  rms_norm_eps: number;
  rope_theta: number;
  max_position_embeddings: number;
  attention_bias: boolean;
  mlp_bias: boolean;
  hidden_act: Activation;
}

/** `gpt2` (learned positions, LayerNorm, fused c_attn, Conv1D weights stored as [in, out]). */
export interface Gpt2Config extends CommonConfig {
  model_type: 'gpt2';
  n_embd: number;
  n_layer: number;
  n_head: number;
  n_positions: number;
  layer_norm_epsilon: number;
  /** MLP width; null in the file means 4 * n_embd, resolved by {@link gpt2Inner}. */
  n_inner: number | null;
  activation_function: Activation;
}

export type ModelConfig = LlamaConfig | Gpt2Config;

/** Which attention projections carry a bias. */
export function attentionBiases(c: LlamaConfig): { qkv: boolean; o: boolean } {
  return c.model_type === 'qwen2' ? { qkv: true, o: false } : { qkv: c.attention_bias, o: c.attention_bias };
}

export function gpt2Inner(c: Gpt2Config): number {
  return c.n_inner ?? 4 * c.n_embd;
}

/** Width of the residual stream, whichever architecture. */
export function hiddenSize(c: ModelConfig): number {
  return c.model_type === 'gpt2' ? c.n_embd : c.hidden_size;
}

export function numLayers(c: ModelConfig): number {
  return c.model_type === 'gpt2' ? c.n_layer : c.num_hidden_layers;
}

export function maxPositions(c: ModelConfig): number {
  return c.model_type === 'gpt2' ? c.n_positions : c.max_position_embeddings;
}

class FieldReader {
  constructor(
    private readonly raw: Record<string, unknown>,
    private readonly where: string,
  ) {}

  private fail(key: string, want: string): never {
    throw new UserError(`${this.where}: "${key}" must be ${want}, got ${JSON.stringify(this.raw[key])}`);
  }

  int(key: string, dflt?: number): number {
    const v = this.raw[key];
    if (v === undefined || v === null) {
      if (dflt === undefined) throw new UserError(`${this.where}: missing required field "${key}"`);
      return dflt;
    }
    if (typeof v !== 'number' || !Number.isSafeInteger(v) || v <= 0) this.fail(key, 'a positive integer');
    return v;
  }

  positive(key: string, dflt: number): number {
    const v = this.raw[key];
    if (v === undefined || v === null) return dflt;
    if (typeof v !== 'number' || !Number.isFinite(v) || v <= 0) this.fail(key, 'a positive number');
    return v;
  }

  bool(key: string, dflt: boolean): boolean {
    const v = this.raw[key];
    if (v === undefined || v === null) return dflt;
    if (typeof v !== 'boolean') this.fail(key, 'true or false');
    return v;
  }

  activation(key: string, dflt: Activation): Activation {
    const v = this.raw[key];
    if (v === undefined || v === null) return dflt;
    if (typeof v !== 'string' || !(ACTIVATIONS as readonly string[]).includes(v)) this.fail(key, `one of ${ACTIVATIONS.join(', ')}`);
    return v as Activation;
  }

  optionalTokenId(key: string): number | null | undefined {
    const v = this.raw[key];
    if (v === undefined || v === null) return v as null | undefined;
    if (typeof v !== 'number' || !Number.isSafeInteger(v) || v < 0) this.fail(key, 'a token id (non-negative integer) or null');
    return v;
  }

  optionalTokenIds(key: string): number | number[] | null | undefined {
    const v = this.raw[key];
    if (Array.isArray(v)) {
      if (!v.every((x) => typeof x === 'number' && Number.isSafeInteger(x) && x >= 0)) this.fail(key, 'a token id or a list of token ids');
      return v as number[];
    }
    return this.optionalTokenId(key);
  }
}

/**
 * Validates a parsed config.json and fills the defaults HF's config classes use. `where` names the
 * file in error messages.
 */
export function parseConfig(raw: unknown, where = 'config.json'): ModelConfig {
  if (raw === null || typeof raw !== 'object' || Array.isArray(raw)) throw new UserError(`${where}: must be a JSON object`);
  const obj = raw as Record<string, unknown>;
  const type = obj.model_type;
  if (typeof type !== 'string') throw new UserError(`${where}: missing "model_type" (expected one of ${ARCHES.join(', ')})`);
  if (!(ARCHES as readonly string[]).includes(type)) {
    throw new UserError(`${where}: model_type "${type}" is not supported (supported: ${ARCHES.join(', ')})`);
  }
  const r = new FieldReader(obj, where);
  const ids = {
    bos_token_id: r.optionalTokenId('bos_token_id'),
    eos_token_id: r.optionalTokenIds('eos_token_id'),
    pad_token_id: r.optionalTokenId('pad_token_id'),
  };
  // Keep absent optional ids absent, so a read-then-write round trip does not add keys.
  for (const k of Object.keys(ids) as (keyof typeof ids)[]) if (ids[k] === undefined) delete ids[k];

  if (type === 'gpt2') {
    const n_embd = r.int('n_embd', 768);
    const n_head = r.int('n_head', 12);
    if (n_embd % n_head !== 0) throw new UserError(`${where}: n_embd ${n_embd} is not divisible by n_head ${n_head}`);
    const inner = obj.n_inner;
    const cfg: Gpt2Config = {
      ...obj,
      model_type: 'gpt2',
      vocab_size: r.int('vocab_size', 50257),
      n_embd,
      n_layer: r.int('n_layer', 12),
      n_head,
      n_positions: r.int('n_positions', 1024),
      layer_norm_epsilon: r.positive('layer_norm_epsilon', 1e-5),
      n_inner: inner === undefined || inner === null ? null : r.int('n_inner'),
      activation_function: r.activation('activation_function', 'gelu_new'),
      // GPT-2 always shares the embedding with the output head.
      tie_word_embeddings: r.bool('tie_word_embeddings', true),
      ...ids,
    };
    return cfg;
  }

  const isQwen = type === 'qwen2';
  const hidden_size = r.int('hidden_size', 4096);
  const num_attention_heads = r.int('num_attention_heads', 32);
  const num_key_value_heads = r.int('num_key_value_heads', num_attention_heads);
  if (num_attention_heads % num_key_value_heads !== 0) {
    throw new UserError(`${where}: num_attention_heads ${num_attention_heads} is not a multiple of num_key_value_heads ${num_key_value_heads}`);
  }
  if (obj.head_dim == null && hidden_size % num_attention_heads !== 0) {
    throw new UserError(`${where}: hidden_size ${hidden_size} is not divisible by num_attention_heads ${num_attention_heads} (set head_dim explicitly)`);
  }
  const head_dim = r.int('head_dim', hidden_size / num_attention_heads);
  if (head_dim % 2 !== 0) throw new UserError(`${where}: head_dim ${head_dim} must be even for rotary embeddings`);
  const cfg: LlamaConfig = {
    ...obj,
    model_type: type as 'llama' | 'qwen2',
    vocab_size: r.int('vocab_size', isQwen ? 151936 : 32000),
    hidden_size,
    intermediate_size: r.int('intermediate_size', isQwen ? 22016 : 11008),
    num_attention_heads,
    num_key_value_heads,
    num_hidden_layers: r.int('num_hidden_layers', 32),
    head_dim,
    rms_norm_eps: r.positive('rms_norm_eps', 1e-6),
    rope_theta: r.positive('rope_theta', 10000),
    max_position_embeddings: r.int('max_position_embeddings', isQwen ? 32768 : 2048),
    attention_bias: r.bool('attention_bias', isQwen),
    mlp_bias: r.bool('mlp_bias', false),
    hidden_act: r.activation('hidden_act', 'silu'),
    tie_word_embeddings: r.bool('tie_word_embeddings', false),
    ...ids,
  };
  if (isQwen && obj.attention_bias === false) {
    throw new UserError(`${where}: qwen2 always has q/k/v biases; "attention_bias": false is not a qwen2 model (use model_type "llama")`);
  }
  return cfg;
}

/** Reads and validates `DIR/config.json`. */
export function readConfig(dir: string): ModelConfig {
  const file = path.join(dir, 'config.json');
  let text: string;
  try {
    text = fs.readFileSync(file, 'utf8');
  } catch (e) {
    const code = (e as NodeJS.ErrnoException).code;
    if (code === 'ENOENT') {
      throw new UserError(fs.existsSync(dir) ? `${file}: no such file (is ${dir} a Hugging Face model folder?)` : `${dir}: no such model folder`);
    }
    throw new UserError(`${file}: cannot read (${(e as Error).message})`);
  }
  let raw: unknown;
  try {
    raw = JSON.parse(text);
  } catch (e) {
    throw new UserError(`${file}: invalid JSON (${(e as Error).message})`);
  }
  return parseConfig(raw, file);
}

/** Writes `DIR/config.json` atomically, keys in a stable order (known fields as parsed, then the rest). */
export function writeConfig(dir: string, config: ModelConfig): void {
  fs.mkdirSync(dir, { recursive: true });
  const text = JSON.stringify(config, null, 2) + '\n';
  writeFileAtomic(path.join(dir, 'config.json'), [Buffer.from(text, 'utf8')]);
}

const ARCHITECTURE_CLASS: Record<Arch, string> = {
  llama: 'LlamaForCausalLM',
  qwen2: 'Qwen2ForCausalLM',
  gpt2: 'GPT2LMHeadModel',
};

export interface PresetOptions {
  /** Tokenizer size; the embedding gets this rounded up to a multiple of 64. Default: 32000 for small; required for tiny. */
  vocabSize?: number;
  bosTokenId?: number;
  eosTokenId?: number;
  padTokenId?: number;
}

/**
 * Config of a freshly initialised model for `prefzoo init-model`.
 * - tiny: hidden 64, 2 layers, 4 heads (2 KV heads), FFN 172, tied embeddings; well under 1M parameters
 *   with a few-hundred-token vocabulary (see {@link countParameters}).
 * - small: hidden 512, 8 layers, 8 heads (4 KV heads), FFN 1376, vocabulary 32000.
 */
export function presetConfig(arch: Arch, preset: 'tiny' | 'small', opts: PresetOptions = {}): ModelConfig {
  if (!(ARCHES as readonly string[]).includes(arch)) throw new UserError(`--arch: "${arch}" is not one of ${ARCHES.join(', ')}`);
  if (preset !== 'tiny' && preset !== 'small') throw new UserError(`--preset: "${preset}" is not one of tiny, small`);
  const tiny = preset === 'tiny';
  const wanted = opts.vocabSize ?? (tiny ? undefined : 32000);
  if (wanted === undefined) throw new Error('presetConfig: the tiny preset needs the tokenizer size (vocabSize)');
  const vocab_size = Math.ceil(wanted / 64) * 64;
  const ids: Record<string, number> = {};
  if (opts.bosTokenId !== undefined) ids.bos_token_id = opts.bosTokenId;
  if (opts.eosTokenId !== undefined) ids.eos_token_id = opts.eosTokenId;
  if (opts.padTokenId !== undefined) ids.pad_token_id = opts.padTokenId;
  let raw: Record<string, unknown>;
  if (arch === 'gpt2') {
    raw = {
      architectures: [ARCHITECTURE_CLASS.gpt2],
      model_type: 'gpt2',
      vocab_size,
      n_embd: tiny ? 64 : 512,
      n_layer: tiny ? 2 : 8,
      n_head: tiny ? 4 : 8,
      n_positions: tiny ? 512 : 2048,
      n_inner: null,
      activation_function: 'gelu_new',
      layer_norm_epsilon: 1e-5,
      tie_word_embeddings: true,
      ...ids,
      torch_dtype: 'float32',
    };
  } else {
    raw = {
      architectures: [ARCHITECTURE_CLASS[arch]],
      model_type: arch,
      vocab_size,
      hidden_size: tiny ? 64 : 512,
      intermediate_size: tiny ? 172 : 1376,
      num_hidden_layers: tiny ? 2 : 8,
      num_attention_heads: tiny ? 4 : 8,
      num_key_value_heads: tiny ? 2 : 4,
      head_dim: tiny ? 16 : 64,
      hidden_act: 'silu',
      max_position_embeddings: tiny ? 512 : 2048,
      rms_norm_eps: 1e-6,
      rope_theta: 10000,
      // Qwen2's q/k/v biases come with its model_type (HF's Qwen2Config has no attention_bias switch).
      ...(arch === 'llama' ? { attention_bias: false, mlp_bias: false } : {}),
      tie_word_embeddings: tiny,
      ...ids,
      torch_dtype: 'float32',
    };
  }
  return parseConfig(raw, `preset ${arch}/${preset}`);
}

/**
 * Parameter names and shapes of an HF checkpoint of this config (names exactly as HF saves them;
 * weights are [out, in] for llama-family Linear layers and [in, out] for GPT-2's Conv1D).
 * Tied output heads are not listed, as HF does not save them.
 */
export function parameterShapes(c: ModelConfig): Map<string, number[]> {
  const s = new Map<string, number[]>();
  if (c.model_type === 'gpt2') {
    const d = c.n_embd;
    const inner = gpt2Inner(c);
    s.set('transformer.wte.weight', [c.vocab_size, d]);
    s.set('transformer.wpe.weight', [c.n_positions, d]);
    for (let i = 0; i < c.n_layer; i++) {
      const p = `transformer.h.${i}.`;
      s.set(p + 'ln_1.weight', [d]);
      s.set(p + 'ln_1.bias', [d]);
      s.set(p + 'attn.c_attn.weight', [d, 3 * d]);
      s.set(p + 'attn.c_attn.bias', [3 * d]);
      s.set(p + 'attn.c_proj.weight', [d, d]);
      s.set(p + 'attn.c_proj.bias', [d]);
      s.set(p + 'ln_2.weight', [d]);
      s.set(p + 'ln_2.bias', [d]);
      s.set(p + 'mlp.c_fc.weight', [d, inner]);
      s.set(p + 'mlp.c_fc.bias', [inner]);
      s.set(p + 'mlp.c_proj.weight', [inner, d]);
      s.set(p + 'mlp.c_proj.bias', [d]);
    }
    s.set('transformer.ln_f.weight', [d]);
    s.set('transformer.ln_f.bias', [d]);
    if (!c.tie_word_embeddings) s.set('lm_head.weight', [c.vocab_size, d]);
    return s;
  }
  const d = c.hidden_size;
  const q = c.num_attention_heads * c.head_dim;
  const kv = c.num_key_value_heads * c.head_dim;
  const bias = attentionBiases(c);
  s.set('model.embed_tokens.weight', [c.vocab_size, d]);
  for (let i = 0; i < c.num_hidden_layers; i++) {
    const p = `model.layers.${i}.`;
    s.set(p + 'input_layernorm.weight', [d]);
    s.set(p + 'self_attn.q_proj.weight', [q, d]);
    s.set(p + 'self_attn.k_proj.weight', [kv, d]);
    s.set(p + 'self_attn.v_proj.weight', [kv, d]);
    if (bias.qkv) {
      s.set(p + 'self_attn.q_proj.bias', [q]);
      s.set(p + 'self_attn.k_proj.bias', [kv]);
      s.set(p + 'self_attn.v_proj.bias', [kv]);
    }
    s.set(p + 'self_attn.o_proj.weight', [d, q]);
    if (bias.o) s.set(p + 'self_attn.o_proj.bias', [d]);
    s.set(p + 'post_attention_layernorm.weight', [d]);
    s.set(p + 'mlp.gate_proj.weight', [c.intermediate_size, d]);
    s.set(p + 'mlp.up_proj.weight', [c.intermediate_size, d]);
    s.set(p + 'mlp.down_proj.weight', [d, c.intermediate_size]);
    if (c.mlp_bias) {
      s.set(p + 'mlp.gate_proj.bias', [c.intermediate_size]);
      s.set(p + 'mlp.up_proj.bias', [c.intermediate_size]);
      s.set(p + 'mlp.down_proj.bias', [d]);
    }
  }
  s.set('model.norm.weight', [d]);
  if (!c.tie_word_embeddings) s.set('lm_head.weight', [c.vocab_size, d]);
  return s;
}

/** Total number of parameters of a model with this config (tied heads counted once). */
export function countParameters(c: ModelConfig): number {
  let n = 0;
  for (const shape of parameterShapes(c).values()) n += shape.reduce((a, b) => a * b, 1);
  return n;
}
