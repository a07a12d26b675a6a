/**
 * What each architecture is called in the export formats: llama.cpp's architecture name, its tensor
 * names and layouts, and its metadata (gguf-py's constants and convert_hf_to_gguf.py), one object per
 * family; plus the decode pieces the ONNX export builds on.
 */
import type { Graph, Tensor } from '../onnx/graph.ts';
import { UserError } from '../errors.ts';
import { type Activation, type Gpt2Config, type LlamaConfig, type ModelConfig, gpt2Inner } from '../models/config.ts';
import { gpt2Decode, gpt2HeadWeight } from '../models/gpt2.ts';
import type { DecodeIndex } from '../models/layers.ts';
import { attentionWindow, llamaDecode, llamaHeadWeight, rotaryDim } from '../models/llama.ts';
import type { Params } from '../models/params.ts';
import { type MetaValue, meta } from './gguf-file.ts';

/** Final hidden states `[B·S, D]` of the family's KV-cached decode. */
export function decodeHidden(g: Graph, c: ModelConfig, P: Params, ix: DecodeIndex, past: Map<string, Tensor>): Tensor {
  return c.model_type === 'gpt2' ? gpt2Decode(g, c, P, ix, past) : llamaDecode(g, c, P, ix, past);
}

export function headWeight(c: ModelConfig, P: Params): Tensor {
  return c.model_type === 'gpt2' ? gpt2HeadWeight(c, P) : llamaHeadWeight(c, P);
}

export function decodeWindow(c: ModelConfig): number | null {
  return c.model_type === 'gpt2' ? null : attentionWindow(c);
}

/** How llama.cpp names and lays out one architecture. */
export interface GgufNames<C extends ModelConfig = ModelConfig> {
  /** `general.architecture`, also the prefix of the architecture's metadata keys. */
  arch: string;
  /** HF name prefix of layer i's tensors (`model.layers.`). */
  layerPrefix: string;
  /** Layer tensors: HF name after the layer prefix → GGUF name after `blk.N.`. */
  layer: Record<string, string>;
  /** Tensors outside the layers, HF name → GGUF name. */
  global: Record<string, string>;
  /**
   * llama.cpp rotates adjacent pairs (rope type NORM) for this architecture where HF rotates halves:
   * the rows of each q and k head are interleaved, first half with second (convert_hf_to_gguf's permute).
   */
  permuteQK?: boolean;
  /** With a tied head: llama.cpp reuses token_embd ('omit'), or needs output.weight written ('copy'). */
  tiedOutput: 'omit' | 'copy';
  /** Norm weights stored as w where the model scales by 1 + w; llama.cpp wants 1 + w (Gemma). */
  normPlusOne?: boolean;
  /** HF tensors stored `[in, out]` (GPT-2's Conv1D), transposed to `[out, in]`. */
  transposed?: RegExp;
  /** The activation llama.cpp applies in the MLP; other configs are refused. */
  activations: readonly Activation[];
  /** Architecture metadata, keys without the `arch.` prefix. */
  metadata(c: C): Record<string, MetaValue>;
  /** Refuses configs llama.cpp would run differently (one line naming the field). */
  check?(c: C): void;
}

const LLAMA_LAYER: Record<string, string> = {
  'input_layernorm.weight': 'attn_norm.weight',
  'self_attn.q_proj.weight': 'attn_q.weight',
  'self_attn.q_proj.bias': 'attn_q.bias',
  'self_attn.k_proj.weight': 'attn_k.weight',
  'self_attn.k_proj.bias': 'attn_k.bias',
  'self_attn.v_proj.weight': 'attn_v.weight',
  'self_attn.v_proj.bias': 'attn_v.bias',
  'self_attn.o_proj.weight': 'attn_output.weight',
  'self_attn.o_proj.bias': 'attn_output.bias',
  'post_attention_layernorm.weight': 'ffn_norm.weight',
  'mlp.gate_proj.weight': 'ffn_gate.weight',
  'mlp.up_proj.weight': 'ffn_up.weight',
  'mlp.down_proj.weight': 'ffn_down.weight',
};

const LLAMA_GLOBAL: Record<string, string> = {
  'model.embed_tokens.weight': 'token_embd.weight',
  'model.norm.weight': 'output_norm.weight',
  'lm_head.weight': 'output.weight',
};

/** The metadata every member of the llama family writes. */
function llamaMetadata(c: LlamaConfig, context = c.max_position_embeddings): Record<string, MetaValue> {
  const m: Record<string, MetaValue> = {
    context_length: meta.u32(context),
    embedding_length: meta.u32(c.hidden_size),
    block_count: meta.u32(c.num_hidden_layers),
    feed_forward_length: meta.u32(c.intermediate_size),
    'attention.head_count': meta.u32(c.num_attention_heads),
    'attention.head_count_kv': meta.u32(c.num_key_value_heads),
    'attention.key_length': meta.u32(c.head_dim),
    'attention.value_length': meta.u32(c.head_dim),
    'attention.layer_norm_rms_epsilon': meta.f32(c.rms_norm_eps),
    'rope.freq_base': meta.f32(c.rope_theta),
    'rope.dimension_count': meta.u32(rotaryDim(c)),
    vocab_size: meta.u32(c.vocab_size),
  };
  const s = c.rope_scaling as Record<string, unknown> | null | undefined;
  const type = s ? (s.rope_type ?? s.type) : undefined;
  if (type === 'linear') {
    m['rope.scaling.type'] = meta.str('linear');
    m['rope.scaling.factor'] = meta.f32(s!.factor as number);
  }
  return m;
}

function llamaCheck(c: LlamaConfig): void {
  const s = c.rope_scaling as Record<string, unknown> | null | undefined;
  const type = s ? (s.rope_type ?? s.type) : undefined;
  if (type !== undefined && type !== 'default' && type !== 'linear') {
    throw new UserError(`config.json: rope_scaling ${JSON.stringify(type)} is not exported to GGUF (supported: none, default, linear)`);
  }
  if (c.mlp_bias) throw new UserError(`config.json: "mlp_bias": true is not exported to GGUF (llama.cpp's ${c.model_type} MLP has no biases)`);
}

const LLAMA: GgufNames<LlamaConfig> = {
  arch: 'llama',
  layerPrefix: 'model.layers.',
  layer: LLAMA_LAYER,
  global: LLAMA_GLOBAL,
  permuteQK: true,
  tiedOutput: 'omit',
  activations: ['silu'],
  metadata: (c) => llamaMetadata(c),
  check: llamaCheck,
};

/**
 * The context length of a model with a sliding window, for a runtime without one: llama.cpp's `llama`
 * architecture (Mistral's) has none and its `phi3` turns it off, so the context is cut to the window,
 * inside which windowed and full attention are the same.
 */
function windowedContext(c: LlamaConfig): number {
  const w = c.sliding_window as number | null | undefined;
  return w ? Math.min(w, c.max_position_embeddings) : c.max_position_embeddings;
}

/** Per family: model_type → llama.cpp's names (Mistral is llama.cpp's `llama` architecture). */
export const GGUF_FAMILIES: Partial<Record<ModelConfig['model_type'], GgufNames<never>>> = {
  llama: LLAMA,
  mistral: { ...LLAMA, metadata: (c: LlamaConfig) => llamaMetadata(c, windowedContext(c)) },
  qwen2: {
    arch: 'qwen2',
    layerPrefix: 'model.layers.',
    layer: LLAMA_LAYER,
    global: LLAMA_GLOBAL,
    tiedOutput: 'omit',
    activations: ['silu'],
    metadata: (c: LlamaConfig) => llamaMetadata(c),
    check: llamaCheck,
  },
  qwen3: {
    arch: 'qwen3',
    layerPrefix: 'model.layers.',
    layer: { ...LLAMA_LAYER, 'self_attn.q_norm.weight': 'attn_q_norm.weight', 'self_attn.k_norm.weight': 'attn_k_norm.weight' },
    global: LLAMA_GLOBAL,
    tiedOutput: 'omit',
    activations: ['silu'],
    metadata: (c: LlamaConfig) => llamaMetadata(c),
    check: llamaCheck,
  },
  gemma: {
    arch: 'gemma',
    layerPrefix: 'model.layers.',
    layer: LLAMA_LAYER,
    global: LLAMA_GLOBAL,
    tiedOutput: 'omit',
    normPlusOne: true,
    activations: ['gelu_pytorch_tanh', 'gelu_new', 'gelu_fast'],
    metadata: (c: LlamaConfig) => llamaMetadata(c),
    check(c: LlamaConfig) {
      llamaCheck(c);
      if (!c.tie_word_embeddings) throw new UserError('config.json: gemma with "tie_word_embeddings": false is not exported to GGUF (llama.cpp ties gemma\'s head)');
    },
  },
  phi3: {
    arch: 'phi3',
    layerPrefix: 'model.layers.',
    layer: {
      'input_layernorm.weight': 'attn_norm.weight',
      'self_attn.qkv_proj.weight': 'attn_qkv.weight',
      'self_attn.o_proj.weight': 'attn_output.weight',
      'post_attention_layernorm.weight': 'ffn_norm.weight',
      'mlp.gate_up_proj.weight': 'ffn_up.weight',
      'mlp.down_proj.weight': 'ffn_down.weight',
    },
    global: LLAMA_GLOBAL,
    tiedOutput: 'omit',
    activations: ['silu'],
    metadata: (c: LlamaConfig) => llamaMetadata(c, windowedContext(c)),
    check: llamaCheck,
  },
  gpt2: {
    arch: 'gpt2',
    layerPrefix: 'transformer.h.',
    layer: {
      'ln_1.weight': 'attn_norm.weight',
      'ln_1.bias': 'attn_norm.bias',
      'attn.c_attn.weight': 'attn_qkv.weight',
      'attn.c_attn.bias': 'attn_qkv.bias',
      'attn.c_proj.weight': 'attn_output.weight',
      'attn.c_proj.bias': 'attn_output.bias',
      'ln_2.weight': 'ffn_norm.weight',
      'ln_2.bias': 'ffn_norm.bias',
      'mlp.c_fc.weight': 'ffn_up.weight',
      'mlp.c_fc.bias': 'ffn_up.bias',
      'mlp.c_proj.weight': 'ffn_down.weight',
      'mlp.c_proj.bias': 'ffn_down.bias',
    },
    global: {
      'transformer.wte.weight': 'token_embd.weight',
      'transformer.wpe.weight': 'position_embd.weight',
      'transformer.ln_f.weight': 'output_norm.weight',
      'transformer.ln_f.bias': 'output_norm.bias',
      'lm_head.weight': 'output.weight',
    },
    tiedOutput: 'omit',
    transposed: /\.(c_attn|c_proj|c_fc)\.weight$/,
    activations: ['gelu_new', 'gelu_pytorch_tanh', 'gelu_fast'],
    metadata: (c: Gpt2Config) => ({
      context_length: meta.u32(c.n_positions),
      embedding_length: meta.u32(c.n_embd),
      feed_forward_length: meta.u32(gpt2Inner(c)),
      block_count: meta.u32(c.n_layer),
      'attention.head_count': meta.u32(c.n_head),
      'attention.layer_norm_epsilon': meta.f32(c.layer_norm_epsilon),
      vocab_size: meta.u32(c.vocab_size),
    }),
    check(c: Gpt2Config) {
      if (c.scale_attn_by_inverse_layer_idx === true) throw new UserError('config.json: gpt2 with "scale_attn_by_inverse_layer_idx": true is not exported to GGUF (llama.cpp scales every layer by 1/sqrt(head_dim))');
      if (c.scale_attn_weights === false) throw new UserError('config.json: gpt2 with "scale_attn_weights": false is not exported to GGUF');
    },
  },
};

/** The activation a config's MLP uses. */
export function mlpActivation(c: ModelConfig): Activation {
  if (c.model_type === 'gpt2') return c.activation_function;
  return (c.hidden_activation as Activation | undefined) ?? c.hidden_act;
}
