/**
 * SPPO — "Self-Play Preference Optimization for Language Model Alignment" (2024), Eq. 4.7.
 *
 *   per response: (ℓ_t(y) − (1/β)(P̂(y ≻ π_t) − ½))²
 *
 * ℓ_t is the log-ratio against the previous iteration's policy π_t (its log-probs are the batch's
 * `ref_*` columns) and P̂ ∈ [0, 1] the estimated win-rate: `chosen_probs`/`rejected_probs` for
 * pairs (the pair's loss sums both responses), `win_probs` for lists (summed over the real entries).
 * η = 1/β; the default β = 0.001 is the paper's η = 1000.
 *
 * sppo_hard (TRL) sets P̂ = 1 for the chosen and 0 for the rejected response:
 *   (u_w − 1/(2β))² + (u_l + 1/(2β))²
 */
import type { Graph } from '../src/onnx/graph.ts';
import { spec } from './core/params.ts';
import { pairwiseLoss, PairGraph, PairHost } from './core/pairwise.ts';
import { pairMetrics, pairMetricsRef, tieTolGraph, tieTolRef } from './core/metrics.ts';
import { ListHost, listMask } from './core/list.ts';
import { square } from './core/ops.ts';
import type { BatchTensors, EmitResult, HostBatch, Kind, LossModule, Params, RefResult } from './core/types.ts';

export interface SppoParams extends Params {
  beta: number;
}

const PAPER = 'Self-Play Preference Optimization for Language Model Alignment';
const betaSpec = spec.beta(0.001, 'β = 1/η: the target log-ratio is (P̂ − ½)/β');
const PAIR_KEYS = ['policy_chosen_logps', 'policy_rejected_logps', 'ref_chosen_logps', 'ref_rejected_logps', 'chosen_probs', 'rejected_probs'];

export const sppo: LossModule<SppoParams> = {
  name: 'sppo',
  paper: PAPER,
  kind: 'pairwise',
  kinds: ['pairwise', 'listwise'],
  params: [betaSpec],
  rowwise: true,
  keys(_p, kind) {
    if (kind === 'listwise') return { required: ['policy_logps', 'ref_logps', 'win_probs'], optional: ['mask', 'weight'] };
    return { required: PAIR_KEYS, optional: ['weight'] };
  },
  grads(_p, kind) {
    return kind === 'listwise' ? ['policy_logps'] : ['policy_chosen_logps', 'policy_rejected_logps'];
  },
  ref(batch: HostBatch, p, coef, kind: Kind): RefResult {
    const b = p.beta;
    if (kind === 'listwise') {
      const h = new ListHost(batch);
      const l = h.logRatios();
      const P = h.key('win_probs');
      const per = new Array<number>(h.B).fill(0);
      const d = new Float64Array(h.B * h.K);
      for (let i = 0; i < h.B * h.K; i++) {
        const row = Math.floor(i / h.K);
        const e = (l[i] - (P[i] - 0.5) / b) * h.mask[i];
        per[row] += e * e;
        d[i] = 2 * e * coef[row];
      }
      return { perExample: per, grad: { policy_logps: d } };
    }
    const h = new PairHost(batch, p);
    const Pw = h.key('chosen_probs');
    const Pl = h.key('rejected_probs');
    const per: number[] = [];
    const dw = new Float64Array(h.B);
    const dl = new Float64Array(h.B);
    for (let i = 0; i < h.B; i++) {
      const ew = h.lw[i] - (Pw[i] - 0.5) / b;
      const el = h.ll[i] - (Pl[i] - 0.5) / b;
      per.push(ew * ew + el * el);
      dw[i] = 2 * ew * coef[i];
      dl[i] = 2 * el * coef[i];
    }
    const metrics = pairMetricsRef(h.lw.map((v) => b * v), h.ll.map((v) => b * v), h.pw, h.pl, tieTolRef(b, h.pw, h.key('ref_chosen_logps'), h.pl, h.key('ref_rejected_logps')));
    return { perExample: per, grad: { policy_chosen_logps: dw, policy_rejected_logps: dl }, metrics };
  },
  emit(g: Graph, inputs: BatchTensors, p, kind: Kind): EmitResult {
    return g.scope('sppo', () => {
      const b = p.beta;
      if (kind === 'listwise') {
        const l = g.sub(inputs.policy_logps, inputs.ref_logps);
        const e = g.mul(g.sub(l, g.mul(g.sub(inputs.win_probs, 0.5), 1 / b)), listMask(g, inputs));
        return { perExample: g.reduceSum(square(g, e), [1], false) };
      }
      const t = new PairGraph(g, inputs, p);
      const ew = g.sub(t.lw, g.mul(g.sub(t.key('chosen_probs'), 0.5), 1 / b));
      const el = g.sub(t.ll, g.mul(g.sub(t.key('rejected_probs'), 0.5), 1 / b));
      const metrics = pairMetrics(g, g.mul(t.lw, b), g.mul(t.ll, b), t.pw, t.pl, tieTolGraph(g, b, t.pw, t.key('ref_chosen_logps'), t.pl, t.key('ref_rejected_logps')));
      return { perExample: g.add(square(g, ew), square(g, el)), metrics };
    });
  },
};

export interface SppoHardParams extends Params {
  beta: number;
  f_divergence: string;
  f_alpha: number;
  wpo: boolean;
  rpo_alpha: number;
}

export const sppoHard = pairwiseLoss<SppoHardParams>({
  name: 'sppo_hard',
  paper: PAPER,
  params: [betaSpec],
  options: ['f_divergence', 'wpo', 'rpo_alpha'],
  ref(h, p) {
    const t = 0.5 / p.beta;
    return {
      value: h.uw.map((u, i) => (u - t) ** 2 + (h.ul[i] + t) ** 2),
      dw: h.uw.map((u, i) => 2 * (u - t) * h.duw[i]),
      dl: h.ul.map((u, i) => 2 * (u + t) * h.dul[i]),
    };
  },
  emit(t, p) {
    const g = t.g;
    const c = 0.5 / p.beta;
    return { perExample: g.add(square(g, g.sub(t.uw, c)), square(g, g.add(t.ul, c))) };
  },
});
