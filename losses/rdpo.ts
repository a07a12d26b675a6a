/**
 * rDPO — "Provably Robust DPO: Aligning Language Models with Noisy Feedback" (2024).
 *
 *   L = [(1−ε)(−log σ(βh)) − ε(−log σ(−βh))] / (1 − 2ε)
 *
 * an unbiased estimate of the clean DPO loss when each label is flipped with probability ε (it can
 * be negative). ε = 0 is DPO.
 */
import { spec } from './core/params.ts';
import { marginRef, pairwiseLoss, type PairOptions } from './core/pairwise.ts';
import { negLogSigmoid } from './core/ops.ts';
import { sigmoid, softplus } from './core/math.ts';

export interface RdpoParams extends PairOptions {
  beta: number;
  epsilon: number;
}

export const rdpo = pairwiseLoss<RdpoParams>({
  name: 'rdpo',
  paper: 'Provably Robust DPO: Aligning Language Models with Noisy Feedback',
  params: [
    spec.beta(),
    {
      name: 'epsilon', type: 'number', default: 0.1, min: 0, max: 0.5, maxOpen: true, aliases: ['label_smoothing'],
      doc: 'label flip rate ε the loss is unbiased under',
    },
  ],
  options: ['f_divergence', 'wpo', 'rpo_alpha'],
  ref(h, p) {
    const b = p.beta;
    const e = p.epsilon;
    const k = 1 / (1 - 2 * e);
    return marginRef(
      h.B,
      (i) => b * (h.uw[i] - h.ul[i]),
      (z) => [k * ((1 - e) * softplus(-z) - e * softplus(z)), k * (-(1 - e) * sigmoid(-z) - e * sigmoid(z))],
      (i) => b * h.duw[i],
      (i) => -b * h.dul[i],
    );
  },
  emit(t, p) {
    const g = t.g;
    const e = p.epsilon;
    const z = g.mul(g.sub(t.uw, t.ul), p.beta);
    const clean = g.mul(negLogSigmoid(g, z), 1 - e);
    const flipped = g.mul(negLogSigmoid(g, g.neg(z)), e);
    return { perExample: g.mul(g.sub(clean, flipped), 1 / (1 - 2 * e)) };
  },
});
