/**
 * The metrics every pairwise loss reports, under the names the best-known peer (TRL) logs, so
 * dashboards work unchanged: means over the batch of the implicit rewards and policy log-probs.
 *
 * Ties (one rule everywhere: train metrics, `eval`, the demo): a pair counts as correct only when
 * r̂(chosen) − r̂(rejected) exceeds a tie tolerance, so ties count as wrong, as in TRL. For rewards
 * built on log-ratios against a reference, the tolerance is float32 rounding of the log-probs,
 * TIE_RTOL·β·(|π_c| + |ref_c| + |π_r| + |ref_r|): the cached reference and the training graph compute
 * the same numbers by different kernels, and with policy = reference every pair must be a tie
 * (accuracy 0 at step 1), not a coin flip of rounding noise.
 */
import type { Graph, Tensor } from '../../src/onnx/graph.ts';
import { mean } from './ops.ts';

export const PAIR_METRICS = [
  'rewards/chosen', 'rewards/rejected', 'rewards/accuracies', 'rewards/margins', 'logps/chosen', 'logps/rejected',
] as const;

const avg = (xs: ArrayLike<number>) => Array.from(xs).reduce((a, b) => a + b, 0) / xs.length;

/** Relative size of a reward margin that float32 rounding of the log-probs can produce (about 8 ulps). */
export const TIE_RTOL = 1e-6;

/** Per-pair tie tolerance of log-ratio rewards β·(π − ref): TIE_RTOL·β·(|π_c| + |ref_c| + |π_r| + |ref_r|). */
export function tieTolRef(beta: number, pw: ArrayLike<number>, rw: ArrayLike<number>, pl: ArrayLike<number>, rl: ArrayLike<number>): Float64Array {
  return Float64Array.from(pw, (_, i) => TIE_RTOL * Math.abs(beta) * (Math.abs(pw[i]) + Math.abs(rw[i]) + Math.abs(pl[i]) + Math.abs(rl[i])));
}

export function tieTolGraph(g: Graph, beta: number, pw: Tensor, rw: Tensor, pl: Tensor, rl: Tensor): Tensor {
  const sum = g.add(g.add(g.abs(pw), g.abs(rw)), g.add(g.abs(pl), g.abs(rl)));
  return g.mul(g.stopGradient(sum), TIE_RTOL * Math.abs(beta));
}

/** Float64 metrics; accuracy counts ties (|margin| ≤ tol, default exact equality) as wrong. Log-prob metrics only for the columns given. */
export function pairMetricsRef(
  rc: ArrayLike<number>, rr: ArrayLike<number>, pw?: ArrayLike<number>, pl?: ArrayLike<number>, tol?: ArrayLike<number>,
): Record<string, number> {
  const out: Record<string, number> = {
    'rewards/chosen': avg(rc),
    'rewards/rejected': avg(rr),
    'rewards/accuracies': avg(Array.from(rc, (c, i) => (c - rr[i] > (tol ? tol[i] : 0) ? 1 : 0))),
    'rewards/margins': avg(Array.from(rc, (c, i) => c - rr[i])),
  };
  if (pw) out['logps/chosen'] = avg(pw);
  if (pl) out['logps/rejected'] = avg(pl);
  return out;
}

/** The same metrics as scalar graph tensors (not differentiated: only `loss` is). */
export function pairMetrics(g: Graph, rc: Tensor, rr: Tensor, pw?: Tensor, pl?: Tensor, tol?: Tensor): Record<string, Tensor> {
  return g.scope('metrics', () => {
    const c = g.stopGradient(rc);
    const r = g.stopGradient(rr);
    const out: Record<string, Tensor> = {
      'rewards/chosen': mean(g, c),
      'rewards/rejected': mean(g, r),
      'rewards/accuracies': mean(g, g.cast(tol ? g.greater(g.sub(c, r), tol) : g.greater(c, r), c.dtype)),
      'rewards/margins': mean(g, g.sub(c, r)),
    };
    if (pw) out['logps/chosen'] = mean(g, g.stopGradient(pw));
    if (pl) out['logps/rejected'] = mean(g, g.stopGradient(pl));
    return out;
  });
}
