/**
 * Length-normalised DPO (TRL's `sigmoid_norm`; the length-normalised reward of "SimPO: Simple
 * Preference Optimization with a Reference-Free Reward", 2024, applied to DPO's log-ratios):
 *
 *   L = −log σ(β (ℓ(w)/n(w) − ℓ(l)/n(l)))
 */
import { spec } from './core/params.ts';
import { logisticRef, marginRef, pairwiseLoss, type PairOptions } from './core/pairwise.ts';
import { negLogSigmoid } from './core/ops.ts';

export interface SigmoidNormParams extends PairOptions {
  beta: number;
}

export const sigmoidNorm = pairwiseLoss<SigmoidNormParams>({
  name: 'sigmoid_norm',
  paper: 'SimPO: Simple Preference Optimization with a Reference-Free Reward (length-normalised reward, on DPO log-ratios)',
  params: [spec.beta()],
  options: ['f_divergence', 'wpo', 'rpo_alpha'],
  keys: () => ['policy_chosen_logps', 'policy_rejected_logps', 'ref_chosen_logps', 'ref_rejected_logps', 'chosen_tokens', 'rejected_tokens'],
  ref(h, p) {
    const b = p.beta;
    return marginRef(
      h.B,
      (i) => b * (h.uw[i] / h.nw[i] - h.ul[i] / h.nl[i]),
      (z) => logisticRef(z, 0),
      (i) => (b * h.duw[i]) / h.nw[i],
      (i) => (-b * h.dul[i]) / h.nl[i],
    );
  },
  emit(t, p) {
    const g = t.g;
    return { perExample: negLogSigmoid(g, g.mul(g.sub(g.div(t.uw, t.nw), g.div(t.ul, t.nl)), p.beta)) };
  },
});
