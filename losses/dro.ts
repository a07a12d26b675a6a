/**
 * DRO — "Offline Regularised Reinforcement Learning for Large Language Models Alignment" (2024).
 *
 * Single trajectories (x, y, r) with a learned value V(x) (a value head on the prompt's last hidden
 * state; the batch carries its outputs as `values`). Per row, with ℓ = logp − ref:
 *
 *   policy part: −(r − V)·logp + (τ/2)·ℓ²      (V stop-gradient)
 *   value part:  ½ (r − V − τℓ)²               (ℓ stop-gradient)
 *
 * Together they have the gradients of ½(r − V − τℓ)² (the policy's up to the paper's 1/τ rescaling):
 * ∂/∂logp = −(r − V) + τℓ, ∂/∂V = −(r − V − τℓ). The row's loss is the sum of both parts.
 */
import type { Graph } from '../src/onnx/graph.ts';
import { col, rows } from './core/batch.ts';
import { mean, square } from './core/ops.ts';
import type { BatchTensors, EmitResult, HostBatch, LossModule, Params, RefResult } from './core/types.ts';

export interface DroParams extends Params {
  tau: number;
}

export const dro: LossModule<DroParams> = {
  name: 'dro',
  paper: 'Offline Regularised Reinforcement Learning for Large Language Models Alignment',
  kind: 'single',
  kinds: ['single'],
  params: [{ name: 'tau', type: 'number', default: 1, min: 0, minOpen: true, doc: 'KL regularisation τ' }],
  rowwise: true,
  keys: () => ({ required: ['policy_logps', 'ref_logps', 'rewards', 'values'], optional: ['weight'] }),
  grads: () => ['policy_logps', 'values'],
  ref(batch: HostBatch, p, coef): RefResult {
    const B = rows(batch);
    const [lp, rf, r, V] = ['policy_logps', 'ref_logps', 'rewards', 'values'].map((k) => col(batch, k));
    const tau = p.tau;
    const per: number[] = [];
    const dp = new Float64Array(B);
    const dv = new Float64Array(B);
    let pol = 0;
    let val = 0;
    for (let i = 0; i < B; i++) {
      const l = lp[i] - rf[i];
      const a = -(r[i] - V[i]) * lp[i] + (tau / 2) * l * l;
      const e = r[i] - V[i] - tau * l;
      per.push(a + 0.5 * e * e);
      pol += a / B;
      val += (0.5 * e * e) / B;
      dp[i] = coef[i] * (-(r[i] - V[i]) + tau * l);
      dv[i] = coef[i] * -e;
    }
    return { perExample: per, grad: { policy_logps: dp, values: dv }, metrics: { 'loss/policy': pol, 'loss/value': val } };
  },
  emit(g: Graph, t: BatchTensors, p): EmitResult {
    return g.scope('dro', () => {
      const l = g.sub(t.policy_logps, t.ref_logps);
      const adv = g.sub(t.rewards, g.stopGradient(t.values));
      const policy = g.add(g.neg(g.mul(adv, t.policy_logps)), g.mul(square(g, l), p.tau / 2));
      const value = g.mul(square(g, g.sub(g.sub(t.rewards, t.values), g.mul(g.stopGradient(l), p.tau))), 0.5);
      return { perExample: g.add(policy, value), metrics: { 'loss/policy': mean(g, policy), 'loss/value': mean(g, value) } };
    });
  },
};
