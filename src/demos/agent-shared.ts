/**
 * What the two agent demos share (`prefzoo demo --method tools`, tools.ts; `--method env`,
 * env.ts): their result, the held-out evaluation of a model folder through the multi-turn
 * rollout (the one GRPO trains with, agent-rollout.ts), and how the figures are kept in the run
 * folder. Each demo brings its task, its warm start and its GRPO settings.
 */
import { readFileSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { makeMeta } from '../../datasets/schema.ts';
import type { Example } from '../../datasets/examples.ts';
import type { TrainConfig } from '../train/config.ts';
import { runRolloutDtype, writeDemoEval } from '../train/demo-eval.ts';
import { train, type TrainResult } from '../train/trainer.ts';
import type { OnlineDemoOptions } from './online.ts';
import { agentRollout, evaluateRewards, type AgentRolloutSettings, type AgentSources } from '../online/grpo/index.ts';
import { ModelSampler } from '../online/policy.ts';
import type { PromptRow } from '../online/prompts.ts';
import type { RewardFunction } from '../online/rewards/index.ts';

export interface AgentDemoOptions extends Omit<OnlineDemoOptions, 'method'> {
  /** Held-out prompts (episodes per sample slot) to evaluate on; tests shorten it. */
  heldoutPrompts?: number;
}

export interface AgentDemoResult {
  method: 'tools' | 'env' | 'agent';
  /** Share of solved episodes among the samples of the held-out prompts: the starting policy, the trained one. */
  heldout_accuracy_start: number;
  heldout_accuracy_final: number;
  /**
   * The trained policy, evaluated the same way with the information withheld: the tool answering
   * nothing useful, or the environment's feedback replaced by a word that tells nothing.
   */
  ceiling_without_tools: number;
  /** Tool calls per rollout (TRL's tools/call_frequency) in the final evaluation; 0 where the task has no tool. */
  tool_call_frequency_final: number;
  /** Assistant turns per rollout in the final evaluation (num_turns/mean). */
  num_turns_final: number;
  heldout_prompts: number;
  samples_per_prompt: number;
  /** The precision the GRPO run sampled its rollouts in (`--param rollout_dtype=q4`); the held-out evaluations sample the saved models in f32. */
  rollout_dtype: string;
  steps: number;
  seconds: number;
  /** The GRPO run folder (metrics.jsonl, final/, demo_eval.json): `prefzoo report` takes it. */
  run: string;
}

/**
 * The agent demos run ONNX Runtime on one thread (warm start, GRPO, evaluations). Their models are
 * so small that the time goes to per-operator overheads, not arithmetic: the tools demo took the same
 * wall time on one thread as on two (52.0 s against 52.3 s, cut to 30 GRPO steps; docs/agents.md) while
 * using half the CPU, which leaves the other core to whatever runs beside it.
 */
export const DEMO_THREADS = 1;

/** Rollouts per held-out prompt in the demos' evaluations (their groups in training may be larger). */
export const EVAL_SAMPLES = 8;

/** What the demos' warm starts share (SFT, 32 rows a step); each adds its steps and lengths. */
export const WARM_START_BASE: Partial<TrainConfig> = {
  batch_size: 32, learning_rate: 3e-3, warmup_steps: 10, weight_decay: 0, max_grad_norm: 1,
  pad_to_multiple_of: 16, lr_scheduler: 'linear', logging_steps: 50, save_steps: 0, threads: DEMO_THREADS,
};

/** What the demos' GRPO runs share (128 rollouts a step); each adds its learning rate and steps. */
export const GRPO_BASE: Partial<TrainConfig> = {
  batch_size: 128, warmup_steps: 10, weight_decay: 0, max_grad_norm: 1,
  pad_to_multiple_of: 8, lr_scheduler: 'linear', logging_steps: 10, save_steps: 0, threads: DEMO_THREADS,
};

/** One held-out evaluation: the reward's mean and the run's agent metrics (tools/…, num_turns/…). */
export interface AgentEval {
  accuracy: number;
  metrics: Record<string, number>;
}

/**
 * Evaluates the model in `dir` on `rows`: n multi-turn rollouts per prompt at the run's sampling
 * settings, scored by `reward`. The starting, final and ceiling figures are all drawn with the same
 * `seed`, so they meet the same episodes (tables, secret numbers) and the same random streams.
 */
export async function evaluateAgent(
  dir: string, rows: readonly PromptRow[], s: AgentRolloutSettings, sources: AgentSources, reward: RewardFunction, o: { n: number; seed: number },
): Promise<AgentEval> {
  const policy = await ModelSampler.load(dir, { threads: DEMO_THREADS });
  try {
    const r = await evaluateRewards(policy.tok, policy.decoder, rows, [reward], [1], { rollout: agentRollout(s, sources), n: o.n, seed: o.seed, step: -1, maxCompletionLength: s.max_completion_length, timeout: 60 });
    return { accuracy: r.perFunction[reward.name], metrics: r.metrics };
  } finally {
    await policy.release();
  }
}

/** The warm start: SFT (assistant tokens only) of DIR/model on single rows, into DIR/start; `warmStartSteps` (tests) overrides the steps. */
export function warmStart(dir: string, data: string, examples: Example[], config: Partial<TrainConfig>, o: AgentDemoOptions): Promise<TrainResult> {
  return train({
    model: join(dir, 'model'), data, rows: { kind: 'single', meta: makeMeta('single', 'messages', 'demo'), examples, files: [] },
    loss: 'sft', out: join(dir, 'start'), base: { ...config, seed: o.seed, ...(o.warmStartSteps !== undefined ? { max_steps: o.warmStartSteps } : {}) },
    reporter: o.reporter, overwrite: true,
  });
}

/**
 * A demo's result from its three evaluations (the starting policy, the trained one, the trained one
 * with the information withheld), kept in the run folder (keepAgentDemoEval) before it is returned.
 */
export function finishAgentDemo(
  method: AgentDemoResult['method'], evals: { before: AgentEval; after: AgentEval; ceiling: AgentEval },
  o: { heldoutPrompts: number; steps: number; t0: number; run: string; heldout: string },
): AgentDemoResult {
  const result: AgentDemoResult = {
    method,
    heldout_accuracy_start: evals.before.accuracy,
    heldout_accuracy_final: evals.after.accuracy,
    ceiling_without_tools: evals.ceiling.accuracy,
    tool_call_frequency_final: evals.after.metrics['tools/call_frequency'] ?? 0,
    num_turns_final: evals.after.metrics['num_turns/mean'] ?? 0,
    heldout_prompts: o.heldoutPrompts,
    samples_per_prompt: EVAL_SAMPLES,
    rollout_dtype: runRolloutDtype(o.run),
    steps: o.steps,
    seconds: Math.round((Date.now() - o.t0) / 100) / 10,
    run: o.run,
  };
  keepAgentDemoEval(o.run, result, evals.before, evals.after, o.heldout);
  return result;
}

/**
 * Keeps the figures in the run folder: the starting and final evaluations as the first and last
 * metrics rows (the report's charts, under the run's metric names) and RUN/demo_eval.json (the
 * report's table).
 */
function keepAgentDemoEval(run: string, r: AgentDemoResult, start: AgentEval, final: AgentEval, heldout: string): void {
  const file = join(run, 'metrics.jsonl');
  const row = (step: number, e: AgentEval) => JSON.stringify({ step, split: 'eval', ...e.metrics });
  writeFileSync(file, `${row(0, start)}\n${readFileSync(file, 'utf8')}${row(r.steps, final)}\n`);
  writeDemoEval(run, {
    demo: r.method,
    heldout,
    metrics: { heldout_accuracy: { before: r.heldout_accuracy_start, after: r.heldout_accuracy_final } },
    values: { ceiling_without_tools: r.ceiling_without_tools, tool_call_frequency_final: r.tool_call_frequency_final, num_turns_final: r.num_turns_final, steps: r.steps, seconds: r.seconds },
  });
}

/** Notes each stage's process CPU seconds since the last call (the demos' budget is in CPU time). */
export function cpuLaps(log: (line: string) => void): (stage: string) => void {
  let last = process.cpuUsage();
  return (stage) => {
    const now = process.cpuUsage();
    log(`demo: ${stage} ${((now.user + now.system - last.user - last.system) / 1e6).toFixed(1)} CPU s`);
    last = now;
  };
}
