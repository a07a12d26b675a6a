/**
 * GRPO and its family (DAPO, Dr. GRPO, GSPO, CISPO, RLOO) on the online loop (loop.ts), with TRL's
 * GRPOConfig names: every round
 *
 *   prompts       batch_size × gradient_accumulation_steps / num_generations of them (a seeded shuffle)
 *   rollout       num_generations completions each from the live weights (rollout.ts: temperature,
 *                 top_p, top_k, at most max_completion_length tokens; token ids kept, never re-tokenized)
 *   score         every reward function (rewards.ts) on every completion: r = Σ_k w_k·r_k over the
 *                 functions that apply (reward_weights; null answers skipped, none → unscorable)
 *   advantages    (advantages.ts) group: r − mean of its group; rloo: r − mean of the others in its
 *                 group; then ÷ (std + 1e-4) of the group or the batch (scale_rewards), or not (none);
 *                 unscorable completions get 0
 *   log-probs     (round.ts) old ones per token when num_iterations > 1 (the policy that sampled; else
 *                 the live one, detached); reference ones when beta > 0 (the starting weights, adapters off);
 *                 the sampler's own (Completion.logps, what the decoder drew each token with) for the
 *                 sampler–trainer correction and the off-policy mask (vllm_importance_sampling_*, on by
 *                 default as in TRL; off_policy_mask_threshold)
 *   entropy       (entropy.ts) with entropy_coef ≠ 0 or use_adaptive_entropy the graph's per-token
 *                 entropies keep their gradient; the adaptive controller moves the coefficient after
 *                 every step and is saved in checkpoints
 *   updates       num_iterations on the round, each over its micro-batches of batch_size completions,
 *                 of the zoo's `grpo` loss (graph.ts; losses/grpo.ts: loss_type, importance_sampling_level,
 *                 epsilon, epsilon_high, delta, beta, top_entropy_quantile)
 *
 * Log-probs, entropies and the sampler all use the logits divided by `temperature`, as TRL does, and
 * the same vocabulary (ids below the tokenizer's; padded embedding rows are never drawn), so the
 * importance ratio compares the distributions completions were drawn from.
 *
 * Metrics (TRL's names, metrics.ts): reward, reward_std, rewards/<name>/mean and /std,
 * frac_reward_zero_std, completions/…, and from the graph loss, kl (beta > 0), entropy,
 * clip_ratio/… (cispo: cispo_clip_ratio), sampling/sampling_logp_difference/mean|max and
 * sampling/importance_sampling_ratio/min|mean|max, policy_loss and entropy_coef (entropy bonus). Every logging_steps the round's first prompt's completions,
 * with their rewards and advantages, go to RUN/completions.jsonl (completions-log.ts). With eval_data
 * (a prompts file), the live weights are evaluated every eval_steps and at the end (evaluate.ts).
 */
import { UserError } from '../../errors.ts';
import { resolveConfig } from '../../train/config.ts';
import { runtimeOf } from '../../train/run.ts';
import type { GrpoParams } from '../../../losses/grpo.ts';
import { PROMPT_COLUMNS, readPromptRows, rowPrompt, type PromptRow } from '../prompts.ts';
import type { Text } from '../../../datasets/schema.ts';
import { loadAllRewards, releaseRewards } from '../rewards/index.ts';
import { ReferenceScorer } from '../reference.ts';
import { runOnline, type OnlineContext, type OnlineMethod, type OnlineOptions, type OnlineResult } from '../../train/loop.ts';
import { computeAdvantages } from './advantages.ts';
import { CompletionsLog } from './completions-log.ts';
import { evaluateRewards, scoreCompletions } from './evaluate.ts';
import { columnsOf, grpoSpec } from './graph.ts';
import { EntropyController } from './entropy.ts';
import { agentMetrics, lengthMetrics, rewardMetrics } from './metrics.ts';
import { microBatches, roundLogps, type GrpoRound } from './round.ts';
import { samplingRollout, type Completion, type Rollout } from './rollout.ts';
import { AgentRun, type AgentOptions } from './agent-run.ts';
import { GRPO_HONOURS, grpoLoss, rewardWeights, type GrpoSettings } from './settings.ts';

export { GRPO_SETTINGS, GRPO_HONOURS, grpoLoss, rewardWeights, type GrpoSettings } from './settings.ts';
export { combineRewards, computeAdvantages, nanMean, nanStd, type Advantages } from './advantages.ts';
export { evaluateRewards, type RewardEval } from './evaluate.ts';
export { samplingRollout, type Completion, type Rollout, type RolloutContext, type RolloutRequest } from './rollout.ts';
export { agentRollout, Episode, STOP_REASONS, type AgentRolloutInfo, type AgentRolloutSettings, type AgentSources, type AgentStopReason } from './agent-rollout.ts';
export type { AgentOptions } from './agent-run.ts';

export interface GrpoOptions extends OnlineOptions, AgentOptions {
  /**
   * The prompts file (any format `convert` reads; a `prompt`, `question` or `problem` column, other
   * columns reach the rewards and the environment). With `env`, rows may lack the prompt (their
   * environment's `reset` gives it), and the file may be left out: rows are generated (max_steps required).
   */
  prompts?: string;
  /** `--reward` specs (rewards.ts), in order; reward_weights follows it. */
  rewards: readonly string[];
  /** Settings by name, typed (as `--param` takes them, after `params`). */
  settings?: Readonly<Record<string, unknown>>;
  /** How completions are made (default: `samplingRollout` with the run's sampling settings). */
  rollout?: (s: GrpoSettings) => Rollout;
}

export type GrpoResult = OnlineResult;

export async function grpo(o: GrpoOptions): Promise<GrpoResult> {
  const { config, lossParams, own } = resolveConfig({ configFile: o.configFile, params: o.params, settings: o.settings, base: o.base, command: 'grpo' });
  const s = own as unknown as GrpoSettings;
  const loss = grpoLoss(lossParams, s);
  const p = loss.terms[0].params as GrpoParams;
  const G = s.num_generations;
  const perRound = config.batch_size * config.gradient_accumulation_steps;
  if (perRound % G !== 0) {
    throw new UserError(`grpo: batch_size × gradient_accumulation_steps (${config.batch_size} × ${config.gradient_accumulation_steps} = ${perRound} completions) must be a multiple of num_generations (${G})`);
  }
  // Tools or an environment make rollouts multi-turn (agent-run.ts); without them the agent settings are refused.
  const agent = await AgentRun.open(o, s);
  const rollout = o.rollout ? o.rollout(s) : agent ? agent.rollout : samplingRollout(s);
  if (o.rewards.length === 0 && !agent?.envReward) {
    await agent?.close();
    throw new UserError('grpo: no reward function: give --reward (or an --env whose environment has reward())');
  }
  const envs = agent?.env ?? null;
  let rows: PromptRow[];
  let evalRows: PromptRow[];
  try {
    if (o.rewards.length === 0) await agent!.checkEnvRewards();
    if (o.prompts === undefined) {
      if (!envs) throw new UserError('grpo: no --prompts: give a prompts file, or an --env whose environments give the prompt (reset() returning it)', { setting: 'prompts' });
      // Generated rows have no end: an epoch is one round, so only max_steps says how long to run.
      if (config.max_steps === 0) throw new UserError(`grpo: without --prompts the --env ${envs.spec} environments give the prompts and the rows never run out; set max_steps`, { setting: 'max_steps' });
    }
    // With an environment a row may leave its prompt to reset().
    rows = o.prompts === undefined ? agent!.generatedRows(perRound / G) : await readPromptRows(o.prompts, PROMPT_COLUMNS, { promptOptional: !!envs });
    evalRows = config.eval_data ? (await readPromptRows(config.eval_data, PROMPT_COLUMNS, { promptOptional: !!envs })).slice(0, config.eval_samples > 0 ? config.eval_samples : undefined) : [];
    agent?.checkRows(rows);
    agent?.checkRows(evalRows);
  } catch (e) {
    await agent?.close();
    throw e;
  }
  const cols = columnsOf(p, s);
  // Reward models run where the policy does.
  const fns = [...(o.rewards.length || !agent?.envReward ? await loadAllRewards(o.rewards, { runtime: runtimeOf(config) }) : []), ...(agent?.envReward ? [agent.envReward] : [])];
  const names = fns.map((f) => f.name);
  let weights: number[];
  try {
    weights = rewardWeights(s, names);
  } catch (e) {
    await releaseRewards(fns);
    throw e;
  }
  const scoring = { maxCompletionLength: s.max_completion_length, timeout: s.reward_timeout };
  const log = new CompletionsLog(o.out, Math.min(s.log_completions, G), (step) => Array.from({ length: s.num_iterations }, (_, u) => step + u).some((t) => t % config.logging_steps === 0));
  const entropy = new EntropyController(p, s, cols);
  let ref: ReferenceScorer | null = null;
  const batching = (ctx: OnlineContext) => ({ batchSize: config.batch_size, padTo: config.pad_to_multiple_of, padId: ctx.tok.padId ?? ctx.tok.eosId ?? 0 });
  const method: OnlineMethod<PromptRow, GrpoRound> = {
    name: 'grpo',
    honours: GRPO_HONOURS,
    spec: (x) => grpoSpec({ config: x.model, init: x.init, lora: x.lora, train: x.config, loss, settings: s, vocabLimit: x.vocabLimit }),
    roundSize: () => perRound / G,
    updatesPerRound: () => s.num_iterations,
    async open(ctx) {
      if (cols.ref) ref = await ReferenceScorer.create(ctx.model, ctx.baseWeights, ctx.runtime, { temperature: s.temperature, vocabLimit: ctx.tok.vocabSize });
      log.truncateAfter(ctx.art.step);
      await agent?.start(ctx, o.resume ? ctx.art.step + 1 : undefined);
    },
    async collect(ctx, items, info) {
      const completions = await rollout({ tok: ctx.tok, policy: await ctx.policy() }, { prompts: items, n: G, seed: ctx.rng.int(2 ** 31), step: info.step, logprobs: cols.sampling });
      const sampling = cols.sampling ? samplerLogps(completions) : null;
      const { perFunction, rewards } = await scoreCompletions(fns, weights, items, completions, scoring);
      const { advantages, zeroStd } = computeAdvantages(rewards, G, s.scale_rewards, s.advantage);
      const masked = completions.some((c) => c.lossMask.some((m) => m !== 1));
      const round: GrpoRound = {
        promptIds: completions.map((c) => c.promptIds),
        ids: completions.map((c) => c.ids),
        counted: completions.map((c) => (s.mask_truncated_completions && !c.stopped ? 0 : 1)),
        masks: masked ? completions.map((c) => c.lossMask) : null,
        advantages: Array.from(advantages),
        old: null,
        ref: null,
        sampling,
        metrics: {
          ...rewardMetrics(names, perFunction, rewards),
          frac_reward_zero_std: zeroStd.filter(Boolean).length / zeroStd.length,
          ...lengthMetrics(completions),
          ...agentMetrics(completions),
        },
      };
      await roundLogps(round, cols, batching(ctx), ctx.art, ref);
      // The round's first prompt as the rollout answered it: an environment's reset may have given it.
      log.write(info.step, (completions[0].info.prompt as Text | undefined) ?? rowPrompt(items[0]), completions, names, perFunction, rewards, advantages);
      return round;
    },
    microBatches: async (ctx, r) => entropy.feed(microBatches(r, cols, batching(ctx))),
    metrics: (r) => r.metrics,
    stepped: (graph) => entropy.stepped(graph),
    state: () => ({ entropy: entropy.state() }),
    restore(state) {
      entropy.restore((state as { entropy?: unknown } | undefined)?.entropy);
    },
    progressFields: (row) => ({ loss: row.loss, reward: row.reward }),
    evaluate: evalRows.length
      ? async (ctx: OnlineContext) => (await evaluateRewards(ctx.tok, await ctx.policy(), evalRows, fns, weights, { rollout, n: G, seed: config.seed * 31 + 7, step: -ctx.art.step - 1, ...scoring })).metrics
      : undefined,
    async close() {
      await ref?.release();
    },
  };
  try {
    return await runOnline(o, rows, method, {
      config,
      record: { prompts: o.prompts, rewards: o.rewards.join(' --reward '), loss: 'grpo', loss_params: p, grpo: s, ...(agent ? { agent: agent.record } : {}) },
      inputs: [
        { key: 'prompts', now: o.prompts, flag: '--prompts' },
        { key: 'rewards', now: o.rewards.join(' --reward '), flag: '--reward' },
      ],
    });
  } finally {
    await releaseRewards(fns);
    await agent?.close();
  }
}

/**
 * Each completion's sampler log-probs (`Completion.logps`), which the sampler–trainer correction and
 * the off-policy mask read: a rollout that gives none is refused in one line.
 */
function samplerLogps(completions: readonly Completion[]): number[][] {
  return completions.map((c, k) => {
    if (!c.logps || c.logps.length !== c.ids.length) {
      throw new UserError(
        `grpo: this rollout gives no sampler log-probs (Completion.logps) for completion ${k} (${c.logps ? `${c.logps.length} for ${c.ids.length} tokens` : 'none'}); ` +
          'they feed vllm_importance_sampling_correction and off_policy_mask_threshold: set vllm_importance_sampling_correction=false and leave off_policy_mask_threshold unset, or return logps from the rollout',
      );
    }
    return c.logps;
  });
}
