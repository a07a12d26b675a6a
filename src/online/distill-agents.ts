/**
 * distill's multi-turn on-policy micro-batches (`--tools`, `--mcp`, `--mcp-config`, `--env`): GRPO's
 * agent sources (grpo/agent-run.ts: modules, servers, the tool journal) and its rollout
 * (grpo/agent-rollout.ts: turns, tool calls, bridges, masks) handed to train/distill.ts, which sits a
 * layer below and takes them as a `MultiTurn`. One conversation per prompt (GRPO's num_generations
 * = 1); the rollout's sampling temperature is distill's `sampling_temperature` (`temperature` is
 * gkd's loss τ there); max_turns and the other agent settings keep GRPO's names.
 */
import { UserError } from '../errors.ts';
import type { MultiTurn } from '../train/distill.ts';
import { AgentRun, agentSourcesGiven, type AgentOptions } from './grpo/agent-run.ts';
import { agentMetrics } from './grpo/metrics.ts';

/** The multi-turn rollouts of a distill run, or undefined when no tool, server or environment is given. */
export function distillAgents(o: AgentOptions): MultiTurn | undefined {
  if (!agentSourcesGiven(o)) return undefined;
  const flag = (o.tools?.length ?? 0) > 0 ? '--tools' : (o.mcp?.length ?? 0) > 0 ? '--mcp' : o.mcpConfig ? '--mcp-config' : '--env';
  return {
    flag,
    async open(s) {
      const run = (await AgentRun.open(o, { ...s, temperature: s.sampling_temperature }, 'distill'))!;
      // A map's environments are picked by a column of the row; distill's rows are train's, which keep only the prompt.
      if (run.env && !run.env.single) {
        await run.close();
        throw new UserError(`distill: --env ${run.env.spec} exports a map of environments (${run.env.names.join(', ')}); distill's rows carry only their prompt, so none can pick one by env_column: give an --env with one factory`, { setting: 'env' });
      }
      return {
        record: run.record,
        start: (ctx, resumeFrom) => run.start(ctx, resumeFrom),
        async rollout(policy, tok, req) {
          const prompts = req.prompts.map((p) => ({ prompt: p.prompt, row: { prompt: p.prompt }, at: p.at }));
          const completions = await run.rollout({ tok, policy }, { prompts, n: 1, seed: req.seed, step: req.step });
          return { conversations: completions.map((c) => ({ promptIds: c.promptIds, ids: c.ids, mask: c.lossMask })), metrics: agentMetrics(completions) };
        },
        close: () => run.close(),
      };
    },
  };
}
