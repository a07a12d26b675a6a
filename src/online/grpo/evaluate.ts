/** Held-out evaluation: n completions per prompt from a decoder, scored by the run's reward functions. */
import type { Decoder } from '../../models/generate.ts';
import type { LoadedTokenizer } from '../../tokenize/index.ts';
import type { PromptRow } from '../prompts.ts';
import { scoreAll, type RewardFunction, type RewardRow } from '../rewards/index.ts';
import { combineRewards, nanMean } from './advantages.ts';
import { agentMetrics, lengthMetrics, rewardMetrics } from './metrics.ts';
import type { Completion, Rollout } from './rollout.ts';

/** The tokens of a completion the policy sampled (a tool's or environment's are not its). */
export const modelTokens = (c: Completion): number => c.lossMask.reduce((a, m) => a + m, 0);

export interface RewardEval {
  /** reward, reward_std, rewards/<name>/mean and /std, completions/…, over n samples per prompt. */
  metrics: Record<string, number>;
  /** Per reward function, the mean over all samples (NaN-free: null answers left out). */
  perFunction: Record<string, number>;
}

/** Each completion's rewards per function ([functions][completions], NaN for null) and their weighted sum. */
export async function scoreCompletions(
  fns: readonly RewardFunction[], weights: readonly number[], rows: readonly PromptRow[], completions: readonly Completion[], o: { maxCompletionLength: number; timeout: number },
): Promise<{ perFunction: Float64Array[]; rewards: Float64Array }> {
  const perFunction = await scoreAll(fns, {
    completions: completions.map((c) => c.text),
    // The prompt as the rollout answered it: an environment's reset may have given it.
    rows: completions.map((c) => (c.info.prompt === undefined ? rows[c.prompt].row : { ...rows[c.prompt].row, prompt: c.info.prompt }) as RewardRow),
    lengths: completions.map(modelTokens),
    maxCompletionLength: o.maxCompletionLength,
    // What a multi-turn or --agent rollout recorded (a single-turn completion records nothing).
    ...(completions.some((c) => Object.keys(c.info).length > 0) ? { rollouts: completions.map((c) => c.info) } : {}),
  }, (i) => rows[completions[i].prompt].at, o.timeout);
  return { perFunction, rewards: combineRewards(perFunction, weights) };
}

/** Samples n completions per prompt row from `decoder` through `rollout` and scores them. */
export async function evaluateRewards(
  tok: LoadedTokenizer, decoder: Decoder, rows: readonly PromptRow[], fns: readonly RewardFunction[], weights: readonly number[],
  o: { rollout: Rollout; n: number; seed: number; step?: number; maxCompletionLength: number; timeout: number },
): Promise<RewardEval> {
  const completions = await o.rollout({ tok, policy: decoder }, { prompts: rows, n: o.n, seed: o.seed, ...(o.step !== undefined ? { step: o.step } : {}) });
  const { perFunction, rewards } = await scoreCompletions(fns, weights, rows, completions, o);
  return {
    metrics: { ...rewardMetrics(fns.map((f) => f.name), perFunction, rewards), ...lengthMetrics(completions), ...agentMetrics(completions) },
    perFunction: Object.fromEntries(fns.map((f, k) => [f.name, nanMean(perFunction[k])])),
  };
}
