/**
 * LiPO — "LiPO: Listwise Preference Optimization through Learning-to-Rank" (2024).
 *
 * Each list holds K responses with labels ψ (`scores`, higher is better) and scores s_i = β ℓ(y_i).
 *
 *   lambda (LiPO-λ): Σ_{ψ_i > ψ_j} Δ_ij · (−log σ(s_i − s_j)),
 *                    Δ_ij = |G_i − G_j| · |1/D(τ_i) − 1/D(τ_j)|,  G = 2^ψ − 1,  D(τ) = log2(1 + τ),
 *                    τ_i = 1-based rank of i by s descending (ties: lower index first); Δ is a
 *                    constant (no gradient through the ranks)
 *   pair_logistic:   Δ_ij = 1 (with K = 2 this is DPO)
 *   pair_hinge:      Σ_{ψ_i > ψ_j} max(0, 1 − (s_i − s_j))
 *   list_mle:        −log Plackett–Luce(order by ψ descending, ties by index) = Σ_k [−s_π(k) + log Σ_{m ≥ k} e^{s_π(m)}]
 *   softmax:         ListNet cross-entropy −Σ_i softmax(ψ)_i · log softmax(s)_i
 *
 * Padded entries (`mask` 0) take part in nothing; a list's loss is a sum over its pairs/entries.
 */
import type { Graph, Tensor } from '../src/onnx/graph.ts';
import { spec } from './core/params.ts';
import { ListHost, listMask } from './core/list.ts';
import { isSet, logSumExpMasked, negLogSigmoid, toFloat } from './core/ops.ts';
import { logSumExp, sigmoid, softmax, softplus } from './core/math.ts';
import type { BatchTensors, EmitResult, HostBatch, LossModule, Params, RefResult } from './core/types.ts';

export const LIPO_VARIANTS = ['lambda', 'pair_logistic', 'pair_hinge', 'list_mle', 'softmax'] as const;

export interface LipoParams extends Params {
  beta: number;
  variant: string;
}

/** 1-based ranks of the entries `idx` by s descending, ties by lower index first. */
export function ranksDesc(s: ArrayLike<number>, idx: readonly number[]): Map<number, number> {
  const order = [...idx].sort((a, b) => s[b] - s[a] || a - b);
  return new Map(order.map((j, r) => [j, r + 1]));
}

/** Per-list loss and its derivative w.r.t. the scores s of that list. */
function listRef(s: number[], psi: number[], idx: number[], variant: string): [number, Map<number, number>] {
  const ds = new Map<number, number>(idx.map((j) => [j, 0]));
  const add = (j: number, v: number) => ds.set(j, ds.get(j)! + v);
  let value = 0;
  if (variant === 'list_mle') {
    const order = [...idx].sort((a, b) => psi[b] - psi[a] || a - b);
    for (let k = 0; k < order.length; k++) {
      const rest = order.slice(k);
      const lse = logSumExp(rest.map((j) => s[j]));
      value += lse - s[order[k]];
      add(order[k], -1);
      for (const j of rest) add(j, Math.exp(s[j] - lse));
    }
    return [value, ds];
  }
  if (variant === 'softmax') {
    const q = softmax(idx.map((j) => psi[j]));
    const p = softmax(idx.map((j) => s[j]));
    const lse = logSumExp(idx.map((j) => s[j]));
    idx.forEach((j, a) => {
      value += -q[a] * (s[j] - lse);
      add(j, p[a] - q[a]);
    });
    return [value, ds];
  }
  const tau = ranksDesc(s, idx);
  const G = (j: number) => 2 ** psi[j] - 1;
  const invD = (j: number) => 1 / Math.log2(1 + tau.get(j)!);
  for (const i of idx) {
    for (const j of idx) {
      if (!(psi[i] > psi[j])) continue;
      const d = s[i] - s[j];
      if (variant === 'pair_hinge') {
        if (1 - d > 0) {
          value += 1 - d;
          add(i, -1);
          add(j, 1);
        }
        continue;
      }
      const w = variant === 'lambda' ? Math.abs(G(i) - G(j)) * Math.abs(invD(i) - invD(j)) : 1;
      value += w * softplus(-d);
      const slope = -w * sigmoid(-d);
      add(i, slope);
      add(j, -slope);
    }
  }
  return [value, ds];
}

/** Pairwise view [B, K, K] of x [B, K]: entry (i, j) along axes (1, 2). */
const rowsOf = (g: Graph, x: Tensor) => g.unsqueeze(x, [2]);
const colsOf = (g: Graph, x: Tensor) => g.unsqueeze(x, [1]);

/** Δ_ij of LiPO-λ as a constant [B, K, K] tensor. */
function lambdaWeights(g: Graph, s: Tensor, psi: Tensor, mask: Tensor): Tensor {
  return g.scope('lambda_weights', () => {
    const ss = g.stopGradient(s);
    const K = g.cast(g.reshape(g.dim(s, 1), []), s.dtype);
    const idx = g.range(0, K, 1, s.dtype);
    const jBeforeI = g.less(g.unsqueeze(idx, [0, 1]), g.unsqueeze(idx, [0, 2]));
    const si = rowsOf(g, ss);
    const sj = colsOf(g, ss);
    const ahead = g.or(g.greater(sj, si), g.and(g.equal(sj, si), jBeforeI));
    const tau = g.add(g.reduceSum(g.mul(toFloat(g, ahead, s), colsOf(g, mask)), [2], false), 1);
    const invD = g.div(Math.LN2, g.log(g.add(tau, 1)));
    const G = g.sub(g.exp(g.mul(psi, Math.LN2)), 1);
    const dG = g.abs(g.sub(rowsOf(g, G), colsOf(g, G)));
    const dD = g.abs(g.sub(rowsOf(g, invD), colsOf(g, invD)));
    return g.stopGradient(g.mul(dG, dD));
  });
}

export const lipo: LossModule<LipoParams> = {
  name: 'lipo',
  paper: 'LiPO: Listwise Preference Optimization through Learning-to-Rank',
  kind: 'listwise',
  kinds: ['listwise'],
  params: [
    spec.beta(0.1, 'β of the scores s = β·ℓ'),
    { name: 'variant', type: 'enum', default: 'lambda', choices: LIPO_VARIANTS, doc: 'ranking objective' },
  ],
  rowwise: true,
  keys: () => ({ required: ['policy_logps', 'ref_logps', 'scores'], optional: ['mask', 'weight'] }),
  grads: () => ['policy_logps'],
  ref(batch: HostBatch, p, coef): RefResult {
    const h = new ListHost(batch);
    const l = h.logRatios();
    const psiAll = h.key('scores');
    const per: number[] = [];
    const grad = new Float64Array(h.B * h.K);
    for (let b = 0; b < h.B; b++) {
      const s = Array.from({ length: h.K }, (_, j) => p.beta * l[b * h.K + j]);
      const psi = Array.from({ length: h.K }, (_, j) => psiAll[b * h.K + j]);
      const [v, ds] = listRef(s, psi, h.valid(b), p.variant);
      per.push(v);
      for (const [j, d] of ds) grad[b * h.K + j] = coef[b] * p.beta * d;
    }
    return { perExample: per, grad: { policy_logps: grad } };
  },
  emit(g: Graph, inputs: BatchTensors, p): EmitResult {
    return g.scope('lipo', () => {
      const mask = listMask(g, inputs);
      const s = g.mul(g.sub(inputs.policy_logps, inputs.ref_logps), p.beta);
      // Padded labels may hold anything: zero them so 2^ψ and softmax(ψ) stay finite.
      const psi = g.where(isSet(g, mask), inputs.scores, 0);
      const both = g.mul(rowsOf(g, mask), colsOf(g, mask));
      if (p.variant === 'softmax') {
        const q = g.mul(g.exp(g.sub(psi, g.unsqueeze(logSumExpMasked(g, psi, mask, 1), [1]))), mask);
        const lse = logSumExpMasked(g, s, mask, 1);
        const cross = g.reduceSum(g.mul(q, s), [1], false);
        return { perExample: g.sub(g.mul(lse, g.reduceSum(q, [1], false)), cross) };
      }
      if (p.variant === 'list_mle') {
        // Entry j is in the Plackett–Luce suffix of i when it comes at or after i in label order.
        const K = g.cast(g.reshape(g.dim(s, 1), []), s.dtype);
        const idx = g.range(0, K, 1, s.dtype);
        const jAtOrAfterI = g.greaterOrEqual(g.unsqueeze(idx, [0, 1]), g.unsqueeze(idx, [0, 2]));
        const pi = rowsOf(g, psi);
        const pj = colsOf(g, psi);
        const suffix = g.or(g.less(pj, pi), g.and(g.equal(pj, pi), jAtOrAfterI));
        const sets = g.mul(toFloat(g, suffix, s), both);
        const lse = logSumExpMasked(g, colsOf(g, s), sets, 2);
        return { perExample: g.reduceSum(g.mul(g.sub(lse, s), mask), [1], false) };
      }
      const d = g.sub(rowsOf(g, s), colsOf(g, s));
      const pairs = g.mul(toFloat(g, g.greater(rowsOf(g, psi), colsOf(g, psi)), s), both);
      const term = p.variant === 'pair_hinge' ? g.relu(g.sub(1, d)) : negLogSigmoid(g, d);
      const w = p.variant === 'lambda' ? g.mul(pairs, lambdaWeights(g, s, psi, mask)) : pairs;
      return { perExample: g.reduceSum(g.mul(term, w), [1, 2], false) };
    });
  },
};
