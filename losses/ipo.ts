/**
 * IPO — "A General Theoretical Paradigm to Understand Learning from Human Preferences" (2023).
 *
 *   L = (h̄ − 1/(2β))²,  h̄ = ℓ(w)/n(w) − ℓ(l)/n(l)   (length_normalize, the default)
 *                        h̄ = ℓ(w) − ℓ(l)              (length_normalize=false)
 *
 * β is the paper's τ. Length normalisation follows TRL, which confirmed it with the IPO authors: the
 * paper's results use per-token log-ratios. The loss is minimised at h̄ = 1/(2β).
 */
import { spec } from './core/params.ts';
import { marginRef, pairwiseLoss, type PairOptions } from './core/pairwise.ts';
import { square } from './core/ops.ts';

export interface IpoParams extends PairOptions {
  beta: number;
  length_normalize: boolean;
}

export const ipo = pairwiseLoss<IpoParams>({
  name: 'ipo',
  paper: 'A General Theoretical Paradigm to Understand Learning from Human Preferences',
  params: [
    spec.beta(0.1, 'regularisation τ of IPO: the target margin is 1/(2β)'),
    { name: 'length_normalize', type: 'boolean', default: true, doc: 'use per-token log-ratios ℓ(y)/n(y)' },
  ],
  options: ['f_divergence', 'wpo', 'rpo_alpha'],
  keys: (p) => [
    'policy_chosen_logps', 'policy_rejected_logps', 'ref_chosen_logps', 'ref_rejected_logps',
    ...(p.length_normalize ? ['chosen_tokens', 'rejected_tokens'] : []),
  ],
  ref(h, p) {
    const target = 1 / (2 * p.beta);
    const nw = (i: number) => (p.length_normalize ? h.nw[i] : 1);
    const nl = (i: number) => (p.length_normalize ? h.nl[i] : 1);
    return marginRef(
      h.B,
      (i) => h.uw[i] / nw(i) - h.ul[i] / nl(i),
      (m) => [(m - target) ** 2, 2 * (m - target)],
      (i) => h.duw[i] / nw(i),
      (i) => -h.dul[i] / nl(i),
    );
  },
  emit(t, p) {
    const g = t.g;
    const m = p.length_normalize ? g.sub(g.div(t.uw, t.nw), g.div(t.ul, t.nl)) : g.sub(t.uw, t.ul);
    return { perExample: square(g, g.sub(m, 1 / (2 * p.beta))) };
  },
});
