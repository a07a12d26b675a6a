/**
 * SimPO — "SimPO: Simple Preference Optimization with a Reference-Free Reward" (2024).
 *
 *   L = −log σ(β·logp(w)/n(w) − β·logp(l)/n(l) − γ)
 *
 * reference-free: the reward is the length-normalised policy log-prob, γ a target margin. Defaults
 * β = 2, γ = 1 (γ/β = 0.5 as in the paper's released configurations). Label smoothing ε as in DPO.
 */
import { spec } from './core/params.ts';
import { logisticGraph, logisticRef, marginRef, pairwiseLoss } from './core/pairwise.ts';
import type { Params } from './core/types.ts';

export interface SimpoParams extends Params {
  beta: number;
  gamma: number;
  label_smoothing: number;
  wpo: boolean;
  rpo_alpha: number;
}

const KEYS = ['policy_chosen_logps', 'policy_rejected_logps', 'chosen_tokens', 'rejected_tokens'];

export const simpo = pairwiseLoss<SimpoParams>({
  name: 'simpo',
  paper: 'SimPO: Simple Preference Optimization with a Reference-Free Reward',
  params: [
    spec.beta(2, 'scale β of the length-normalised reward β·logp(y)/n(y)'),
    { name: 'gamma', type: 'number', default: 1, min: 0, doc: 'target reward margin γ' },
    spec.labelSmoothing(),
  ],
  options: ['wpo', 'rpo_alpha'],
  keys: () => KEYS,
  ref(h, p) {
    const b = p.beta;
    const core = marginRef(
      h.B,
      (i) => b * (h.pw[i] / h.nw[i] - h.pl[i] / h.nl[i]) - p.gamma,
      (z) => logisticRef(z, p.label_smoothing),
      (i) => b / h.nw[i],
      (i) => -b / h.nl[i],
    );
    return { ...core, rewards: { chosen: h.pw.map((x, i) => (b * x) / h.nw[i]), rejected: h.pl.map((x, i) => (b * x) / h.nl[i]) } };
  },
  emit(t, p) {
    const g = t.g;
    const rc = g.mul(g.div(t.pw, t.nw), p.beta);
    const rr = g.mul(g.div(t.pl, t.nl), p.beta);
    return { perExample: logisticGraph(g, g.sub(g.sub(rc, rr), p.gamma), p.label_smoothing), rewards: { chosen: rc, rejected: rr } };
  },
});
