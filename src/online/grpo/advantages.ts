/**
 * Rewards → advantages, as TRL's GRPOTrainer computes them (sum_then_normalize): the weighted sum of
 * the reward functions that answered, a baseline per group of G completions (the group mean, or RLOO's
 * mean of the others), scaled by the group's or the batch's std. NaN stands for "no answer" (a
 * function's null, or a completion no function scored) and is left out of every mean and std.
 */
import type { GrpoSettings } from './settings.ts';

export function nanMean(xs: ArrayLike<number>): number {
  let s = 0;
  let n = 0;
  for (let i = 0; i < xs.length; i++) if (!Number.isNaN(xs[i])) (s += xs[i]), n++;
  return n ? s / n : NaN;
}

/** The sample standard deviation (Bessel-corrected, as TRL's nanstd) of the non-NaN values. */
export function nanStd(xs: ArrayLike<number>): number {
  const m = nanMean(xs);
  let s = 0;
  let n = 0;
  for (let i = 0; i < xs.length; i++) if (!Number.isNaN(xs[i])) (s += (xs[i] - m) ** 2), n++;
  return n > 1 ? Math.sqrt(s / (n - 1)) : n === 1 ? 0 : NaN;
}

/** Σ_k w_k·r_k over the functions that gave a number (NaN when none did: unscorable). */
export function combineRewards(perFunction: readonly ArrayLike<number>[], weights: readonly number[]): Float64Array {
  const n = perFunction[0].length;
  return Float64Array.from({ length: n }, (_, i) => {
    let s = 0;
    let any = false;
    perFunction.forEach((r, k) => {
      if (!Number.isNaN(r[i])) (s += weights[k] * r[i]), (any = true);
    });
    return any ? s : NaN;
  });
}

export interface Advantages {
  advantages: Float64Array;
  /** Per completion: whether the std its advantage is scaled by is (close to) zero. */
  zeroStd: boolean[];
}

/**
 * Advantages of groups of G consecutive completions (TRL's sum_then_normalize): the baseline is the
 * group mean (or, rloo, the mean of the others), scaled by the group or batch std + 1e-4 unless
 * `none`; NaN rewards (unscorable) are left out of means and stds and get advantage 0.
 */
export function computeAdvantages(rewards: ArrayLike<number>, G: number, scale: GrpoSettings['scale_rewards'], baseline: GrpoSettings['advantage']): Advantages {
  const n = rewards.length;
  if (n % G !== 0) throw new Error(`computeAdvantages: ${n} rewards are not groups of ${G}`);
  const adv = new Float64Array(n);
  const std = new Float64Array(n);
  const batchStd = nanStd(rewards);
  for (let g0 = 0; g0 < n; g0 += G) {
    const grp = Array.from({ length: G }, (_, k) => rewards[g0 + k]);
    const mean = nanMean(grp);
    const sd = scale === 'batch' ? batchStd : nanStd(grp);
    const scorable = grp.filter((r) => !Number.isNaN(r));
    const total = scorable.reduce((a, b) => a + b, 0);
    for (let k = 0; k < G; k++) {
      const r = grp[k];
      let a: number;
      if (Number.isNaN(r)) a = NaN;
      else if (baseline === 'rloo') a = scorable.length > 1 ? r - (total - r) / (scorable.length - 1) : 0;
      else a = r - mean;
      if (scale !== 'none') a = a / (sd + 1e-4);
      adv[g0 + k] = Number.isNaN(a) ? 0 : a;
      std[g0 + k] = sd;
    }
  }
  const zeroStd = Array.from(std, (s) => Math.abs(s) <= 1e-8 || Number.isNaN(s));
  return { advantages: adv, zeroStd };
}
