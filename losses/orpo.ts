/**
 * ORPO — "ORPO: Monolithic Preference Optimization without Reference Model" (2024).
 *
 *   a(y) = logp(y)/n(y)  (mean token log-prob),  odds(y) = e^a / (1 − e^a)
 *   L = −a(w) − λ·log σ(log odds(w) − log odds(l)),  log odds = a − log(1 − eᵃ)
 *
 * reference-free. log(1 − eᵃ) is computed without cancellation near a = 0; a is clamped to
 * ≤ −1e-12 so a response of probability 1 keeps finite odds. `lambda` is TRL's `beta`.
 */
import type { Graph, Tensor } from '../src/onnx/graph.ts';
import { pairwiseLoss } from './core/pairwise.ts';
import { log1mexp as log1mexpT, logSigmoid as logSigmoidT } from './core/ops.ts';
import { log1mexp, logSigmoid, sigmoid } from './core/math.ts';
import type { Params } from './core/types.ts';

export interface OrpoParams extends Params {
  lambda: number;
}

/** Upper clamp of the mean log-prob (probability 1 would give infinite odds). */
export const ORPO_MAX_MEAN_LOGP = -1e-12;

const clampRef = (a: number) => Math.min(a, ORPO_MAX_MEAN_LOGP);

function logOddsGraph(g: Graph, a: Tensor): Tensor {
  const c = g.where(g.less(a, ORPO_MAX_MEAN_LOGP), a, ORPO_MAX_MEAN_LOGP);
  return g.sub(c, log1mexpT(g, c));
}

export const orpo = pairwiseLoss<OrpoParams>({
  name: 'orpo',
  paper: 'ORPO: Monolithic Preference Optimization without Reference Model',
  params: [{ name: 'lambda', type: 'number', default: 0.1, min: 0, doc: 'weight λ of the odds-ratio term', aliases: ['beta'] }],
  options: [],
  keys: () => ['policy_chosen_logps', 'policy_rejected_logps', 'chosen_tokens', 'rejected_tokens'],
  ref(h, p) {
    const lam = p.lambda;
    const value = new Float64Array(h.B);
    const dw = new Float64Array(h.B);
    const dl = new Float64Array(h.B);
    const chosen = new Float64Array(h.B);
    const rejected = new Float64Array(h.B);
    for (let i = 0; i < h.B; i++) {
      const aw = h.pw[i] / h.nw[i];
      const al = h.pl[i] / h.nl[i];
      const cw = clampRef(aw);
      const cl = clampRef(al);
      const lo = cw - log1mexp(cw) - (cl - log1mexp(cl));
      value[i] = -aw - lam * logSigmoid(lo);
      // d(log odds)/da = 1/(1 − eᵃ) = −1/expm1(a); zero where the clamp is active.
      const sw = aw < ORPO_MAX_MEAN_LOGP ? -1 / Math.expm1(cw) : 0;
      const sl = al < ORPO_MAX_MEAN_LOGP ? -1 / Math.expm1(cl) : 0;
      const dlo = -lam * sigmoid(-lo);
      dw[i] = (-1 + dlo * sw) / h.nw[i];
      dl[i] = (-dlo * sl) / h.nl[i];
      chosen[i] = lam * aw;
      rejected[i] = lam * al;
    }
    return { value, dw, dl, rewards: { chosen, rejected } };
  },
  emit(t, p) {
    const g = t.g;
    const aw = g.div(t.pw, t.nw);
    const al = g.div(t.pl, t.nl);
    const lo = g.sub(logOddsGraph(g, aw), logOddsGraph(g, al));
    const per = g.sub(g.neg(aw), g.mul(logSigmoidT(g, lo), p.lambda));
    return { perExample: per, rewards: { chosen: g.mul(aw, p.lambda), rejected: g.mul(al, p.lambda) } };
  },
});
