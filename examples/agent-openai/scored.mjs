// agent.mjs returning its own reward: 1 when the last number of its final text equals the task's
// `answer`, else 0 (`--reward accuracy`'s rule on these one-digit answers). An agent that scores itself
// needs no `--reward` under `prefzoo grpo --agent`, and carries its reward to frameworks that take it
// from the agent process (Agent Lightning's reward event; docs/trl-handoff.md).
import agent from './agent.mjs';

export default async function scored(task, ctx) {
  const text = await agent(task, ctx);
  const numbers = text.match(/-?\d+(?:\.\d+)?/g);
  const last = numbers ? numbers[numbers.length - 1] : null;
  return { reward: last !== null && Number(last) === Number(task.answer) ? 1 : 0, text };
}
