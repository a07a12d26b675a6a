/**
 * Per-sequence log-probabilities: logp[b] = Σ_t loss_mask[b,t] · log p(ids[b,t] | ids[b,<t]) and
 * tokens[b] = the number of positions counted. Position 0 has no prediction, so loss_mask[b,0] is
 * ignored. Only the M counted positions reach the output head (in DPO the prompt half of every
 * sequence is skipped). log p = (target logit) − logsumexp(logits), arranged for cheap gradients:
 * the target logit is h·W[target] from gathered head rows (its gradient is `[M, D]`-sized, not a
 * scatter into an `[M, V]` zero tensor), and logsumexp is m + log Σ exp(x − m) with the row max m
 * held constant (its gradient through m is exactly zero), so the backward pass reuses exp(x − m) and
 * costs two `[M, V]` passes (ONNX Runtime's ReduceLogSumExp kernel measured 2× slower: single-threaded
 * with a scalar exp). A second softmax over the vocabulary is never formed.
 */
import { Graph, type Tensor } from '../onnx/graph.ts';
import type { ModelConfig } from './config.ts';
import { type CausalLM, type CausalLMOptions, buildCausalLM } from './index.ts';
import { type FloatDType, lmHead, reshapeRt, reshapeTo } from './layers.ts';
import { declareParameters, modelParameterShapes, parameterInitializers } from './params.ts';
import type { FloatTensor } from './checkpoint.ts';

export interface SequenceLogps {
  /** `[B]` summed log-probabilities of the tokens with loss_mask = 1. */
  logp: Tensor;
  /** `[B]` how many tokens were counted. */
  tokens: Tensor;
  /** `[B, T]` log p(ids[t] | ids[<t]) · loss_mask[t] at each token's own position (0 at t = 0). */
  tokenLogps?: Tensor;
  /**
   * With `perToken` and `stats`: `[B, T]` the entropy of the distribution token t was drawn from, at t
   * (no gradient, unless `entropyGrad`: then differentiable, for an entropy bonus in the loss).
   */
  tokenEntropies?: Tensor;
  /**
   * With `stats` (monitoring only, no gradient): per sequence, the sums over its counted tokens of
   * the mean logit over the vocabulary (`logitSum [B]`, TRL's `logits/chosen` numerator) and of the
   * entropy of the predicted distribution in nats (`entropySum [B]`).
   */
  logitSum?: Tensor;
  entropySum?: Tensor;
}

/**
 * Slices of the output head: about 8,192 vocabulary entries' worth each, so one slice's `[rows, V]`
 * logits are alive at a time (a Qwen vocabulary of 151,936 tokens: 19 slices). The training graph
 * slices under recomputation, the scoring graphs (`buildLogpsGraph`, the online reference) always:
 * 4,096 scored rows are 2.5 GB of logits at once, and the next two ops' as much again. Not more
 * slices for longer batches: 75 slices at 4,096 scored rows ran the 1,024-token proxy step out of
 * memory when each slice's backward made a `[V, D]` head-weight gradient of its own (519 MiB at
 * Qwen2.5-0.5B's shape), summed by Adds; a chunked graph now sums them in place (autodiff
 * `gemmSums`), not measured with more slices (docs/performance.md, issue 46).
 */
export function headChunksOf(c: ModelConfig): number {
  return Math.max(1, Math.ceil(c.vocab_size / 8192));
}

/** Large enough for any Slice end. */
const END = 2 ** 40;

/** Shifts `[B, T]` one step left along the sequence (x[:, t+1] at t), filling the last column from `fill`. */
function shiftLeft(g: Graph, x: Tensor, fill: Tensor, shape: (string | number)[]): Tensor {
  return g.op('Concat', [g.slice(x, [1], [END], [1]), fill], { axis: { kind: 'int', value: 1 } }, [{ dtype: x.dtype, shape }])[0];
}

/**
 * Log-probabilities of the tokens of a built model under `lossMask [B, T]` (float, int or bool).
 * Only the M positions whose next token is counted go through the output head: a prompt's
 * positions predict nothing the loss reads, so their `[·, V]` logits are never formed.
 */
export function sequenceLogps(g: Graph, model: CausalLM, lossMask: Tensor, opts: { perToken?: boolean; stats?: boolean; entropyGrad?: boolean; dense?: boolean; headChunks?: number; vocabLimit?: number } = {}): SequenceLogps {
  const head: Head = { stats: opts.entropyGrad ? 'grad' : !!opts.stats, bias: vocabBias(g, model, opts.vocabLimit) };
  const bi = model.batch;
  return g.scope('logps', () => {
    const shape = [bi.B, bi.T];
    const mask = lossMask.dtype === bi.dtype ? lossMask : g.cast(lossMask, bi.dtype);
    const firstCol = (x: Tensor) => g.slice(x, [0], [1], [1]); // [B, 1]
    // Targets: the next token at each position; the last position's (any valid id) is masked out.
    const targets = reshapeTo(g, shiftLeft(g, bi.ids, firstCol(bi.ids), shape), [-1], [bi.N]);
    const counted = shiftLeft(g, mask, g.mul(firstCol(mask), 0), shape);
    const flatCounted = reshapeTo(g, counted, [-1], [bi.N]);
    let rl: RowLogps;
    let spread: (perRow: Tensor) => Tensor; // per head row → `[B, T]` at the rows' positions, masked
    if (opts.dense) {
      // Every position through the head: no data-dependent ops, which WebGPU cannot run on the device.
      rl = rowLogps(g, model, model.hidden, targets, bi.N as string, head);
      spread = (perRow) => g.mul(reshapeRt(g, perRow, bi.shapeBT, shape), counted);
    } else {
      // Only the counted positions: NonZero lists them, ScatterND puts their values back.
      const scored = g.not(g.equal(flatCounted, 0)); // [N]
      const M = 'scored';
      const rowsIdx = reshapeTo(g, g.op('NonZero', [scored], {}, [{ dtype: 'int64', shape: [1, M] }])[0], [-1], [M]);
      rl = headRows(g, model, rowsIdx, g.gather(targets, rowsIdx, 0), M, head, opts.headChunks);
      // Back to [N]: slot 0 holds a zero for unscored positions, a scored one reads its rank 1..M.
      const ranks = g.range(1, g.add(g.squeeze(g.shapeOf(rowsIdx), [0]), 1), 1); // [M]: 1..M
      const slot = g.scatterND(g.cast(g.mul(flatCounted, 0), 'int64'), g.unsqueeze(rowsIdx, [1]), ranks); // [N]
      spread = (perRow) => {
        const padded = g.concat([g.constant([0], bi.dtype, [1]), perRow], 0); // [M + 1]
        return g.mul(reshapeRt(g, g.gather(padded, slot, 0), bi.shapeBT, shape), counted);
      };
    }
    const weighted = spread(rl.lp); // [B, T]
    const out: SequenceLogps = { logp: g.reduceSum(weighted, [1], false), tokens: g.reduceSum(counted, [1], false) };
    if (rl.meanLogit && rl.entropy) {
      out.logitSum = g.reduceSum(spread(rl.meanLogit), [1], false);
      out.entropySum = g.reduceSum(spread(rl.entropy), [1], false);
    }
    if (opts.perToken) {
      // From the predicting position t − 1 to the token's own position t.
      const atOwn = (x: Tensor) => g.op('Concat', [g.mul(firstCol(x), 0), g.slice(x, [0], [-1], [1])], { axis: { kind: 'int', value: 1 } }, [{ dtype: bi.dtype, shape }])[0];
      out.tokenLogps = atOwn(weighted);
      if (rl.entropy) out.tokenEntropies = atOwn(spread(rl.entropy));
    }
    return out;
  });
}

/**
 * `[M]` log p(target[m] | hidden row h[m]) for hidden rows `h [M, D]`: the head over those rows only, the target
 * logit from gathered head rows, and the log-sum-exp with the row max held constant (module comment).
 */
/**
 * How the head's rows are scored: the monitoring statistics (none, without gradient, or with the
 * entropy differentiable: 'grad'), and a `[V]` bias added to every row's logits.
 */
interface Head {
  stats: boolean | 'grad';
  bias?: Tensor;
}

/**
 * The `[V]` bias that leaves ids ≥ `limit` out of the distribution (−1e9: their exp is 0 in float32),
 * for graphs that must score the distribution a sampler restricted to the tokenizer's vocabulary drew
 * from (embeddings padded past it have rows of their own); none when the limit covers every id.
 */
function vocabBias(g: Graph, model: CausalLM, limit: number | undefined): Tensor | undefined {
  const V = model.config.vocab_size;
  if (limit === undefined || limit >= V) return undefined;
  return g.constant(Array.from({ length: V }, (_, v) => (v < limit ? 0 : -1e9)), model.batch.dtype, [V]);
}

interface RowLogps {
  lp: Tensor;
  meanLogit?: Tensor;
  entropy?: Tensor;
}

/** The head over the hidden rows `index`: gathered, then `rowLogps`, in `chunks` slices when more than one. */
function headRows(g: Graph, model: CausalLM, index: Tensor, target: Tensor, M: string, head: Head = { stats: false }, chunks = 1): RowLogps {
  if (chunks <= 1) return rowLogps(g, model, g.gather(model.hidden, index, 0), target, M, head);
  return chunkedRowLogps(g, model, index, target, chunks, head);
}

/**
 * The same in `chunks` slices of the rows, each in its own scope `head.k` so that recomputation
 * (src/autodiff/recompute.ts) treats it as a segment: one slice's `[M/chunks, V]` logits are alive
 * at a time, in the forward and in the backward, instead of all M rows' (2.5 GB for 4,096 rows of
 * Qwen's 151,936-token vocabulary). The target logit h·W[target] is taken once over all M rows,
 * outside the slices: inside them, each slice's gathered head rows would send the backward a
 * `[V, D]` scatter of its own (545 MB at Qwen2.5-0.5B's shape, one per slice).
 */
function chunkedRowLogps(g: Graph, model: CausalLM, index: Tensor, target: Tensor, chunks: number, head: Head): RowLogps {
  const rows = g.dim(index, 0); // [1]
  const picked = targetLogits(g, model, g.gather(model.hidden, index, 0), target);
  const parts: RowLse[] = [];
  const lps: Tensor[] = [];
  for (let k = 0; k < chunks; k++) {
    // Rows ⌊k·M/K⌋ … ⌊(k+1)·M/K⌋.
    const at = (j: number) => g.div(g.mul(rows, g.ints([j])), g.ints([chunks]));
    const take = (x: Tensor) => g.op('Slice', [x, at(k), at(k + 1), g.ints([0])], {}, [{ dtype: x.dtype, shape: [`scored_${k}`] }])[0];
    const hk = g.gather(model.hidden, take(index), 0); // [M_k, D], outside the segment: its checkpoint
    const r = g.scope(`head.${k}`, () => rowLse(g, model, hk, `scored_${k}`, head));
    parts.push(r);
    // Outside the segment too: the Concat's gradient reads its inputs' shapes, and a shape read of a
    // segment's own tensor would be the segment's first backward reader, recomputing every slice at once.
    lps.push(g.sub(take(picked), r.lse));
  }
  const cat = (xs: Tensor[]) => g.op('Concat', xs, { axis: { kind: 'int', value: 0 } }, [{ dtype: xs[0].dtype, shape: ['scored'] }])[0];
  const out: RowLogps = { lp: cat(lps) };
  if (head.stats) {
    out.meanLogit = cat(parts.map((p) => p.meanLogit!));
    out.entropy = cat(parts.map((p) => p.entropy!));
  }
  return out;
}

/** `[M]` target logits h·W[target] from the gathered head rows (gradient `[M, D]`-sized, module comment). */
function targetLogits(g: Graph, model: CausalLM, h: Tensor, target: Tensor): Tensor {
  const rows = g.gather(model.headWeight, target, 0); // [M, D]
  return g.reduceSum(g.mul(h, rows), [1], false); // [M]
}

interface RowLse {
  lse: Tensor;
  meanLogit?: Tensor;
  entropy?: Tensor;
}

/** `[M]` logsumexp of the logits of hidden rows `h [M, D]`, the row max held constant (module comment); with `stats`, the monitoring values. */
function rowLse(g: Graph, model: CausalLM, h: Tensor, M: string, head: Head = { stats: false }): RowLse {
  const stats = head.stats;
  const logits = head.bias ? g.add(lmHead(g, h, model.headWeight), head.bias) : lmHead(g, h, model.headWeight); // [M, V]
  const m = g.stopGradient(g.reduceMax(logits, [1], true)); // [M, 1]
  const e = g.exp(g.sub(logits, m)); // [M, V]
  const z = g.reduceSum(e, [1], false); // [M]
  const lse = g.add(reshapeTo(g, m, [-1], [M]), g.log(z));
  if (!stats) return { lse };
  // H = lse − Σ_v p_v·x_v with p = e / z, reusing e (two more [M, V] passes); monitoring only unless
  // 'grad', where the same expression is left differentiable (m held constant is exact here too:
  // both lse and p are invariant to it), so dH/dx_v = −p_v·(x_v − Σ_u p_u·x_u) reaches the weights.
  const x = g.stopGradient(logits);
  const entropy = stats === 'grad'
    ? g.sub(lse, g.div(g.reduceSum(g.mul(e, logits), [1], false), z))
    : g.sub(g.stopGradient(lse), g.div(g.reduceSum(g.mul(g.stopGradient(e), x), [1], false), g.stopGradient(z)));
  const meanLogit = g.reduceMean(x, [1], false);
  // lse + 0, the 0 computed from both statistics (s < s is false, even for NaN): the runtime then
  // takes them as it takes lse, while the logits are still alive, instead of at the very end when the
  // metrics are collected, which would keep every slice's [M, V] logits alive until then.
  const s = g.add(g.reduceSum(meanLogit, undefined, false), g.reduceSum(entropy, undefined, false));
  return { lse: g.add(lse, g.cast(g.less(s, s), lse.dtype)), meanLogit, entropy };
}

function rowLogps(g: Graph, model: CausalLM, h: Tensor, target: Tensor, M: string, head: Head = { stats: false }): RowLogps {
  const picked = targetLogits(g, model, h, target);
  const r = rowLse(g, model, h, M, head);
  return { lp: g.sub(picked, r.lse), meanLogit: r.meanLogit, entropy: r.entropy };
}

/**
 * Sequence log-probs of a packed batch (src/models/batch.ts): the scored positions are listed
 * (`scoreIndex [M]` into the flattened rows, `scoreTarget [M]` the predicted token) and
 * `scoreSelect [S, M]` (0/1) sums them into the S sequences. Same results as `sequenceLogps` on the
 * unpacked sequences.
 */
export function scoredLogps(g: Graph, model: CausalLM, scoreIndex: Tensor, scoreTarget: Tensor, scoreSelect: Tensor, opts: { stats?: boolean; headChunks?: number } = {}): SequenceLogps {
  return g.scope('logps', () => {
    const rl = headRows(g, model, scoreIndex, scoreTarget, 'scored', { stats: !!opts.stats }, opts.headChunks);
    const perSeq = (x: Tensor) => g.squeeze(g.matmul(scoreSelect, g.unsqueeze(x, [1])), [1]); // [S]
    const out: SequenceLogps = { logp: perSeq(rl.lp), tokens: g.reduceSum(scoreSelect, [1], false) };
    if (rl.meanLogit && rl.entropy) {
      const sel = g.stopGradient(scoreSelect);
      out.logitSum = g.squeeze(g.matmul(sel, g.unsqueeze(rl.meanLogit, [1])), [1]);
      out.entropySum = g.squeeze(g.matmul(sel, g.unsqueeze(rl.entropy, [1])), [1]);
    }
    return out;
  });
}

export interface LogpsGraphOptions extends CausalLMOptions {
  dtype?: FloatDType;
  /** Bake these weights in as initializers; otherwise every parameter is a graph input. */
  weights?: Map<string, FloatTensor>;
  perToken?: boolean;
  /**
   * Run the head over every position rather than only the counted ones: no data-dependent ops
   * (NonZero, ScatterND), which the WebGPU provider cannot run on the device. Same values.
   */
  dense?: boolean;
  /** Slices of the head over the counted rows (default `headChunksOf(config)`; 1: all rows at once). Same values to float rounding. */
  headChunks?: number;
}

/**
 * A self-contained scoring graph: inputs `input_ids`, `attention_mask` (int64 `[batch, seq]`) and
 * `loss_mask` (float `[batch, seq]`) → outputs `logp`, `tokens` (and `token_logps`).
 */
export function buildLogpsGraph(config: ModelConfig, opts: LogpsGraphOptions = {}): Graph {
  const g = new Graph('prefzoo_logps');
  const dtype = opts.dtype ?? 'float32';
  const inputIds = g.input('input_ids', 'int64', ['batch', 'seq']);
  const attentionMask = g.input('attention_mask', 'int64', ['batch', 'seq']);
  const lossMask = g.input('loss_mask', dtype, ['batch', 'seq']);
  const params = opts.weights
    ? parameterInitializers(g, opts.weights, modelParameterShapes(config, { lora: opts.lora }).keys())
    : declareParameters(g, config, { dtype, lora: opts.lora });
  const model = buildCausalLM(g, config, params, { inputIds, attentionMask }, { lora: opts.lora, ...(opts.chunking ? { chunking: opts.chunking } : {}) });
  const r = sequenceLogps(g, model, lossMask, { perToken: opts.perToken, dense: opts.dense, headChunks: opts.headChunks ?? headChunksOf(config) });
  g.output(r.logp, 'logp');
  g.output(r.tokens, 'tokens');
  if (r.tokenLogps) g.output(r.tokenLogps, 'token_logps');
  return g;
}
