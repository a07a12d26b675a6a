/**
 * AOT — "Distributional Preference Alignment of LLMs via Optimal Transport" (2024).
 *
 * First-order stochastic dominance of the chosen reward distribution over the rejected one,
 * enforced on the sorted batch (the 1-D optimal transport plan matches order statistics):
 *
 *   aot:          Δ_k = sort(logp(w) − logp(l))_k − sort(ref(w) − ref(l))_k
 *   aot_unpaired: Δ_k = sort(ℓ(w))_k − sort(ℓ(l))_k
 *   L_k = −(1−ε) log σ(βΔ_k) − ε log σ(−βΔ_k)
 *
 * The k-th value belongs to the k-th order statistic, not to row k, so rows cannot carry weights.
 * Sorting is ascending, ties broken by row index; the permutation is a constant for the gradient.
 */
import type { Graph, Tensor } from '../src/onnx/graph.ts';
import { spec } from './core/params.ts';
import { logisticGraph, logisticRef, pairwiseLoss, type PairCoreRef } from './core/pairwise.ts';
import type { Params } from './core/types.ts';

export interface AotParams extends Params {
  beta: number;
  label_smoothing: number;
}

/** Row indices in ascending order of x (ties by index). */
export function argsortAsc(x: ArrayLike<number>): number[] {
  return Array.from({ length: x.length }, (_, i) => i).sort((i, j) => x[i] - x[j] || i - j);
}

/**
 * Ascending sort of x [B] in the graph: a permutation matrix P[k, i] = [rank_i = k] from pairwise
 * comparisons (rank_i = #{j : x_j < x_i or (x_j = x_i and j < i)}), then P·x. P is a constant to
 * autodiff, so the gradient is routed back through the permutation.
 */
export function sortAscGraph(g: Graph, x: Tensor): Tensor {
  return g.scope('sort', () => {
    const xs = g.stopGradient(x);
    const n = g.cast(g.reshape(g.dim(x, 0), []), x.dtype);
    const idx = g.range(0, n, 1, x.dtype);
    const xi = g.unsqueeze(xs, [1]);
    const xj = g.unsqueeze(xs, [0]);
    const before = g.or(g.less(xj, xi), g.and(g.equal(xj, xi), g.less(g.unsqueeze(idx, [0]), g.unsqueeze(idx, [1]))));
    const rank = g.reduceSum(g.cast(before, x.dtype), [1], false);
    const perm = g.cast(g.equal(g.unsqueeze(rank, [0]), g.unsqueeze(idx, [1])), x.dtype);
    return g.squeeze(g.matmul(perm, g.unsqueeze(x, [1])), [1]);
  });
}

function sortedRef(B: number, a: Float64Array, b: Float64Array, beta: number, eps: number): PairCoreRef {
  const oa = argsortAsc(a);
  const ob = argsortAsc(b);
  const value = new Float64Array(B);
  const dw = new Float64Array(B);
  const dl = new Float64Array(B);
  for (let k = 0; k < B; k++) {
    const [v, s] = logisticRef(beta * (a[oa[k]] - b[ob[k]]), eps);
    value[k] = v;
    // a and b are differences of the inputs; the callers map them back to policy log-probs.
    dw[oa[k]] += beta * s;
    dl[ob[k]] -= beta * s;
  }
  return { value, dw, dl };
}

const params = [spec.beta(), spec.labelSmoothing()];

export const aot = pairwiseLoss<AotParams>({
  name: 'aot',
  paper: 'Distributional Preference Alignment of LLMs via Optimal Transport',
  params,
  options: [],
  rowwise: false,
  ref(h, p) {
    const a = h.pw.map((x, i) => x - h.pl[i]);
    const r = h.key('ref_chosen_logps').map((x, i) => x - h.key('ref_rejected_logps')[i]);
    // Δ depends on the policy only through a = logp(w) − logp(l): ∂/∂logp(w) = ∂/∂a, ∂/∂logp(l) = −∂/∂a.
    const core = sortedRef(h.B, a, r, p.beta, p.label_smoothing);
    return { value: core.value, dw: core.dw, dl: core.dw.map((v) => -v) };
  },
  emit(t, p) {
    const g = t.g;
    const a = sortAscGraph(g, g.sub(t.pw, t.pl));
    const r = sortAscGraph(g, g.sub(t.key('ref_chosen_logps'), t.key('ref_rejected_logps')));
    return { perExample: logisticGraph(g, g.mul(g.sub(a, r), p.beta), p.label_smoothing) };
  },
});

export const aotUnpaired = pairwiseLoss<AotParams>({
  name: 'aot_unpaired',
  paper: 'Distributional Preference Alignment of LLMs via Optimal Transport',
  params,
  options: [],
  rowwise: false,
  ref(h, p) {
    return sortedRef(h.B, h.lw, h.ll, p.beta, p.label_smoothing);
  },
  emit(t, p) {
    const g = t.g;
    const d = g.sub(sortAscGraph(g, t.lw), sortAscGraph(g, t.ll));
    return { perExample: logisticGraph(g, g.mul(d, p.beta), p.label_smoothing) };
  },
});
