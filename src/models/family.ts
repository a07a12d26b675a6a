/**
 * What a family file declares about an architecture, and the config types it reads: a {@link Family}
 * is one object per HF `model_type` (src/models/llama.ts, gpt2.ts, qwen3.ts, …) holding its config
 * fields and defaults, presets, HF tensor names, training forward, KV-cached decode, LoRA targets and,
 * optionally, its names in exported formats. src/models/families.ts lists them; everything else asks
 * the registry, never compares `model_type`. This file imports nothing from src/models: it also
 * declares the types a family's builders take (the batch and decode indices, the parameter lookup,
 * LoRA modules), so the families, layers.ts, params.ts, lora.ts, the registry and config.ts all
 * stand on it, and test/layers.test.ts holds the folder free of import circles.
 */
import { UserError } from '../errors.ts';
import type { Dim, Graph, Tensor } from '../onnx/graph.ts';

/** Float types of the parameters and activations. */
export type FloatDType = 'float32' | 'float64';

/** Index tensors of one batch, derived once and shared by every layer. */
export interface BatchIndex {
  dtype: FloatDType;
  B: Dim;
  T: Dim;
  /** B·T, the row count of the 2-D activations. */
  N: Dim;
  /** `[B, T]` int64 token ids. */
  ids: Tensor;
  /** `[N]` int64 token ids. */
  flatIds: Tensor;
  /** `[B, T]` int64 position of each token among the row's real tokens (pads get their neighbour's). */
  positions: Tensor;
  /** `[B, 1, T, T]` additive mask: 0 where query t may attend key s (s ≤ t and s is real), else MASK_VALUE. */
  mask: Tensor;
  /** `[2]` int64 runtime shape (B, T). */
  shapeBT: Tensor;
  /**
   * Attention in up to this many pieces over the key/value heads (CausalLMOptions.attentionPieces):
   * one piece's `[B, heads/pieces, T, T]` scores are alive at a time instead of all heads'.
   */
  pieces?: number;
  /**
   * The largest batch the graph is built for (CausalLMOptions.chunking): the training forward then
   * runs its MLP in pieces of rows and attention in blocks of queries, as many as keep each piece's
   * tensors under `bound` bytes at that shape (src/models/layers.ts, `piecesUnder`).
   */
  chunking?: Chunking;
}

/**
 * A batch shape for chunking: `rows` × `len` input ids, each tensor under `bound` bytes (default
 * layers.ts's TENSOR_BOUND). Numbers fixed when the graph is built; the pieces' sizes follow the
 * batch at run time (K near-equal runs), so a shorter batch gets smaller pieces.
 */
export interface Chunking {
  rows: number;
  len: number;
  bound?: number;
  /** Set by the builders: the most pieces any block of the graph was cut into (1 or absent: none was). */
  built?: number;
}

/** Index tensors shared by the layers of one decode graph. */
export interface DecodeIndex {
  /** `[B·S]` new token ids. */
  flatIds: Tensor;
  /** `[B, S]` int64 positions of the new tokens. */
  positions: Tensor;
  /** `[B, 1, S, L]` additive mask of new queries over past + new keys. */
  mask: Tensor;
  /** `[2]` runtime (B, S). */
  shapeBS: Tensor;
  /**
   * Attention's softmax in float64 (see decode.ts's `rowInvariant`): a row's probabilities then do
   * not depend on which columns its values sit at (a left-padded prefill group, an extend run after
   * a cache's capacity).
   */
  softmax64?: boolean;
  /** A step's attention products one query row each (see decode.ts's `rowProducts`; layers.ts's `stepAttentionByRow`). */
  rowProducts?: boolean;
}

/** LoRA adapter of one projection: y += scale · (x Aᵀ) Bᵀ with A `[r, in]`, B `[out, r]`. */
export interface Adapter {
  A: Tensor;
  B: Tensor;
  scale: number;
}

/** Parameter lookup for a family's builders (src/models/params.ts's `Params`). */
export interface ModelParams {
  /** The parameter as the forward computes with it (a float16 one widened to float32). */
  get(name: string): Tensor;
  /** The parameter as declared (no widening). */
  raw(name: string): Tensor;
  /** Rows `ids` of a table (embeddings), gathered, then widened. */
  rows(name: string, ids: Tensor): Tensor;
  /** The LoRA adapter of module `name`, if adapters are on. */
  adapter(name: string): Adapter | undefined;
}

/** One projection that can carry an adapter. */
export interface LoraModule {
  /** Module path, e.g. `model.layers.0.self_attn.q_proj`. */
  name: string;
  in: number;
  out: number;
  /** GPT-2's Conv1D stores its weight `[in, out]`; Linear stores `[out, in]`. */
  layout: 'linear' | 'conv1d';
}

/** The model_types prefzoo ships (the registry may hold more: {@link Family} objects registered at run time). */
export type LlamaType = 'llama' | 'qwen2' | 'qwen3' | 'mistral' | 'gemma' | 'phi3';
export type Arch = LlamaType | 'gpt2';

/** Activations the HF configs name (`hidden_act` / `activation_function`). */
export const ACTIVATIONS = ['silu', 'gelu', 'gelu_new', 'gelu_pytorch_tanh', 'gelu_fast', 'quick_gelu', 'relu'] as const;
export type Activation = (typeof ACTIVATIONS)[number];

export interface CommonConfig {
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
 * The llama family (decoder with RMSNorm, rotary embeddings, grouped-query attention, gated MLP):
 * `llama`, `qwen2` and the members in their own files. Llama's `attention_bias` puts biases on q, k,
 * v and o; Qwen2 always has q/k/v biases and never an o bias, so llama.ts's members decide, not the
 * field alone. Fields only one member has (`sliding_window`, `partial_rotary_factor`, …) are read
 * by that member's file and kept under their HF names.
 */
export interface LlamaConfig extends CommonConfig {
  model_type: LlamaType;
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
  /** MLP width; null in the file means 4 * n_embd, resolved by `gpt2Inner` (gpt2.ts). */
  n_inner: number | null;
  activation_function: Activation;
}

export type ModelConfig = LlamaConfig | Gpt2Config;

export class FieldReader {
  constructor(
    readonly raw: Record<string, unknown>,
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

/** The special token ids of config.json, read by config.ts before the family's own fields (absent ones left out). */
export interface SpecialIds {
  bos_token_id?: number | null;
  eos_token_id?: number | number[] | null;
  pad_token_id?: number | null;
}

/** Key/value cache geometry: layers, key/value heads, head size (cache tensors are `[B, kvHeads, P, headDim]`). */
export interface CacheShape {
  layers: number;
  kvHeads: number;
  headDim: number;
}

/**
 * ONNX export names of a family (src/export/onnx.ts): what Optimum's export of this model_type takes
 * beyond `input_ids`, `attention_mask` and `past_key_values.N.key|value`.
 */
export interface OnnxNames {
  /** Extra graph inputs Optimum names for this model_type: `position_ids` (else positions come from the mask). */
  extraInputs: 'position_ids'[];
}

/** A GGUF metadata value with its GGUF type (src/export/gguf-file.ts writes it). */
export type GgufValue =
  | { type: 'u32' | 'i32' | 'f32' | 'u64' | 'u8'; value: number }
  | { type: 'bool'; value: boolean }
  | { type: 'string'; value: string }
  | { type: 'array'; of: 'string'; value: string[] }
  | { type: 'array'; of: 'i32' | 'f32' | 'u32'; value: ArrayLike<number> };

export const ggufValue = {
  u32: (value: number): GgufValue => ({ type: 'u32', value }),
  i32: (value: number): GgufValue => ({ type: 'i32', value }),
  f32: (value: number): GgufValue => ({ type: 'f32', value }),
  bool: (value: boolean): GgufValue => ({ type: 'bool', value }),
  str: (value: string): GgufValue => ({ type: 'string', value }),
  strings: (value: string[]): GgufValue => ({ type: 'array', of: 'string', value }),
  i32s: (value: ArrayLike<number>): GgufValue => ({ type: 'array', of: 'i32', value }),
  f32s: (value: ArrayLike<number>): GgufValue => ({ type: 'array', of: 'f32', value }),
};

/** GGUF export names of a family (src/export/gguf.ts), as llama.cpp expects them. */
export interface GgufNames<C extends ModelConfig = ModelConfig> {
  /** `general.architecture` (llama.cpp's name, e.g. `llama`, `qwen2`, `gpt2`); also its metadata keys' prefix. */
  arch: string;
  /** llama.cpp's tensor name of an HF tensor (`model.layers.0.self_attn.q_proj.weight` → `blk.0.attn_q.weight`); null drops it. */
  tensorName(hfName: string): string | null;
  /**
   * The tensor as llama.cpp lays it out, where that differs from HF's: rows permuted, transposed,
   * values shifted. `shape` is row-major (`[out, in]`). Default: as HF stores it.
   */
  tensorData?(c: C, hfName: string, shape: number[], data: Float32Array): { shape: number[]; data: Float32Array };
  /** The architecture's metadata, keys without the `<arch>.` prefix (`context_length`, `block_count`, …). */
  metadata(c: C): Record<string, GgufValue>;
  /** Refuses, in one line naming the field, a config llama.cpp would run differently. */
  check?(c: C): void;
  /**
   * The layer count at which llama.cpp classes this architecture as a 70B model, whose q4_k_m mix then
   * gives `attn_v` Q5_K (a type prefzoo's writer does not produce); absent: no such class.
   */
  seventyBLayers?: number;
}

/**
 * Everything about one architecture. Methods see the family's own config type `C`; the registry
 * hands them configs it parsed with this family's {@link Family.parse}.
 */
export interface Family<C extends ModelConfig = ModelConfig> {
  /** The `model_type` of config.json. */
  model_type: string;
  /** HF's class name, written to `architectures`. */
  hfClass: string;
  /**
   * Validates config.json's fields (read through `r`, messages naming `where`) and fills the
   * defaults of HF's config class; returns `{ ...r.raw, <fields>, ...ids }` so unknown keys survive.
   */
  parse(r: FieldReader, ids: SpecialIds, where: string): C;
  /** The tiny and small presets' fields (config.ts adds `architectures`, `model_type`, special ids, `torch_dtype`), `vocab_size` first. */
  preset(tiny: boolean, vocab_size: number): Record<string, unknown>;
  /** Shapes of released models (random weights, real shapes), by preset name: config.json fields with `model_type` first. */
  released?: Record<string, Record<string, unknown>>;
  /** Width of the residual stream. */
  hiddenSize(c: C): number;
  numLayers(c: C): number;
  /** Positions the model was built for (`max_position_embeddings`, `n_positions`). */
  maxPositions(c: C): number;
  /** Positions are a learned table: a sequence past {@link maxPositions} cannot be scored at all. */
  learnedPositions: boolean;
  /** HF tensor names and shapes of a checkpoint (tied heads not listed, as HF does not save them). */
  parameterShapes(c: C): Map<string, number[]>;
  /** Name of the token-embedding table (its dtype is the forward's). */
  embedding: string;
  /** Maps a checkpoint's tensor name onto the model's own (older HF layouts); null drops the tensor. */
  normalizeName?(name: string): string | null;
  /** Initial value of norm weights (HF's `_init_weights`; default 1). */
  normInit?: number;
  /** Standard deviation of a fresh weight `name` given the default `std` (default: `std`). */
  initStd?(c: C, name: string, std: number): number;
  /** A token attends to at most this many positions (itself included); null: no window. */
  window(c: C): number | null;
  /** The training forward: final hidden states `[N, D]` (after the final norm) of a batch. */
  hidden(g: Graph, c: C, P: ModelParams, bi: BatchIndex): Tensor;
  /** The output head's weight `[V, D]` (the token embedding when tied). */
  headWeight(c: C, P: ModelParams): Tensor;
  /**
   * The KV-cached decode: final hidden states `[B·S, D]` of S new tokens per row over the cache `past`.
   * `o.fused`: with ONNX Runtime's fused ops where the family has them (see decode.ts's `fused`); a
   * family without ignores it.
   */
  decode(g: Graph, c: C, P: ModelParams, ix: DecodeIndex, past: Map<string, Tensor> | null, o?: { fused?: boolean }): Tensor;
  cacheShape(c: C): CacheShape;
  /** Every projection that can carry a LoRA adapter (the LM head and embeddings are not targets). */
  projections(c: C): LoraModule[];
  /** ONNX export names (optional until the exporter fills them). */
  onnx?: OnnxNames;
  /** GGUF export names (optional; a family without them is refused by the GGUF exporter). */
  gguf?: GgufNames<C>;
}
