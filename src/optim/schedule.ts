/**
 * Learning-rate schedules, computed in TypeScript and fed to the optimizer graph as its `lr` input.
 *
 * `t` is the 1-based index of the update (the optimizer's `step` input). With W warmup steps and T
 * total steps:
 *   warmup   t ≤ W:  lr·t/W                      (the first update already moves: lr/W, not 0)
 *   after    p = (t − W)/(T − W) clipped to [0, 1], f = 1 (constant) | 1 − p (linear) | ½(1 + cos πp) (cosine)
 *            lr·(r + (1 − r)·f) with r = minLrRatio (default 0)
 */
import { UserError } from '../errors.ts';

export interface LrScheduleConfig {
  type: 'constant' | 'linear' | 'cosine';
  /** Peak learning rate. */
  lr: number;
  /** Linear warmup from lr/W to lr over the first W updates (default 0: none). */
  warmupSteps?: number;
  /** Total number of updates; needed by linear and cosine decay. */
  totalSteps?: number;
  /** Floor of the decay as a fraction of lr (default 0). */
  minLrRatio?: number;
}

/** Validates a schedule (one-line errors naming the field). */
export function checkSchedule(c: LrScheduleConfig): void {
  if (!['constant', 'linear', 'cosine'].includes(c.type)) throw new UserError(`lr schedule must be constant, linear or cosine, got "${c.type}"`);
  if (!Number.isFinite(c.lr) || c.lr < 0) throw new UserError(`learning rate must be a finite number ≥ 0, got ${c.lr}`);
  const w = c.warmupSteps ?? 0;
  if (!Number.isInteger(w) || w < 0) throw new UserError(`warmup_steps must be an integer ≥ 0, got ${w}`);
  const r = c.minLrRatio ?? 0;
  if (!(r >= 0 && r <= 1)) throw new UserError(`min_lr_ratio must be in [0, 1], got ${r}`);
  if (c.type !== 'constant') {
    const t = c.totalSteps;
    if (t === undefined || !Number.isInteger(t) || t < 1) throw new UserError(`${c.type} lr schedule needs total_steps, an integer ≥ 1 (got ${t})`);
    if (w > t) throw new UserError(`warmup_steps (${w}) exceeds total_steps (${t})`);
  }
}

/** Learning rate of update t (1-based). */
export function lrAt(t: number, c: LrScheduleConfig): number {
  checkSchedule(c);
  if (!Number.isInteger(t) || t < 1) throw new Error(`lrAt: step must be an integer ≥ 1, got ${t}`);
  const w = c.warmupSteps ?? 0;
  if (t <= w) return (c.lr * t) / w;
  if (c.type === 'constant') return c.lr;
  const total = c.totalSteps!;
  const p = total === w ? 1 : Math.min(1, (t - w) / (total - w));
  const f = c.type === 'linear' ? 1 - p : 0.5 * (1 + Math.cos(Math.PI * p));
  const r = c.minLrRatio ?? 0;
  return c.lr * (r + (1 - r) * f);
}
