/**
 * MPO — "Mixed Preference Optimization: Reinforcement Learning with Data Selection and Better
 * Reference Model" (2024).
 *
 * Not a new per-pair formula but a two-stage schedule over a reward-scored dataset:
 *   split: easy = pairs with |s_w − s_l| ≥ δ, hard = the rest (`mpoSplit`, here);
 *   stage 1: DPO from π_ref on the easy pairs;
 *   stage 2: `stage2_loss` (DPO by default) on the hard pairs, with the stage-1 model as reference.
 * The stages are orchestrated by the trainer; this module is the per-step loss of a stage (DPO with
 * β and ε, and RPO's NLL term when `rpo_alpha` > 0), the split, and the parameters the trainer reads
 * (`delta`, `delta_quantile`, `stage2_loss`).
 */
import { UserError } from '../src/errors.ts';
import { spec } from './core/params.ts';
import { logisticGraph, logisticRef, marginRef, pairwiseLoss } from './core/pairwise.ts';
import type { Params } from './core/types.ts';

export interface MpoParams extends Params {
  beta: number;
  label_smoothing: number;
  delta: number | null;
  delta_quantile: number;
  stage2_loss: string;
  rpo_alpha: number;
}

/** Pairwise losses stage 2 may use (kept equal to the registry's pairwise losses by a test). */
export const MPO_STAGE2_LOSSES = [
  'dpo', 'ipo', 'rdpo', 'hinge', 'exo_pair', 'nca_pair', 'bco_pair', 'sppo', 'sppo_hard', 'aot', 'aot_unpaired',
  'apo_zero', 'apo_down', 'discopop', 'sigmoid_norm', 'sft', 'simpo', 'orpo', 'mpo',
] as const;

/** The q-quantile of values, linear between order statistics (numpy's default). */
export function quantile(values: readonly number[], q: number): number {
  if (values.length === 0) throw new UserError('quantile of an empty set of margins');
  if (!(q >= 0 && q <= 1)) throw new UserError(`delta_quantile must be in [0, 1], got ${q}`);
  const s = [...values].sort((a, b) => a - b);
  const pos = q * (s.length - 1);
  const lo = Math.floor(pos);
  const hi = Math.ceil(pos);
  return s[lo] + (pos - lo) * (s[hi] - s[lo]);
}

export interface MpoSplit {
  /** The threshold used (given, or the quantile of the margins). */
  delta: number;
  /** Row indices with |s_w − s_l| ≥ δ (stage 1). */
  easy: number[];
  /** The other rows (stage 2). */
  hard: number[];
}

/**
 * Splits pairs by reward margin |s_w − s_l|: easy when ≥ δ. δ is `delta` when given, else the
 * `quantile` (default 0.5) of the margins.
 */
export function mpoSplit(
  chosenScores: ArrayLike<number>, rejectedScores: ArrayLike<number>, opts: { delta?: number | null; quantile?: number } = {},
): MpoSplit {
  if (chosenScores.length !== rejectedScores.length) {
    throw new UserError(`MPO split: ${chosenScores.length} chosen scores but ${rejectedScores.length} rejected scores`);
  }
  const margins = Array.from(chosenScores, (s, i) => {
    const m = Math.abs(s - rejectedScores[i]);
    if (!Number.isFinite(m)) throw new UserError(`MPO split: the scores of row ${i} are not finite`);
    return m;
  });
  if (opts.delta !== undefined && opts.delta !== null && !(opts.delta >= 0)) throw new UserError(`delta must be ≥ 0, got ${opts.delta}`);
  const delta = opts.delta ?? quantile(margins, opts.quantile ?? 0.5);
  const easy: number[] = [];
  const hard: number[] = [];
  margins.forEach((m, i) => (m >= delta ? easy : hard).push(i));
  return { delta, easy, hard };
}

export const mpo = pairwiseLoss<MpoParams>({
  name: 'mpo',
  schedule: 'mpo_stages',
  paper: 'Mixed Preference Optimization: Reinforcement Learning with Data Selection and Better Reference Model',
  params: [
    spec.beta(),
    spec.labelSmoothing(),
    { name: 'delta', type: 'number', default: null, min: 0, doc: 'absolute reward-margin threshold δ of the easy/hard split (unset: a quantile)' },
    { name: 'delta_quantile', type: 'number', default: 0.5, min: 0, max: 1, doc: 'δ as this quantile of the margins, when delta is unset' },
    { name: 'stage2_loss', type: 'enum', default: 'dpo', choices: MPO_STAGE2_LOSSES.filter((n) => n !== 'mpo'), doc: 'loss of stage 2 (hard pairs, stage-1 model as reference)' },
  ],
  // rpo_alpha (the chosen response's NLL) goes to both stages: without it stage 1's DPO can push the
  // chosen answers' likelihood down with the rejected ones' until the policy samples neither.
  options: ['rpo_alpha'],
  ref(h, p) {
    const b = p.beta;
    return marginRef(h.B, (i) => b * (h.lw[i] - h.ll[i]), (z) => logisticRef(z, p.label_smoothing), () => b, () => -b);
  },
  emit(t, p) {
    const g = t.g;
    return { perExample: logisticGraph(g, g.mul(g.sub(t.lw, t.ll), p.beta), p.label_smoothing) };
  },
});
