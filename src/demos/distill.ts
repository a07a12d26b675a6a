/**
 * `prefzoo demo --method distill`: on-policy distillation against GRPO from the same start, on the
 * GRPO demo's task (recall the last digit: "4719:" → "9", grpo.ts):
 *
 *   1. the task as the GRPO demo sets it up (recallLastTask): prompts.jsonl, heldout.jsonl and the
 *      student's start π_0, a tiny llama warm-started to copy one digit of the prompt (right about one
 *      time in four, chance among the four digits)
 *   2. the teacher: a llama of the same tokenizer, wider and deeper than the student (TEACHER_SHAPE),
 *      trained by SFT on the training prompts with their answers (the task learnt, not its format)
 *   3. held-out accuracy of the teacher and of π_0: the share of right answers among 8 samples
 *      (temperature 1) per held-out prompt, the GRPO demo's evaluation, same sampler and seed
 *   4. on-policy distillation from π_0 (`distill` with lmbda=1: the student samples, the teacher's top
 *      K grades every sampled token; beta=0, the forward KL, see DISTILL), evaluated every EVAL_EVERY
 *      steps and stopped at the first evaluation reaching the target, 0.9 × the teacher's accuracy:
 *      `distill_steps` is that step (null if not within DISTILL_BUDGET)
 *   5. GRPO from the same π_0 (the GRPO demo's settings, reward accuracy), evaluated and stopped the
 *      same way: `grpo_steps` (null if not within GRPO_BUDGET)
 *
 * The demo folder keeps everything: model/ and start/ (π_0), teacher-model/ and teacher/ (the
 * teacher: teacher/final), distill/ and grpo/ (the two runs, each metrics.jsonl with the demo's
 * evaluations as eval rows), and distill/demo_eval.json, what the demo printed.
 */
import { mkdtempSync, readFileSync } from 'node:fs';
import { writeFileAtomic } from '../io/atomic.ts';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { makeMeta } from '../../datasets/schema.ts';
import type { Example } from '../../datasets/examples.ts';
import { UserError } from '../errors.ts';
import { initModelFolder, type ShapeField } from '../models/init.ts';
import type { Decoder } from '../models/generate.ts';
import { loadTokenizer } from '../tokenize/index.ts';
import { resolveConfig, type TrainConfig } from '../train/config.ts';
import { writeDemoEval } from '../train/demo-eval.ts';
import { distill } from '../train/distill.ts';
import { train } from '../train/trainer.ts';
import { grpo } from '../online/grpo/index.ts';
import { ModelSampler } from '../online/policy.ts';
import { grpoOnRecallLast, lastDigit, recallLastTask, type GrpoDemoOptions, type RecallLastTask } from './grpo.ts';

export interface DistillDemoOptions extends GrpoDemoOptions {
  /** Cut-downs for tests (defaults: the demo's): SFT steps of the teacher (π_0's warm start: warmStartSteps). */
  teacherSteps?: number;
  /** The most steps each method is given to reach the target, and the evaluation's period in steps. */
  distillBudget?: number;
  grpoBudget?: number;
  evalEvery?: number;
  /** The target as a share of the teacher's accuracy (default 0.9). */
  targetShare?: number;
}

export interface DistillDemoResult {
  method: 'distill';
  seed: number;
  /** gkd's beta in the distillation (0: forward KL, the demo's; 1: reverse KL; --param beta=… changes it). */
  beta: number;
  /** Held-out accuracy (share of right answers among the samples): the teacher, the student's start, the distilled student. */
  teacher_accuracy: number;
  student_accuracy_start: number;
  student_accuracy_final: number;
  /** What both methods run to: target_share (0.9) × teacher_accuracy. */
  target_share: number;
  target_accuracy: number;
  /** Optimizer steps on-policy distillation took to reach the target (null: not within distill_budget). */
  distill_steps: number | null;
  /** GRPO's steps from the same start to the same target (null: not within grpo_budget), and its accuracy when it stopped. */
  grpo_steps: number | null;
  grpo_accuracy_final: number;
  distill_budget: number;
  grpo_budget: number;
  /** Both methods are evaluated every eval_every steps: a step count is a multiple of it. */
  eval_every: number;
  teacher_parameters: number;
  student_parameters: number;
  heldout_prompts: number;
  samples_per_prompt: number;
  seconds: number;
  /** The distillation run folder (metrics.jsonl, final/, demo_eval.json): `prefzoo report` takes it; the GRPO run is beside it (../grpo). */
  run: string;
}

/** Rows learnt per step, lengths and logging of the demo's runs (the GRPO demo's sequence lengths). */
const SHORT: Partial<TrainConfig> = { weight_decay: 0, max_grad_norm: 1, max_length: 32, max_prompt_length: 16, pad_to_multiple_of: 16, save_steps: 0 };

/** The teacher: the tiny preset's tokenizer and vocabulary, twice as wide and twice as deep (hidden 128, 4 layers). */
const TEACHER_SHAPE: Partial<Record<ShapeField, number>> = { hidden_size: 128, intermediate_size: 344, num_hidden_layers: 4, num_attention_heads: 4, num_key_value_heads: 2, head_dim: 32 };
/** The teacher's SFT on the task: prompt → its last digit (its loss is below 0.005 by step 150). */
const TEACHER_SFT: Partial<TrainConfig> = { ...SHORT, batch_size: 32, learning_rate: 3e-3, max_steps: 200, warmup_steps: 10, lr_scheduler: 'linear', logging_steps: 50 };
/**
 * On-policy distillation: 128 prompts a step, one sample each of at most 2 tokens (a digit and the
 * end): as many completions a step as GRPO's 16 prompts × 8. The loss is the forward KL (beta=0)
 * from the teacher's top 16 and the rest at every sampled token. The reverse KL (beta=1) is slower
 * here: it cannot raise a token the student gives next to no mass. AdamW with adam_beta1 0.7 (not
 * 0.9) at learning rate 5e-3, constant: with 0.9 the student sat at chance for 8–9 steps after the
 * first on seed 8 and took 13 steps on seed 3, more than a quarter of GRPO's there (docs/distill.md,
 * "Demo", "Seeds 3 and 8").
 */
export const DISTILL: Partial<TrainConfig> = { ...SHORT, batch_size: 128, learning_rate: 5e-3, adam_beta1: 0.7, warmup_steps: 0, lr_scheduler: 'constant', logging_steps: 1 };
export const DISTILL_PARAMS = ['lmbda=1', 'beta=0', 'distill_topk=16', 'max_completion_length=2', 'sampling_temperature=1'];
const DISTILL_BUDGET = 100;
export const GRPO_BUDGET = 400;
const EVAL_EVERY = 5;
const TARGET_SHARE = 0.9;
const EVAL_SAMPLES = 8;

/** Settings the demo sets itself, refused from --param with the reason. */
const FIXED: Record<string, string> = {
  lmbda: 'the demo is on-policy distillation (lmbda=1)',
  max_completion_length: 'the answers are a digit and the end (max_completion_length=2)',
  max_steps: 'distill runs until the target accuracy, within the demo\'s budget',
  num_epochs: 'distill runs until the target accuracy, within the demo\'s budget',
  seed: 'the demo\'s --seed seeds every stage',
};

export async function runDistillDemo(o: DistillDemoOptions): Promise<DistillDemoResult> {
  const t0 = Date.now();
  const params = o.params ?? [];
  // Refused before anything runs: a setting distill does not know or honour (resolveConfig's line), or one the demo fixes.
  const { lossParams } = resolveConfig({ params: [...DISTILL_PARAMS, ...params], base: DISTILL, command: 'distill' });
  for (const p of params) {
    const key = p.split('=')[0].trim();
    if (Object.hasOwn(FIXED, key)) throw new UserError(`--param ${p}: the distill demo sets ${key} itself: ${FIXED[key]}`);
  }
  const distillBudget = o.distillBudget ?? DISTILL_BUDGET;
  const grpoBudget = o.grpoBudget ?? GRPO_BUDGET;
  const evalEvery = o.evalEvery ?? EVAL_EVERY;
  const dir = o.out ?? mkdtempSync(join(tmpdir(), 'prefzoo-demo-distill-'));
  const info = (line: string) => o.reporter?.info(line);

  const task = await recallLastTask(dir, o.seed, {
    reporter: o.reporter, warmStartSteps: o.warmStartSteps,
    intro: (n) => `demo: student a tiny llama (${n.toLocaleString('en-US')} parameters); method distill (on-policy: lmbda=1, beta=${lossParams.beta}) against grpo from the same start`,
  });
  try {
    const teacher = await trainTeacher(dir, o.seed, task, o);
    const teacherAcc = await accuracyOfFolder(task, teacher.finalDir);
    const startAcc = await accuracyOfFolder(task, task.startDir);
    const share = o.targetShare ?? TARGET_SHARE;
    const target = share * teacherAcc;
    info(`demo: teacher trained in ${teacher.seconds.toFixed(1)}s; held-out accuracy: teacher ${teacherAcc.toFixed(3)}, student ${startAcc.toFixed(3)}; target ${target.toFixed(3)} (${share} × the teacher's)`);
    const tok = loadTokenizer(task.startDir);

    /** Evaluates every evalEvery steps and stops at the first evaluation reaching the target; keeps the evaluations. */
    const untilTarget = (curve: { step: number; accuracy: number }[]) => async (step: number, policy: () => Promise<Decoder>) => {
      if (step % evalEvery !== 0) return false;
      const accuracy = (await task.accuracy(tok, await policy())).perFunction.accuracy;
      curve.push({ step, accuracy });
      return accuracy >= target;
    };

    const promptsOnly = distillPrompts(dir, task);
    const distillCurve: { step: number; accuracy: number }[] = [];
    const run = join(dir, 'distill');
    const d = await distill({
      teacher: teacher.finalDir, model: task.startDir, data: promptsOnly, out: run, overwrite: true, reporter: o.reporter,
      base: { ...DISTILL, seed: o.seed, max_steps: distillBudget }, params: [...DISTILL_PARAMS, ...params], until: untilTarget(distillCurve),
    });
    const distillSteps = reached(distillCurve, target);
    info(`demo: distill ${distillSteps === null ? `did not reach ${target.toFixed(3)} within ${distillBudget} steps` : `reached ${target.toFixed(3)} at step ${distillSteps}`} (${d.seconds}s)`);
    const finalAcc = lastAt(distillCurve, d.steps) ?? (await accuracyOfFolder(task, d.finalDir));

    // GRPO from the same start, with the task's reward, to the same target.
    const grpoCurve: { step: number; accuracy: number }[] = [];
    const g = grpoOnRecallLast(o.seed);
    const gr = await grpo({
      model: task.startDir, prompts: task.promptsFile, rewards: ['accuracy'], out: join(dir, 'grpo'), overwrite: true, reporter: o.reporter,
      base: { ...g.base, max_steps: grpoBudget }, params: g.params, until: untilTarget(grpoCurve),
    });
    const grpoSteps = reached(grpoCurve, target);
    info(`demo: grpo ${grpoSteps === null ? `did not reach ${target.toFixed(3)} within ${grpoBudget} steps` : `reached ${target.toFixed(3)} at step ${grpoSteps}`} (${gr.seconds}s)`);
    const grpoFinal = lastAt(grpoCurve, gr.steps) ?? (await accuracyOfFolder(task, gr.finalDir));

    addEvalRows(run, startAcc, distillCurve);
    addEvalRows(join(dir, 'grpo'), startAcc, grpoCurve);
    const result: DistillDemoResult = {
      method: 'distill',
      seed: o.seed,
      beta: Number(lossParams.beta),
      teacher_accuracy: teacherAcc,
      student_accuracy_start: startAcc,
      student_accuracy_final: finalAcc,
      target_share: share,
      target_accuracy: target,
      distill_steps: distillSteps,
      grpo_steps: grpoSteps,
      grpo_accuracy_final: grpoFinal,
      distill_budget: distillBudget,
      grpo_budget: grpoBudget,
      eval_every: evalEvery,
      teacher_parameters: teacher.parameters,
      student_parameters: task.parameters,
      heldout_prompts: task.heldout.length,
      samples_per_prompt: EVAL_SAMPLES,
      seconds: Math.round((Date.now() - t0) / 100) / 10,
      run,
    };
    writeDemoEval(run, {
      demo: 'distill',
      heldout: `${task.heldout.length} held-out prompts × ${EVAL_SAMPLES} samples at temperature 1 (recall the last digit); teacher ${teacherAcc.toFixed(3)}, target ${target.toFixed(3)}`,
      metrics: { heldout_accuracy: { before: startAcc, after: finalAcc } },
      values: {
        teacher_accuracy: teacherAcc, target_accuracy: target,
        ...(distillSteps !== null ? { distill_steps: distillSteps } : {}),
        ...(grpoSteps !== null ? { grpo_steps: grpoSteps } : {}),
        seconds: result.seconds,
      },
    });
    return result;
  } finally {
    await task.release();
  }
}

/** The teacher: a bigger llama with the student's tokenizer, taught the task by SFT (in DIR/teacher; its model in teacher/final). */
export async function trainTeacher(dir: string, seed: number, task: RecallLastTask, o: { reporter?: DistillDemoOptions['reporter']; teacherSteps?: number } = {}): Promise<{ finalDir: string; seconds: number; parameters: number }> {
  const init = initModelFolder(join(dir, 'teacher-model'), 'llama', 'tiny', seed + 1000, {}, TEACHER_SHAPE); // weights of its own, not π_0's seed
  o.reporter?.info(`demo: teacher a llama of hidden ${TEACHER_SHAPE.hidden_size}, ${TEACHER_SHAPE.num_hidden_layers} layers (${init.parameters.toLocaleString('en-US')} parameters), SFT on the task's answers`);
  const rows: Example[] = task.trainPrompts.map((p) => ({ prompt: p, responses: [lastDigit(p), lastDigit(p)] }));
  const t = await train({
    model: join(dir, 'teacher-model'), data: 'teacher.jsonl', rows: { kind: 'pairwise', meta: makeMeta('pairwise', 'plain', 'demo'), examples: rows, files: [] },
    loss: 'sft', out: join(dir, 'teacher'), base: { ...TEACHER_SFT, seed, ...(o.teacherSteps ? { max_steps: o.teacherSteps } : {}) }, reporter: o.reporter, overwrite: true,
  });
  return { finalDir: t.finalDir, seconds: t.seconds, parameters: init.parameters };
}

/** On-policy distillation's data, DIR/distill-prompts.jsonl: the prompts only (KTO-shaped rows: completion and label are placeholders lmbda=1 never reads). */
export function distillPrompts(dir: string, task: RecallLastTask): string {
  const file = join(dir, 'distill-prompts.jsonl');
  writeFileAtomic(file, task.trainPrompts.map((p) => JSON.stringify({ prompt: p, completion: '-', label: true }) + '\n').join(''));
  return file;
}

/** The first evaluated step at or above the target, or null. */
function reached(curve: readonly { step: number; accuracy: number }[], target: number): number | null {
  return curve.find((c) => c.accuracy >= target)?.step ?? null;
}

/** The accuracy evaluated at the run's last step, if it was evaluated there. */
function lastAt(curve: readonly { step: number; accuracy: number }[], step: number): number | null {
  const last = curve[curve.length - 1];
  return last && last.step === step ? last.accuracy : null;
}

/** A model folder's held-out accuracy (the task's evaluation). */
export async function accuracyOfFolder(task: RecallLastTask, dir: string): Promise<number> {
  const m = await ModelSampler.load(dir);
  try {
    return (await task.accuracy(m.tok, m.decoder)).perFunction.accuracy;
  } finally {
    await m.release();
  }
}

/** The demo's evaluations as eval rows of the run's metrics.jsonl (step 0: the start), each after its step's training row. */
function addEvalRows(run: string, start: number, curve: readonly { step: number; accuracy: number }[]): void {
  const file = join(run, 'metrics.jsonl');
  const rows = readFileSync(file, 'utf8').trim().split('\n').map((l) => JSON.parse(l) as { step: number; split?: string });
  const evals = [{ step: 0, accuracy: start }, ...curve].map((c) => ({ step: c.step, split: 'eval', 'rewards/accuracy/mean': c.accuracy }));
  const merged = [...rows, ...evals].map((r, i) => ({ r, i })).sort((a, b) => a.r.step - b.r.step || (a.r.split === 'eval' ? 1 : 0) - (b.r.split === 'eval' ? 1 : 0) || a.i - b.i).map((x) => x.r);
  writeFileAtomic(file, merged.map((r) => JSON.stringify(r) + '\n').join(''));
}
