/**
 * The metrics every pairwise loss reports, under the names the best-known peer (TRL) logs, so
 * dashboards work unchanged: means over the batch of the implicit rewards and policy log-probs.
 */
import type { Graph, Tensor } from '../../src/onnx/graph.ts';
import { mean } from './ops.ts';

export const PAIR_METRICS = [
  'rewards/chosen', 'rewards/rejected', 'rewards/accuracies', 'rewards/margins', 'logps/chosen', 'logps/rejected',
] as const;

const avg = (xs: ArrayLike<number>) => Array.from(xs).reduce((a, b) => a + b, 0) / xs.length;

/** Float64 metrics; accuracy counts ties as wrong. Log-prob metrics only for the columns given. */
export function pairMetricsRef(
  rc: ArrayLike<number>, rr: ArrayLike<number>, pw?: ArrayLike<number>, pl?: ArrayLike<number>,
): Record<string, number> {
  const out: Record<string, number> = {
    'rewards/chosen': avg(rc),
    'rewards/rejected': avg(rr),
    'rewards/accuracies': avg(Array.from(rc, (c, i) => (c > rr[i] ? 1 : 0))),
    'rewards/margins': avg(Array.from(rc, (c, i) => c - rr[i])),
  };
  if (pw) out['logps/chosen'] = avg(pw);
  if (pl) out['logps/rejected'] = avg(pl);
  return out;
}

/** The same metrics as scalar graph tensors (not differentiated: only `loss` is). */
export function pairMetrics(g: Graph, rc: Tensor, rr: Tensor, pw?: Tensor, pl?: Tensor): Record<string, Tensor> {
  return g.scope('metrics', () => {
    const c = g.stopGradient(rc);
    const r = g.stopGradient(rr);
    const out: Record<string, Tensor> = {
      'rewards/chosen': mean(g, c),
      'rewards/rejected': mean(g, r),
      'rewards/accuracies': mean(g, g.cast(g.greater(c, r), c.dtype)),
      'rewards/margins': mean(g, g.sub(c, r)),
    };
    if (pw) out['logps/chosen'] = mean(g, g.stopGradient(pw));
    if (pl) out['logps/rejected'] = mean(g, g.stopGradient(pl));
    return out;
  });
}
