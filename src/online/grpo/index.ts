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
 *                 the teacher's with `teacher` (distill_coef > 0: teacher-guided RL, DGPO — the k3 KL to
 *                 the teacher on the policy's own rollouts, beside the reference's; teacher.ts);
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
 * frac_reward_zero_std, completions/…, and from the graph loss, kl (beta > 0), distill/kl (the
 * teacher's, distill_coef > 0), entropy,
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
import { AGENT_HARNESS_SETTINGS } from './agent-settings.ts';
import { AGENT_REWARD, agentRoundMetrics, loadAgent, loadCallPredicate, rolloutCompletions, rowsWithAdvantages, runAgents, type AgentEndpoint, type AgentFunction, type CallPredicate, type LoadedAgent } from './agent-harness.ts';
import { openAgentEndpoint } from './agent-endpoint.ts';
import { AgentLog } from './agent-log.ts';
import { GRPO_HONOURS, grpoLoss, rewardWeights, type GrpoSettings } from './settings.ts';
import { checkTeacher, openTeacher, teacherParams } from './teacher.ts';

export { GRPO_SETTINGS, GRPO_HONOURS, grpoLoss, rewardWeights, type GrpoSettings } from './settings.ts';
export { DEFAULT_DISTILL_COEF } from './teacher.ts';
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
  /**
   * An agent written against an OpenAI-compatible API (`--agent FILE[:export]`, or the function):
   * `(task, { baseURL, apiKey, model, seed, signal }) => reward`, run G times a task against the
   * run's endpoint (agent-harness.ts). The prompts file's rows are its tasks (any columns).
   */
  agent?: string | AgentFunction;
  /**
   * Teacher-guided RL (`--teacher`, a model folder with the policy's tokenizer): the loss adds
   * distill_coef × the per-token k3 KL of the policy to this model on the sampled tokens.
   */
  teacher?: string;
  /** AlignDistil: `teacher` is a DPO model and this its reference; the teacher's logits are z_ref + teacher_weight·(z_dpo − z_ref). */
  teacherRef?: string;
}

export type GrpoResult = OnlineResult;

export async function grpo(o: GrpoOptions): Promise<GrpoResult> {
  const { config, lossParams, own, named } = resolveConfig({ configFile: o.configFile, params: o.params, settings: o.settings, base: o.base, command: 'grpo' });
  const s = own as unknown as GrpoSettings;
  const loss = grpoLoss(teacherParams(lossParams, o), s, config.rollout_dtype);
  const p = loss.terms[0].params as GrpoParams;
  const G = s.num_generations;
  const perRound = config.batch_size * config.gradient_accumulation_steps;
  if (perRound % G !== 0) {
    throw new UserError(`grpo: batch_size × gradient_accumulation_steps (${config.batch_size} × ${config.gradient_accumulation_steps} = ${perRound} completions) must be a multiple of num_generations (${G})`);
  }
  // A teacher that is no model folder, or reads other token ids, is refused before anything opens.
  const teacherSpec = checkTeacher(o, named.has('teacher_weight') ? s.teacher_weight : undefined);
  const harness = await openHarness(o, s);
  // Tools or an environment make rollouts multi-turn (agent-run.ts); without them the agent settings are refused.
  const agent = await AgentRun.open(o, s);
  const rollout = o.rollout ? o.rollout(s) : agent ? agent.rollout : samplingRollout(s);
  if (o.rewards.length === 0 && !agent?.envReward && !harness) {
    await agent?.close();
    throw new UserError('grpo: no reward function: give --reward (or an --env whose environment has reward(), or an --agent that returns one)');
  }
  const envs = agent?.env ?? null;
  let rows: PromptRow[];
  let evalRows: PromptRow[];
  try {
    if (o.rewards.length === 0 && agent) await agent.checkEnvRewards();
    if (o.prompts === undefined) {
      if (harness) throw new UserError(`grpo: --agent ${harness.agent.spec} needs --prompts: its rows are the agent's tasks`, { setting: 'prompts' });
      if (!envs) throw new UserError('grpo: no --prompts: give a prompts file, or an --env whose environments give the prompt (reset() returning it)', { setting: 'prompts' });
      // Generated rows have no end: an epoch is one round, so only max_steps says how long to run.
      if (config.max_steps === 0) throw new UserError(`grpo: without --prompts the --env ${envs.spec} environments give the prompts and the rows never run out; set max_steps`, { setting: 'max_steps' });
    }
    // With an environment a row may leave its prompt to reset().
    // An agent's task is its row as is (any columns; no question → prompt renaming), a prompt optional.
    const read = (f: string) => readPromptRows(f, harness ? ['prompt'] : PROMPT_COLUMNS, { promptOptional: !!envs || !!harness });
    rows = o.prompts === undefined ? agent!.generatedRows(perRound / G) : await read(o.prompts);
    evalRows = config.eval_data ? (await read(config.eval_data)).slice(0, config.eval_samples > 0 ? config.eval_samples : undefined) : [];
    agent?.checkRows(rows);
    agent?.checkRows(evalRows);
  } catch (e) {
    await agent?.close();
    throw e;
  }
  const cols = columnsOf(p, s);
  // Reward models run where the policy does.
  const fns = [
    ...(o.rewards.length || (!agent?.envReward && !harness) ? await loadAllRewards(o.rewards, { runtime: runtimeOf(config) }) : []),
    ...(agent?.envReward ? [agent.envReward] : []),
    ...(harness ? [AGENT_REWARD] : []),
  ];
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
  let teacher: ReferenceScorer | null = null;
  let endpoint: AgentEndpoint | null = null;
  const agentLog = harness ? new AgentLog(o.out) : null;
  // An --agent round: the agents run against the endpoint over the live weights; each rollout's reward
  // gives one advantage, spread over its rows (agent-harness.ts).
  const agentRound = async (ctx: OnlineContext, items: readonly PromptRow[], step: number, seed: number, h: { agent: LoadedAgent; trainCalls: CallPredicate | 'all' | 'last' }) => {
    const policy = await ctx.policy();
    if (endpoint) await endpoint.setModel(policy);
    else endpoint = await openAgentEndpoint(ctx.tok, policy, s);
    const ran = await runAgents(h.agent, endpoint!, items, { G, seed, runSeed: config.seed, step, scored: o.rewards.length > 0, trainCalls: h.trainCalls, settings: s });
    const completions = rolloutCompletions(ran.rollouts);
    const { perFunction, rewards } = await scoreCompletions(fns, weights, items, completions, scoring);
    ran.rollouts.forEach((r, i) => {
      if (r.error) rewards[i] = NaN;
    });
    return { ...ran, completions, perFunction, rewards };
  };
  const batching = (ctx: OnlineContext) => ({ batchSize: config.batch_size, padTo: config.pad_to_multiple_of, padId: ctx.tok.padId ?? ctx.tok.eosId ?? 0 });
  const method: OnlineMethod<PromptRow, GrpoRound> = {
    name: 'grpo',
    honours: GRPO_HONOURS,
    spec: (x) => grpoSpec({ config: x.model, init: x.init, lora: x.lora, train: x.config, loss, settings: s, vocabLimit: x.vocabLimit }),
    roundSize: () => perRound / G,
    updatesPerRound: () => s.num_iterations,
    async open(ctx) {
      if (cols.ref) ref = await ReferenceScorer.create(ctx.model, ctx.baseWeights, ctx.runtime, { temperature: s.temperature, vocabLimit: ctx.tok.vocabSize });
      if (cols.teacher) teacher = await openTeacher(teacherSpec!, ctx, s.temperature);
      log.truncateAfter(ctx.art.step);
      await agent?.start(ctx, o.resume ? ctx.art.step + 1 : undefined);
      agentLog?.truncateAfter(ctx.art.step);
    },
    async collect(ctx, items, info) {
      if (harness) {
        const a = await agentRound(ctx, items, info.step, ctx.rng.int(2 ** 31), harness);
        const { advantages, zeroStd } = computeAdvantages(a.rewards, G, s.scale_rewards, s.advantage);
        const trainRows = rowsWithAdvantages(a.rollouts, advantages);
        if (trainRows.length === 0) throw new UserError(`--agent ${harness.agent.spec}: no rollout of step ${info.step} made a call to train on`, { setting: 'agent' });
        const round: GrpoRound = {
          promptIds: trainRows.map((r) => r.row.promptIds),
          ids: trainRows.map((r) => r.row.ids),
          counted: trainRows.map((r) => (s.mask_truncated_completions && !r.row.stopped ? 0 : 1)),
          masks: trainRows.map((r) => r.row.lossMask),
          advantages: microBatchEven(trainRows.map((r) => r.advantage), config.batch_size, p.loss_type),
          old: null,
          ref: null,
          teacher: null,
          sampling: cols.sampling ? trainRows.map((r) => r.row.logps) : null,
          metrics: {
            ...rewardMetrics(names, a.perFunction, a.rewards),
            frac_reward_zero_std: zeroStd.filter(Boolean).length / zeroStd.length,
            ...lengthMetrics(a.completions),
            ...agentRoundMetrics(a.rollouts, a.agentSeconds, a.decodeSeconds),
          },
        };
        await roundLogps(round, cols, batching(ctx), ctx.art, ref, teacher);
        log.write(info.step, items[0].prompt ?? JSON.stringify(items[0].row), a.completions, names, a.perFunction, a.rewards, advantages);
        agentLog!.write(info.step, a.rollouts, (t) => items[t].at, a.rewards, advantages);
        return round;
      }
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
        teacher: null,
        sampling,
        metrics: {
          ...rewardMetrics(names, perFunction, rewards),
          frac_reward_zero_std: zeroStd.filter(Boolean).length / zeroStd.length,
          ...lengthMetrics(completions),
          ...agentMetrics(completions),
        },
      };
      await roundLogps(round, cols, batching(ctx), ctx.art, ref, teacher);
      // The round's first prompt as the rollout answered it: an environment's reset may have given it.
      log.write(info.step, (completions[0].info.prompt as Text | undefined) ?? rowPrompt(items[0]), completions, names, perFunction, rewards, advantages);
      return round;
    },
    microBatches: async (ctx, r) => entropy.feed(microBatches(r, cols, batching(ctx))),
    variableMicroBatches: !!harness,
    metrics: (r) => r.metrics,
    stepped: (graph) => entropy.stepped(graph),
    state: () => ({ entropy: entropy.state() }),
    restore(state) {
      entropy.restore((state as { entropy?: unknown } | undefined)?.entropy);
    },
    progressFields: (row) => ({ loss: row.loss, reward: row.reward }),
    evaluate: evalRows.length && harness
      ? async (ctx: OnlineContext) => {
          const a = await agentRound(ctx, evalRows, -ctx.art.step - 1, config.seed * 31 + 7, harness);
          return { ...rewardMetrics(names, a.perFunction, a.rewards), ...lengthMetrics(a.completions), ...agentRoundMetrics(a.rollouts, a.agentSeconds, a.decodeSeconds) };
        }
      : evalRows.length
      ? async (ctx: OnlineContext) => (await evaluateRewards(ctx.tok, await ctx.policy(), evalRows, fns, weights, { rollout, n: G, seed: config.seed * 31 + 7, step: -ctx.art.step - 1, ...scoring })).metrics
      : undefined,
    async close() {
      await ref?.release();
      await (teacher as ReferenceScorer | null)?.release();
      await endpoint?.close();
    },
  };
  try {
    return await runOnline(o, rows, method, {
      config,
      record: { prompts: o.prompts, rewards: o.rewards.join(' --reward '), teacher: o.teacher ?? null, ...(o.teacherRef !== undefined ? { teacher_ref: o.teacherRef, teacher_weight: teacherSpec!.weight } : {}), loss: 'grpo', loss_params: p, grpo: s, ...(agent ? { agent: agent.record } : {}), ...(harness ? { agent_module: harness.agent.spec } : {}) },
      inputs: [
        { key: 'prompts', now: o.prompts, flag: '--prompts' },
        { key: 'rewards', now: o.rewards.join(' --reward '), flag: '--reward' },
        { key: 'teacher', now: o.teacher ?? null, flag: '--teacher', optional: true },
        { key: 'teacher_ref', now: o.teacherRef ?? null, flag: '--teacher-ref', optional: true },
      ],
    });
  } finally {
    await releaseRewards(fns);
    await agent?.close();
    await (endpoint as AgentEndpoint | null)?.close();
  }
}

/**
 * The `--agent` of a run, loaded with its train_calls predicate, or null — then the agent settings
 * are refused away from their defaults. An agent trains through the endpoint only: tools, MCP
 * servers and environments are its own business (refused beside it).
 */
async function openHarness(o: GrpoOptions, s: GrpoSettings): Promise<{ agent: LoadedAgent; trainCalls: CallPredicate | 'all' | 'last' } | null> {
  if (o.agent === undefined) {
    for (const [k, d] of Object.entries(AGENT_HARNESS_SETTINGS)) {
      const v = (s as unknown as Record<string, unknown>)[k];
      if (v !== d.default) throw new UserError(`grpo: ${k}=${String(v)} applies to --agent runs; give --agent or leave ${k} out`, { setting: k });
    }
    return null;
  }
  const others = [(o.tools?.length ?? 0) > 0 && '--tools', (o.mcp?.length ?? 0) > 0 && '--mcp', !!o.mcpConfig && '--mcp-config', o.env !== undefined && '--env', o.rollout && 'rollout'].filter(Boolean);
  if (others.length) throw new UserError(`grpo: --agent runs its own tools and talks to the endpoint; ${others.join(', ')} cannot be given beside it`, { setting: 'agent' });
  return { agent: await loadAgent(o.agent), trainCalls: await loadCallPredicate(s.train_calls) };
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

/**
 * An --agent round's rows fill micro-batches of batch_size rows with a last one that may be short,
 * and the loop averages the micro-batches. Loss types that average the rows of a micro-batch (grpo,
 * sapo, luspo, dr_grpo) would then weigh a row of the short one more: its advantage (the policy term
 * is linear in it) is scaled by n_b·M/R — n_b rows in its micro-batch, M micro-batches, R rows — so
 * every row weighs 1/R of the loss. dapo, cispo and vespo divide by the round's token count and need
 * nothing; bnpo divides by each micro-batch's own tokens and keeps them as they are.
 */
export function microBatchEven(advantages: readonly number[], batchSize: number, lossType: GrpoParams['loss_type']): number[] {
  if (!['grpo', 'sapo', 'luspo', 'dr_grpo'].includes(lossType)) return [...advantages];
  const R = advantages.length;
  const M = Math.ceil(R / batchSize);
  return advantages.map((a, i) => {
    const b = Math.floor(i / batchSize);
    const n = Math.min(batchSize, R - b * batchSize);
    return (a * n * M) / R;
  });
}
