/**
 * Nash-MD — "Nash Learning from Human Feedback" (2023).
 *
 * On-policy pairs: y ~ π_θ, y′ from the geometric mixture softmax((1−m)·logits_θ + m·logits_ref),
 * with P = P(y ≻ y′) from a preference model. Per row:
 *
 *   L = β·KL̂ − (P − ½)·logp(y),  KL̂ = stopgrad(ℓ(y))·logp(y)
 *
 * (a REINFORCE estimate of KL(π_θ ‖ π_ref)): ∂L/∂logp = βℓ − (P − ½). `mixture_coef` m is read by
 * the generator of y′ (the online loop), not by the loss.
 */
import type { Graph } from '../src/onnx/graph.ts';
import { col, rows } from './core/batch.ts';
import { spec } from './core/params.ts';
import { mean } from './core/ops.ts';
import type { BatchTensors, EmitResult, HostBatch, LossModule, Params, RefResult } from './core/types.ts';

export interface NashMdParams extends Params {
  beta: number;
  mixture_coef: number;
}

export const nashMd: LossModule<NashMdParams> = {
  name: 'nash_md',
  paper: 'Nash Learning from Human Feedback',
  kind: 'nash_md',
  kinds: ['nash_md'],
  params: [
    spec.beta(0.1, 'weight β of the KL(π_θ ‖ π_ref) penalty'),
    { name: 'mixture_coef', type: 'number', default: 0.5, min: 0, max: 1, doc: 'mixture m of the opponent policy (used by generation)' },
  ],
  rowwise: true,
  keys: () => ({ required: ['policy_logps', 'ref_logps', 'probs'], optional: ['weight'] }),
  grads: () => ['policy_logps'],
  ref(batch: HostBatch, p, coef): RefResult {
    const B = rows(batch);
    const lp = col(batch, 'policy_logps');
    const rf = col(batch, 'ref_logps');
    const P = col(batch, 'probs');
    const per: number[] = [];
    const d = new Float64Array(B);
    let kl = 0;
    for (let i = 0; i < B; i++) {
      const l = lp[i] - rf[i];
      per.push(p.beta * l * lp[i] - (P[i] - 0.5) * lp[i]);
      d[i] = coef[i] * (p.beta * l - (P[i] - 0.5));
      kl += l / B;
    }
    return { perExample: per, grad: { policy_logps: d }, metrics: { 'objective/kl': kl } };
  },
  emit(g: Graph, t: BatchTensors, p): EmitResult {
    return g.scope('nash_md', () => {
      const l = g.sub(t.policy_logps, t.ref_logps);
      const kl = g.mul(g.stopGradient(l), t.policy_logps);
      const per = g.sub(g.mul(kl, p.beta), g.mul(g.sub(t.probs, 0.5), t.policy_logps));
      return { perExample: per, metrics: { 'objective/kl': mean(g, g.stopGradient(l)) } };
    });
  },
};
