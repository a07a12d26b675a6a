/**
 * The settings of multi-turn rollouts with tools or an environment (`--tools`, `--mcp`,
 * `--mcp-config`, `--env`), under TRL's names where TRL has one; verl's and verifiers' names are in
 * each line and in docs/agents.md ("Rollouts"). They are part of GRPO's table (settings.ts); a run
 * without tools or an environment refuses them when they differ from their defaults.
 */
import { defineSettings } from '../../train/settings.ts';

const GROUP = 'Agents (with --tools, --mcp, --mcp-config or --env)';

export const AGENT_SETTINGS = defineSettings({
  max_turns: { type: 'int', default: 10, min: 1, max: 1 << 16, group: GROUP, doc: 'assistant turns per rollout at most; the rollout ends after the last (verifiers max_turns; verl multi_turn.max_assistant_turns)' },
  max_tool_calling_iterations: { type: 'int', default: 0, min: 0, max: 1 << 16, group: GROUP, trl: 'max_tool_calling_iterations', doc: 'turns whose tool calls are run, at most (0: no limit but max_turns); a turn calling past it ends the rollout, its calls unanswered' },
  max_tool_response_tokens: { type: 'int', default: 256, min: 0, max: 1 << 20, group: GROUP, doc: "a tool's or environment message's content cut to this many tokens (0: no cut) (verl multi_turn.max_tool_response_length)" },
  mcp_tools: { type: 'string', default: '', group: GROUP, doc: "comma-separated names of the MCP servers' and cmd: programs' tools to offer ('': all they list); a server's whole list may not fit a small model's positions (verl tool_selected_list)" },
  env_column: { type: 'string', default: 'environment', group: GROUP, doc: "with an --env map of environments, the prompt rows' column naming each row's environment (TRL's environment column)" },
  tool_timeout: { type: 'number', default: 60, min: 0, minOpen: true, max: 1e9, group: GROUP, doc: 'seconds a tool call may run; past it the model is answered with an error and the call counts as failed (verl tool timeout; the MCP SDK request timeout)' },
});

const AGENT_GROUP = 'Agents through the endpoint (with --agent)';

/** The settings of `--agent` runs (agent-harness.ts); a run without --agent refuses them away from their defaults. */
export const AGENT_HARNESS_SETTINGS = defineSettings({
  agent_timeout: { type: 'number', default: 300, min: 0, minOpen: true, max: 1e9, group: AGENT_GROUP, doc: "seconds one rollout's agent may run; past it its signal aborts and the rollout counts as failed" },
  max_agent_error_rate: { type: 'number', default: 0.25, min: 0, max: 1, group: AGENT_GROUP, doc: "share of a round's rollouts that may fail (throw, time out, return no reward, make a malformed call) — left out of the round — before the run stops naming the first" },
  train_calls: { type: 'string', default: 'all', group: AGENT_GROUP, doc: "which of an agent's calls are trained on: all, last (the rollout's last call), or a module FILE.mjs[:export] whose function (call) => boolean picks them" },
});
