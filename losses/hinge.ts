/**
 * Hinge (SLiC) — "SLiC-HF: Sequence Likelihood Calibration with Human Feedback" (2023).
 *
 *   L = relu(1 − βh)   (β plays the role of 1/δ, the inverse margin)
 */
import { spec } from './core/params.ts';
import { marginRef, pairwiseLoss, type PairOptions } from './core/pairwise.ts';

export interface HingeParams extends PairOptions {
  beta: number;
}

export const hinge = pairwiseLoss<HingeParams>({
  name: 'hinge',
  paper: 'SLiC-HF: Sequence Likelihood Calibration with Human Feedback',
  params: [spec.beta()],
  options: ['f_divergence', 'wpo', 'rpo_alpha'],
  ref(h, p) {
    const b = p.beta;
    return marginRef(h.B, (i) => b * (h.uw[i] - h.ul[i]), (z) => (z < 1 ? [1 - z, -1] : [0, 0]), (i) => b * h.duw[i], (i) => -b * h.dul[i]);
  },
  emit(t, p) {
    const g = t.g;
    return { perExample: g.relu(g.sub(1, g.mul(g.sub(t.uw, t.ul), p.beta))) };
  },
});
