/**
 * BCO (pairwise) — "Binary Classifier Optimization for Large Language Model Alignment" (2024).
 *
 *   L = −log σ(βu_w) − log σ(−βu_l)
 *
 * each response classified on its own (chosen → reward > 0, rejected → reward < 0). The paper's
 * running-mean reward shift δ is trainer state; here δ = 0, as TRL's pairwise variant does.
 */
import { spec } from './params.ts';
import { pairwiseLoss } from './pairwise.ts';
import { negLogSigmoid } from './ops.ts';
import { sigmoid, softplus } from './math.ts';
import type { Params } from './types.ts';

export interface BcoParams extends Params {
  beta: number;
  f_divergence: string;
  f_alpha: number;
  wpo: boolean;
  rpo_alpha: number;
}

export const bcoPair = pairwiseLoss<BcoParams>({
  name: 'bco_pair',
  paper: 'Binary Classifier Optimization for Large Language Model Alignment',
  params: [spec.beta()],
  options: ['f_divergence', 'wpo', 'rpo_alpha'],
  ref(h, p) {
    const b = p.beta;
    const value = new Float64Array(h.B);
    const dw = new Float64Array(h.B);
    const dl = new Float64Array(h.B);
    for (let i = 0; i < h.B; i++) {
      const x = b * h.uw[i];
      const y = b * h.ul[i];
      value[i] = softplus(-x) + softplus(y);
      dw[i] = -b * h.duw[i] * sigmoid(-x);
      dl[i] = b * h.dul[i] * sigmoid(y);
    }
    return { value, dw, dl };
  },
  emit(t, p) {
    const g = t.g;
    const x = g.mul(t.uw, p.beta);
    const y = g.mul(t.ul, p.beta);
    return { perExample: g.add(negLogSigmoid(g, x), negLogSigmoid(g, g.neg(y))) };
  },
});
