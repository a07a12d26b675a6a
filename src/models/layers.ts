/**
 * Building blocks shared by the architectures: the batch's index tensors (positions and the additive
 * attention mask, built once per graph), projections with optional LoRA, attention, norms and
 * activations. Activations flow as 2-D `[N, D]` tensors (N = batch·seq) so every projection is one
 * Gemm and its weight gradient one Gemm, with no batched-matmul reductions; only attention reshapes
 * to `[B, heads, T, head_dim]`. The second half holds the blocks of KV-cached decoding (src/models/decode.ts).
 */
import { attr, Graph, Tensor, type Dim, type Shape } from '../onnx/graph.ts';
import type { Activation, Adapter, BatchIndex, Chunking, DecodeIndex, FloatDType } from './family.ts';
import { UserError } from '../errors.ts';

// The batch, decode and adapter types are declared in family.ts, which the family files and this file
// both stand on; re-exported here for the modules that build graphs from layers.
export type { Adapter, BatchIndex, Chunking, DecodeIndex, FloatDType };

/**
 * Additive mask value: exp(x − 1e9) is exactly 0 in float32 and float64, yet a row whose keys are all
 * masked (a left pad as query) stays finite, so no NaN reaches the gradients.
 */
export const MASK_VALUE = -1e9;

/** Product of symbolic dims: a number when both are known, else a readable name like `batch*seq`. */
export function mulDims(a: Dim, b: Dim): Dim {
  return typeof a === 'number' && typeof b === 'number' ? a * b : `${a}*${b}`;
}

/** Reshape to constant dims (0 copies an input dim, -1 is inferred) with the caller's symbolic shape. */
export function reshapeTo(g: Graph, x: Tensor, dims: number[], shape: Shape): Tensor {
  return g.op('Reshape', [x, g.ints(dims)], {}, [{ dtype: x.dtype, shape }])[0];
}

/** Reshape to a runtime shape tensor, with the caller's symbolic shape. */
export function reshapeRt(g: Graph, x: Tensor, dims: Tensor, shape: Shape): Tensor {
  return g.op('Reshape', [x, dims], {}, [{ dtype: x.dtype, shape }])[0];
}

/**
 * Positions and masks of a batch. Positions count the real tokens before each token (exclusive
 * cumulative sum of the mask), so a row gets the same positions left-padded, right-padded or alone.
 */
export function batchIndex(g: Graph, inputIds: Tensor, attentionMask: Tensor, dtype: FloatDType, window: number | null = null): BatchIndex {
  return indexTensors(g, inputIds, dtype, window, (causal) => {
    const maskI = attentionMask.dtype === 'int64' ? attentionMask : g.cast(attentionMask, 'int64');
    const keyOk = g.unsqueeze(g.cast(maskI, 'bool'), [1, 2]); // [B, 1, 1, T]
    return { positions: g.cumSum(maskI, 1, { exclusive: true }), allowed: g.and(causal, keyOk) };
  });
}

/**
 * Index tensors of a packed batch (rows of prompt ++ response_1 ++ response_2 ++ …, see
 * src/models/batch.ts): positions are given, and query t may attend key s when s ≤ t, s is not a pad,
 * and s is in the prompt or in t's own response (`segmentIds`: 0 pad, 1 prompt, 2 + k response k).
 * Every query row keeps at least its own position (or, for pads, the prompt) unmasked or falls back
 * to the finite MASK_VALUE rows as in `batchIndex`.
 */
export function packedBatchIndex(g: Graph, inputIds: Tensor, positionIds: Tensor, segmentIds: Tensor, dtype: FloatDType, window: number | null = null): BatchIndex {
  if (positionIds.dtype !== 'int64' || segmentIds.dtype !== 'int64') throw new Error('position_ids and segment_ids must be int64');
  return indexTensors(g, inputIds, dtype, window, (causal) => {
    const segK = g.unsqueeze(segmentIds, [1, 2]); // [B, 1, 1, T]
    const segQ = g.unsqueeze(segmentIds, [1, 3]); // [B, 1, T, 1]
    const keyReal = g.not(g.equal(segK, g.scalar(0, 'int64')));
    const visible = g.or(g.equal(segK, g.scalar(1, 'int64')), g.equal(segK, segQ)); // prompt or own segment
    return { positions: positionIds, allowed: g.and(causal, g.and(keyReal, visible)) };
  });
}

/**
 * The shared part of both layouts: the `[T, T]` causal pattern (key ≤ query) handed to `rule`, which
 * returns the positions and the `[B, 1, T, T]` allowed pattern; that becomes the additive mask. A
 * sliding `window` W also hides keys W or more positions before the query ({@link windowed}).
 */
function indexTensors(g: Graph, inputIds: Tensor, dtype: FloatDType, window: number | null, rule: (causal: Tensor) => { positions: Tensor; allowed: Tensor }): BatchIndex {
  if (inputIds.dtype !== 'int64') throw new Error(`input_ids must be int64, got ${inputIds.dtype}`);
  if (inputIds.shape?.length !== 2) throw new Error('input_ids must have shape [batch, seq]');
  const [B, T] = inputIds.shape;
  const N = mulDims(B, T);
  return g.scope('batch', () => {
    // 1..T along the sequence as a running count over one row: no arithmetic on shapes, so every
    // provider runs it on the device (WebGPU has no 64-bit integers for Range's int64 form).
    const row = g.slice(g.expand(g.scalar(1, dtype), g.shapeOf(inputIds)), [0], [1], [0]); // [1, T]
    const idx = reshapeTo(g, g.cumSum(row, 1), [-1], [T]);
    const causal = g.lessOrEqual(g.unsqueeze(idx, [0]), g.unsqueeze(idx, [1])); // [T, T]: key ≤ query
    const { positions, allowed } = rule(causal);
    const mask = g.where(windowed(g, allowed, positions, positions, window), g.scalar(0, dtype), g.scalar(MASK_VALUE, dtype));
    const flatIds = reshapeTo(g, inputIds, [-1], [N]);
    return { dtype, B, T, N, ids: inputIds, flatIds, positions, mask, shapeBT: g.shapeOf(inputIds) };
  });
}

/**
 * Sliding-window attention (Mistral's `sliding_window`): query at position p sees keys at positions
 * p − W < q ≤ p, W positions with its own. Distances are of positions, not of slots, so a row sees
 * the same keys alone, padded or packed (a response continues from its prompt's end). `allowed`
 * `[B, 1, Q, K]`; positions `[B, Q]` and `[B, K]`.
 */
export function windowed(g: Graph, allowed: Tensor, queryPositions: Tensor, keyPositions: Tensor, window: number | null): Tensor {
  if (window === null) return allowed;
  const dist = g.sub(g.unsqueeze(queryPositions, [1, 3]), g.unsqueeze(keyPositions, [1, 2])); // [B, 1, Q, K]
  return g.and(allowed, g.less(dist, g.scalar(window, 'int64')));
}

/**
 * A projection of 2-D activations: Linear (`weight [out, in]`, HF nn.Linear) or Conv1D
 * (`weight [in, out]`, GPT-2). The bias and the LoRA sum ride on Gemm's C input and alpha.
 */
export function project(g: Graph, x: Tensor, weight: Tensor, bias: Tensor | null, layout: 'linear' | 'conv1d', adapter?: Adapter): Tensor {
  const y = g.gemm(x, weight, bias, { transB: layout === 'linear' });
  if (!adapter) return y;
  const xa = g.gemm(x, adapter.A, null, { transB: true }); // [N, r]
  return g.gemm(xa, adapter.B, y, { transB: true, alpha: adapter.scale, beta: 1 });
}

/**
 * RMSNorm: x / sqrt(mean(x²) + eps) · w, in the graph's float type as HF computes it in float32.
 * Σx² is one ReduceSumSquare: its gradient is 2x·dy, where Pow's needs another Pow.
 */
export function rmsNorm(g: Graph, x: Tensor, w: Tensor, eps: number): Tensor {
  const d = x.shape?.[x.shape.length - 1];
  if (typeof d !== 'number') throw new Error(`rmsNorm: the normalised axis of ${x.name} needs a static size`);
  const ms = g.div(g.reduceSumSquare(x, [-1], true), d);
  return g.mul(g.div(x, g.sqrt(g.add(ms, eps))), w);
}

export function layerNorm(g: Graph, x: Tensor, w: Tensor, b: Tensor, eps: number): Tensor {
  return g.layerNorm(x, w, b, { axis: -1, epsilon: eps });
}

/**
 * `skip` added to `x`, then RMSNorm of the sum (weight `w`), as one node: ONNX Runtime's
 * SkipSimplifiedLayerNormalization (com.microsoft), which returns the sum beside the normed value (the
 * residual stream goes on from it); without `skip`, SimplifiedLayerNormalization (ORT's, ONNX domain).
 * The same function as `rmsNorm(g, add(x, skip), w, eps)` (scripts/bench/fused-ops.ts holds both
 * against float64). Decode graphs only: the ops have no gradient rule. Returns [normed, sum].
 */
export function fusedRmsNorm(g: Graph, x: Tensor, skip: Tensor | null, w: Tensor, eps: number): [Tensor, Tensor] {
  const out = { dtype: x.dtype, shape: x.shape };
  if (!skip) {
    const y = g.op('SimplifiedLayerNormalization', [x, w], { axis: attr.int(-1), epsilon: attr.float(eps), stash_type: attr.int(1) }, [out])[0];
    return [y, x];
  }
  const [y, , , sum] = g.op('SkipSimplifiedLayerNormalization', [x, skip, w], { epsilon: attr.float(eps) }, [out, { dtype: 'float32', shape: null }, { dtype: 'float32', shape: null }, out], undefined, 'com.microsoft');
  return [y, sum];
}

/**
 * Rotate-half RoPE of `x` `[B, S, heads, hd]` on its first `rd` dims at `positions` `[B, S]` (int64),
 * as one node: ONNX Runtime's RotaryEmbedding (com.microsoft) over tables `cos`, `sin`
 * `[max positions, rd/2]`. A position past the tables is an error of the run. Decode graphs only.
 */
export function rotaryEmbedding(g: Graph, x: Tensor, positions: Tensor, cos: Tensor, sin: Tensor, heads: number, hd: number, rd: number): Tensor {
  const [B, S] = x.shape ?? ['B', 'S'];
  const flat = reshapeTo(g, x, [0, 0, -1], [B, S, heads * hd]);
  const attrs = { num_heads: attr.int(heads), rotary_embedding_dim: attr.int(rd) };
  const y = g.op('RotaryEmbedding', [flat, positions, cos, sin], attrs, [{ dtype: x.dtype, shape: [B, S, heads * hd] }], undefined, 'com.microsoft')[0];
  return reshapeTo(g, y, [0, 0, heads, hd], [B, S, heads, hd]);
}

const SQRT_2_OVER_PI = Math.sqrt(2 / Math.PI);

/** The activation functions HF configs name, each as its defining formula. */
export function activation(g: Graph, name: Activation, x: Tensor): Tensor {
  switch (name) {
    case 'silu':
      // ORT fuses x·sigmoid(x) into a float-only QuickGelu kernel, so float64 graphs spell it x/(1+e⁻ˣ).
      return x.dtype === 'float64' ? g.div(x, g.add(g.exp(g.neg(x)), 1)) : g.mul(x, g.sigmoid(x));
    case 'relu':
      return g.relu(x);
    case 'gelu':
      // Exact GELU: ½x(1 + erf(x/√2)).
      return g.mul(g.mul(x, 0.5), g.add(g.erf(g.mul(x, Math.SQRT1_2)), 1));
    case 'quick_gelu': {
      const z = g.mul(x, 1.702);
      return x.dtype === 'float64' ? g.div(x, g.add(g.exp(g.neg(z)), 1)) : g.mul(x, g.sigmoid(z));
    }
    case 'gelu_new':
    case 'gelu_pytorch_tanh':
    case 'gelu_fast': {
      // Tanh approximation: ½x(1 + tanh(√(2/π)(x + 0.044715x³))); the three names are one function.
      const x3 = g.mul(g.mul(x, x), x);
      const inner = g.mul(g.add(x, g.mul(x3, 0.044715)), SQRT_2_OVER_PI);
      return g.mul(g.mul(x, 0.5), g.add(g.tanh(inner), 1));
    }
  }
}

/**
 * Causal self-attention over heads laid out `[B, H, T, hd]` (queries, already scaled by 1/√hd),
 * keys `[B, KV, hd, T]` (transposed) and values `[B, KV, T, hd]`. Grouped-query attention folds the
 * H/KV query heads sharing a KV head into the row axis, so K and V are never repeated.
 * Returns the context as `[N, H·hd]`.
 */
export function attention(g: Graph, bi: BatchIndex, q: Tensor, kT: Tensor, v: Tensor, heads: number, kvHeads: number, headDim: number): Tensor {
  const { B, T, N } = bi;
  const group = heads / kvHeads;
  let ctx: Tensor;
  const parts = piecesOf(kvHeads, bi.pieces ?? 1);
  // One block's scores `[B, heads/parts, T_k, T]` under the bound at the batch shape the graph is built for.
  const c = bi.chunking;
  const blocks = c ? Math.min(piecesUnder(c.rows * (heads / parts) * c.len * c.len * dtypeBytes(bi.dtype), c.bound), c.len) : 1;
  if (blocks > 1) {
    c!.built = Math.max(c!.built ?? 1, blocks);
    ctx = blockedAttention(g, bi, q, kT, v, heads, kvHeads, headDim, parts, blocks);
  } else if (parts > 1) {
    // The same products per head, in `parts` groups of whole key/value heads (and their query heads).
    const per = kvHeads / parts;
    const GT = mulDims(group, T);
    const qg = group === 1 ? q : reshapeTo(g, q, [0, kvHeads, -1, headDim], [B, kvHeads, GT, headDim]);
    const pieces: Tensor[] = [];
    for (let k = 0; k < parts; k++) {
      const take = (x: Tensor) => g.slice(x, [k * per], [(k + 1) * per], [1]);
      const s = reshapeTo(g, g.matmul(take(qg), take(kT)), [0, per * group, -1, 0], [B, per * group, T, T]);
      const p = g.softmax(g.add(s, bi.mask), -1);
      const pg = group === 1 ? p : reshapeTo(g, p, [0, per, -1, 0], [B, per, GT, T]);
      pieces.push(g.matmul(pg, take(v))); // [B, per, G·T, hd]
    }
    const joined = g.concat(pieces, 1); // [B, KV, G·T, hd]
    ctx = group === 1 ? joined : reshapeTo(g, joined, [0, heads, -1, headDim], [B, heads, T, headDim]);
  } else if (group === 1) {
    const scores = g.add(g.matmul(q, kT), bi.mask); // [B, H, T, T]
    ctx = g.matmul(g.softmax(scores, -1), v); // [B, H, T, hd]
  } else {
    const GT = mulDims(group, T);
    const qg = reshapeTo(g, q, [0, kvHeads, -1, headDim], [B, kvHeads, GT, headDim]);
    const s = reshapeTo(g, g.matmul(qg, kT), [0, heads, -1, 0], [B, heads, T, T]);
    const p = g.softmax(g.add(s, bi.mask), -1);
    const pg = reshapeTo(g, p, [0, kvHeads, -1, 0], [B, kvHeads, GT, T]);
    ctx = reshapeTo(g, g.matmul(pg, v), [0, heads, -1, headDim], [B, heads, T, headDim]);
  }
  const merged = g.transpose(ctx, [0, 2, 1, 3]); // [B, T, H, hd]
  return reshapeTo(g, merged, [-1, heads * headDim], [N, heads * headDim]);
}

/**
 * Attention in blocks of queries: the query rows and the mask cut into K runs along T, each block
 * scored with its own softmax against the keys up to its last query (`[B, heads, T_k, end_k]`: the
 * mask is causal, so a later key has probability 0 for every query of the block, an exact 0 in
 * float32, and its score and product are skipped: the K blocks do about (K + 1)/2K of the whole
 * products), and the contexts joined again along T. Same products row by row as {@link attention}'s
 * over the keys that count; within a block, the heads in `parts` groups of key/value heads as there.
 */
function blockedAttention(g: Graph, bi: BatchIndex, q: Tensor, kT: Tensor, v: Tensor, heads: number, kvHeads: number, headDim: number, parts: number, blocks: number): Tensor {
  const { B, T } = bi;
  const group = heads / kvHeads;
  const per = kvHeads / parts;
  const take = (x: Tensor, k: number) => (parts === 1 ? x : g.slice(x, [k * per], [(k + 1) * per], [1]));
  const keys = Array.from({ length: parts }, (_, k) => take(kT, k));
  const values = Array.from({ length: parts }, (_, k) => take(v, k));
  const qs = splitEven(g, q, 2, blocks, 'query');
  const masks = splitEven(g, bi.mask, 2, blocks, 'query');
  // Block j's queries end at cuts[j + 1]; no query of it attends a key at or past that position
  // (a query that attends no key at all, a left pad's, gets the mean of the keys its block scores:
  // nothing reads it). At least one key, so that an empty block's shapes stay inferable.
  const cuts = evenCuts(g, g.dim(q, 2), blocks);
  const ends = Array.from({ length: blocks }, (_, j) => g.max(g.slice(cuts, [j + 1], [j + 2]), g.ints([1])));
  const upTo = (x: Tensor, axis: number, j: number) => {
    const shape = x.shape ? x.shape.map((d, i) => (i === axis ? `keys_${j}` : d)) : null;
    return g.op('Slice', [x, g.ints([0]), ends[j], g.ints([axis])], {}, [{ dtype: x.dtype, shape }])[0];
  };
  const ctxs = qs.map((qj, j) => {
    const Tj = `query_${j}`;
    const Kj = `keys_${j}`;
    const GT = mulDims(group, Tj);
    const qg = group === 1 ? qj : reshapeTo(g, qj, [0, kvHeads, -1, headDim], [B, kvHeads, GT, headDim]);
    // A block left empty (a batch with fewer positions than blocks) sums its key and value gradients
    // over no queries, and ONNX Runtime's FusedMatMul (its optimizer's MatMul of a Transpose) then
    // leaves its output unwritten: the block reads keys and values through Where(block not empty),
    // whose gradient is 0 there whatever that product holds.
    const filled = g.greater(g.dim(qj, 2), 0); // [1]
    const mask = upTo(masks[j], 3, j); // [B, 1, T_j, end_j]
    const pieces = keys.map((kk, k) => {
      const s = reshapeTo(g, g.matmul(take(qg, k), g.where(filled, upTo(kk, 3, j), 0)), [0, per * group, -1, 0], [B, per * group, Tj, Kj]);
      const p = g.softmax(g.add(s, mask), -1);
      const pg = group === 1 ? p : reshapeTo(g, p, [0, per, -1, 0], [B, per, GT, Kj]);
      return g.matmul(pg, g.where(filled, upTo(values[k], 2, j), 0)); // [B, per, G·T_j, hd]
    });
    const joined = parts === 1 ? pieces[0] : g.concat(pieces, 1); // [B, KV, G·T_j, hd]
    return group === 1 ? joined : reshapeTo(g, joined, [0, heads, -1, headDim], [B, heads, Tj, headDim]);
  });
  return joinEven(g, ctxs, 2, [B, heads, T, headDim]);
}

/** The largest divisor of `kvHeads` that is at most `wanted`. */
function piecesOf(kvHeads: number, wanted: number): number {
  for (let p = Math.min(wanted, kvHeads); p > 1; p--) if (kvHeads % p === 0) return p;
  return 1;
}

/**
 * glibc's largest mmap threshold on 64-bit (DEFAULT_MMAP_THRESHOLD_MAX, 32 MiB). Without ONNX Runtime's
 * arena (the gradient sessions' LOW_MEMORY_RUNTIME) every op output is a malloc; one above this is a
 * fresh mapping the kernel zero-fills page by page at each allocation, one at or below it is recycled
 * inside the heap (docs/performance.md, issue 46). The chunked training forward keeps its tensors under it.
 */
export const TENSOR_BOUND = 32 * 2 ** 20;

function dtypeBytes(dtype: FloatDType): number {
  return dtype === 'float64' ? 8 : 4;
}

/**
 * The bound the builders cut to when a batch shape names none: TENSOR_BOUND, or the bytes in the
 * environment variable PREFZOO_TENSOR_BOUND (a test knob: a tiny model's `prefzoo train` cut into
 * pieces, which at the real bound only long batches of real widths are).
 */
export function tensorBound(): number {
  const v = process.env.PREFZOO_TENSOR_BOUND;
  if (v === undefined || v === '') return TENSOR_BOUND;
  const n = Number(v);
  if (!Number.isInteger(n) || n < 1) throw new UserError(`PREFZOO_TENSOR_BOUND=${v}: not a whole number of bytes ≥ 1`);
  return n;
}

/** How many near-equal pieces keep a tensor of `bytes` under `bound`: 1 when it already is. */
export function piecesUnder(bytes: number, bound = tensorBound()): number {
  return Math.max(1, Math.ceil(bytes / bound));
}

/**
 * `x` cut along `axis` into `K` runs of near-equal sizes taken at run time, ⌊(k+1)·n/K⌋ − ⌊k·n/K⌋ of
 * its n entries (a run is empty when n < K): one Split, whose gradient is one Concat. Piece k's dim is
 * named `${name}_k`, so the ops after it see matching shapes.
 */
export function splitEven(g: Graph, x: Tensor, axis: number, K: number, name: string): Tensor[] {
  const cuts = evenCuts(g, g.dim(x, axis), K);
  const sizes = g.sub(g.slice(cuts, [1], [K + 1]), g.slice(cuts, [0], [K]));
  const outs = Array.from({ length: K }, (_, k) => ({ dtype: x.dtype, shape: x.shape ? x.shape.map((d, i) => (i === axis ? `${name}_${k}` : d)) : null }));
  return g.op('Split', [x, sizes], { axis: attr.int(axis) }, outs);
}

/** `[K + 1]` where {@link splitEven}'s K runs of `n [1]` entries begin and end: ⌊k·n/K⌋ for k = 0 … K. */
function evenCuts(g: Graph, n: Tensor, K: number): Tensor {
  return g.div(g.mul(n, g.ints(Array.from({ length: K + 1 }, (_, k) => k))), g.ints([K]));
}

/** The pieces of {@link splitEven} joined again along `axis`, as `shape`. */
export function joinEven(g: Graph, xs: Tensor[], axis: number, shape: Shape): Tensor {
  return g.op('Concat', xs, { axis: attr.int(axis) }, [{ dtype: xs[0].dtype, shape }])[0];
}

/**
 * A row-wise block `f` (an MLP) of `x [N, D]`, in as many runs of rows as keep its widest tensor
 * (`width` columns) under the bound at the batch shape the graph is built for (`bi.chunking`); one
 * run, `f(x)` itself, without chunking or when the widest tensor fits.
 */
export function chunkRows(g: Graph, bi: BatchIndex, x: Tensor, width: number, f: (x: Tensor) => Tensor): Tensor {
  const c = bi.chunking;
  const K = c ? Math.min(piecesUnder(c.rows * c.len * width * dtypeBytes(bi.dtype), c.bound), c.rows * c.len) : 1;
  if (K <= 1) return f(x);
  c!.built = Math.max(c!.built ?? 1, K);
  const ys = splitEven(g, x, 0, K, 'rows').map(f);
  return joinEven(g, ys, 0, [bi.N, ys[0].shape?.[1] ?? '?']);
}

/** `[N, heads·hd]` → `[B, T, heads, hd]`. */
export function splitHeads(g: Graph, bi: BatchIndex, x: Tensor, heads: number, headDim: number): Tensor {
  const dims = g.concat([bi.shapeBT, g.ints([heads, headDim])], 0);
  return reshapeRt(g, x, dims, [bi.B, bi.T, heads, headDim]);
}

/** Logits `[N, V]` = hidden · Wᵀ for an output head stored `[V, D]` (tied embeddings included). */
export function lmHead(g: Graph, hidden: Tensor, weight: Tensor): Tensor {
  return g.gemm(hidden, weight, null, { transB: true }); // [N, V]
}

// ---- KV-cached decoding: S new tokens per row attend over the past keys/values plus their own. ----

export const pastName = (layer: number, kv: 'key' | 'value') => `past.${layer}.${kv}`;
export const presentName = (layer: number, kv: 'key' | 'value') => `present.${layer}.${kv}`;

/**
 * Positions and mask of the new tokens `ids [B, S]` under `attn [B, L]` (past + new). Positions count
 * the real tokens before each token, as `batchIndex` does, so a cached row decodes as it would alone.
 */
export function decodeIndex(g: Graph, ids: Tensor, attn: Tensor, window: number | null = null): DecodeIndex {
  return g.scope('index', () => {
    // No arithmetic on shapes (every provider, WebGPU included, runs this on the device): each key's
    // and each new query's distance from the end, by running counts over a row of ones. Key l of L is
    // L−1−l from the end and new query s of S sits at key L−S+s, S−1−s from the end, so
    // key ≤ query ⟺ the key's distance ≥ the query's.
    const fromEnd = (x: Tensor, n: Dim) => {
      const ones = g.slice(g.expand(g.scalar(1, 'float32'), g.shapeOf(x)), [0], [1], [0]); // [1, n]
      return reshapeTo(g, g.cumSum(ones, 1, { exclusive: true, reverse: true }), [-1], [n]);
    };
    const keys = fromEnd(attn, attn.shape?.[1] ?? '?'); // [L]
    const queries = fromEnd(ids, ids.shape?.[1] ?? '?'); // [S]
    const causal = g.greaterOrEqual(g.unsqueeze(keys, [0]), g.unsqueeze(queries, [1])); // [S, L]
    // A new token's position is the count of real tokens before it: the exclusive running count at
    // its own key, picked by a 0/1 [S, L] matrix (exact: small integers in float32).
    const pick = g.cast(g.equal(g.unsqueeze(queries, [1]), g.unsqueeze(keys, [0])), 'float32'); // [S, L]
    const before = g.cast(g.cumSum(attn, 1, { exclusive: true }), 'float32'); // [B, L]
    const positions = g.cast(g.matmul(before, g.transpose(pick, [1, 0])), 'int64'); // [B, S]
    const real = g.unsqueeze(g.cast(attn, 'bool'), [1, 2]); // [B, 1, 1, L]
    // A sliding window counts positions, as the training mask does.
    const allowed = window === null ? g.and(causal, real) : windowed(g, g.and(causal, real), positions, g.cumSum(attn, 1, { exclusive: true }), window);
    const mask = g.where(allowed, g.scalar(0, 'float32'), g.scalar(MASK_VALUE, 'float32'));
    const flatIds = g.reshape(ids, [-1]);
    return { flatIds, positions, mask, shapeBS: g.shapeOf(ids) };
  });
}

/** `[B·S, heads·hd]` → `[B, heads, S, hd]`. */
export function decodeHeads(g: Graph, x: Tensor, ix: DecodeIndex, n: number, hd: number): Tensor {
  const split = reshapeRt(g, x, g.concat([ix.shapeBS, g.ints([n, hd])], 0), ['B', 'S', n, hd]);
  return g.transpose(split, [0, 2, 1, 3]);
}

/**
 * A layer's keys or values in a decode graph, `[B, KV, ·, hd]`: the cache fed in (`past`, `[B, KV, P, hd]`;
 * null in the prefill) and the new tokens' own (`cur`, `[B, KV, S, hd]`). They are never concatenated:
 * attention scores the two parts apart, so a step neither copies the cache nor returns it.
 */
export interface CachedKV {
  past: Tensor | null;
  cur: Tensor;
}

/**
 * Attention of S new queries `[B, H, S, hd]` (already scaled) over the cached and new keys/values:
 * scores over both (concatenated: `[·, P + S]`, the order of `ix.mask`), one softmax, then the
 * probabilities split back and each part multiplied by its own values. With a cache, S is 1 (the
 * step graph's one new token per row). Cache slots the mask hides
 * (zero in the attention mask) get probability 0, so a preallocated cache may hold unfilled slots.
 * With `ix.softmax64` the softmax runs in float64 (its input and output cast): ONNX Runtime's float32
 * Softmax sums a row in SIMD lanes by column, so the same scores at other columns (a left-padded
 * prefill, new tokens after a cache of another capacity) could give probabilities one unit in the
 * last place apart; summed in float64 and rounded to float32, the difference vanishes except when a
 * probability lies within ~1e-16 of a float32 rounding boundary. (The CPU step graph keeps float32:
 * its caches keep each row's columns in place instead; decoder.ts's `STEP_ALIGN`.)
 * Grouped queries fold into the row axis, as in `attention`. Returns `[B·S, H·hd]`.
 */
export function cachedAttention(g: Graph, ix: DecodeIndex, q: Tensor, k: CachedKV, v: CachedKV, H: number, KV: number, hd: number): Tensor {
  const group = H / KV;
  if (ix.rowProducts && k.past && v.past && group > 1) return stepAttentionByRow(g, ix, q, k, v, H, KV, hd);
  const qg = group === 1 ? q : g.reshape(q, [0, KV, -1, hd]); // [B, KV, group·S, hd]
  const scores = (keys: Tensor) => g.matmul(qg, g.transpose(keys, [0, 1, 3, 2])); // [B, KV, group·S, ·]
  let s = k.past ? g.concat([scores(k.past), scores(k.cur)], -1) : scores(k.cur);
  if (group > 1) s = g.reshape(s, [0, H, -1, 0]); // [B, H, S, P+S]
  const masked = g.add(s, ix.mask);
  let p = ix.softmax64 ? g.cast(g.softmax(g.cast(masked, 'float64'), -1), 'float32') : g.softmax(masked, -1);
  if (group > 1) p = g.reshape(p, [0, KV, -1, 0]);
  let ctx: Tensor;
  if (v.past) {
    // A step feeds one new token, so the split is at a constant (no shape arithmetic: WebGPU runs it).
    const pPast = g.slice(p, [0], [-1], [-1]);
    const pCur = g.slice(p, [-1], [2 ** 40], [-1]);
    ctx = g.add(g.matmul(pPast, v.past), g.matmul(pCur, v.cur));
  } else {
    ctx = g.matmul(p, v.cur);
  }
  if (group > 1) ctx = g.reshape(ctx, [0, H, -1, hd]); // [B, H, S, hd]
  return g.reshape(g.transpose(ctx, [0, 2, 1, 3]), [-1, H * hd]);
}

/**
 * `cachedAttention` of a step (one new token per row, S = 1) with each query head its own product
 * row: q `[B, KV, group, 1, hd]` against the cache broadcast `[B, KV, 1, P, hd]`, so each product has
 * one row. ONNX Runtime's MatMul hands each to MLAS one by one, and MLAS multiplies a one-row product
 * by reading the other operand in place (its M = 1 kernels), where the grouped form's two rows made
 * it pack (copy) the cache's slice first: at a batch of 16 over ~330 slots the cache is ~88 MB a
 * step, read once here, read and copied there. A head's group partners read the same slice again
 * from the core's cache. Each output sums its slots in slot order whatever the cache's capacity
 * (masked slots add exact zeros), so a row's numbers still do not depend on the rows beside it.
 */
function stepAttentionByRow(g: Graph, ix: DecodeIndex, q: Tensor, k: CachedKV, v: CachedKV, H: number, KV: number, hd: number): Tensor {
  const group = H / KV;
  const rows = g.reshape(q, [0, KV, group, 1, hd]); // [B, KV, group, 1, hd]
  const each = (x: Tensor) => g.unsqueeze(x, [2]); // [B, KV, ·, hd] → [B, KV, 1, ·, hd]
  const scores = (keys: Tensor) => g.matmul(rows, g.transpose(each(keys), [0, 1, 2, 4, 3])); // [B, KV, group, 1, ·]
  const s = g.reshape(g.concat([scores(k.past!), scores(k.cur)], -1), [0, H, 1, -1]); // [B, H, 1, P+1]
  const p = g.reshape(g.softmax(g.add(s, ix.mask), -1), [0, KV, group, 1, -1]);
  const pPast = g.slice(p, [0], [-1], [-1]);
  const pCur = g.slice(p, [-1], [2 ** 40], [-1]);
  const ctx = g.reshape(g.add(g.matmul(pPast, each(v.past!)), g.matmul(pCur, each(v.cur))), [0, H, 1, hd]); // [B, H, 1, hd]
  return g.reshape(g.transpose(ctx, [0, 2, 1, 3]), [-1, H * hd]);
}

/**
 * A decode graph's past keys/values by name. `inPlace` (prefzoo's own step graph): the caller keeps
 * the cache and writes each step's new keys/values into it, so `present` is only the new ones and
 * attention reads the two parts apart. Without it (graphs for other runtimes, e.g. the transformers.js
 * export), `present` is past ++ new, as HF's caches return it; with `newOnly` as well (attention over
 * the concatenation) `present` is only the new keys/values (the CPU extend graph: the caller keeps its cache).
 */
export type PastCache = Map<string, Tensor> & { inPlace?: boolean; newOnly?: boolean };

/** The layer's keys and values for attention, and the `present` outputs (see {@link PastCache}). */
export function extendCache(g: Graph, layer: number, k: Tensor, v: Tensor, past: PastCache | null): [CachedKV, CachedKV] {
  const part = (kv: 'key' | 'value', x: Tensor): CachedKV => {
    const p = past?.get(pastName(layer, kv)) ?? null;
    if (p && !past!.inPlace) {
      const all = g.concat([p, x], 2);
      return { past: null, cur: past!.newOnly ? (g.output(x, presentName(layer, kv)), all) : g.output(all, presentName(layer, kv)) };
    }
    g.output(x, presentName(layer, kv));
    return { past: p, cur: x };
  };
  return [part('key', k), part('value', v)];
}
