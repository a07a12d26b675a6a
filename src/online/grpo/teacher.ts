/**
 * Teacher-guided RL (`grpo --teacher T`, DGPO's guidance during policy optimization): the `grpo`
 * loss adds distill_coef × the k3 estimate of KL(π_θ ‖ π_teacher) on every sampled token, GRPO's KL
 * term with the teacher in the reference's place (losses/grpo.ts), beside the reference's (beta) when
 * both are on. The teacher scores the round's completions as the reference does — a
 * `ReferenceScorer` over the teacher's weights, the logits divided by the sampling temperature, the
 * distribution over the tokenizer's ids — and its log-probs travel in the round (`GrpoRound.teacher`),
 * so a checkpoint inside a round (num_iterations > 1) carries them and --resume is exact.
 */
import { UserError } from '../../errors.ts';
import { loadTokenizer } from '../../tokenize/index.ts';
import { TeacherSpec } from '../../train/teacher-model.ts';
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

/**
 * The run's teacher, checked (train/teacher-model.ts): a model folder with the policy's tokenizer, or
 * with `--teacher-ref` and `teacher_weight` an AlignDistil pair; a reference or a weight without a
 * teacher, and a weight without a reference, are refused in one line. null without `--teacher`.
 */
export function checkTeacher(o: { teacher?: string; teacherRef?: string; model: string }, weight: number | undefined): TeacherSpec | null {
  if (o.teacher === undefined) {
    if (o.teacherRef !== undefined) throw new UserError(`--teacher-ref ${o.teacherRef}: the reference of an AlignDistil teacher; give --teacher (the DPO model) too`, { setting: 'teacher_ref' });
    if (weight !== undefined) throw new UserError(`teacher_weight=${weight}: weighs an AlignDistil teacher; give --teacher and --teacher-ref, or leave teacher_weight out`, { setting: 'teacher_weight' });
    return null;
  }
  const spec = TeacherSpec.of(o.teacher, o.teacherRef, weight);
  spec.checkTokenizer(o.model, loadTokenizer(o.model), 'grpo --teacher scores the sampled completions, reading');
  return spec;
}

/** The teacher's scorer: its own weights (or the AlignDistil pair's combined logits), the policy's temperature and vocabulary. */
export async function openTeacher(spec: TeacherSpec, ctx: OnlineContext, temperature: number): Promise<ReferenceScorer> {
  const t = spec.load();
  const limit = ctx.tok.vocabSize;
  if (t.config.vocab_size < limit) {
    throw new UserError(`--teacher ${spec.dir}: ${t.config.vocab_size} embedding rows, fewer than the ${limit} ids of the tokenizer the policy samples from`, { setting: 'teacher' });
  }
  return ReferenceScorer.forModel(t, runtimeOf(ctx.config, t.config), { temperature, vocabLimit: limit });
}
