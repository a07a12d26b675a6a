/** A round's metrics in TRL's names: rewards (total and per function) and completion lengths. */
import { nanMean, nanStd } from './advantages.ts';
import type { Completion } from './rollout.ts';
import { toolMetrics, turnMetrics } from '../../agents/metrics.ts';
import { STOP_REASONS } from './agent-rollout.ts';
import type { CallRecord } from '../../agents/types.ts';

const mean = (xs: readonly number[]) => (xs.length ? xs.reduce((a, b) => a + b, 0) / xs.length : 0);

/**
 * reward, reward_std, rewards/<name>/mean and /std (NaN-free: null answers left out, a metric with no
 * answer at all omitted), and frac_reward_none: the share of completions no function scored (every
 * answer null), whose advantage is 0.
 */
export function rewardMetrics(names: readonly string[], perFunction: readonly Float64Array[], rewards: Float64Array): Record<string, number> {
  const m: Record<string, number> = {};
  const put = (k: string, v: number) => {
    if (Number.isFinite(v)) m[k] = v;
  };
  put('reward', nanMean(rewards));
  put('reward_std', nanStd(rewards));
  put('frac_reward_none', Array.from(rewards).filter((r) => Number.isNaN(r)).length / rewards.length);
  names.forEach((n, k) => {
    put(`rewards/${n}/mean`, nanMean(perFunction[k]));
    put(`rewards/${n}/std`, nanStd(perFunction[k]));
  });
  return m;
}

/** completions/mean_length, min_length, max_length, clipped_ratio (no stop token), mean_terminated_length. */
export function lengthMetrics(completions: readonly Completion[]): Record<string, number> {
  // The policy's own tokens: a multi-turn completion's tool and environment tokens are not counted.
  const own = (s: Completion) => s.lossMask.reduce((a, m) => a + m, 0);
  const len = completions.map(own);
  const term = completions.filter((s) => s.stopped).map(own);
  return {
    'completions/mean_length': mean(len),
    'completions/min_length': Math.min(...len),
    'completions/max_length': Math.max(...len),
    'completions/clipped_ratio': completions.filter((s) => !s.stopped).length / completions.length,
    'completions/mean_terminated_length': mean(term),
  };
}

/**
 * A multi-turn round's metrics (TRL's and verl's names): tools/call_frequency and
 * tools/failure_frequency (agents/metrics.ts), num_turns/mean|min|max, and stop_reason/<reason>: the
 * share of rollouts that ended for that reason. None for single-turn completions.
 */
export function agentMetrics(completions: readonly Completion[]): Record<string, number> {
  const infos = completions.map((c) => c.info as { turns?: number; stop_reason?: string; tool_calls?: CallRecord[] });
  if (!infos.length || infos.some((x) => typeof x.turns !== 'number')) return {};
  const turns = infos.map((x) => x.turns!);
  const m: Record<string, number> = { ...toolMetrics(infos.map((x) => x.tool_calls ?? [])) };
  Object.assign(m, turnMetrics(turns));
  for (const r of STOP_REASONS) m[`stop_reason/${r}`] = infos.filter((x) => x.stop_reason === r).length / infos.length;
  return m;
}
