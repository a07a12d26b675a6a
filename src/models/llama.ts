/**
 * The Llama family as an ONNX graph, following HF's modeling code: pre-norm blocks of RMSNorm →
 * attention with rotary embeddings (rotate-half convention, inv_freq = 1/θ^(2i/d)) and grouped-query
 * heads → residual, RMSNorm → gated MLP down(act(gate(x)) · up(x)) → residual; a final RMSNorm.
 * Parameters are looked up by their HF names.
 *
 * `llama` and `qwen2` live here; `qwen3`, `mistral`, `gemma` and `phi3` each have a file beside this
 * one holding a {@link LlamaMember} made a {@link Family} by {@link llamaFamily}: the pieces of this
 * decoder they change (config fields, tensor names, norms, projections, MLP, rotary width, sliding
 * window), each written once and used by both the training forward and the KV-cache decode
 * (llamaDecode below), which run the same {@link llamaStack} and differ only in how a layer attends.
 */
import type { Graph, Tensor } from '../onnx/graph.ts';
import { UserError } from '../errors.ts';
import { type Activation, type Family, type FieldReader, type GgufNames, type LlamaConfig, type LoraModule, type ModelParams, type LlamaType, type OnnxNames, type SpecialIds, ggufValue as gv } from './family.ts';
import { type BatchIndex, type DecodeIndex, activation, attention, cachedAttention, chunkRows, extendCache, fusedRmsNorm, project, reshapeRt, rmsNorm, rotaryEmbedding, splitHeads } from './layers.ts';

/** A projection of layer tensors by module name (`self_attn.q_proj`), with its LoRA adapter when on. */
export type Proj = (name: string, x: Tensor, hasBias: boolean) => Tensor;

/**
 * What a member of the llama family changes. Every hook is optional and defaults to llama's own
 * piece; hooks see 2-D activations `[N, ·]` or per-head tensors `[B, T, heads, hd]`, the same in the
 * training forward and in decoding.
 */
export interface LlamaMember {
  model_type: LlamaType;
  /** HF's class name, written to `architectures`. */
  hfClass: string;
  /** Defaults of HF's config class for the shared fields. */
  defaults: {
    vocab_size: number;
    intermediate_size: number;
    max_position_embeddings: number;
    num_hidden_layers?: number;
    num_attention_heads?: number;
    num_key_value_heads?: number;
    head_dim?: number;
    rms_norm_eps?: number;
    hidden_act?: Activation;
    attention_bias?: boolean;
    tie_word_embeddings?: boolean;
  };
  /** Reads and checks the member's own config fields (returned under their HF names). */
  fields?(r: FieldReader, c: LlamaConfig, where: string): Record<string, unknown>;
  /** Initial value of the norm weights (HF's `_init_weights`; default 1). */
  normInit?: number;
  /** Member-specific fields of the tiny/small presets. */
  preset?(tiny: boolean): Record<string, unknown>;
  /** HF's config class has no `attention_bias`/`mlp_bias` switch (Qwen2: biases come with the model_type), so presets leave them out. */
  noBiasSwitch?: boolean;
  /** Released models' shapes, by preset name (see {@link Family.released}). */
  released?: Record<string, Record<string, unknown>>;
  /** The member's ONNX export names (default: Optimum's for llama, with `position_ids`). */
  onnx?: OnnxNames;
  /** How llama.cpp sees the member, made the family's {@link GgufNames} by {@link llamaGguf}; none: not exported to GGUF. */
  gguf?: LlamaGguf;
  /** Which attention projections carry biases (default: `attention_bias` on q, k, v and o). */
  biases?(c: LlamaConfig): { qkv: boolean; o: boolean };
  /** HF tensor names and shapes of one layer (prefix `model.layers.i.`). */
  layerShapes?(c: LlamaConfig, p: string): [string, number[]][];
  /** The layer's projections that can carry LoRA adapters. */
  projections?(c: LlamaConfig, p: string): LoraModule[];
  /** Token embeddings `[N, D]` of the flat ids. */
  embed?(g: Graph, c: LlamaConfig, P: ModelParams, flatIds: Tensor): Tensor;
  /** The weight an RMSNorm multiplies by, from the stored `w` (default `w` itself). */
  normWeight?(g: Graph, w: Tensor): Tensor;
  /** q `[N, H·hd]`, k and v `[N, KV·hd]` from the normed input. */
  qkv?(g: Graph, c: LlamaConfig, p: string, x: Tensor, proj: Proj, P: ModelParams): [Tensor, Tensor, Tensor];
  /** Per-head transform of q and k `[B, T, heads, hd]` before the rotary embedding. */
  headNorm?(g: Graph, c: LlamaConfig, p: string, q: Tensor, k: Tensor, P: ModelParams): [Tensor, Tensor];
  /** The MLP of the normed input. */
  mlp?(g: Graph, c: LlamaConfig, p: string, x: Tensor, proj: Proj): Tensor;
  /** Leading dims of each head that rotate (default all: head_dim). */
  rotaryDim?(c: LlamaConfig): number;
  /** A token attends to at most this many positions (itself included); null: no window. */
  window?(c: LlamaConfig): number | null;
}

/** Llama's layer tensors, with the biases `bias` says. */
export function llamaLayerShapes(c: LlamaConfig, p: string, bias = llamaBiases(c)): [string, number[]][] {
  const d = c.hidden_size;
  const q = c.num_attention_heads * c.head_dim;
  const kv = c.num_key_value_heads * c.head_dim;
  const ffn = c.intermediate_size;
  const s: [string, number[]][] = [[p + 'input_layernorm.weight', [d]]];
  for (const [m, out] of [['q', q], ['k', kv], ['v', kv]] as const) {
    s.push([`${p}self_attn.${m}_proj.weight`, [out, d]]);
    if (bias.qkv) s.push([`${p}self_attn.${m}_proj.bias`, [out]]);
  }
  s.push([p + 'self_attn.o_proj.weight', [d, q]]);
  if (bias.o) s.push([p + 'self_attn.o_proj.bias', [d]]);
  s.push([p + 'post_attention_layernorm.weight', [d]]);
  for (const [m, shape] of [['gate', [ffn, d]], ['up', [ffn, d]], ['down', [d, ffn]]] as const) {
    s.push([`${p}mlp.${m}_proj.weight`, [...shape]]);
    if (c.mlp_bias) s.push([`${p}mlp.${m}_proj.bias`, [shape[0]]]);
  }
  return s;
}

function llamaProjections(c: LlamaConfig, p: string): LoraModule[] {
  const d = c.hidden_size;
  const q = c.num_attention_heads * c.head_dim;
  const kv = c.num_key_value_heads * c.head_dim;
  const ffn = c.intermediate_size;
  const m = (name: string, i: number, o: number): LoraModule => ({ name: p + name, in: i, out: o, layout: 'linear' });
  return [
    m('self_attn.q_proj', d, q),
    m('self_attn.k_proj', d, kv),
    m('self_attn.v_proj', d, kv),
    m('self_attn.o_proj', q, d),
    m('mlp.gate_proj', d, ffn),
    m('mlp.up_proj', d, ffn),
    m('mlp.down_proj', ffn, d),
  ];
}

function llamaBiases(c: LlamaConfig): { qkv: boolean; o: boolean } {
  return { qkv: c.attention_bias, o: c.attention_bias };
}

/** Which attention projections of a member carry a bias. */
function attentionBiases(m: LlamaMember, c: LlamaConfig): { qkv: boolean; o: boolean } {
  return m.biases?.(c) ?? llamaBiases(c);
}

/** Llama: every hook is the default. */
export const LLAMA_MEMBER: LlamaMember = {
  model_type: 'llama',
  hfClass: 'LlamaForCausalLM',
  defaults: { vocab_size: 32000, intermediate_size: 11008, max_position_embeddings: 2048 },
  gguf: { arch: 'llama', permuteQK: true, activations: ['silu'], seventyBLayers: 80 },
  released: {
    'smollm2-360m': {
      model_type: 'llama', vocab_size: 49152, hidden_size: 960, intermediate_size: 2560, num_hidden_layers: 32, num_attention_heads: 15,
      num_key_value_heads: 5, max_position_embeddings: 8192, rms_norm_eps: 1e-5, rope_theta: 100000, tie_word_embeddings: true,
      attention_bias: false, mlp_bias: false, hidden_act: 'silu',
    },
  },
};

/** Qwen2: llama with q/k/v biases always and no o bias. */
const QWEN2_MEMBER: LlamaMember = {
  model_type: 'qwen2',
  hfClass: 'Qwen2ForCausalLM',
  defaults: { vocab_size: 151936, intermediate_size: 22016, max_position_embeddings: 32768, attention_bias: true },
  fields(r, c, where) {
    if (c.attention_bias === false) throw new UserError(`${where}: qwen2 always has q/k/v biases; "attention_bias": false is not a qwen2 model (use model_type "llama")`);
    if (r.bool('use_sliding_window', false)) throw new UserError(`${where}: qwen2 with "use_sliding_window": true is not supported (its windowed layers differ by max_window_layers)`);
    return {};
  },
  biases: () => ({ qkv: true, o: false }),
  noBiasSwitch: true,
  gguf: { arch: 'qwen2', activations: ['silu'], seventyBLayers: 80 },
  released: {
    'qwen2.5-0.5b': {
      model_type: 'qwen2', vocab_size: 151936, hidden_size: 896, intermediate_size: 4864, num_hidden_layers: 24, num_attention_heads: 14,
      num_key_value_heads: 2, max_position_embeddings: 32768, rms_norm_eps: 1e-6, rope_theta: 1000000, tie_word_embeddings: true, hidden_act: 'silu',
    },
    'qwen2.5-1.5b': {
      model_type: 'qwen2', vocab_size: 151936, hidden_size: 1536, intermediate_size: 8960, num_hidden_layers: 28, num_attention_heads: 12,
      num_key_value_heads: 2, max_position_embeddings: 32768, rms_norm_eps: 1e-6, rope_theta: 1000000, tie_word_embeddings: true, hidden_act: 'silu',
    },
  },
};

/** The layer tensors and adapter targets of a member (its hooks, or llama's). */
function layerShapes(m: LlamaMember, c: LlamaConfig, p: string): [string, number[]][] {
  return m.layerShapes ? m.layerShapes(c, p) : llamaLayerShapes(c, p, attentionBiases(m, c));
}

function layerProjections(m: LlamaMember, c: LlamaConfig, p: string): LoraModule[] {
  return (m.projections ?? llamaProjections)(c, p);
}

/** inv_freq[i] = 1/θ^(2i/d), i < d/2 (HF's default rotary frequencies). */
export function ropeInvFreq(theta: number, headDim: number): number[] {
  return Array.from({ length: headDim / 2 }, (_, i) => 1 / Math.pow(theta, (2 * i) / headDim));
}

/** How many leading dims of each head rotate. */
function rotaryDim(m: LlamaMember, c: LlamaConfig): number {
  return m.rotaryDim?.(c) ?? c.head_dim;
}

function scalingNumber(s: Record<string, unknown>, key: string, dflt?: number): number {
  const v = s[key] ?? dflt;
  if (typeof v !== 'number' || !Number.isFinite(v) || v <= 0) {
    throw new UserError(`config.json: rope_scaling.${key} must be a positive number, got ${JSON.stringify(s[key])}`);
  }
  return v;
}

/**
 * Rotary frequencies of a config, with HF's `rope_scaling` variants that only rescale frequencies:
 * `linear` (positions divided by `factor`) and `llama3` (long wavelengths divided by `factor`, short
 * ones kept, a smooth blend between `original_max_position_embeddings / high_freq_factor` and
 * `/ low_freq_factor`). Other variants change attention itself and are refused.
 */
function rotaryFrequencies(m: LlamaMember, c: LlamaConfig): number[] {
  const base = ropeInvFreq(c.rope_theta, rotaryDim(m, c));
  const raw = c.rope_scaling as unknown;
  if (raw === undefined || raw === null) return base;
  if (typeof raw !== 'object' || Array.isArray(raw)) throw new UserError(`config.json: rope_scaling must be an object or null, got ${JSON.stringify(raw)}`);
  const s = raw as Record<string, unknown>;
  const type = s.rope_type ?? s.type;
  if (type === 'default') return base;
  if (type === 'linear') {
    const factor = scalingNumber(s, 'factor');
    return base.map((f) => f / factor);
  }
  if (type === 'llama3') {
    const factor = scalingNumber(s, 'factor');
    const low = scalingNumber(s, 'low_freq_factor', 1);
    const high = scalingNumber(s, 'high_freq_factor', 4);
    const original = scalingNumber(s, 'original_max_position_embeddings', 8192);
    const lowWavelen = original / low;
    const highWavelen = original / high;
    return base.map((f) => {
      const wavelen = (2 * Math.PI) / f;
      if (wavelen < highWavelen) return f;
      if (wavelen > lowWavelen) return f / factor;
      const smooth = (original / wavelen - low) / (high - low);
      return (1 - smooth) * (f / factor) + smooth * f;
    });
  }
  throw new UserError(`config.json: rope_scaling type ${JSON.stringify(type)} is not supported (supported: default, linear, llama3)`);
}

/** Rotate-half RoPE on the first `rd` dims of `[…, hd]`: x·cos + rotate_half(x)·sin, rotate_half(x) = [−x₂, x₁]; the rest pass. */
function rope(g: Graph, x: Tensor, cos: Tensor, sin: Tensor, hd: number, rd: number): Tensor {
  const [xr, pass] = rd < hd ? g.split(x, [rd, hd - rd], -1) : [x, null];
  const [x1, x2] = g.split(xr, [rd / 2, rd / 2], -1);
  const rotated = g.concat([g.neg(x2), x1], -1);
  const y = g.add(g.mul(xr, cos), g.mul(rotated, sin));
  return pass ? g.concat([y, pass], -1) : y;
}

/** cos/sin `[B, T, 1, rd]` of positions `[B, T]`; the queries' copy carries the 1/√hd scale. */
export interface RopeTables {
  cos: Tensor;
  sin: Tensor;
  cosQ: Tensor;
  sinQ: Tensor;
}

function ropeTables(m: LlamaMember, g: Graph, c: LlamaConfig, positions: Tensor, dtype: 'float32' | 'float64'): RopeTables {
  return g.scope('rope', () => {
    const rd = rotaryDim(m, c);
    const invFreq = g.constant(rotaryFrequencies(m, c), dtype, [rd / 2]);
    const freqs = g.mul(g.unsqueeze(g.cast(positions, dtype), [2]), invFreq); // [B, T, rd/2]
    const emb = g.unsqueeze(g.concat([freqs, freqs], -1), [2]); // [B, T, 1, rd]
    const cos = g.cos(emb);
    const sin = g.sin(emb);
    const scale = 1 / Math.sqrt(c.head_dim);
    return { cos, sin, cosQ: g.mul(cos, scale), sinQ: g.mul(sin, scale) };
  });
}

/** How the layers of one graph attend: the training forward over the batch, or decoding over a cache. */
export interface Attend {
  /** `[N, n·hd]` → `[B, T, n, hd]`. */
  heads(x: Tensor, n: number): Tensor;
  /** The rotary tables of the unfused graph (absent when `fused`). */
  rope?: RopeTables;
  /**
   * Decoding with ONNX Runtime's fused ops: each residual sum and the norm after it as one
   * SkipSimplifiedLayerNormalization, and `rotate` (RotaryEmbedding) in place of the rope subgraph —
   * `query`: the result carries the 1/√hd scale.
   */
  fused?: { rotate(x: Tensor, n: number, query: boolean): Tensor };
  /** Layer i's attention of q `[B, T, H, hd]` (scaled) over k, v `[B, T, KV, hd]` → context `[N, H·hd]`. */
  attend(layer: number, q: Tensor, k: Tensor, v: Tensor): Tensor;
  /** The training forward's MLP over runs of rows (layers.ts `chunkRows`; `width`: its widest tensor's columns); absent: at once. */
  rows?(x: Tensor, width: number, f: (x: Tensor) => Tensor): Tensor;
}

/** The decoder: embeddings, every layer, the final norm → `[N, D]`. */
function llamaStack(fam: LlamaMember, g: Graph, c: LlamaConfig, P: ModelParams, flatIds: Tensor, at: Attend): Tensor {
  const H = c.num_attention_heads;
  const KV = c.num_key_value_heads;
  const hd = c.head_dim;
  const rd = rotaryDim(fam, c);
  const bias = attentionBiases(fam, c);
  const weight = (w: string) => (fam.normWeight ? fam.normWeight(g, P.get(w)) : P.get(w));
  // The MLP's widest tensor: the widest projection of a layer (phi3's gate_up: 2·ffn).
  const mlpWidth = Math.max(...layerProjections(fam, c, '').filter((m) => m.name.startsWith('mlp.')).map((m) => Math.max(m.in, m.out)));
  const norm = (x: Tensor, w: string) => rmsNorm(g, x, weight(w), c.rms_norm_eps);
  // Fused: `carry` is the last block's output, not yet added to the residual stream `h`: the next
  // norm takes the sum and the norm in one node and hands the sum back.
  let carry: Tensor | null = null;
  const addNorm = (x: Tensor, w: string): [Tensor, Tensor] => {
    const r = fusedRmsNorm(g, x, carry, weight(w), c.rms_norm_eps);
    carry = null;
    return r;
  };
  const rotate = (x: Tensor, n: number, query: boolean): Tensor => {
    if (at.fused) return at.fused.rotate(x, n, query);
    const { cos, sin, cosQ, sinQ } = at.rope!;
    if (!query) return rope(g, x, cos, sin, hd, rd);
    // The 1/√hd scale rides on the queries' cos/sin when every dim rotates; otherwise on q itself.
    return rd === hd ? rope(g, x, cosQ, sinQ, hd, rd) : g.mul(rope(g, x, cos, sin, hd, rd), 1 / Math.sqrt(hd));
  };

  let h = g.scope('embed', () => (fam.embed ? fam.embed(g, c, P, flatIds) : P.rows('model.embed_tokens.weight', flatIds))); // [N, D]
  for (let i = 0; i < c.num_hidden_layers; i++) {
    const p = `model.layers.${i}.`;
    h = g.scope(`layers.${i}`, () => {
      const proj: Proj = (name, x, hasBias) =>
        project(g, x, P.get(p + name + '.weight'), hasBias ? P.get(p + name + '.bias') : null, 'linear', P.adapter(p + name));
      let hIn = h;
      const attnOut = g.scope('attn', () => {
        let x: Tensor;
        if (at.fused) [x, hIn] = addNorm(h, p + 'input_layernorm.weight');
        else x = norm(h, p + 'input_layernorm.weight');
        const [q2, k2, v2] = fam.qkv
          ? fam.qkv(g, c, p, x, proj, P)
          : [proj('self_attn.q_proj', x, bias.qkv), proj('self_attn.k_proj', x, bias.qkv), proj('self_attn.v_proj', x, bias.qkv)];
        let q = at.heads(q2, H);
        let k = at.heads(k2, KV);
        if (fam.headNorm) [q, k] = fam.headNorm(g, c, p, q, k, P);
        const ctx = at.attend(i, rotate(q, H, true), rotate(k, KV, false), at.heads(v2, KV));
        return proj('self_attn.o_proj', ctx, bias.o);
      });
      let h1: Tensor | null = at.fused ? null : g.add(h, attnOut);
      carry = attnOut;
      const mlpOut = g.scope('mlp', () => {
        let x: Tensor;
        if (at.fused) [x, h1] = addNorm(hIn, p + 'post_attention_layernorm.weight');
        else x = norm(h1!, p + 'post_attention_layernorm.weight');
        const mlp = (x: Tensor): Tensor => {
          if (fam.mlp) return fam.mlp(g, c, p, x, proj);
          const gate = activation(g, c.hidden_act, proj('mlp.gate_proj', x, c.mlp_bias));
          return proj('mlp.down_proj', g.mul(gate, proj('mlp.up_proj', x, c.mlp_bias)), c.mlp_bias);
        };
        return at.rows ? at.rows(x, mlpWidth, mlp) : mlp(x);
      });
      if (!at.fused) return g.add(h1!, mlpOut);
      carry = mlpOut;
      return h1!;
    });
  }
  return at.fused ? addNorm(h, 'model.norm.weight')[0] : norm(h, 'model.norm.weight');
}

/** The sliding window of a config (a token sees at most this many positions), or null. */
function attentionWindow(m: LlamaMember, c: LlamaConfig): number | null {
  return m.window?.(c) ?? null;
}

/** Final hidden states `[N, D]` (after the last RMSNorm) of the training forward. */
function llamaHidden(m: LlamaMember, g: Graph, c: LlamaConfig, P: ModelParams, bi: BatchIndex): Tensor {
  const H = c.num_attention_heads;
  const KV = c.num_key_value_heads;
  const hd = c.head_dim;
  return llamaStack(m, g, c, P, bi.flatIds, {
    heads: (x, n) => splitHeads(g, bi, x, n, hd),
    rope: ropeTables(m, g, c, bi.positions, bi.dtype),
    rows: (x, width, f) => chunkRows(g, bi, x, width, f),
    attend: (_i, q, k, v) =>
      attention(
        g,
        bi,
        g.transpose(q, [0, 2, 1, 3]), // [B, H, T, hd]
        g.transpose(k, [0, 2, 3, 1]), // [B, KV, hd, T]
        g.transpose(v, [0, 2, 1, 3]), // [B, KV, T, hd]
        H,
        KV,
        hd,
      ),
  });
}

/** The output head's weight `[V, D]`: the embedding when tied. */
function llamaHeadWeight(c: LlamaConfig, P: ModelParams): Tensor {
  return P.get(c.tie_word_embeddings ? 'model.embed_tokens.weight' : 'lm_head.weight');
}

/**
 * The rotary tables of positions 0 … max_position_embeddings − 1 `[positions, rd/2]` for
 * RotaryEmbedding, each value as the unfused graph computes it in float32 (position × frequency
 * rounded to float32, then its cos and sin), and the queries' copies with the 1/√hd scale when every
 * dim rotates (as `ropeTables`' cosQ/sinQ).
 */
function rotaryCache(m: LlamaMember, g: Graph, c: LlamaConfig): { cos: Tensor; sin: Tensor; cosQ: Tensor; sinQ: Tensor } {
  const freqs = rotaryFrequencies(m, c).map(Math.fround);
  const half = freqs.length;
  const n = c.max_position_embeddings;
  const scale = Math.fround(1 / Math.sqrt(c.head_dim));
  const [cos, sin, cosQ, sinQ] = [0, 1, 2, 3].map(() => new Float32Array(n * half));
  for (let p = 0; p < n; p++) {
    for (let i = 0; i < half; i++) {
      const angle = Math.fround(p * freqs[i]);
      const j = p * half + i;
      cos[j] = Math.cos(angle);
      sin[j] = Math.sin(angle);
      cosQ[j] = cos[j] * scale;
      sinQ[j] = sin[j] * scale;
    }
  }
  const t = (x: Float32Array) => g.constant(x, 'float32', [n, half]);
  return rotaryDim(m, c) === c.head_dim ? { cos: t(cos), sin: t(sin), cosQ: t(cosQ), sinQ: t(sinQ) } : { cos: t(cos), sin: t(sin), cosQ: t(cos), sinQ: t(sin) };
}

/**
 * Final hidden states `[B·S, D]` of S new tokens per row: the same layers, attending over the key/value
 * cache `past`. `fused`: residual sums and norms as SkipSimplifiedLayerNormalization, the rotary
 * embedding as RotaryEmbedding (see `Attend.fused`).
 */
function llamaDecode(m: LlamaMember, g: Graph, c: LlamaConfig, P: ModelParams, ix: DecodeIndex, past: Map<string, Tensor> | null, o: { fused?: boolean } = {}): Tensor {
  const H = c.num_attention_heads;
  const KV = c.num_key_value_heads;
  const hd = c.head_dim;
  const rd = rotaryDim(m, c);
  const byToken = (x: Tensor, n: number) => reshapeRt(g, x, g.concat([ix.shapeBS, g.ints([n, hd])], 0), ['B', 'S', n, hd]); // [B, S, n, hd]
  let fused: Attend['fused'];
  if (o.fused) {
    const t = g.scope('rope', () => rotaryCache(m, g, c));
    fused = {
      rotate(x, n, query) {
        const y = rotaryEmbedding(g, x, ix.positions, query ? t.cosQ : t.cos, query ? t.sinQ : t.sin, n, hd, rd);
        return query && rd !== hd ? g.mul(y, 1 / Math.sqrt(hd)) : y;
      },
    };
  }
  return llamaStack(m, g, c, P, ix.flatIds, {
    heads: byToken,
    rope: fused ? undefined : ropeTables(m, g, c, ix.positions, 'float32'),
    fused,
    attend(i, q, k, v) {
      const [kc, vc] = extendCache(g, i, g.transpose(k, [0, 2, 1, 3]), g.transpose(v, [0, 2, 1, 3]), past);
      return cachedAttention(g, ix, g.transpose(q, [0, 2, 1, 3]), kc, vc, H, KV, hd);
    },
  });
}

/** Cache geometry: layers, key/value heads, head size. */
function llamaCacheShape(c: LlamaConfig): { layers: number; kvHeads: number; headDim: number } {
  return { layers: c.num_hidden_layers, kvHeads: c.num_key_value_heads, headDim: c.head_dim };
}

/**
 * llama.cpp's view of a member of the llama family (gguf-py's constants, convert_hf_to_gguf.py):
 * its architecture and what differs from llama's tensor names and layouts.
 */
export interface LlamaGguf {
  /** `general.architecture`. */
  arch: string;
  /** {@link GgufNames.seventyBLayers}. */
  seventyBLayers?: number;
  /** Layer tensor names beyond or instead of llama's (HF after `model.layers.N.` → GGUF after `blk.N.`). */
  layer?: Record<string, string>;
  /**
   * llama.cpp rotates adjacent pairs (rope type NORM) for this architecture where HF rotates halves:
   * each q and k head's rows are interleaved, first half with second (the converter's permute).
   */
  permuteQK?: boolean;
  /** HF scales by (1 + w) and stores w; llama.cpp multiplies by the stored weight (Gemma). */
  normPlusOne?: boolean;
  /**
   * llama.cpp runs this architecture without the sliding window (none in `llama`; `phi3`'s is turned
   * off): the context is cut to the window, inside which the two attend alike.
   */
  windowAsContext?: boolean;
  /** The MLP activations llama.cpp's architecture computes; a config with another is refused. */
  activations: readonly Activation[];
  /** The activation a config's MLP uses (default `hidden_act`). */
  activation?(c: LlamaConfig): Activation;
}

const GGUF_LAYER: Record<string, string> = {
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

const GGUF_GLOBAL: Record<string, string> = {
  'model.embed_tokens.weight': 'token_embd.weight',
  'model.norm.weight': 'output_norm.weight',
  'lm_head.weight': 'output.weight',
};

/**
 * HF's rotate-half q/k rows → llama.cpp's adjacent pairs, per head: row j·hd/2 + i of a head (half j,
 * index i) moves to row 2i + j. `data` is heads·hd rows of `cols` values.
 */
export function permuteRotary(data: Float32Array, heads: number, cols: number): Float32Array {
  const hd = data.length / cols / heads;
  const half = hd / 2;
  const out = new Float32Array(data.length);
  for (let h = 0; h < heads; h++) {
    for (let j = 0; j < 2; j++) {
      for (let i = 0; i < half; i++) {
        const from = (h * hd + j * half + i) * cols;
        out.set(data.subarray(from, from + cols), (h * hd + 2 * i + j) * cols);
      }
    }
  }
  return out;
}

/** A member's {@link LlamaGguf} as the family's GGUF names. */
function llamaGguf(m: LlamaMember, o: LlamaGguf): GgufNames<LlamaConfig> {
  const layer = { ...GGUF_LAYER, ...o.layer };
  return {
    arch: o.arch,
    ...(o.seventyBLayers !== undefined ? { seventyBLayers: o.seventyBLayers } : {}),
    tensorName(hf) {
      const l = /^model\.layers\.(\d+)\.(.+)$/.exec(hf);
      if (l) return layer[l[2]] ? `blk.${l[1]}.${layer[l[2]]}` : null;
      return GGUF_GLOBAL[hf] ?? null;
    },
    tensorData(c, hf, shape, data) {
      if (o.permuteQK) {
        const heads = /\.self_attn\.q_proj\./.test(hf) ? c.num_attention_heads : /\.self_attn\.k_proj\./.test(hf) ? c.num_key_value_heads : 0;
        if (heads) return { shape, data: permuteRotary(data, heads, shape.length === 2 ? shape[1] : 1) };
      }
      if (o.normPlusOne && /norm\.weight$/.test(hf)) return { shape, data: data.map((x) => x + 1) };
      return { shape, data };
    },
    metadata(c) {
      const w = attentionWindow(m, c);
      const m0: Record<string, ReturnType<typeof gv.u32>> = {
        context_length: gv.u32(o.windowAsContext && w !== null ? Math.min(w, c.max_position_embeddings) : c.max_position_embeddings),
        embedding_length: gv.u32(c.hidden_size),
        block_count: gv.u32(c.num_hidden_layers),
        feed_forward_length: gv.u32(c.intermediate_size),
        'attention.head_count': gv.u32(c.num_attention_heads),
        'attention.head_count_kv': gv.u32(c.num_key_value_heads),
        'attention.key_length': gv.u32(c.head_dim),
        'attention.value_length': gv.u32(c.head_dim),
        'attention.layer_norm_rms_epsilon': gv.f32(c.rms_norm_eps),
        'rope.freq_base': gv.f32(c.rope_theta),
        'rope.dimension_count': gv.u32(rotaryDim(m, c)),
        vocab_size: gv.u32(c.vocab_size),
      };
      const s = c.rope_scaling as Record<string, unknown> | null | undefined;
      if (s && (s.rope_type ?? s.type) === 'linear') {
        m0['rope.scaling.type'] = gv.str('linear');
        m0['rope.scaling.factor'] = gv.f32(s.factor as number);
      }
      return m0;
    },
    check(c) {
      const act = o.activation?.(c) ?? c.hidden_act;
      if (!o.activations.includes(act)) throw new UserError(`config.json: activation "${act}" is not exported to GGUF for ${c.model_type} (llama.cpp's ${o.arch} computes ${o.activations[0]})`);
      const s = c.rope_scaling as Record<string, unknown> | null | undefined;
      const type = s ? (s.rope_type ?? s.type) : undefined;
      if (type !== undefined && type !== 'default' && type !== 'linear') throw new UserError(`config.json: rope_scaling ${JSON.stringify(type)} is not exported to GGUF (supported: none, default, linear)`);
      if (c.mlp_bias) throw new UserError(`config.json: "mlp_bias": true is not exported to GGUF (llama.cpp's ${o.arch} MLP has no biases)`);
      if (o.normPlusOne && !c.tie_word_embeddings) throw new UserError(`config.json: ${c.model_type} with "tie_word_embeddings": false is not exported to GGUF (llama.cpp ties ${o.arch}'s head)`);
    },
  };
}

/** Optimum's export of the llama family takes `position_ids`. */
const LLAMA_ONNX: OnnxNames = { extraInputs: ['position_ids'] };

/** Validates a llama-family config.json: the shared fields with the member's defaults, then the member's own. */
function parseLlama(m: LlamaMember, r: FieldReader, ids: SpecialIds, where: string): LlamaConfig {
  const obj = r.raw;
  const d = m.defaults;
  const hidden_size = r.int('hidden_size', 4096);
  const num_attention_heads = r.int('num_attention_heads', d.num_attention_heads ?? 32);
  const num_key_value_heads = r.int('num_key_value_heads', d.num_key_value_heads ?? num_attention_heads);
  if (num_attention_heads % num_key_value_heads !== 0) {
    throw new UserError(`${where}: num_attention_heads ${num_attention_heads} is not a multiple of num_key_value_heads ${num_key_value_heads}`);
  }
  if (obj.head_dim == null && d.head_dim === undefined && hidden_size % num_attention_heads !== 0) {
    throw new UserError(`${where}: hidden_size ${hidden_size} is not divisible by num_attention_heads ${num_attention_heads} (set head_dim explicitly)`);
  }
  const head_dim = r.int('head_dim', d.head_dim ?? hidden_size / num_attention_heads);
  if (head_dim % 2 !== 0) throw new UserError(`${where}: head_dim ${head_dim} must be even for rotary embeddings`);
  const cfg: LlamaConfig = {
    ...obj,
    // The registry found this family by the file's model_type.
    model_type: obj.model_type as LlamaType,
    vocab_size: r.int('vocab_size', d.vocab_size),
    hidden_size,
    intermediate_size: r.int('intermediate_size', d.intermediate_size),
    num_attention_heads,
    num_key_value_heads,
    num_hidden_layers: r.int('num_hidden_layers', d.num_hidden_layers ?? 32),
    head_dim,
    rms_norm_eps: r.positive('rms_norm_eps', d.rms_norm_eps ?? 1e-6),
    rope_theta: r.positive('rope_theta', 10000),
    max_position_embeddings: r.int('max_position_embeddings', d.max_position_embeddings),
    attention_bias: r.bool('attention_bias', d.attention_bias ?? false),
    mlp_bias: r.bool('mlp_bias', false),
    hidden_act: r.activation('hidden_act', d.hidden_act ?? 'silu'),
    tie_word_embeddings: r.bool('tie_word_embeddings', d.tie_word_embeddings ?? false),
    ...ids,
  };
  // The member's own fields (sliding_window, partial_rotary_factor, …), validated by its file.
  Object.assign(cfg, m.fields?.(r, cfg, where));
  return cfg;
}

/** The tiny (hidden 64, 2 layers, 4 heads, 2 KV heads, FFN 172, tied) and small (hidden 512, 8 layers) presets of a member. */
function llamaPreset(m: LlamaMember, tiny: boolean, vocab_size: number): Record<string, unknown> {
  return {
    vocab_size,
    hidden_size: tiny ? 64 : 512,
    intermediate_size: tiny ? 172 : 1376,
    num_hidden_layers: tiny ? 2 : 8,
    num_attention_heads: tiny ? 4 : 8,
    num_key_value_heads: tiny ? 2 : 4,
    head_dim: tiny ? 16 : 64,
    hidden_act: m.defaults.hidden_act ?? 'silu',
    max_position_embeddings: tiny ? 512 : 2048,
    rms_norm_eps: 1e-6,
    rope_theta: 10000,
    ...(m.noBiasSwitch ? {} : { attention_bias: false, mlp_bias: false }),
    tie_word_embeddings: tiny || m.defaults.tie_word_embeddings === true,
    // The member's own fields at demo sizes (a sliding window shorter than test sequences, …).
    ...m.preset?.(tiny),
  };
}

/** A member of the llama family as a {@link Family}: llama's decoder with the member's hooks. */
export function llamaFamily(m: LlamaMember): Family<LlamaConfig> {
  return {
    model_type: m.model_type,
    hfClass: m.hfClass,
    parse: (r, ids, where) => parseLlama(m, r, ids, where),
    preset: (tiny, vocab_size) => llamaPreset(m, tiny, vocab_size),
    released: m.released,
    hiddenSize: (c) => c.hidden_size,
    numLayers: (c) => c.num_hidden_layers,
    maxPositions: (c) => c.max_position_embeddings,
    learnedPositions: false,
    parameterShapes(c) {
      const s = new Map<string, number[]>();
      s.set('model.embed_tokens.weight', [c.vocab_size, c.hidden_size]);
      for (let i = 0; i < c.num_hidden_layers; i++) {
        for (const [name, shape] of layerShapes(m, c, `model.layers.${i}.`)) s.set(name, shape);
      }
      s.set('model.norm.weight', [c.hidden_size]);
      if (!c.tie_word_embeddings) s.set('lm_head.weight', [c.vocab_size, c.hidden_size]);
      return s;
    },
    embedding: 'model.embed_tokens.weight',
    normInit: m.normInit,
    window: (c) => attentionWindow(m, c),
    hidden: (g, c, P, bi) => llamaHidden(m, g, c, P, bi),
    headWeight: llamaHeadWeight,
    decode: (g, c, P, ix, past, o) => llamaDecode(m, g, c, P, ix, past, o),
    cacheShape: llamaCacheShape,
    projections(c) {
      const mods: LoraModule[] = [];
      for (let i = 0; i < c.num_hidden_layers; i++) mods.push(...layerProjections(m, c, `model.layers.${i}.`));
      return mods;
    },
    onnx: m.onnx ?? LLAMA_ONNX,
    gguf: m.gguf && llamaGguf(m, m.gguf),
  };
}

export const LLAMA = llamaFamily(LLAMA_MEMBER);
export const QWEN2 = llamaFamily(QWEN2_MEMBER);
