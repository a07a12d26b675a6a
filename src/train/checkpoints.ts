/**
 * Which checkpoints a run keeps (`save_total_limit`) and which one is best by an eval metric
 * (`load_best_model_at_end`, `metric_for_best_model`), as Hugging Face's Trainer does: the newest
 * ones stay, the best one is never removed.
 */
import { existsSync, mkdirSync, readdirSync, rmSync } from 'node:fs';
import { join } from 'node:path';
import type { Kind } from '../../datasets/schema.ts';
import { UserError } from '../errors.ts';
import { writeJsonAtomic } from '../io/atomic.ts';
import type { TrainingArtifacts } from '../artifacts/training.ts';
import type { CheckpointState, CheckpointTensor } from '../artifacts/checkpoint.ts';

export const CKPT_DIR = 'checkpoints';

export function stepDir(run: string, step: number): string {
  return join(run, CKPT_DIR, `step-${String(step).padStart(8, '0')}`);
}

/** Complete checkpoints of a run (state.json is written last, then the folder renamed), oldest first. */
export function completeCheckpoints(run: string): string[] {
  const dir = join(run, CKPT_DIR);
  if (!existsSync(dir)) return [];
  return readdirSync(dir)
    .filter((d) => /^step-\d{8}$/.test(d) && existsSync(join(dir, d, 'state.json')))
    .sort()
    .map((d) => join(dir, d));
}

/** The newest complete checkpoint (state.json present: it is written last, then the folder renamed). */
export function lastCheckpoint(run: string): string | null {
  const all = completeCheckpoints(run);
  return all.length ? all[all.length - 1] : null;
}

/**
 * The checkpoint stage of every loop: the parameters, optimizer state and `state` (the loop's data
 * cursor, RNG words, counters) of step `art.step` written atomically to checkpoints/step-N, `best.json`
 * updated, and the checkpoints past `save_total_limit` removed (never the best one).
 */
export async function saveCheckpointAt(
  run: string,
  art: TrainingArtifacts,
  state: Omit<CheckpointState, 'step'>,
  o: { limit: number; best?: Best | null; files?: Record<string, Map<string, CheckpointTensor>> },
): Promise<string> {
  const dir = stepDir(run, art.step);
  mkdirSync(join(run, CKPT_DIR), { recursive: true });
  await art.toHost();
  const best = o.best ?? null;
  art.saveCheckpoint(dir, { ...state, ...(best ? { best } : {}) }, o.files ?? {});
  if (best) writeJsonAtomic(join(run, 'best.json'), best);
  pruneCheckpoints(run, o.limit, best ? stepDir(run, best.step) : null);
  return dir;
}

/** A fault hook for tests: the step whose batch is poisoned so its loss turns NaN (-1: none). */
export function faultStep(): number {
  const v = process.env.PREFZOO_FAULT_NAN_AT_STEP;
  return v ? Number(v) : -1;
}

/**
 * The NaN stop of every loop: the one-line error for a non-finite loss at `step` (the update was
 * not applied), naming the last good checkpoint to resume from. `prefix` names the command.
 */
export function nonFiniteLoss(run: string, art: TrainingArtifacts, loss: number, step: number, prefix = ''): UserError {
  const good = lastCheckpoint(run);
  // Before any update the learning rate cannot be the cause: the inputs to the first step are.
  const advice =
    art.step === 0
      ? 'No update had been applied yet, so the learning rate is not the cause: the starting weights, the reference log-probs or a loss parameter give a non-finite loss.'
      : good
        ? `The last good checkpoint is ${good} (resume with --resume after lowering learning_rate).`
        : 'No checkpoint was written yet (lower learning_rate and start again).';
  return new UserError(`${prefix}loss is ${loss} at step ${step}: stopping without applying the update. ${advice}`);
}

/**
 * Removes complete checkpoints other than the `limit` newest and `keep` (the best one, kept even when
 * older: then limit + 1 remain); 0 keeps all. Returns the folders removed.
 */
export function pruneCheckpoints(run: string, limit: number, keep: string | null = null): string[] {
  if (limit <= 0) return [];
  const all = completeCheckpoints(run);
  const kept = new Set(all.slice(-limit));
  if (keep) kept.add(keep);
  const gone = all.filter((d) => !kept.has(d));
  for (const d of gone) rmSync(d, { recursive: true, force: true });
  return gone;
}

/** The eval metric that decides the best checkpoint, by default the headline metric of the kind. */
export function bestMetricName(kind: Kind, configured: string): string {
  if (configured) return configured.replace(/^eval[_/]/, '');
  return kind === 'pairwise' ? 'accuracy' : kind === 'listwise' ? 'ndcg' : 'roc_auc';
}

/** Higher is better, except for losses. */
export function greaterIsBetter(metric: string): boolean {
  return !/loss$/.test(metric);
}

export interface Best {
  step: number;
  metric: string;
  value: number;
  /** The checkpoint folder, relative to the run folder. */
  checkpoint: string;
}

/** Reads the chosen metric from an eval summary; a name the evaluation does not report is an error. */
export function metricValue(overall: Record<string, number>, metric: string): number {
  const v = overall[metric];
  if (typeof v !== 'number') {
    throw new UserError(`metric_for_best_model: the evaluation reports no "${metric}" (it reports ${Object.keys(overall).join(', ')})`);
  }
  return v;
}

/** Whether `value` beats the best so far (a NaN never does; the first finite value always does). */
export function improves(value: number, best: Best | null, metric: string): boolean {
  if (!Number.isFinite(value)) return false;
  if (!best || !Number.isFinite(best.value)) return true;
  return greaterIsBetter(metric) ? value > best.value : value < best.value;
}
