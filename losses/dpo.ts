/**
 * DPO — "Direct Preference Optimization: Your Language Model is Secretly a Reward Model" (2023).
 *
 *   L = −log σ(β h),  h = ℓ(w) − ℓ(l),  ℓ = logp − ref
 *
 * With label smoothing ε (conservative DPO, cDPO — "A Note on DPO with Noisy Preferences &
 * Relationship to IPO", 2023): L = −(1−ε) log σ(βh) − ε log σ(−βh), i.e. the expected loss when a
 * label is flipped with probability ε.
 */
import { spec } from './core/params.ts';
import { logisticGraph, logisticRef, marginRef, pairwiseLoss, type PairOptions } from './core/pairwise.ts';

export interface DpoParams extends PairOptions {
  beta: number;
  label_smoothing: number;
}

export const dpo = pairwiseLoss<DpoParams>({
  name: 'dpo',
  paper: 'Direct Preference Optimization: Your Language Model is Secretly a Reward Model',
  params: [spec.beta(), spec.labelSmoothing()],
  options: ['f_divergence', 'wpo', 'rpo_alpha'],
  ref(h, p) {
    const b = p.beta;
    return marginRef(h.B, (i) => b * (h.uw[i] - h.ul[i]), (z) => logisticRef(z, p.label_smoothing), (i) => b * h.duw[i], (i) => -b * h.dul[i]);
  },
  emit(t, p) {
    const g = t.g;
    return { perExample: logisticGraph(g, g.mul(g.sub(t.uw, t.ul), p.beta), p.label_smoothing) };
  },
});
