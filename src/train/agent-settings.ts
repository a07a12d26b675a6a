/**
 * The settings of multi-turn rollouts with tools or an environment (`--tools`, `--mcp`,
 * `--mcp-config`, `--env`), under TRL's names where TRL has one; verl's and verifiers' names are in
 * each line and in docs/agents.md ("Rollouts"). Declared here, below src/online, because two commands
 * read them under the same names: GRPO (online/grpo/settings.ts) and distill's multi-turn on-policy
 * micro-batches (distill.ts). A run without tools or an environment refuses them away from their defaults.
 */
import { UserError } from '../errors.ts';
import { defineSettings } from './settings.ts';

const GROUP = 'Agents (with --tools, --mcp, --mcp-config or --env)';

export const AGENT_SETTINGS = defineSettings({
  max_turns: { type: 'int', default: 10, min: 1, max: 1 << 16, group: GROUP, doc: 'assistant turns per rollout at most; the rollout ends after the last (verifiers max_turns; verl multi_turn.max_assistant_turns)' },
  max_tool_calling_iterations: { type: 'int', default: 0, min: 0, max: 1 << 16, group: GROUP, trl: 'max_tool_calling_iterations', doc: 'turns whose tool calls are run, at most (0: no limit but max_turns); a turn calling past it ends the rollout, its calls unanswered' },
  max_tool_response_tokens: { type: 'int', default: 256, min: 0, max: 1 << 20, group: GROUP, doc: "a tool's or environment message's content cut to this many tokens (0: no cut) (verl multi_turn.max_tool_response_length)" },
  mcp_tools: { type: 'string', default: '', group: GROUP, doc: "comma-separated names of the MCP servers' and cmd: programs' tools to offer ('': all they list); a server's whole list may not fit a small model's positions (verl tool_selected_list)" },
  env_column: { type: 'string', default: 'environment', group: GROUP, doc: "with an --env map of environments, the prompt rows' column naming each row's environment (TRL's environment column)" },
  tool_timeout: { type: 'number', default: 60, min: 0, minOpen: true, max: 1e9, group: GROUP, doc: 'seconds a tool call may run; past it the model is answered with an error and the call counts as failed (verl tool timeout; the MCP SDK request timeout)' },
});

/** A run without tools or an environment: an agent setting away from its default is refused in one line, since nothing would read it. */
export function refuseAgentSettings(command: string, s: Readonly<Record<string, unknown>>): void {
  for (const [k, d] of Object.entries(AGENT_SETTINGS)) {
    const v = s[k];
    if (v !== d.default) throw new UserError(`${command}: ${k}=${String(v)} applies to rollouts with tools or an environment; give --tools, --mcp, --mcp-config or --env, or leave ${k} out`, { setting: k });
  }
}
