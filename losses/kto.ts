/**
 * KTO — "KTO: Model Alignment as Prospect Theoretic Optimization" (2024).
 *
 * Single trajectories with labels (1 desirable, 0 undesirable). With z₀ the reference point, a
 * stop-gradient estimate of KL(π_θ ‖ π_ref):
 *
 *   desirable:   λ_D · (1 − σ(β(ℓ − z₀)))
 *   undesirable: λ_U · (1 − σ(β(z₀ − ℓ)))
 *
 * z₀ is the batch key `kl` when given, else max(0, mean(policy_kl_logps − ref_kl_logps)) over
 * mismatched (prompt, completion) pairs — the paper's batch estimate (as TRL computes it).
 */
import type { Graph, Tensor } from '../src/onnx/graph.ts';
import { col, rows } from './core/batch.ts';
import { spec } from './core/params.ts';
import { sigmoid as sigmoidT } from './core/ops.ts';
import { sigmoid } from './core/math.ts';
import type { BatchTensors, EmitResult, HostBatch, LossModule, Params, RefResult } from './core/types.ts';

export interface KtoParams extends Params {
  beta: number;
  desirable_weight: number;
  undesirable_weight: number;
}

/** The reference point z₀ of a batch (float64). */
export function ktoReferencePoint(batch: HostBatch): number {
  if (batch.kl) return batch.kl.data[0];
  const pk = col(batch, 'policy_kl_logps');
  const rk = col(batch, 'ref_kl_logps');
  if (pk.length !== rk.length) throw new Error('policy_kl_logps and ref_kl_logps differ in length');
  let s = 0;
  for (let i = 0; i < pk.length; i++) s += pk[i] - rk[i];
  return Math.max(0, s / pk.length);
}

function referencePointGraph(g: Graph, t: BatchTensors): Tensor {
  if (t.kl) return g.stopGradient(t.kl);
  const m = g.reduceMean(g.sub(t.policy_kl_logps, t.ref_kl_logps), undefined, false);
  return g.stopGradient(g.max(m, 0));
}

export const kto: LossModule<KtoParams> = {
  name: 'kto',
  paper: 'KTO: Model Alignment as Prospect Theoretic Optimization',
  kind: 'single',
  kinds: ['single'],
  params: [
    spec.beta(),
    { name: 'desirable_weight', type: 'number', default: 1, min: 0, minOpen: true, doc: 'λ_D, weight of desirable rows' },
    { name: 'undesirable_weight', type: 'number', default: 1, min: 0, minOpen: true, doc: 'λ_U, weight of undesirable rows' },
  ],
  rowwise: true,
  keys: () => ({
    required: ['policy_logps', 'ref_logps', 'labels'],
    optional: ['kl', 'policy_kl_logps', 'ref_kl_logps', 'weight'],
    oneOf: [['kl'], ['policy_kl_logps', 'ref_kl_logps']],
  }),
  grads: () => ['policy_logps'],
  ref(batch: HostBatch, p, coef): RefResult {
    const B = rows(batch);
    const lp = col(batch, 'policy_logps');
    const rf = col(batch, 'ref_logps');
    const y = col(batch, 'labels');
    const z0 = ktoReferencePoint(batch);
    const b = p.beta;
    const per: number[] = [];
    const d = new Float64Array(B);
    for (let i = 0; i < B; i++) {
      const x = b * (lp[i] - rf[i] - z0);
      const slope = b * sigmoid(x) * sigmoid(-x);
      if (y[i] > 0.5) {
        per.push(p.desirable_weight * sigmoid(-x));
        d[i] = -coef[i] * p.desirable_weight * slope;
      } else {
        per.push(p.undesirable_weight * sigmoid(x));
        d[i] = coef[i] * p.undesirable_weight * slope;
      }
    }
    return { perExample: per, grad: { policy_logps: d }, metrics: { kl: z0 } };
  },
  emit(g: Graph, t: BatchTensors, p): EmitResult {
    return g.scope('kto', () => {
      const z0 = referencePointGraph(g, t);
      const x = g.mul(g.sub(g.sub(t.policy_logps, t.ref_logps), z0), p.beta);
      const want = g.mul(sigmoidT(g, g.neg(x)), p.desirable_weight);
      const avoid = g.mul(sigmoidT(g, x), p.undesirable_weight);
      const per = g.where(g.greater(t.labels, 0.5), want, avoid);
      return { perExample: per, metrics: { kl: g.reduceMean(z0, undefined, false) } };
    });
  },
};
