/**
 * `prefzoo demo --method grpo`: GRPO end to end on a built-in verifiable task, recall the last digit
 * ("4719:" → "9"), with the `accuracy` reward reading each prompt's `answer` column:
 *
 *   1. a tiny llama is initialised and taught to copy a digit by a short SFT on masked prompts: each
 *      shows one digit in its place and dashes for the others ("-7--:" → "7"), so the starting policy
 *      answers a digit of the prompt and stops, with nothing to tell it which position is asked for:
 *      on the real prompts it is right about one time in four, chance among the four digits
 *   2. prompts.jsonl (3,000 prompts with their answers: too many to memorise in the run, so only the
 *      rule pays) and heldout.jsonl (100 others) are written to the run folder; `grpo` trains on the
 *      first with `--reward accuracy`, evaluating on the second
 *   3. held-out accuracy: the share of right answers among num_generations samples (temperature 1)
 *      per held-out prompt, of the starting policy and of the trained one (the same sampler and seed)
 *
 * The run folder keeps the evaluation: demo_eval.json holds the numbers this prints (src/train/demo-eval.ts),
 * eval.json the final evaluation of the run, and metrics.jsonl starts with the starting policy's
 * held-out evaluation (an eval row at step 0), so `prefzoo report RUN/grpo` shows before and after.
 */
import { mkdirSync, mkdtempSync, readFileSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { makeMeta } from '../../datasets/schema.ts';
import type { Example } from '../../datasets/examples.ts';
import { initModelFolder } from '../models/init.ts';
import { SeededRandom } from '../random.ts';
import { runRolloutDtype, writeDemoEval } from '../train/demo-eval.ts';
import { writeFileAtomic } from '../io/atomic.ts';
import type { TrainConfig } from '../train/config.ts';
import { train } from '../train/trainer.ts';
import { recallPrompts, type OnlineDemoOptions } from './online.ts';
import { evaluateRewards, grpo, samplingRollout, type RewardEval } from '../online/grpo/index.ts';
import type { Decoder } from '../models/generate.ts';
import type { LoadedTokenizer } from '../tokenize/index.ts';
import type { Reporter } from '../progress.ts';
import { ModelSampler } from '../online/policy.ts';
import { readPromptRows } from '../online/prompts.ts';
import { loadAllRewards, releaseRewards } from '../online/rewards/index.ts';

/** The online demo's options; `params` are extra settings of the GRPO run (e.g. loss_type=grpo, max_steps=40). */
export type GrpoDemoOptions = Omit<OnlineDemoOptions, 'method'>;

export interface GrpoDemoResult {
  method: 'grpo';
  /** Share of right answers among the samples on the held-out prompts: the starting policy, the trained one. */
  heldout_accuracy_start: number;
  heldout_accuracy_final: number;
  /** Mean training reward over the first and the last five logged steps. */
  reward_mean_start: number;
  reward_mean_final: number;
  heldout_prompts: number;
  samples_per_prompt: number;
  /** The precision the run sampled in (`--param rollout_dtype=q4`); the final evaluation samples the same way. */
  rollout_dtype: string;
  steps: number;
  seconds: number;
  run: string;
}

/**
 * The warm start: SFT on masked prompts ("-7--:" → "7", the digit's place drawn at random), 300 steps.
 * A single digit to copy is a deterministic target, learnt at once, and by content, not by position:
 * with four digits shown, the policy copies one of them, so GRPO starts from a policy whose groups
 * already hold right answers and only has to learn which position is asked for. A random digit of the
 * real prompt as the answer would leave SFT near ln 10, with no rule to learn.
 */
const WARM_START: Partial<TrainConfig> = {
  batch_size: 32, learning_rate: 3e-3, max_steps: 300, warmup_steps: 10, weight_decay: 0, max_grad_norm: 1,
  max_length: 32, max_prompt_length: 16, pad_to_multiple_of: 16, lr_scheduler: 'linear', logging_steps: 50, save_steps: 0,
};

/**
 * GRPO on the task: 16 prompts × 8 completions a step, answers of at most 2 tokens (a digit and the
 * end), 400 steps at learning rate 2e-3 (linear decay) with the k3 KL to the starting policy (β = 0.04,
 * DeepSeek's value). The KL keeps the policy near π_0, whose groups disagree often enough to give a
 * signal; without it a seed can settle on a confident wrong digit, where every group scores the same.
 * Learning rates of 4e-3 and above move the policy's mass off the digits. Seed table: docs/losses.md,
 * "The GRPO demo".
 */
const GRPO_BASE: Partial<TrainConfig> = {
  batch_size: 128, learning_rate: 2e-3, max_steps: 400, warmup_steps: 10, weight_decay: 0, max_grad_norm: 1,
  pad_to_multiple_of: 8, lr_scheduler: 'linear', logging_steps: 10, save_steps: 0,
};
const GRPO_PARAMS = ['num_generations=8', 'max_completion_length=2', 'temperature=1', 'beta=0.04'];
const TRAIN_PROMPTS = 3000;
/** Digits in a prompt (online.ts's recallPrompts), and the warm start's prompts. */
const DIGITS = 4;
const WARM_PROMPTS = 800;

/** The prompt with every digit but the k-th replaced by '-' ("4719:", 1 → "-7--:"). */
export function maskedPrompt(p: string, k: number): string {
  return [...p].map((c, i) => (i === k || i >= DIGITS ? c : '-')).join('');
}
const HELDOUT_PROMPTS = 100;
const EVAL_SAMPLES = 8;

/** The recall-the-last-digit task as the GRPO demo sets it up: its prompt files, π_0 and the held-out evaluation. */
export interface RecallLastTask {
  /** π_0's parameters. */
  parameters: number;
  /** The warm-started π_0 (the SFT run's final/). */
  startDir: string;
  /** prompts.jsonl and heldout.jsonl (prompt and answer columns) in the demo folder. */
  promptsFile: string;
  heldoutFile: string;
  trainPrompts: string[];
  heldout: string[];
  /** The held-out accuracy of a decoder: the share of right answers among EVAL_SAMPLES samples (temperature 1) per held-out prompt, with the evaluation's fixed seed. */
  accuracy(tok: LoadedTokenizer, decoder: Decoder): Promise<RewardEval>;
  /** Lets go of the reward functions the evaluation holds. */
  release(): Promise<void>;
}

/** The task's answer: the prompt's last digit ("4719:" → "9"). */
export const lastDigit = (p: string): string => p[p.length - 2];

/**
 * The task in `dir`: a tiny llama initialised in dir/model and warm-started by SFT on masked prompts
 * (dir/start), prompts.jsonl (3,000) and heldout.jsonl (100 others), and the evaluation.
 */
export async function recallLastTask(dir: string, seed: number, o: { reporter?: Reporter; intro: (parameters: number) => string; warmStartSteps?: number }): Promise<RecallLastTask> {
  const { reporter } = o;
  mkdirSync(dir, { recursive: true });
  const init = initModelFolder(join(dir, 'model'), 'llama', 'tiny', seed);
  reporter?.info(o.intro(init.parameters));
  // Prompts of four distinct digits and a colon; the held-out ones never occur in training.
  const split = new SeededRandom(seed + 17);
  const trainPrompts = recallPrompts(split, TRAIN_PROMPTS);
  const heldout = recallPrompts(split, HELDOUT_PROMPTS, new Set(trainPrompts));

  // π_0 knows the answer format (one digit of the prompt, then the end) and nothing of which digit.
  const rand = new SeededRandom(seed * 13 + 1);
  const formatRows: Example[] = trainPrompts.slice(0, WARM_PROMPTS).map((p) => {
    const k = rand.int(DIGITS);
    return { prompt: maskedPrompt(p, k), responses: [p[k], p[k]] };
  });
  const start = await train({
    model: join(dir, 'model'), data: 'format.jsonl', rows: { kind: 'pairwise', meta: makeMeta('pairwise', 'plain', 'demo'), examples: formatRows, files: [] },
    loss: 'sft', out: join(dir, 'start'), base: { ...WARM_START, seed, ...(o.warmStartSteps ? { max_steps: o.warmStartSteps } : {}) }, reporter, overwrite: true,
  });

  const jsonl = (file: string, prompts: string[]) => {
    writeFileAtomic(file, prompts.map((p) => JSON.stringify({ prompt: p, answer: lastDigit(p) }) + '\n').join(''));
    return file;
  };
  const promptsFile = jsonl(join(dir, 'prompts.jsonl'), trainPrompts);
  const heldoutFile = jsonl(join(dir, 'heldout.jsonl'), heldout);
  const evalSeed = seed * 31 + 7;
  const heldRows = await readPromptRows(heldoutFile);
  const fns = await loadAllRewards(['accuracy']);
  const rollout = samplingRollout({ max_completion_length: 2, temperature: 1, top_k: 0, top_p: 1 });
  return {
    parameters: init.parameters, startDir: start.finalDir, promptsFile, heldoutFile, trainPrompts, heldout,
    accuracy: (tok, decoder) => evaluateRewards(tok, decoder, heldRows, fns, [1], { rollout, n: EVAL_SAMPLES, seed: evalSeed, maxCompletionLength: 2, timeout: 60 }),
    release: () => releaseRewards(fns),
  };
}

/** GRPO's settings on the task (the demo's; `params` after them). */
export function grpoOnRecallLast(seed: number, heldoutFile?: string): { base: Partial<TrainConfig>; params: string[] } {
  return { base: { ...GRPO_BASE, seed, ...(heldoutFile ? { eval_data: heldoutFile } : {}) }, params: GRPO_PARAMS };
}

export async function runGrpoDemo(o: GrpoDemoOptions): Promise<GrpoDemoResult> {
  const t0 = Date.now();
  const dir = o.out ?? mkdtempSync(join(tmpdir(), 'prefzoo-demo-grpo-'));
  const task = await recallLastTask(dir, o.seed, { reporter: o.reporter, intro: (n) => `demo: tiny llama (${n.toLocaleString('en-US')} parameters); method grpo, reward accuracy` });
  const { heldout } = task;

  // The starting policy on the held-out prompts, sampled as the run's own evaluation samples.
  const pi0 = await ModelSampler.load(task.startDir);
  const before = await task.accuracy(pi0.tok, pi0.decoder);
  await pi0.release();
  await task.release();

  const run = join(dir, 'grpo');
  const g = grpoOnRecallLast(o.seed, task.heldoutFile);
  const r = await grpo({
    model: task.startDir, prompts: task.promptsFile, rewards: ['accuracy'], out: run, overwrite: true,
    base: g.base, params: [...g.params, ...(o.params ?? [])], reporter: o.reporter,
  });

  const rows = readFileSync(join(run, 'metrics.jsonl'), 'utf8').trim().split('\n').map((l) => JSON.parse(l) as Record<string, unknown>);
  const trainRewards = rows.filter((x) => x.split === undefined && typeof x.reward === 'number').map((x) => x.reward as number);
  const avg = (xs: number[]) => xs.reduce((a, b) => a + b, 0) / Math.max(xs.length, 1);
  const result: GrpoDemoResult = {
    method: 'grpo',
    heldout_accuracy_start: before.perFunction.accuracy,
    heldout_accuracy_final: r.eval!['rewards/accuracy/mean'] ?? 0,
    reward_mean_start: avg(trainRewards.slice(0, 5)),
    reward_mean_final: avg(trainRewards.slice(-5)),
    heldout_prompts: heldout.length,
    samples_per_prompt: EVAL_SAMPLES,
    rollout_dtype: runRolloutDtype(run),
    steps: r.steps,
    seconds: Math.round((Date.now() - t0) / 100) / 10,
    run,
  };
  // Before and after in the run folder: the starting policy's evaluation as the first metrics row
  // (the report's charts), and demo_eval.json (the report's before → after table).
  const startRow = JSON.stringify({ step: 0, split: 'eval', ...before.metrics });
  writeFileSync(join(run, 'metrics.jsonl'), `${startRow}\n${readFileSync(join(run, 'metrics.jsonl'), 'utf8')}`);
  writeDemoEval(run, {
    demo: 'grpo',
    heldout: `${heldout.length} held-out prompts × ${EVAL_SAMPLES} samples at temperature 1 (recall the last digit; reward: accuracy)`,
    metrics: {
      heldout_accuracy: { before: result.heldout_accuracy_start, after: result.heldout_accuracy_final },
      reward_mean: { before: result.reward_mean_start, after: result.reward_mean_final },
    },
    values: { steps: result.steps, seconds: result.seconds },
  });
  return result;
}
