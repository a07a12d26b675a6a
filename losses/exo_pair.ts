/**
 * EXO (pairwise) — "Towards Efficient Exact Optimization of Language Model Alignment" (2024), Eq. 16.
 *
 * KL(p_θ ‖ p_rh) over the pair {w, l}, with p_θ = softmax of the implicit rewards and p_rh =
 * (1−ε, ε) the smoothed label:
 *
 *   L = σ(z)(log σ(z) − log(1−ε)) + σ(−z)(log σ(−z) − log ε),  z = βh
 *
 * ε must be > 0 (the paper recommends 1e-3, the default).
 */
import { spec } from './core/params.ts';
import { marginRef, pairwiseLoss, type PairOptions } from './core/pairwise.ts';
import { logSigmoid as logSigmoidT, sigmoid as sigmoidT } from './core/ops.ts';
import { logSigmoid, sigmoid } from './core/math.ts';

export interface ExoParams extends PairOptions {
  beta: number;
  label_smoothing: number;
}

export const exoPair = pairwiseLoss<ExoParams>({
  name: 'exo_pair',
  paper: 'Towards Efficient Exact Optimization of Language Model Alignment',
  params: [
    spec.beta(),
    {
      name: 'label_smoothing', type: 'number', default: 1e-3, min: 0, max: 1, minOpen: true, maxOpen: true,
      doc: 'ε of the smoothed preference label (1−ε, ε)',
    },
  ],
  options: ['f_divergence', 'wpo', 'rpo_alpha'],
  ref(h, p) {
    const b = p.beta;
    const e = p.label_smoothing;
    const lw = Math.log1p(-e);
    const ll = Math.log(e);
    return marginRef(
      h.B,
      (i) => b * (h.uw[i] - h.ul[i]),
      // d/dz: σ(z)σ(−z)·(z − log((1−ε)/ε)), since log σ(z) − log σ(−z) = z.
      (z) => [
        sigmoid(z) * (logSigmoid(z) - lw) + sigmoid(-z) * (logSigmoid(-z) - ll),
        sigmoid(z) * sigmoid(-z) * (z - (lw - ll)),
      ],
      (i) => b * h.duw[i],
      (i) => -b * h.dul[i],
    );
  },
  emit(t, p) {
    const g = t.g;
    const e = p.label_smoothing;
    const z = g.mul(g.sub(t.uw, t.ul), p.beta);
    const nz = g.neg(z);
    const win = g.mul(sigmoidT(g, z), g.sub(logSigmoidT(g, z), Math.log1p(-e)));
    const lose = g.mul(sigmoidT(g, nz), g.sub(logSigmoidT(g, nz), Math.log(e)));
    return { perExample: g.add(win, lose) };
  },
});
