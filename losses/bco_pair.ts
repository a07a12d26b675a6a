/**
 * BCO (pairwise) — "Binary Classifier Optimization for Large Language Model Alignment" (2024).
 *
 *   L = −log σ(βu_w) − log σ(−βu_l)
 *
 * each response classified on its own (chosen → reward > 0, rejected → reward < 0). The paper's
 * running-mean reward shift δ is trainer state; here δ = 0, as TRL's pairwise variant does.
 */
import { spec } from './core/params.ts';
import { pairwiseLoss, responseScoresRef, type PairOptions } from './core/pairwise.ts';
import { negLogSigmoid } from './core/ops.ts';
import { sigmoid, softplus } from './core/math.ts';

export interface BcoParams extends PairOptions {
  beta: number;
}

export const bcoPair = pairwiseLoss<BcoParams>({
  name: 'bco_pair',
  paper: 'Binary Classifier Optimization for Large Language Model Alignment',
  params: [spec.beta()],
  options: ['f_divergence', 'wpo', 'rpo_alpha'],
  ref: (h, p) => responseScoresRef(h, p.beta, (x, y) => [softplus(-x) + softplus(y), -sigmoid(-x), sigmoid(y)]),
  emit(t, p) {
    const g = t.g;
    const x = g.mul(t.uw, p.beta);
    const y = g.mul(t.ul, p.beta);
    return { perExample: g.add(negLogSigmoid(g, x), negLogSigmoid(g, g.neg(y))) };
  },
});
