/**
 * GPT-2 as an ONNX graph, following HF's GPT2LMHeadModel: token + learned position embeddings,
 * pre-norm blocks of LayerNorm → fused q/k/v projection (`c_attn`) → attention → `c_proj` → residual,
 * LayerNorm → `c_fc` → GELU (tanh approximation by default) → `c_proj` → residual; a final LayerNorm.
 * Conv1D weights are stored `[in, out]`. Positions come from the attention mask, so padding does
 * not shift them. `gpt2Hidden` is the training forward over a whole batch; `gpt2Decode` the same
 * model over S new tokens per row with a key/value cache.
 */
import type { Graph, Tensor } from '../onnx/graph.ts';
import { UserError } from '../errors.ts';
import { type Family, type GgufNames, type Gpt2Config, type LoraModule, type ModelParams, type OnnxNames, ggufValue as gv } from './family.ts';
import { type BatchIndex, type DecodeIndex, activation, attention, cachedAttention, chunkRows, decodeHeads, extendCache, layerNorm, project, reshapeTo, splitHeads } from './layers.ts';

/** MLP width: `n_inner`, or 4 · n_embd when the file says null. */
export function gpt2Inner(c: Gpt2Config): number {
  return c.n_inner ?? 4 * c.n_embd;
}

/**
 * Sizes and the query scale of layer i: HF's scale_attn_weights (default on) divides the scores by
 * √hd, scale_attn_by_inverse_layer_idx also by i + 1.
 */
function dims(c: Gpt2Config): { D: number; H: number; hd: number; eps: number; scale: (i: number) => number } {
  const D = c.n_embd;
  const H = c.n_head;
  const hd = D / H;
  const scaleWeights = c.scale_attn_weights !== false;
  const byLayer = c.scale_attn_by_inverse_layer_idx === true;
  return { D, H, hd, eps: c.layer_norm_epsilon, scale: (i) => (scaleWeights ? 1 / Math.sqrt(hd) : 1) / (byLayer ? i + 1 : 1) };
}

/** Final hidden states `[N, D]` (after `ln_f`). */
function gpt2Hidden(g: Graph, c: Gpt2Config, P: ModelParams, bi: BatchIndex): Tensor {
  const { D, H, hd, eps, scale: scaleOf } = dims(c);

  let h = g.scope('embed', () => {
    const pos = reshapeTo(g, bi.positions, [-1], [bi.N]);
    return g.add(P.rows('transformer.wte.weight', bi.flatIds), P.rows('transformer.wpe.weight', pos));
  });
  for (let i = 0; i < c.n_layer; i++) {
    const p = `transformer.h.${i}.`;
    const scale = scaleOf(i);
    h = g.scope(`h.${i}`, () => {
      const proj = (name: string, x: Tensor) => project(g, x, P.get(p + name + '.weight'), P.get(p + name + '.bias'), 'conv1d', P.adapter(p + name));
      const attnOut = g.scope('attn', () => {
        const x = layerNorm(g, h, P.get(p + 'ln_1.weight'), P.get(p + 'ln_1.bias'), eps);
        const [q, k, v] = g.split(proj('attn.c_attn', x), [D, D, D], 1);
        const ctx = attention(
          g,
          bi,
          g.transpose(splitHeads(g, bi, scale === 1 ? q : g.mul(q, scale), H, hd), [0, 2, 1, 3]), // [B, H, T, hd]
          g.transpose(splitHeads(g, bi, k, H, hd), [0, 2, 3, 1]), // [B, H, hd, T]
          g.transpose(splitHeads(g, bi, v, H, hd), [0, 2, 1, 3]), // [B, H, T, hd]
          H,
          H,
          hd,
        );
        return proj('attn.c_proj', ctx);
      });
      const h1 = g.add(h, attnOut);
      const mlpOut = g.scope('mlp', () => {
        const x = layerNorm(g, h1, P.get(p + 'ln_2.weight'), P.get(p + 'ln_2.bias'), eps);
        return chunkRows(g, bi, x, gpt2Inner(c), (x) => proj('mlp.c_proj', activation(g, c.activation_function, proj('mlp.c_fc', x))));
      });
      return g.add(h1, mlpOut);
    });
  }
  return layerNorm(g, h, P.get('transformer.ln_f.weight'), P.get('transformer.ln_f.bias'), eps);
}

/** The output head's weight `[V, D]`: the token embedding when tied (always, in released GPT-2s). */
function gpt2HeadWeight(c: Gpt2Config, P: ModelParams): Tensor {
  return P.get(c.tie_word_embeddings ? 'transformer.wte.weight' : 'lm_head.weight');
}

/** Final hidden states `[B·S, D]` of S new tokens per row, reading and extending the key/value cache `past`. */
function gpt2Decode(g: Graph, c: Gpt2Config, P: ModelParams, ix: DecodeIndex, past: Map<string, Tensor> | null): Tensor {
  const { D, H, hd, eps, scale: scaleOf } = dims(c);
  let h = g.add(g.gather(P.get('transformer.wte.weight'), ix.flatIds, 0), g.gather(P.get('transformer.wpe.weight'), g.reshape(ix.positions, [-1]), 0));
  for (let i = 0; i < c.n_layer; i++) {
    const p = `transformer.h.${i}.`;
    const scale = scaleOf(i);
    const proj = (name: string, x: Tensor) => project(g, x, P.get(p + name + '.weight'), P.get(p + name + '.bias'), 'conv1d', P.adapter(p + name));
    h = g.scope(`h.${i}`, () => {
      const x = layerNorm(g, h, P.get(p + 'ln_1.weight'), P.get(p + 'ln_1.bias'), eps);
      const [q, kNew, vNew] = g.split(proj('attn.c_attn', x), [D, D, D], 1).map((t) => decodeHeads(g, t, ix, H, hd));
      const [k, v] = extendCache(g, i, kNew, vNew, past);
      const h1 = g.add(h, proj('attn.c_proj', cachedAttention(g, ix, scale === 1 ? q : g.mul(q, scale), k, v, H, H, hd)));
      const y = layerNorm(g, h1, P.get(p + 'ln_2.weight'), P.get(p + 'ln_2.bias'), eps);
      return g.add(h1, proj('mlp.c_proj', activation(g, c.activation_function, proj('mlp.c_fc', y))));
    });
  }
  return layerNorm(g, h, P.get('transformer.ln_f.weight'), P.get('transformer.ln_f.bias'), eps);
}

/** Cache geometry: layers, key/value heads (every head has its own), head size. */
function gpt2CacheShape(c: Gpt2Config): { layers: number; kvHeads: number; headDim: number } {
  return { layers: c.n_layer, kvHeads: c.n_head, headDim: c.n_embd / c.n_head };
}

/**
 * HF's original GPT-2 checkpoints name tensors without the `transformer.` prefix and carry attention
 * mask buffers (`attn.bias`, `attn.masked_bias`); this maps such names onto the model's own.
 */
function normalizeGpt2Name(name: string): string | null {
  if (/\.attn\.(masked_)?bias$/.test(name)) return null;
  if (name.startsWith('transformer.') || name.startsWith('lm_head.') || name.startsWith('value_head.')) return name;
  return 'transformer.' + name;
}

/** HF tensor names and shapes; Conv1D weights `[in, out]`. */
function gpt2ParameterShapes(c: Gpt2Config): Map<string, number[]> {
  const s = new Map<string, number[]>();
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

function gpt2Projections(c: Gpt2Config): LoraModule[] {
  const mods: LoraModule[] = [];
  const d = c.n_embd;
  const inner = gpt2Inner(c);
  for (let i = 0; i < c.n_layer; i++) {
    const p = `transformer.h.${i}.`;
    mods.push({ name: p + 'attn.c_attn', in: d, out: 3 * d, layout: 'conv1d' });
    mods.push({ name: p + 'attn.c_proj', in: d, out: d, layout: 'conv1d' });
    mods.push({ name: p + 'mlp.c_fc', in: d, out: inner, layout: 'conv1d' });
    mods.push({ name: p + 'mlp.c_proj', in: inner, out: d, layout: 'conv1d' });
  }
  return mods;
}

/** llama.cpp's names of GPT-2's layer tensors (after `transformer.h.N.` → after `blk.N.`). */
const GGUF_LAYER: Record<string, string> = {
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
};

const GGUF_GLOBAL: Record<string, string> = {
  'transformer.wte.weight': 'token_embd.weight',
  'transformer.wpe.weight': 'position_embd.weight',
  'transformer.ln_f.weight': 'output_norm.weight',
  'transformer.ln_f.bias': 'output_norm.bias',
  'lm_head.weight': 'output.weight',
};

/** GPT-2 in llama.cpp: its `gpt2` architecture, Conv1D weights `[in, out]` transposed to `[out, in]`, tanh-GELU, every layer scaled by 1/√hd. */
const GPT2_GGUF: GgufNames<Gpt2Config> = {
  arch: 'gpt2',
  tensorName(hf) {
    const l = /^transformer\.h\.(\d+)\.(.+)$/.exec(hf);
    if (l) return GGUF_LAYER[l[2]] ? `blk.${l[1]}.${GGUF_LAYER[l[2]]}` : null;
    return GGUF_GLOBAL[hf] ?? null;
  },
  tensorData(_c, hf, shape, data) {
    if (!/\.(c_attn|c_proj|c_fc)\.weight$/.test(hf)) return { shape, data };
    const [rows, cols] = shape;
    const out = new Float32Array(data.length);
    for (let r = 0; r < rows; r++) for (let k = 0; k < cols; k++) out[k * rows + r] = data[r * cols + k];
    return { shape: [cols, rows], data: out };
  },
  metadata: (c) => ({
    context_length: gv.u32(c.n_positions),
    embedding_length: gv.u32(c.n_embd),
    feed_forward_length: gv.u32(gpt2Inner(c)),
    block_count: gv.u32(c.n_layer),
    'attention.head_count': gv.u32(c.n_head),
    'attention.layer_norm_epsilon': gv.f32(c.layer_norm_epsilon),
    vocab_size: gv.u32(c.vocab_size),
  }),
  check(c) {
    if (!['gelu_new', 'gelu_pytorch_tanh', 'gelu_fast'].includes(c.activation_function)) throw new UserError(`config.json: activation "${c.activation_function}" is not exported to GGUF for gpt2 (llama.cpp's gpt2 computes gelu_new)`);
    if (c.scale_attn_by_inverse_layer_idx === true) throw new UserError('config.json: gpt2 with "scale_attn_by_inverse_layer_idx": true is not exported to GGUF (llama.cpp scales every layer by 1/sqrt(head_dim))');
    if (c.scale_attn_weights === false) throw new UserError('config.json: gpt2 with "scale_attn_weights": false is not exported to GGUF (llama.cpp scales by 1/sqrt(head_dim))');
  },
};

/** Optimum's export of GPT-2 takes `position_ids`. */
const GPT2_ONNX: OnnxNames = { extraInputs: ['position_ids'] };

export const GPT2: Family<Gpt2Config> = {
  model_type: 'gpt2',
  hfClass: 'GPT2LMHeadModel',
  parse(r, ids, where) {
    const obj = r.raw;
    const n_embd = r.int('n_embd', 768);
    const n_head = r.int('n_head', 12);
    if (n_embd % n_head !== 0) throw new UserError(`${where}: n_embd ${n_embd} is not divisible by n_head ${n_head}`);
    const inner = obj.n_inner;
    return {
      ...obj,
      // The registry found this family by the file's model_type.
      model_type: obj.model_type as 'gpt2',
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
  },
  preset: (tiny, vocab_size) => ({
    vocab_size,
    n_embd: tiny ? 64 : 512,
    n_layer: tiny ? 2 : 8,
    n_head: tiny ? 4 : 8,
    n_positions: tiny ? 512 : 2048,
    n_inner: null,
    activation_function: 'gelu_new',
    layer_norm_epsilon: 1e-5,
    tie_word_embeddings: true,
  }),
  hiddenSize: (c) => c.n_embd,
  numLayers: (c) => c.n_layer,
  maxPositions: (c) => c.n_positions,
  learnedPositions: true,
  parameterShapes: gpt2ParameterShapes,
  embedding: 'transformer.wte.weight',
  normalizeName: normalizeGpt2Name,
  // The residual output projections start scaled by 1/√(2·n_layer), as GPT-2's paper and HF do.
  initStd: (c, name, std) => (name.endsWith('c_proj.weight') ? std / Math.sqrt(2 * c.n_layer) : std),
  window: () => null,
  hidden: gpt2Hidden,
  headWeight: gpt2HeadWeight,
  decode: gpt2Decode,
  cacheShape: gpt2CacheShape,
  projections: gpt2Projections,
  onnx: GPT2_ONNX,
  gguf: GPT2_GGUF,
};
