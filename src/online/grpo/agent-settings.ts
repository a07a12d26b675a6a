/**
 * The settings of `--agent` runs. The multi-turn rollouts' own (max_turns, …) are declared in
 * train/agent-settings.ts, which distill reads too, and re-exported here.
 */
import { defineSettings } from '../../train/settings.ts';

export { AGENT_SETTINGS, refuseAgentSettings } from '../../train/agent-settings.ts';

const AGENT_GROUP = 'Agents through the endpoint (with --agent)';

/** The settings of `--agent` runs (agent-harness.ts); a run without --agent refuses them away from their defaults. */
export const AGENT_HARNESS_SETTINGS = defineSettings({
  agent_timeout: { type: 'number', default: 300, min: 0, minOpen: true, max: 1e9, group: AGENT_GROUP, doc: "seconds one rollout's agent may run; past it its signal aborts and the rollout counts as failed" },
  max_agent_error_rate: { type: 'number', default: 0.25, min: 0, max: 1, group: AGENT_GROUP, doc: "share of a round's rollouts that may fail (throw, time out, return no reward, make a malformed call) — left out of the round — before the run stops naming the first" },
  train_calls: { type: 'string', default: 'all', group: AGENT_GROUP, doc: "which of an agent's calls are trained on: all, last (the rollout's last call), or a module FILE.mjs[:export] whose function (call) => boolean picks them" },
});
