/**
 * `prefzoo demo --method agent`: the tools demo's task (tools.ts: look up a key in a table only the
 * tool reads) learnt by an agent written as an app would be — lookup-agent.mjs, the Vercel AI SDK's
 * `generateText` with a tool and a step limit, no prefzoo import — trained unchanged through the
 * run's OpenAI-compatible endpoint (`grpo --agent`, src/online/grpo/agent-harness.ts):
 *
 *   1. the tools demo's model, prompts and warm start (prepareToolsTask), seed for seed;
 *   2. `grpo --agent lookup-agent.mjs --reward accuracy` with the tools demo's GRPO settings: every
 *      rollout is the agent run against its own base URL; its two calls (the tool call, the answer)
 *      continue one conversation from the sampled ids and train as one row;
 *   3. held-out accuracy the same way as the tools demo's — 8 rollouts per held-out prompt at
 *      temperature 1, scored by `accuracy` — but through the agent and the endpoint, for the starting
 *      and the trained policy; the ceiling: the trained policy's agent given tables drawn at random
 *      (the tool then answers a digit that tells nothing, as the tools demo's useless tool).
 */
import { fileURLToPath } from 'node:url';
import { join } from 'node:path';
import { UserError } from '../errors.ts';
import { SeededRandom } from '../random.ts';
import { grpo, type GrpoSettings } from '../online/grpo/index.ts';
import { agentRoundMetrics, loadAgent, rolloutCompletions, runAgents, type LoadedAgent } from '../online/grpo/agent-harness.ts';
import { openAgentEndpoint } from '../online/grpo/agent-endpoint.ts';
import { scoreCompletions } from '../online/grpo/evaluate.ts';
import { ModelSampler } from '../online/policy.ts';
import { readPromptRows, type PromptRow } from '../online/prompts.ts';
import { loadAllRewards, releaseRewards, type RewardFunction } from '../online/rewards/index.ts';
import { DEMO_THREADS, EVAL_SAMPLES, finishAgentDemo, type AgentDemoOptions, type AgentDemoResult, type AgentEval } from './agent-shared.ts';
import { drawTable, GRPO_CONFIG, LOOKUP_GRPO_PARAMS, prepareToolsTask, ROLLOUT } from './tools.ts';

/**
 * Tokens per call at most (the run's max_completion_length caps each call of an --agent rollout). The
 * tools demo caps a whole rollout at 48 (call, tool result, answer), so a call that rambles on is cut
 * and, under mask_truncated_completions, left out of the loss; a right call is about 27 tokens, its
 * answer 2. At 48 per call such a call ran on and stayed in the loss, and seed 4 of the first seed
 * table never learnt the key (0.242; at 32: 0.955; docs/agents.md has both tables).
 */
const CALL_TOKENS = 32;

/** The agent module: plain JavaScript, loaded by the run as `--agent` would load a user's. */
export const LOOKUP_AGENT = fileURLToPath(new URL('./lookup-agent.mjs', import.meta.url));

/** The AI SDK packages the agent imports (dev dependencies of prefzoo: present in a clone). */
async function checkAiSdk(): Promise<void> {
  for (const pkg of ['ai', '@ai-sdk/openai-compatible']) {
    try {
      await import(pkg);
    } catch {
      throw new UserError(`demo --method agent: its agent is written with the Vercel AI SDK, and ${pkg} is not installed here (npm install ai @ai-sdk/openai-compatible)`);
    }
  }
}

export async function runAgentDemo(o: AgentDemoOptions): Promise<AgentDemoResult> {
  await checkAiSdk();
  const agent = await loadAgent(LOOKUP_AGENT);
  const { t0, dir, startDir, promptsFile, heldoutFile, lap } = await prepareToolsTask(o, 'agent');
  const run = join(dir, 'grpo');
  const r = await grpo({
    model: startDir, prompts: promptsFile, rewards: ['accuracy'], agent: LOOKUP_AGENT, out: run, overwrite: true,
    base: { ...GRPO_CONFIG, seed: o.seed }, params: [...LOOKUP_GRPO_PARAMS, `max_completion_length=${CALL_TOKENS}`, ...(o.params ?? [])], reporter: o.reporter,
  });
  lap('grpo');

  // Start, final and ceiling: the same held-out prompts, seeds and sampler; only the model or the tables differ.
  const held = await readPromptRows(heldoutFile);
  const rand = new SeededRandom(o.seed + 71);
  const withoutTables = held.map((h) => ({ ...h, row: { ...h.row, table: drawTable(rand) } }));
  const [accuracy] = await loadAllRewards(['accuracy']);
  try {
    const seed = o.seed * 31 + 7;
    const before = await evaluateAgentModel(startDir, agent, held, accuracy, seed);
    const after = await evaluateAgentModel(r.finalDir, agent, held, accuracy, seed);
    const ceiling = await evaluateAgentModel(r.finalDir, agent, withoutTables, accuracy, seed);
    lap('evaluations');
    return finishAgentDemo('agent', { before, after, ceiling }, {
      heldoutPrompts: held.length, steps: r.steps, t0, run,
      heldout: `${held.length} held-out prompts × ${EVAL_SAMPLES} rollouts at temperature 1, each the AI SDK agent (src/demos/lookup-agent.mjs) against the endpoint (look up a key in a table only its tool get(k) reads; reward: accuracy); the ceiling: the trained policy with tables drawn at random`,
    });
  } finally {
    await releaseRewards([accuracy]);
  }
}

/**
 * The agent on `rows`, `EVAL_SAMPLES` rollouts each, against an endpoint over the model in `dir` at
 * the demo's sampling settings; a rollout the agent fails counts as wrong. Metrics as a GRPO
 * evaluation's, with tools/call_frequency (calls that asked for the tool, per rollout) and
 * num_turns/mean (calls per rollout) for the demo's table.
 */
export async function evaluateAgentModel(dir: string, agent: LoadedAgent, rows: readonly PromptRow[], reward: RewardFunction, seed: number): Promise<AgentEval> {
  const policy = await ModelSampler.load(dir, { threads: DEMO_THREADS });
  const s = { temperature: ROLLOUT.temperature, top_p: ROLLOUT.top_p, top_k: ROLLOUT.top_k, max_completion_length: CALL_TOKENS } as GrpoSettings;
  const endpoint = await openAgentEndpoint(policy.tok, policy.decoder, s);
  try {
    const ran = await runAgents(agent, endpoint, rows, {
      G: EVAL_SAMPLES, seed, runSeed: seed, step: -1, scored: true, trainCalls: 'all', settings: { agent_timeout: 120, max_agent_error_rate: 1 },
    });
    const completions = rolloutCompletions(ran.rollouts);
    const { perFunction } = await scoreCompletions([reward], [1], rows, completions, { maxCompletionLength: s.max_completion_length, timeout: 60 });
    const scores = Array.from(perFunction[0], (x, i) => (ran.rollouts[i].error || Number.isNaN(x) ? 0 : x));
    const n = scores.length;
    const acc = scores.reduce((a, b) => a + b, 0) / n;
    const toolCalls = ran.rollouts.reduce((a, x) => a + x.calls.filter((c) => c.finishReason === 'tool_calls').length, 0) / n;
    return {
      accuracy: acc,
      metrics: {
        reward: acc,
        [`rewards/${reward.name}/mean`]: acc,
        'tools/call_frequency': toolCalls,
        'num_turns/mean': ran.rollouts.reduce((a, x) => a + x.calls.length, 0) / n,
        ...agentRoundMetrics(ran.rollouts, ran.agentSeconds, ran.decodeSeconds),
      },
    };
  } finally {
    await endpoint.close();
    await policy.release();
  }
}
