/**
 * Incremental decoding graphs with a key/value cache, built from the same HF parameter names as the
 * training forward (src/models), for the llama family (the same layers as training: llamaStack) and gpt2.
 *
 *   prefill:  input_ids [B, S], attention_mask [B, S]                        → logits [B, V], present.*
 *   step:     input_ids [B, S], attention_mask [B, P+S], past.i.key/value    → logits [B, V], present.*
 *
 * `past.<i>.key`, `past.<i>.value` and `present.<i>.key`, `present.<i>.value` are `[B, KV, P, hd]`
 * (keys after rotary embedding); `present` = past ++ the S new positions. `logits` are those of each
 * row's last new position. Positions count the real tokens before each token (exclusive cumulative
 * sum of the attention mask over past and new positions), exactly as the training forward counts
 * them, so left-padded prompts decode as they would alone and the cache reproduces a full
 * recomputation. Parameters are graph inputs (fed from weight arrays, so a policy that changes every
 * optimizer step needs no new session) or, with `weights`, baked-in initializers.
 */
import { Graph, type Tensor } from '../onnx/graph.ts';
import type { LlamaConfig, ModelConfig } from '../models/config.ts';
import type { FloatTensor } from '../models/checkpoint.ts';
import { activation, layerNorm, MASK_VALUE, project, reshapeRt, windowed } from '../models/layers.ts';
import { attentionWindow, llamaStack, ropeTables } from '../models/llama.ts';
import type { LoraConfig } from '../models/lora.ts';
import { declareParameters, modelParameterShapes, parameterInitializers, Params } from '../models/params.ts';

export interface DecodeGraphOptions {
  /** With past key/value inputs (the step graph); without, the prefill graph. */
  past: boolean;
  /** Bake these weights in; otherwise every parameter is a graph input. */
  weights?: Map<string, FloatTensor>;
  /** Decode with these LoRA adapters (their tensors become parameters too). */
  lora?: LoraConfig | null;
}

/** Cache geometry of a config: layers, key/value heads, head size. */
export function cacheShape(c: ModelConfig): { layers: number; kvHeads: number; headDim: number } {
  if (c.model_type === 'gpt2') return { layers: c.n_layer, kvHeads: c.n_head, headDim: c.n_embd / c.n_head };
  return { layers: c.num_hidden_layers, kvHeads: c.num_key_value_heads, headDim: c.head_dim };
}

export const pastName = (layer: number, kv: 'key' | 'value') => `past.${layer}.${kv}`;
export const presentName = (layer: number, kv: 'key' | 'value') => `present.${layer}.${kv}`;

/** Index tensors shared by the layers of one decode graph. */
interface DecodeIndex {
  /** `[B·S]` new token ids. */
  flatIds: Tensor;
  /** `[B, S]` int64 positions of the new tokens. */
  positions: Tensor;
  /** `[B, 1, S, L]` additive mask of new queries over past + new keys. */
  mask: Tensor;
  /** `[2]` runtime (B, S). */
  shapeBS: Tensor;
}

function decodeIndex(g: Graph, ids: Tensor, attn: Tensor, window: number | null): DecodeIndex {
  return g.scope('index', () => {
    const S = g.dim(ids, 1); // [1]
    const L = g.dim(attn, 1);
    const all = g.cumSum(attn, 1, { exclusive: true }); // [B, L]
    const start = g.sub(L, S);
    const positions = g.slice(all, start, L, [1]); // [B, S]
    const keys = g.range(g.scalar(0, 'int64'), g.squeeze(L, [0]), g.scalar(1, 'int64')); // [L]
    const queries = g.add(g.range(g.scalar(0, 'int64'), g.squeeze(S, [0]), g.scalar(1, 'int64')), g.squeeze(start, [0])); // [S]
    const causal = g.lessOrEqual(g.unsqueeze(keys, [0]), g.unsqueeze(queries, [1])); // [S, L]
    const real = g.unsqueeze(g.cast(attn, 'bool'), [1, 2]); // [B, 1, 1, L]
    // A sliding window counts positions, as the training mask does.
    const allowed = windowed(g, g.and(causal, real), positions, all, window);
    const mask = g.where(allowed, g.scalar(0, 'float32'), g.scalar(MASK_VALUE, 'float32'));
    const flatIds = g.reshape(ids, [-1]);
    return { flatIds, positions, mask, shapeBS: g.shapeOf(ids) };
  });
}

/** `[B·S, heads·hd]` → `[B, heads, S, hd]`. */
function heads(g: Graph, x: Tensor, ix: DecodeIndex, n: number, hd: number): Tensor {
  const split = reshapeRt(g, x, g.concat([ix.shapeBS, g.ints([n, hd])], 0), ['B', 'S', n, hd]);
  return g.transpose(split, [0, 2, 1, 3]);
}

/**
 * Attention of S new queries `[B, H, S, hd]` (already scaled) over the cache `[B, KV, L, hd]`.
 * Grouped queries fold into the row axis, as in the training forward. Returns `[B·S, H·hd]`.
 */
function cachedAttention(g: Graph, ix: DecodeIndex, q: Tensor, k: Tensor, v: Tensor, H: number, KV: number, hd: number): Tensor {
  const group = H / KV;
  const kT = g.transpose(k, [0, 1, 3, 2]); // [B, KV, hd, L]
  let ctx: Tensor;
  if (group === 1) {
    ctx = g.matmul(g.softmax(g.add(g.matmul(q, kT), ix.mask), -1), v);
  } else {
    const qg = g.reshape(q, [0, KV, -1, hd]); // [B, KV, group·S, hd]
    const s = g.reshape(g.matmul(qg, kT), [0, H, -1, 0]); // [B, H, S, L]
    const p = g.reshape(g.softmax(g.add(s, ix.mask), -1), [0, KV, -1, 0]);
    ctx = g.reshape(g.matmul(p, v), [0, H, -1, hd]); // [B, H, S, hd]
  }
  return g.reshape(g.transpose(ctx, [0, 2, 1, 3]), [-1, H * hd]);
}

/** Appends the new keys/values to the layer's cache and marks the result as the present outputs. */
function extendCache(g: Graph, layer: number, k: Tensor, v: Tensor, past: Map<string, Tensor> | null): [Tensor, Tensor] {
  const full = (kv: 'key' | 'value', x: Tensor) => {
    const p = past?.get(pastName(layer, kv));
    return g.output(p ? g.concat([p, x], 2) : g.identity(x), presentName(layer, kv));
  };
  return [full('key', k), full('value', v)];
}

/** The llama family's decoder (src/models/llama.ts) attending over the cache. */
function llamaDecode(g: Graph, c: LlamaConfig, P: Params, ix: DecodeIndex, past: Map<string, Tensor> | null): Tensor {
  const H = c.num_attention_heads;
  const KV = c.num_key_value_heads;
  const hd = c.head_dim;
  const byToken = (x: Tensor, n: number) => reshapeRt(g, x, g.concat([ix.shapeBS, g.ints([n, hd])], 0), ['B', 'S', n, hd]); // [B, S, n, hd]
  return llamaStack(g, c, P, ix.flatIds, {
    heads: byToken,
    rope: ropeTables(g, c, ix.positions, 'float32'),
    attend(i, q, k, v) {
      const [kc, vc] = extendCache(g, i, g.transpose(k, [0, 2, 1, 3]), g.transpose(v, [0, 2, 1, 3]), past);
      return cachedAttention(g, ix, g.transpose(q, [0, 2, 1, 3]), kc, vc, H, KV, hd);
    },
  });
}

function gpt2Decode(g: Graph, c: Extract<ModelConfig, { model_type: 'gpt2' }>, P: Params, ix: DecodeIndex, past: Map<string, Tensor> | null): Tensor {
  const D = c.n_embd;
  const H = c.n_head;
  const hd = D / H;
  const eps = c.layer_norm_epsilon;
  const scaleWeights = c.scale_attn_weights !== false;
  const byLayer = c.scale_attn_by_inverse_layer_idx === true;
  let h = g.add(g.gather(P.get('transformer.wte.weight'), ix.flatIds, 0), g.gather(P.get('transformer.wpe.weight'), g.reshape(ix.positions, [-1]), 0));
  for (let i = 0; i < c.n_layer; i++) {
    const p = `transformer.h.${i}.`;
    const scale = (scaleWeights ? 1 / Math.sqrt(hd) : 1) / (byLayer ? i + 1 : 1);
    const proj = (name: string, x: Tensor) => project(g, x, P.get(p + name + '.weight'), P.get(p + name + '.bias'), 'conv1d', P.adapter(p + name));
    h = g.scope(`h.${i}`, () => {
      const x = layerNorm(g, h, P.get(p + 'ln_1.weight'), P.get(p + 'ln_1.bias'), eps);
      const [q, kNew, vNew] = g.split(proj('attn.c_attn', x), [D, D, D], 1).map((t) => heads(g, t, ix, H, hd));
      const [k, v] = extendCache(g, i, kNew, vNew, past);
      const h1 = g.add(h, proj('attn.c_proj', cachedAttention(g, ix, scale === 1 ? q : g.mul(q, scale), k, v, H, H, hd)));
      const y = layerNorm(g, h1, P.get(p + 'ln_2.weight'), P.get(p + 'ln_2.bias'), eps);
      return g.add(h1, proj('mlp.c_proj', activation(g, c.activation_function, proj('mlp.c_fc', y))));
    });
  }
  return layerNorm(g, h, P.get('transformer.ln_f.weight'), P.get('transformer.ln_f.bias'), eps);
}

/** Builds the prefill (`past: false`) or step (`past: true`) graph of `config` (float32). */
export function buildDecodeGraph(config: ModelConfig, o: DecodeGraphOptions): Graph {
  const g = new Graph(o.past ? 'prefzoo_decode_step' : 'prefzoo_decode_prefill');
  const ids = g.input('input_ids', 'int64', ['batch', 'new']);
  const attn = g.input('attention_mask', 'int64', ['batch', o.past ? 'total' : 'new']);
  const { layers, kvHeads, headDim } = cacheShape(config);
  let past: Map<string, Tensor> | null = null;
  if (o.past) {
    past = new Map();
    for (let i = 0; i < layers; i++) {
      for (const kv of ['key', 'value'] as const) past.set(pastName(i, kv), g.input(pastName(i, kv), 'float32', ['batch', kvHeads, 'past', headDim]));
    }
  }
  const params = o.weights
    ? parameterInitializers(g, o.weights, modelParameterShapes(config, { lora: o.lora }).keys())
    : declareParameters(g, config, { dtype: 'float32', lora: o.lora });
  const P = new Params(params, config, o.lora);
  const ix = decodeIndex(g, ids, attn, config.model_type === 'gpt2' ? null : attentionWindow(config));
  const hidden = config.model_type === 'gpt2' ? gpt2Decode(g, config, P, ix, past) : llamaDecode(g, config, P, ix, past);
  const headW =
    config.model_type === 'gpt2'
      ? P.get(config.tie_word_embeddings ? 'transformer.wte.weight' : 'lm_head.weight')
      : P.get(config.tie_word_embeddings ? 'model.embed_tokens.weight' : 'lm_head.weight');
  // Only each row's last new position needs logits: [B·S, D] → [B, S, D] → [B, D].
  const D = headW.shape![1] as number;
  const last = g.squeeze(g.slice(g.reshape(hidden, g.concat([ix.shapeBS, g.ints([D])], 0)), [-1], [2 ** 40], [1]), [1]);
  g.output(g.gemm(last, headW, null, { transB: true }), 'logits');
  return g;
}
