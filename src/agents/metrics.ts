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
