/**
 * Bradley–Terry — the reward-model loss of "Training language models to follow instructions with
 * human feedback" (Ouyang et al. 2022), on the scalar rewards a value head gives the two responses
 * of a preference pair:
 *
 *   L = −log σ(r_w − r_l)
 *
 * ∂L/∂r_w = −σ(r_l − r_w), ∂L/∂r_l = σ(r_l − r_w). Metrics: `accuracy` (share of pairs with
 * r_w > r_l; ties count as wrong), `margin` (mean r_w − r_l), `rewards/chosen`, `rewards/rejected`.
 * `prefzoo reward-train` trains with it (src/online/reward-model.ts).
 */
import type { Graph } from '../src/onnx/graph.ts';
import { col, rows } from './core/batch.ts';
import { logSigmoid, sigmoid } from './core/math.ts';
import { mean, negLogSigmoid } from './core/ops.ts';
import type { BatchTensors, EmitResult, HostBatch, LossModule, Params, RefResult } from './core/types.ts';

export const bradleyTerry: LossModule<Params> = {
  name: 'bradley_terry',
  paper: 'Training language models to follow instructions with human feedback',
  kind: 'reward_pairs',
  kinds: ['reward_pairs'],
  params: [],
  rowwise: true,
  keys: () => ({ required: ['chosen_rewards', 'rejected_rewards'], optional: ['weight'] }),
  grads: () => ['chosen_rewards', 'rejected_rewards'],
  ref(batch: HostBatch, _p, coef): RefResult {
    const B = rows(batch);
    const rw = col(batch, 'chosen_rewards');
    const rl = col(batch, 'rejected_rewards');
    const per: number[] = [];
    const dw = new Float64Array(B);
    const dl = new Float64Array(B);
    let acc = 0;
    let margin = 0;
    let chosen = 0;
    let rejected = 0;
    for (let i = 0; i < B; i++) {
      const m = rw[i] - rl[i];
      per.push(-logSigmoid(m));
      const s = sigmoid(-m);
      dw[i] = -coef[i] * s;
      dl[i] = coef[i] * s;
      acc += (m > 0 ? 1 : 0) / B;
      margin += m / B;
      chosen += rw[i] / B;
      rejected += rl[i] / B;
    }
    return { perExample: per, grad: { chosen_rewards: dw, rejected_rewards: dl }, metrics: { accuracy: acc, margin, 'rewards/chosen': chosen, 'rewards/rejected': rejected } };
  },
  emit(g: Graph, t: BatchTensors): EmitResult {
    return g.scope('bradley_terry', () => {
      const margin = g.sub(t.chosen_rewards, t.rejected_rewards);
      const m = g.stopGradient(margin);
      return {
        perExample: negLogSigmoid(g, margin),
        metrics: {
          accuracy: mean(g, g.cast(g.greater(m, 0), m.dtype)),
          margin: mean(g, m),
          'rewards/chosen': mean(g, g.stopGradient(t.chosen_rewards)),
          'rewards/rejected': mean(g, g.stopGradient(t.rejected_rewards)),
        },
      };
    });
  },
};
