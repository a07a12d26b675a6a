/**
 * NCA (pairwise) — "Noise Contrastive Alignment of Language Models with Explicit Rewards" (2024).
 *
 *   L = −log σ(βu_w) − ½ log σ(−βu_w) − ½ log σ(−βu_l)
 *
 * (absolute rewards: pushes the chosen reward up, not only the margin).
 */
import { spec } from './core/params.ts';
import { pairwiseLoss, responseScoresRef, type PairOptions } from './core/pairwise.ts';
import { negLogSigmoid } from './core/ops.ts';
import { sigmoid, softplus } from './core/math.ts';

export interface NcaParams extends PairOptions {
  beta: number;
}

export const ncaPair = pairwiseLoss<NcaParams>({
  name: 'nca_pair',
  paper: 'Noise Contrastive Alignment of Language Models with Explicit Rewards',
  params: [spec.beta()],
  options: ['f_divergence', 'wpo', 'rpo_alpha'],
  ref: (h, p) => responseScoresRef(h, p.beta, (x, y) => [softplus(-x) + 0.5 * softplus(x) + 0.5 * softplus(y), -sigmoid(-x) + 0.5 * sigmoid(x), 0.5 * sigmoid(y)]),
  emit(t, p) {
    const g = t.g;
    const x = g.mul(t.uw, p.beta);
    const y = g.mul(t.ul, p.beta);
    const half = g.mul(g.add(negLogSigmoid(g, g.neg(x)), negLogSigmoid(g, g.neg(y))), 0.5);
    return { perExample: g.add(negLogSigmoid(g, x), half) };
  },
});
