/**
 * Teacher-guided RL (`grpo --teacher T`, DGPO's guidance during policy optimization): the `grpo`
 * loss adds distill_coef × the k3 estimate of KL(π_θ ‖ π_teacher) on every sampled token, GRPO's KL
 * term with the teacher in the reference's place (losses/grpo.ts), beside the reference's (beta) when
 * both are on. The teacher scores the round's completions as the reference does — a
 * `ReferenceScorer` over the teacher's weights, the logits divided by the sampling temperature, the
 * distribution over the tokenizer's ids — and its log-probs travel in the round (`GrpoRound.teacher`),
 * so a checkpoint inside a round (num_iterations > 1) carries them and --resume is exact.
 */
import { existsSync } from 'node:fs';
import { join } from 'node:path';
import { UserError } from '../../errors.ts';
import { loadModel } from '../../models/load.ts';
import { loadTokenizer } from '../../tokenize/index.ts';
import { checkSameTokenizer } from '../../train/teacher-topk.ts';
import { runtimeOf } from '../../train/run.ts';
import type { OnlineContext } from '../../train/loop.ts';
import { ReferenceScorer } from '../reference.ts';

/** distill_coef when `--teacher` is given and distill_coef is not (docs/settings.md, docs/distill.md). */
export const DEFAULT_DISTILL_COEF = 0.1;

/**
 * The loss parameters with distill_coef settled: given a teacher, distill_coef as given or
 * DEFAULT_DISTILL_COEF; without one, distill_coef > 0 is refused (there is nothing to score it).
 */
export function teacherParams(lossParams: Record<string, unknown>, o: { teacher?: string }): Record<string, unknown> {
  const given = lossParams.distill_coef;
  if (o.teacher === undefined) {
    if (given !== undefined && given !== null && Number(given) !== 0) {
      throw new UserError(`grpo: distill_coef=${String(given)} weighs the KL to a teacher: give --teacher, or leave distill_coef out`, { setting: 'distill_coef' });
    }
    return lossParams;
  }
  return given === undefined || given === null ? { ...lossParams, distill_coef: DEFAULT_DISTILL_COEF } : lossParams;
}

/** Refuses a teacher that is no model folder, or whose tokenizer is not the policy's (one line, naming both). */
export function checkTeacher(teacher: string, model: string): void {
  if (!existsSync(join(teacher, 'config.json'))) throw new UserError(`--teacher ${teacher}: not a model folder (no config.json)`, { setting: 'teacher' });
  checkSameTokenizer(teacher, model, loadTokenizer(model), 'grpo --teacher scores the sampled completions, reading');
}

/** The teacher's scorer: its own weights, the policy's temperature and vocabulary. */
export async function openTeacher(dir: string, ctx: OnlineContext, temperature: number): Promise<ReferenceScorer> {
  const t = loadModel(dir);
  const limit = ctx.tok.vocabSize;
  if (t.config.vocab_size < limit) {
    throw new UserError(`--teacher ${dir}: ${t.config.vocab_size} embedding rows, fewer than the ${limit} ids of the tokenizer the policy samples from`, { setting: 'teacher' });
  }
  return ReferenceScorer.create(t.config, t.weights, runtimeOf(ctx.config, t.config), { temperature, vocabLimit: limit });
}
