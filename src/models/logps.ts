/**
 * Per-sequence log-probabilities: logp[b] = Σ_t loss_mask[b,t] · log p(ids[b,t] | ids[b,<t]) and
 * tokens[b] = the number of positions counted. Position 0 has no prediction, so loss_mask[b,0] is
 * ignored. log p = (target logit) − logsumexp(logits), arranged for cheap gradients: the target
 * logit is h·W[target] from gathered head rows (its gradient is `[N, D]`-sized, not a scatter into an
 * `[N, V]` zero tensor), and logsumexp is m + log Σ exp(x − m) with the row max m held constant (its
 * gradient through m is exactly zero), so the backward pass reuses exp(x − m) and costs two `[N, V]`
 * passes. A second softmax over the vocabulary is never formed.
 */
import { Graph, type Tensor } from '../onnx/graph.ts';
import type { ModelConfig } from './config.ts';
import { type CausalLM, type CausalLMOptions, buildCausalLM } from './index.ts';
import { type FloatDType, reshapeRt, reshapeTo } from './layers.ts';
import { declareParameters, modelParameterShapes, parameterInitializers } from './params.ts';
import type { FloatTensor } from './checkpoint.ts';

export interface SequenceLogps {
  /** `[B]` summed log-probabilities of the tokens with loss_mask = 1. */
  logp: Tensor;
  /** `[B]` how many tokens were counted. */
  tokens: Tensor;
  /** `[B, T]` log p(ids[t] | ids[<t]) · loss_mask[t] at each token's own position (0 at t = 0). */
  tokenLogps?: Tensor;
}

/** Large enough for any Slice end. */
const END = 2 ** 40;

/** Shifts `[B, T]` one step left along the sequence (x[:, t+1] at t), filling the last column from `fill`. */
function shiftLeft(g: Graph, x: Tensor, fill: Tensor, shape: (string | number)[]): Tensor {
  return g.op('Concat', [g.slice(x, [1], [END], [1]), fill], { axis: { kind: 'int', value: 1 } }, [{ dtype: x.dtype, shape }])[0];
}

/** Log-probabilities of the tokens of a built model under `lossMask [B, T]` (float, int or bool). */
export function sequenceLogps(g: Graph, model: CausalLM, lossMask: Tensor, opts: { perToken?: boolean } = {}): SequenceLogps {
  const bi = model.batch;
  const logits = model.logits();
  return g.scope('logps', () => {
    const shape = [bi.B, bi.T];
    const mask = lossMask.dtype === bi.dtype ? lossMask : g.cast(lossMask, bi.dtype);
    const firstCol = (x: Tensor) => g.slice(x, [0], [1], [1]); // [B, 1]
    // Targets: the next token at each position; the last position's (any valid id) is masked out.
    const targets = shiftLeft(g, bi.ids, firstCol(bi.ids), shape);
    const counted = shiftLeft(g, mask, g.mul(firstCol(mask), 0), shape);
    const rows = g.gather(model.headWeight, reshapeTo(g, targets, [-1], [bi.N]), 0); // [N, D]
    const picked = g.reduceSum(g.mul(model.hidden, rows), [1], true); // [N, 1]
    const m = g.stopGradient(g.reduceMax(logits, [1], true)); // [N, 1]
    const lse = g.add(m, g.log(g.reduceSum(g.exp(g.sub(logits, m)), [1], true)));
    const lp = g.sub(picked, lse); // [N, 1]
    const weighted = g.mul(reshapeRt(g, lp, bi.shapeBT, shape), counted); // [B, T]
    const out: SequenceLogps = { logp: g.reduceSum(weighted, [1], false), tokens: g.reduceSum(counted, [1], false) };
    if (opts.perToken) {
      const zeros = g.mul(firstCol(weighted), 0);
      const body = g.slice(weighted, [0], [-1], [1]);
      out.tokenLogps = g.op('Concat', [zeros, body], { axis: { kind: 'int', value: 1 } }, [{ dtype: bi.dtype, shape }])[0];
    }
    return out;
  });
}

export interface LogpsGraphOptions extends CausalLMOptions {
  dtype?: FloatDType;
  /** Bake these weights in as initializers; otherwise every parameter is a graph input. */
  weights?: Map<string, FloatTensor>;
  perToken?: boolean;
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
  const model = buildCausalLM(g, config, params, { inputIds, attentionMask }, { lora: opts.lora });
  const r = sequenceLogps(g, model, lossMask, { perToken: opts.perToken });
  g.output(r.logp, 'logp');
  g.output(r.tokens, 'tokens');
  if (r.tokenLogps) g.output(r.tokenLogps, 'token_logps');
  return g;
}
