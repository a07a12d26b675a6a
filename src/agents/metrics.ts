/**
 * Tool metrics under TRL's names, computed as TRL's GRPOTrainer does (trl/trainer/grpo_trainer.py,
 * `_generate`): `tools/call_frequency` = all tool calls of the batch / the number of rollouts
 * (completions) in it; `tools/failure_frequency` = failed calls / all calls, 0 when there was no call.
 * Every call counts, answered or not (unknown tool, bad arguments, timeouts included), as in TRL.
 */
import type { CallRecord } from './types.ts';

export interface ToolMetrics {
  'tools/call_frequency': number;
  'tools/failure_frequency': number;
}

/** The metrics of one round: `rollouts[i]` holds every call record of rollout i, all its turns together. */
export function toolMetrics(rollouts: readonly (readonly CallRecord[])[]): ToolMetrics {
  let calls = 0;
  let failures = 0;
  for (const r of rollouts) {
    calls += r.length;
    for (const c of r) if (!c.ok) failures++;
  }
  return {
    'tools/call_frequency': rollouts.length > 0 ? calls / rollouts.length : 0,
    'tools/failure_frequency': calls > 0 ? failures / calls : 0,
  };
}

/**
 * verl's turn metrics (`compute_data_metrics`: `num_turns/min|max|mean` over the batch's
 * trajectories), from each rollout's number of turns as the rollout counts them. Empty: no metrics.
 */
export function turnMetrics(numTurns: readonly number[]): Record<string, number> {
  if (numTurns.length === 0) return {};
  let sum = 0;
  let min = Infinity;
  let max = -Infinity;
  for (const n of numTurns) {
    sum += n;
    if (n < min) min = n;
    if (n > max) max = n;
  }
  return { 'num_turns/mean': sum / numTurns.length, 'num_turns/min': min, 'num_turns/max': max };
}

/** `stop_reason/<reason>`: the fraction of the batch's rollouts that ended for each reason seen (they sum to 1). */
export function stopReasonMetrics(reasons: readonly string[]): Record<string, number> {
  const count = new Map<string, number>();
  for (const r of reasons) count.set(r, (count.get(r) ?? 0) + 1);
  const out: Record<string, number> = {};
  for (const [r, c] of [...count].sort(([a], [b]) => (a < b ? -1 : a > b ? 1 : 0))) out[`stop_reason/${r}`] = c / reasons.length;
  return out;
}
