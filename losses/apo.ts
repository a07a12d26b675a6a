/**
 * APO — "Anchored Preference Optimization and Contrastive Revisions: Addressing Underspecification
 * in Alignment" (2024), Eqs. 7 and 8. Written on the log-ratios ℓ (as TRL does, no f-divergence).
 *
 *   apo_zero: L = (1 − σ(βℓ_w)) + σ(βℓ_l)      chosen better than the model: raise w, lower l
 *   apo_down: L = σ(βℓ_w) + (1 − σ(βh))        chosen worse than the model: lower both, l more
 */
import type { Graph, Tensor } from '../src/onnx/graph.ts';
import { spec } from './core/params.ts';
import { pairwiseLoss, perPairRef } from './core/pairwise.ts';
import { sigmoid as sigmoidT } from './core/ops.ts';
import { sigmoid } from './core/math.ts';
import type { Params } from './core/types.ts';

export interface ApoParams extends Params {
  beta: number;
  wpo: boolean;
  rpo_alpha: number;
}

/** σ′(x) = σ(x)σ(−x). */
const dsig = (x: number) => sigmoid(x) * sigmoid(-x);
const sig = (g: Graph, x: Tensor) => sigmoidT(g, x);

/** What both variants share: the paper, β, and the options that apply (no f-divergence: written on ℓ). */
const APO = {
  paper: 'Anchored Preference Optimization and Contrastive Revisions: Addressing Underspecification in Alignment',
  params: [spec.beta()],
  options: ['wpo', 'rpo_alpha'] as const,
};

export const apoZero = pairwiseLoss<ApoParams>({
  name: 'apo_zero',
  ...APO,
  ref(h, p) {
    const b = p.beta;
    return perPairRef(h.B, (i) => {
      const x = b * h.lw[i];
      const y = b * h.ll[i];
      return [sigmoid(-x) + sigmoid(y), -b * dsig(x), b * dsig(y)];
    });
  },
  emit(t, p) {
    const g = t.g;
    return { perExample: g.add(sig(g, g.mul(t.lw, -p.beta)), sig(g, g.mul(t.ll, p.beta))) };
  },
});

export const apoDown = pairwiseLoss<ApoParams>({
  name: 'apo_down',
  ...APO,
  ref(h, p) {
    const b = p.beta;
    return perPairRef(h.B, (i) => {
      const x = b * h.lw[i];
      const z = b * (h.lw[i] - h.ll[i]);
      return [sigmoid(x) + sigmoid(-z), b * dsig(x) - b * dsig(z), b * dsig(z)];
    });
  },
  emit(t, p) {
    const g = t.g;
    const z = g.mul(g.sub(t.lw, t.ll), -p.beta);
    return { perExample: g.add(sig(g, g.mul(t.lw, p.beta)), sig(g, z)) };
  },
});
