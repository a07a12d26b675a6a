/**
 * Incremental decoding graphs with a key/value cache, built from the same HF parameter names as the
 * training forward; each architecture's layers are in its family file (llama.ts, gpt2.ts, …, found
 * through families.ts), the shared blocks in layers.ts.
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
import type { ModelConfig } from './config.ts';
import type { FloatTensor } from './checkpoint.ts';
import { familyFor } from './families.ts';
import type { CacheShape } from './family.ts';
import { decodeIndex, pastName } from './layers.ts';
import type { LoraConfig } from './lora.ts';
import { declareParameters, modelParameterShapes, parameterInitializers, Params } from './params.ts';

export { pastName, presentName } from './layers.ts';

export interface DecodeGraphOptions {
  /** With past key/value inputs (the step graph); without, the prefill graph. */
  past: boolean;
  /** Bake these weights in; otherwise every parameter is a graph input. */
  weights?: Map<string, FloatTensor>;
  /** Decode with these LoRA adapters (their tensors become parameters too). */
  lora?: LoraConfig | null;
}

/** Cache geometry of a config: layers, key/value heads, head size. */
export function cacheShape(c: ModelConfig): CacheShape {
  return familyFor(c).cacheShape(c);
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
  const family = familyFor(config);
  const ix = decodeIndex(g, ids, attn, family.window(config));
  const hidden = family.decode(g, config, P, ix, past);
  const headW = family.headWeight(config, P);
  // Only each row's last new position needs logits: [B·S, D] → [B, S, D] → [B, D].
  const D = headW.shape![1] as number;
  const last = g.squeeze(g.slice(g.reshape(hidden, g.concat([ix.shapeBS, g.ints([D])], 0)), [-1], [2 ** 40], [1]), [1]);
  g.output(g.gemm(last, headW, null, { transB: true }), 'logits');
  return g;
}
