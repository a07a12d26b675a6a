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
import { attr, Graph, type Tensor } from '../onnx/graph.ts';
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
  /**
   * Fed weights as the first operand of their products (see `fedWeightFirst`): faster on the CPU,
   * where a product packs its second operand on every call. Default true.
   */
  weightFirst?: boolean;
  /**
   * With `past`: `present.*` are past ++ new (`[B, KV, P+S, hd]`; see `presentNew`) and any number S of new tokens per
   * row attends over both (a row's cache extended by several tokens in one run). Without it a step
   * feeds one token per row and returns only its new keys/values.
   */
  concatPast?: boolean;
  /**
   * With `concatPast`: `present.*` are only the new positions' keys/values (`[B, KV, S, hd]`), as a
   * step's: attention still runs over past ++ new (so its numbers are a whole prefill's), but the
   * caller that keeps its own cache is not handed the past back.
   */
  presentNew?: boolean;
  /**
   * Build with ONNX Runtime's fused decoding ops where the family has them (the llama family: each
   * residual sum and the RMSNorm after it as SkipSimplifiedLayerNormalization, the rotary embedding as
   * RotaryEmbedding, both com.microsoft); same numbers within float32 rounding, fewer nodes per step
   * (docs/performance.md, "Fused decoding"). Default false: the graphs exported for other runtimes
   * keep standard ONNX ops.
   */
  fused?: boolean;
  /**
   * Attention's softmax in float64 (CPU only), so that a row's numbers do not depend on the columns
   * its values sit at, and so on the rows decoding beside it (see layers.ts's `cachedAttention`).
   * The CPU decoder asks it for its prefill and extend graphs; its step graph keeps float32 and gets
   * the same from the cache's layout (decoder.ts's `STEP_ALIGN`). Default false: the graphs for
   * other runtimes and the WebGPU backend keep float32.
   */
  rowInvariant?: boolean;
  /**
   * A step's attention products with one query row each, the grouped query heads of a key/value head
   * against the cache broadcast (layers.ts's `stepAttentionByRow`): on the CPU, MLAS then reads the
   * cache in place instead of packing a copy of it per product (docs/performance.md, "The step's
   * attention one query row a product"). Graphs with a past only, whose KV heads are grouped. Default false.
   */
  rowProducts?: boolean;
}

/**
 * The graph's last step. `logits` `[B, V]` for the host to sample from. `greedy`: `token` `[B]`, the
 * first argmax of the logits below `vocab_limit` `[1]`. `sample`: `token` `[B]` drawn as
 * src/models/sampling.ts's sampleToken draws without top-k/top-p: weights
 * e^((l − max)/temperature) over the ids below `vocab_limit` (float32 exps, float64 sums: see
 * `drawToken`), and the first id whose running sum exceeds `uniform` `[B, 1]` (each row's draw in
 * [0, 1)) times their total; and `logprob` `[B]` (float64), the token's log-probability under that
 * distribution. The logits never leave the graph. `sample-t1` is `sample` at temperature 1, without
 * the division (x/1 = x). (The float64 sums: CPU only.)
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
    past = Object.assign(new Map<string, Tensor>(), { inPlace: !o.concatPast, newOnly: o.concatPast && o.presentNew });
    for (let i = 0; i < layers; i++) {
      for (const kv of ['key', 'value'] as const) past.set(pastName(i, kv), g.input(pastName(i, kv), 'float32', ['batch', kvHeads, 'past', headDim]));
    }
  }
  const params = o.weights
    ? parameterInitializers(g, o.weights, modelParameterShapes(config, { lora: o.lora }).keys())
    : declareParameters(g, config, { dtype: 'float32', lora: o.lora });
  const P = new Params(params, config, o.lora);
  const family = familyFor(config);
  const ix = { ...decodeIndex(g, ids, attn, family.window(config)), softmax64: o.rowInvariant ?? false, rowProducts: o.rowProducts ?? false };
  const hidden = family.decode(g, config, P, ix, past, { fused: o.fused });
  const headW = family.headWeight(config, P);
  // Only each row's last new position needs logits: [B·S, D] → [B, S, D] → [B, D].
  const D = headW.shape![1] as number;
  const last = g.squeeze(g.slice(g.reshape(hidden, g.concat([ix.shapeBS, g.ints([D])], 0)), [-1], [2 ** 40], [1]), [1]);
  // Fed weights: the head's product as (W·lastᵀ)ᵀ (see `fedWeightFirst`); baked, last·Wᵀ with the
  // weight prepacked.
  const weightFirst = !o.weights && (o.weightFirst ?? true);
  if (weightFirst) fedWeightFirst(g);
  const logits = !weightFirst ? g.gemm(last, headW, null, { transB: true }) : g.transpose(g.matmul(headW, g.transpose(last, [1, 0])), [1, 0]); // [B, V]
  const head = o.head ?? 'logits';
  if (head === 'logits') {
    g.output(logits, 'logits');
    return g;
  }
  const vocabLimit = g.input('vocab_limit', 'int64', [1]);
  if (head === 'greedy') {
    g.output(g.argMax(g.slice(logits, g.ints([0]), vocabLimit, [1]), 1, false), 'token');
    return g;
  }
  const draw = drawToken(g, logits, vocabLimit, head === 'sample' ? g.input('temperature', 'float64', []) : null);
  g.output(draw.token, 'token');
  g.output(draw.logprob, 'logprob');
  return g;
}

/** Ids per block of the two-level draw (see `drawToken`). */
const DRAW_BLOCK = 128;

/**
 * sampleToken's draw without top-k/top-p: weights w_i = e^((l_i − max)/temperature) over the ids
 * below `vocabLimit` (the others weigh 0), and the first id whose running sum exceeds the row's
 * `uniform` times the total. The exponent and the Exp are float32 (MLAS's vectorised exp, within
 * 1.25 float32 rounding units of e^x as measured here: ONNX Runtime's float64 Exp is a scalar loop, ~2 ms of a
 * 16-row `small` step over [16, 32000]); the weights are then cast to float64 and every sum is
 * float64. So a weight is within (2 + c·|x_i|)·2⁻²⁴ of the float64 one (c = 1 at temperature 1, 3
 * with the division: the subtraction, the temperature's and the quotient's roundings), the
 * log-probability within Σ_i w_i·that / Σ_i w_i (~1e-7; the trainer's log-probabilities are
 * float32), and a draw differs from a float64 draw only when its uniform lands within twice that
 * of a boundary (test/decode-draw.test.ts holds both). Only the ids below the limit are computed
 * (a Slice: a `Where` to −∞ over all V ids was ~1 ms at 16 rows, and `small`'s generated tokenizer
 * uses 461 of its 32,000 ids). Every op is elementwise or a reduction within one row, so a row's
 * draw does not depend on the rows beside it.
 * The running sum is taken in two levels, blocks of DRAW_BLOCK ids then within the block the draw
 * lands in: a running sum over all V ids (ONNX Runtime's CumSum, a scalar loop) cost more than the
 * exps.
 * `logits` [B, V] float32 → the token [B] (int64) and its log-probability under those weights,
 * (l_tok − max)/temperature − log Σ_i w_i [B] (float64, its first term as generate.ts's logProb computes it on the host).
 */
export function drawToken(g: Graph, logits: Tensor, vocabLimit: Tensor, temperature: Tensor | null): { token: Tensor; logprob: Tensor } {
  const K = DRAW_BLOCK;
  const batch = g.dim(logits, 0);
  // The ids below the limit only (a copy of those columns): the others weigh 0, and a model whose
  // tokenizer uses few of its vocabulary's ids (the presets' generated one) skips the rest.
  const limited = g.slice(logits, g.ints([0]), vocabLimit, [1]); // [B, L]
  const max = g.reduceMax(limited, [1], true); // [B, 1]
  const shifted = g.sub(limited, max);
  const scaled = temperature ? g.div(shifted, g.cast(temperature, 'float32')) : shifted; // [B, L]
  // Zeros up to a whole number of blocks (⌈L/K⌉·K − L of them), padded in float32 before the cast.
  const L = g.dim(limited, 1);
  const padded = g.sub(g.mul(g.div(g.add(L, g.constant(K - 1, 'int64')), g.constant(K, 'int64')), g.constant(K, 'int64')), L);
  const w = g.cast(g.op('Pad', [g.exp(scaled), g.concat([g.ints([0, 0, 0]), padded], 0)], {}, [{ dtype: 'float32', shape: null }])[0], 'float64'); // [B, nb·K]
  const blocks = g.reshape(w, [0, -1, K]); // [B, nb, K]
  const blockSums = g.reduceSum(blocks, [2], false); // [B, nb]
  const before = g.cumSum(blockSums, 1, { exclusive: true }); // [B, nb]: the sum of the blocks before each
  const through = g.add(before, blockSums);
  const total = g.slice(through, [-1], [2 ** 40], [1]); // [B, 1]
  const target = g.mul(g.input('uniform', 'float64', ['batch', 1]), total);
  // The first position whose running sum passes the target is the count of those that do not (the
  // sums never decrease), at most the last position: a target that rounds to the total passes none.
  const firstOver = (running: Tensor, last: Tensor) => g.min(g.reduceSum(g.cast(g.lessOrEqual(running, target), 'int64'), [1], true), last); // [B, 1]
  const one = g.constant(1, 'int64');
  const j = firstOver(through, g.sub(g.dim(blocks, 1), one)); // the block the draw lands in
  const inBlock = g.reshape(g.gatherElements(blocks, g.expand(g.unsqueeze(j, [2]), g.concat([batch, g.ints([1, K])], 0)), 1), [0, K]); // [B, K]
  const i = firstOver(g.add(g.gatherElements(before, j, 1), g.cumSum(inBlock, 1)), g.constant(K - 1, 'int64'));
  // Past the limit only when the target passed every sum: then the last id below the limit, as
  // sampleToken's loop ends.
  const token = g.min(g.add(g.mul(j, g.constant(K, 'int64')), i), g.sub(vocabLimit, one)); // [B, 1]
  // The token's own term in float64 from its float32 logit (the max is one of the logits: the same number).
  const top = g.sub(g.cast(g.gatherElements(limited, token, 1), 'float64'), g.cast(max, 'float64'));
  const logprob = g.sub(temperature ? g.div(top, temperature) : top, g.log(total)); // [B, 1]
  return { token: g.squeeze(token, [1]), logprob: g.squeeze(logprob, [1]) };
}

/**
 * Rewrites every product x·Wᵀ whose W is a graph input (a fed weight: `Gemm(x, W, transB=1)`
 * without C) as (W·xᵀ)ᵀ: `Transpose(MatMul(W, Transpose(x)))`. MLAS packs a product's second operand
 * on every call unless it is a constant (prepacked once); with the weight first it is read in place
 * and only the small activation `[B, in]` is packed. (A `Gemm(W, x, transB=1)` would be folded back
 * by ONNX Runtime's GemmTransposeFusion; the MatMul becomes a FusedMatMul with the same operands.)
 */
function fedWeightFirst(g: Graph): void {
  const fed = new Set(g.inputs.map((i) => i.name));
  const T = { perm: attr.ints([1, 0]) };
  for (let n = 0; n < g.nodes.length; n++) {
    const node = g.nodes[n];
    const [x, w, c] = node.inputs;
    if (node.op !== 'Gemm' || node.domain !== '' || c || !fed.has(w) || node.attrs.transA || node.attrs.transB?.value !== 1 || node.attrs.alpha) continue;
    const out = node.outputs[0];
    const xT = g.uniq(`${out}_xT`);
    const yT = g.uniq(`${out}_yT`);
    const nodes = [
      { op: 'Transpose', domain: '', name: g.uniq('Transpose'), inputs: [x], outputs: [xT], attrs: T },
      { op: 'MatMul', domain: '', name: node.name, inputs: [w, xT], outputs: [yT], attrs: {} },
      { op: 'Transpose', domain: '', name: g.uniq('Transpose'), inputs: [yT], outputs: [out], attrs: T },
    ];
    g.nodes.splice(n, 1, ...nodes);
    for (const m of nodes) g.producer.set(m.outputs[0], m);
    n += 2;
  }
}
