/**
 * DiscoPOP (log-ratio modulated loss) — "Discovering Preference Optimization Algorithms with and for
 * Large Language Models" (2024), Eq. 5.
 *
 *   z = βh,  m = σ(z/τ),  L = (1 − m)·(−log σ(z)) + m·e^(−z)
 *
 * computed as σ(−z/τ)·softplus(−z) + exp(−z − softplus(−z/τ)), which stays finite for any z when
 * τ ≤ 1 (e^(−z)·σ(z/τ) → 0 as z → −∞), hence τ ∈ (0, 1]; the paper's τ is 0.05.
 */
import { spec } from './core/params.ts';
import { marginRef, pairwiseLoss, type PairOptions } from './core/pairwise.ts';
import { sigmoid as sigmoidT, softplus as softplusT } from './core/ops.ts';
import { sigmoid, softplus } from './core/math.ts';

export interface DiscopopParams extends PairOptions {
  beta: number;
  tau: number;
}

export const discopop = pairwiseLoss<DiscopopParams>({
  name: 'discopop',
  paper: 'Discovering Preference Optimization Algorithms with and for Large Language Models',
  params: [
    spec.beta(),
    { name: 'tau', type: 'number', default: 0.05, min: 0, max: 1, minOpen: true, doc: 'temperature τ of the modulation σ(βh/τ)', aliases: ['discopop_tau'] },
  ],
  options: ['f_divergence', 'wpo', 'rpo_alpha'],
  ref(h, p) {
    const b = p.beta;
    const tau = p.tau;
    return marginRef(
      h.B,
      (i) => b * (h.uw[i] - h.ul[i]),
      (z) => {
        const keep = sigmoid(-z / tau); // 1 − m
        const expo = Math.exp(-z - softplus(-z / tau)); // e^(−z)·m
        const value = keep * softplus(-z) + expo;
        const slope = -sigmoid(-z) * keep - (softplus(-z) * sigmoid(z / tau) * keep) / tau + expo * (-1 + keep / tau);
        return [value, slope];
      },
      (i) => b * h.duw[i],
      (i) => -b * h.dul[i],
    );
  },
  emit(t, p) {
    const g = t.g;
    const z = g.mul(g.sub(t.uw, t.ul), p.beta);
    const zt = g.mul(z, -1 / p.tau);
    const logistic = g.mul(sigmoidT(g, zt), softplusT(g, g.neg(z)));
    const expo = g.exp(g.sub(g.neg(z), softplusT(g, zt)));
    return { perExample: g.add(logistic, expo) };
  },
});
