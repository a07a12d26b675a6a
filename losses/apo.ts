/**
 * APO — "Anchored Preference Optimization and Contrastive Revisions: Addressing Underspecification
 * in Alignment" (2024), Eqs. 7 and 8. Written on the log-ratios ℓ (as TRL does, no f-divergence).
 *
 *   apo_zero: L = (1 − σ(βℓ_w)) + σ(βℓ_l)      chosen better than the model: raise w, lower l
 *   apo_down: L = σ(βℓ_w) + (1 − σ(βh))        chosen worse than the model: lower both, l more
 */
import type { Graph, Tensor } from '../src/onnx/graph.ts';
import { spec } from './params.ts';
import { pairwiseLoss } from './pairwise.ts';
import { sigmoid as sigmoidT } from './ops.ts';
import { sigmoid } from './math.ts';
import type { Params } from './types.ts';

export interface ApoParams extends Params {
  beta: number;
  wpo: boolean;
  rpo_alpha: number;
}

/** σ′(x) = σ(x)σ(−x). */
const dsig = (x: number) => sigmoid(x) * sigmoid(-x);
const sig = (g: Graph, x: Tensor) => sigmoidT(g, x);

export const apoZero = pairwiseLoss<ApoParams>({
  name: 'apo_zero',
  paper: 'Anchored Preference Optimization and Contrastive Revisions: Addressing Underspecification in Alignment',
  params: [spec.beta()],
  options: ['wpo', 'rpo_alpha'],
  ref(h, p) {
    const b = p.beta;
    const value = new Float64Array(h.B);
    const dw = new Float64Array(h.B);
    const dl = new Float64Array(h.B);
    for (let i = 0; i < h.B; i++) {
      const x = b * h.lw[i];
      const y = b * h.ll[i];
      value[i] = sigmoid(-x) + sigmoid(y);
      dw[i] = -b * dsig(x);
      dl[i] = b * dsig(y);
    }
    return { value, dw, dl };
  },
  emit(t, p) {
    const g = t.g;
    return { perExample: g.add(sig(g, g.mul(t.lw, -p.beta)), sig(g, g.mul(t.ll, p.beta))) };
  },
});

export const apoDown = pairwiseLoss<ApoParams>({
  name: 'apo_down',
  paper: 'Anchored Preference Optimization and Contrastive Revisions: Addressing Underspecification in Alignment',
  params: [spec.beta()],
  options: ['wpo', 'rpo_alpha'],
  ref(h, p) {
    const b = p.beta;
    const value = new Float64Array(h.B);
    const dw = new Float64Array(h.B);
    const dl = new Float64Array(h.B);
    for (let i = 0; i < h.B; i++) {
      const x = b * h.lw[i];
      const z = b * (h.lw[i] - h.ll[i]);
      value[i] = sigmoid(x) + sigmoid(-z);
      dw[i] = b * dsig(x) - b * dsig(z);
      dl[i] = b * dsig(z);
    }
    return { value, dw, dl };
  },
  emit(t, p) {
    const g = t.g;
    const z = g.mul(g.sub(t.lw, t.ll), -p.beta);
    return { perExample: g.add(sig(g, g.mul(t.lw, p.beta)), sig(g, z)) };
  },
});
