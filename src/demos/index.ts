/**
 * `prefzoo demo --method M`: the online demos, one row each — what runs and the lines printed for
 * people (`--json` prints the result itself). A new demo is a file of its own and a row here.
 */
import type { Reporter } from '../progress.ts';
import { runOnlineDemo, type OnlineDemoMethod, type OnlineDemoResult } from './online.ts';
import { runGrpoDemo, type GrpoDemoResult } from './grpo.ts';
import type { AgentDemoResult } from './agent-shared.ts';
import { runToolsDemo } from './tools.ts';
import { runEnvDemo } from './env.ts';
import { runAgentDemo } from './agent.ts';
import { runDistillDemo, type DistillDemoResult } from './distill.ts';

/** What every online demo takes. */
export interface MethodDemoOptions {
  seed: number;
  /** Extra `key=value` settings of the method's training run (e.g. max_steps=40). */
  params?: string[];
  out?: string;
  /** The progress of the training stages and the demo's notes; none without it. */
  reporter?: Reporter;
}

export interface MethodDemo {
  /** One line for `--help`. */
  summary: string;
  run(o: MethodDemoOptions): Promise<{ run: string }>;
  /** The result as lines for the terminal. */
  lines(r: never): string[];
}

const f3 = (x: number) => x.toFixed(3);
/** A step count, or that the budget ran out first. */
const stepsOf = (n: number | null, budget: number) => (n === null ? `not within ${budget} step${budget === 1 ? '' : 's'}` : `${n} steps`);

function onlineDemo(method: OnlineDemoMethod): MethodDemo {
  return {
    summary: `${method} with the task judge (reports win_rate_vs_start)`,
    run: (o) => runOnlineDemo({ ...o, method }),
    lines: (r: OnlineDemoResult) => [
      `method ${r.method} in ${r.seconds}s`,
      `win-rate of the final policy's samples vs the starting policy's on ${r.heldout_prompts} held-out prompts: ${f3(r.win_rate_vs_start)}`,
      `win-rate on the training prompts (fresh samples): ${f3(r.win_rate_vs_start_train_prompts)}`,
      `correct answers, held-out prompts: ${f3(r.heldout_accuracy_start)} → ${f3(r.heldout_accuracy_final)}; training prompts: ${f3(r.train_accuracy_start)} → ${f3(r.train_accuracy_final)}`,
      `run folder: ${r.run} (try: npx prefzoo report ${r.run})`,
    ],
  };
}

function agentLines(task: string): (r: AgentDemoResult) => string[] {
  return (r) => [
    `method grpo ${task}, ${r.steps} steps in ${r.seconds}s`,
    `episodes solved among ${r.samples_per_prompt} rollouts per held-out prompt (${r.heldout_prompts} prompts): ${f3(r.heldout_accuracy_start)} → ${f3(r.heldout_accuracy_final)}`,
    `the trained policy without the information (${r.method === 'env' ? 'the feedback withheld' : r.method === 'agent' ? 'its tool reading a random table' : 'the tool answering a random digit'}): ${f3(r.ceiling_without_tools)}`,
    `tool calls per rollout: ${f3(r.tool_call_frequency_final)}; turns per rollout: ${f3(r.num_turns_final)}`,
    `run folder: ${r.run} (try: npx prefzoo report ${r.run})`,
  ];
}

export const METHOD_DEMOS: Record<string, MethodDemo> = {
  sppo: onlineDemo('sppo'),
  nash_md: onlineDemo('nash_md'),
  mpo: onlineDemo('mpo'),
  grpo: {
    summary: 'GRPO with the accuracy reward (reports heldout_accuracy_start/final)',
    run: runGrpoDemo,
    lines: (r: GrpoDemoResult) => [
      `method grpo (reward: accuracy), ${r.steps} steps in ${r.seconds}s`,
      `right answers among ${r.samples_per_prompt} samples per held-out prompt (${r.heldout_prompts} prompts): ${f3(r.heldout_accuracy_start)} → ${f3(r.heldout_accuracy_final)}`,
      `mean training reward, first → last five logged steps: ${f3(r.reward_mean_start)} → ${f3(r.reward_mean_final)}`,
      `run folder: ${r.run} (try: npx prefzoo report ${r.run})`,
    ],
  },
  distill: {
    summary: 'on-policy distillation (distill, lmbda=1, beta=0) of a trained teacher into a smaller student, against GRPO from the same start: steps each takes to 0.9 × the teacher\'s held-out accuracy (reports teacher_accuracy, student_accuracy_start/final, distill_steps, grpo_steps; --param settings go to the distill run)',
    run: runDistillDemo,
    lines: (r: DistillDemoResult) => [
      `method distill (on-policy, lmbda=1, beta=${r.beta}) against grpo (reward: accuracy) from the same start, in ${r.seconds}s`,
      `right answers among ${r.samples_per_prompt} samples per held-out prompt (${r.heldout_prompts} prompts): teacher ${f3(r.teacher_accuracy)} (${r.teacher_parameters.toLocaleString('en-US')} parameters); student (${r.student_parameters.toLocaleString('en-US')} parameters) ${f3(r.student_accuracy_start)} → ${f3(r.student_accuracy_final)}`,
      `steps to ${f3(r.target_accuracy)} (${r.target_share} × the teacher's; evaluated every ${r.eval_every} steps): distill ${stepsOf(r.distill_steps, r.distill_budget)}, grpo ${stepsOf(r.grpo_steps, r.grpo_budget)}${r.distill_steps !== null && r.grpo_steps !== null ? ` (GRPO ${(r.grpo_steps / r.distill_steps).toFixed(1)}× as many)` : ''}`,
      `run folder: ${r.run} (try: npx prefzoo report ${r.run}); the GRPO run beside it`,
    ],
  },
  tools: {
    summary: 'GRPO with an in-process tool: a lookup whose answer only the tool knows (reports heldout_accuracy_start/final, ceiling_without_tools)',
    run: runToolsDemo,
    lines: agentLines('with the tool get(k) (look up a key in a table drawn per prompt)'),
  },
  env: {
    summary: 'GRPO with an environment: guess 1–7 in 3 guesses with higher/lower feedback (reports heldout_accuracy_start/final, ceiling_without_tools)',
    run: runEnvDemo,
    lines: agentLines('with the environment "guess 1–7 in 3 guesses"'),
  },
  agent: {
    summary: 'GRPO --agent: an agent written with the Vercel AI SDK (generateText, a tool, a step limit; no prefzoo import) trained through the run\'s OpenAI-compatible endpoint on the tools task (reports heldout_accuracy_start/final, ceiling_without_tools)',
    run: runAgentDemo,
    lines: agentLines('--agent src/demos/lookup-agent.mjs (an AI SDK agent with the tool get(k), through the endpoint)'),
  },
};
