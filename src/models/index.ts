/**
 * Causal language models as ONNX graphs: `buildCausalLM` runs the config's family (families.ts) and returns the
 * final hidden states, the logits on demand, and the batch's index tensors; `valueHead` reads a
 * scalar per row from the hidden state at a chosen position.
 */
import type { Graph, Tensor } from '../onnx/graph.ts';
import type { ModelConfig } from './config.ts';
import { familyFor } from './families.ts';
import { type BatchIndex, type Chunking, type FloatDType, batchIndex, lmHead, packedBatchIndex } from './layers.ts';
import type { LoraConfig } from './lora.ts';
import { Params, VALUE_HEAD_BIAS, VALUE_HEAD_WEIGHT } from './params.ts';

export interface CausalLMInputs {
  /** `[batch, seq]` int64. */
  inputIds: Tensor;
  /** `[batch, seq]` 1 for real tokens, 0 for padding (int64, bool or float); left or right padding. */
  attentionMask?: Tensor;
  /** Packed rows (src/models/batch.ts): `[batch, seq]` int64 positions and segments instead of a mask. */
  packed?: { positionIds: Tensor; segmentIds: Tensor };
}

export interface CausalLMOptions {
  /**
   * Use these LoRA adapters (their tensors must be among the parameters). Without it the forward
   * ignores any adapter tensors: the same base weights then give the reference model.
   */
  lora?: LoraConfig | null;
  /**
   * Index tensors of another forward over the same inputs (`model.batch`), so a policy and its
   * adapters-off reference in one graph share positions and the attention mask.
   */
  batch?: BatchIndex;
  /** Attention in up to this many pieces over the key/value heads, to bound its memory (BatchIndex.pieces). */
  attentionPieces?: number;
  /** The largest batch the graph is built for: the MLP and attention in pieces that keep each tensor under a bound there (BatchIndex.chunking). */
  chunking?: Chunking;
}

export interface CausalLM {
  config: ModelConfig;
  batch: BatchIndex;
  /** `[N, D]` final hidden states (after the final norm), N = batch·seq, row b·seq + t. */
  hidden: Tensor;
  /** `[V, D]` output head weight (the token embedding when tied). */
  headWeight: Tensor;
  /** `[N, V]` logits; built on the first call, then reused. */
  logits(): Tensor;
}

/**
 * Builds the forward pass of `config` over `params` (HF names → tensors, from `declareParameters`
 * or `parameterInitializers`). The float type is the embedding's (float32, or float64 for checks).
 */
export function buildCausalLM(g: Graph, config: ModelConfig, params: Map<string, Tensor>, inputs: CausalLMInputs, opts: CausalLMOptions = {}): CausalLM {
  const family = familyFor(config);
  const P = new Params(params, config, opts.lora);
  const embed = P.raw(family.embedding);
  // float16 base weights (LoRA's base_dtype) compute in float32.
  const dtype = (embed.dtype === 'float16' ? 'float32' : embed.dtype) as FloatDType;
  if (dtype !== 'float32' && dtype !== 'float64') throw new Error(`model parameters must be float32, float64 or (frozen) float16, got ${embed.dtype}`);
  if (opts.batch && (opts.batch.ids !== inputs.inputIds || opts.batch.dtype !== dtype)) throw new Error('buildCausalLM: opts.batch belongs to other inputs');
  const indexOf = (): BatchIndex => {
    const window = family.window(config);
    if (inputs.packed) return packedBatchIndex(g, inputs.inputIds, inputs.packed.positionIds, inputs.packed.segmentIds, dtype, window);
    if (!inputs.attentionMask) throw new Error('buildCausalLM: an attention mask or packed positions and segments are needed');
    return batchIndex(g, inputs.inputIds, inputs.attentionMask, dtype, window);
  };
  const shared = opts.batch ?? indexOf();
  const bi = opts.attentionPieces || opts.chunking ? { ...shared, ...(opts.attentionPieces ? { pieces: opts.attentionPieces } : {}), ...(opts.chunking ? { chunking: opts.chunking } : {}) } : shared;
  const hidden = family.hidden(g, config, P, bi);
  const headWeight = family.headWeight(config, P);
  let logits: Tensor | undefined;
  return {
    config,
    batch: bi,
    hidden,
    headWeight,
    logits: () => (logits ??= g.scope('lm_head', () => lmHead(g, hidden, headWeight))),
  };
}

/**
 * The scalar head `value_head.weight · h + value_head.bias` on the final hidden state of each row at
 * position `valueIndex [B]` (int64; e.g. the last prompt token for DRO's V(x), the last token for a
 * reward model). Returns `[B]`.
 */
export function valueHead(g: Graph, model: CausalLM, params: Map<string, Tensor>, valueIndex: Tensor): Tensor {
  const w = params.get(VALUE_HEAD_WEIGHT);
  const b = params.get(VALUE_HEAD_BIAS);
  if (!w || !b) throw new Error('valueHead: declare the parameters with { valueHead: true }');
  return g.scope('value_head', () => {
    const ids = model.batch.ids;
    const idx = valueIndex.dtype === 'int64' ? valueIndex : g.cast(valueIndex, 'int64');
    const rows = g.range(0, g.squeeze(g.dim(ids, 0), [0]), 1, 'int64'); // [B]
    const flat = g.add(g.mul(rows, g.squeeze(g.dim(ids, 1), [0])), idx); // b·T + index
    const h = g.gather(model.hidden, flat, 0); // [B, D]
    return g.add(g.matmul(h, w), b);
  });
}

export { type BatchIndex, type FloatDType } from './layers.ts';
export { type LoraConfig, initLora, loraModules, loraParameterShapes, loraScale, mergeLora } from './lora.ts';
export { declareParameters, modelParameterShapes, parameterInitializers, VALUE_HEAD_BIAS, VALUE_HEAD_WEIGHT, type ParameterOptions } from './params.ts';
export { initValueHead, initWeights } from './init.ts';
