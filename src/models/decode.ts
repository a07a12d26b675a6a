/**
 * Incremental decoding graphs with a key/value cache, built from the same HF parameter names as the
 * training forward; each architecture's layers are in its family file (llama.ts, gpt2.ts, …, found
 * through families.ts), the shared blocks in layers.ts.
 *
 *   prefill:  input_ids [B, S], attention_mask [B, S]                        → logits [B, V], present.*
 *   step:     input_ids [B, 1], attention_mask [B, P+1], past.i.key/value    → logits [B, V], present.*
 *
 * `past.<i>.key`, `past.<i>.value` are `[B, KV, P, hd]` (keys after rotary embedding) and
 * `present.<i>.key`, `present.<i>.value` `[B, KV, S, hd]` (S = 1 in a step): only the new positions' own, which the
 * caller writes into its cache (the graph never copies the cache). The past may be a preallocated
 * cache with unfilled slots: the attention mask's zeros hide them. `logits` are those of each
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
import { decodeIndex, pastName, type PastCache } from './layers.ts';
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
  /** What the graph returns for the last position: the logits (default), or the token it picks (see {@link DecodeHead}). */
  head?: DecodeHead;
}

/**
 * The graph's last step. `logits` `[B, V]` for the host to sample from. `greedy`: `token` `[B]`, the
 * first argmax of the logits below `vocab_limit` `[1]`. `sample`: `token` `[B]` drawn as
 * src/models/sampling.ts's sampleToken draws without top-k/top-p, in float64: weights
 * e^((l − max)/temperature) over the ids below `vocab_limit`, and the first id whose running sum
 * exceeds `uniform` `[B, 1]` (each row's draw in [0, 1)) times their total. The logits never leave
 * the graph. `sample-t1` is `sample` at temperature 1, without the division (x/1 = x). (float64
 * throughout: CPU only.)
 */
export type DecodeHead = 'logits' | 'greedy' | 'sample' | 'sample-t1';

/** Cache geometry of a config: layers, key/value heads, head size. */
export function cacheShape(c: ModelConfig): CacheShape {
  return familyFor(c).cacheShape(c);
}

/** Builds the prefill (`past: false`) or step (`past: true`) graph of `config` (float32). */
export function buildDecodeGraph(config: ModelConfig, o: DecodeGraphOptions): Graph {
  const g = new Graph(o.past ? 'prefzoo_decode_step' : 'prefzoo_decode_prefill');
  // A step feeds one token per row (its attention relies on it), the prefill any number; the dim
  // stays symbolic in both, as the shapes built from it are carried on the device under WebGPU.
  const ids = g.input('input_ids', 'int64', ['batch', 'new']);
  const attn = g.input('attention_mask', 'int64', ['batch', o.past ? 'total' : 'new']);
  const { layers, kvHeads, headDim } = cacheShape(config);
  let past: PastCache | null = null;
  if (o.past) {
    past = Object.assign(new Map<string, Tensor>(), { inPlace: true });
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
  const logits = g.gemm(last, headW, null, { transB: true });
  const head = o.head ?? 'logits';
  if (head === 'logits') {
    g.output(logits, 'logits');
    return g;
  }
  const limited = g.slice(logits, g.ints([0]), g.input('vocab_limit', 'int64', [1]), [1]); // [B, V']
  if (head === 'greedy') {
    g.output(g.argMax(limited, 1, false), 'token');
    return g;
  }
  // The max of float32 values is one of them: taken before the cast, it is the same number.
  const shifted = g.sub(g.cast(limited, 'float64'), g.cast(g.reduceMax(limited, [1], true), 'float64'));
  const w = g.exp(head === 'sample' ? g.div(shifted, g.input('temperature', 'float64', [])) : shifted);
  const running = g.cumSum(w, 1);
  const total = g.slice(running, [-1], [2 ** 40], [1]); // [B, 1]: the sum in the running order
  const beyond = g.cast(g.greater(running, g.mul(g.input('uniform', 'float64', ['batch', 1]), total)), 'int32');
  g.output(g.argMax(beyond, 1, false), 'token');
  return g;
}
