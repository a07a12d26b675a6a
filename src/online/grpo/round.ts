/**
 * A sampled, scored round and its micro-batches: each completion's tokens, whether it counts in the
 * loss, its advantage, and — when the loss reads them — its tokens' old log-probs (the sampling
 * policy's, through the artifacts' eval graph), reference log-probs (the reference scorer's), the
 * teacher's log-probs (`--teacher`, a scorer of the same kind over the teacher's weights) and
 * sampler log-probs (what the decoder drew them with, for the sampler–trainer correction).
 */
import { UserError } from '../../errors.ts';
import type { TrainingArtifacts } from '../../artifacts/training.ts';
import { toOrt, type Feeds } from '../../runtime/session.ts';
import type { MicroBatch } from '../../train/run.ts';
import { collateRows, gatherTokens, type ReferenceScorer } from '../reference.ts';
import type { Columns } from './graph.ts';

/** One round, JSON-serialisable: a checkpoint inside it (num_iterations > 1) stores it. */
export interface GrpoRound {
  promptIds: number[][];
  ids: number[][];
  /** Per completion: 1 when it counts in the loss (0: truncated under mask_truncated_completions). */
  counted: number[];
  /** Per completion, its tokens' loss mask when the rollout masked some out (else null: all count). */
  masks: number[][] | null;
  advantages: number[];
  /** Per completion, its tokens' old / reference / teacher log-probs (only when used). */
  old: number[][] | null;
  ref: number[][] | null;
  /** Absent in rounds checkpointed before `--teacher` existed (read as null). */
  teacher?: number[][] | null;
  /** Per completion, the log-probs its tokens were sampled with (`Completion.logps`; when the correction reads them). */
  sampling: number[][] | null;
  metrics: Record<string, number>;
}

export interface Batching {
  /** Completions per micro-batch. */
  batchSize: number;
  padTo: number;
  padId: number;
}

/**
 * The round's old, reference and teacher log-probs per token, micro-batch by micro-batch, as the
 * columns ask. Every completion token is scored (the full mask); tokens the rollout masked out (tool
 * results, an environment's turns) leave the loss afterwards, in `microBatches`. `ref` scores the
 * reference column (beta > 0), `teacher` the teacher's (distill_coef > 0).
 */
export async function roundLogps(r: GrpoRound, cols: Columns, b: Batching, art: TrainingArtifacts, ref: ReferenceScorer | null, teacher: ReferenceScorer | null = null): Promise<void> {
  if (!cols.old && !cols.ref && !cols.teacher) return;
  const old: number[][] = [];
  const refs: number[][] = [];
  const teachers: number[][] = [];
  const n = r.ids.length;
  for (let at = 0; at < n; at += b.batchSize) {
    const idx = Array.from({ length: Math.min(b.batchSize, n - at) }, (_, k) => at + k);
    const c = collateRows(idx.map((i) => ({ promptIds: r.promptIds[i], ids: r.ids[i] })), b);
    const [rows, T] = c.feeds.input_ids.dims as number[];
    const mask = c.feeds.loss_mask.data as Float32Array;
    if (cols.old) old.push(...gatherTokens((await art.evaluate(c.feeds)).token_logps.data as Float32Array, mask, rows, T));
    if (cols.ref) refs.push(...gatherTokens((await ref!.run(c.feeds)).tokenLogps, mask, rows, T));
    if (cols.teacher) teachers.push(...gatherTokens((await teacher!.run(c.feeds)).tokenLogps, mask, rows, T));
  }
  r.old = cols.old ? old : null;
  r.ref = cols.ref ? refs : null;
  r.teacher = cols.teacher ? teachers : null;
}

/** The inverse of gatherTokens: each completion's token values placed at its loss_mask positions of [B, T]. */
function scatterTokens(perCompletion: number[][], mask: Float32Array, B: number, T: number): Float32Array {
  const out = new Float32Array(B * T);
  for (let b = 0; b < B; b++) {
    let k = 0;
    for (let t = 0; t < T; t++) if (mask[b * T + t] > 0) out[b * T + t] = perCompletion[b][k++];
  }
  return out;
}

/** The round's micro-batches of batchSize completions (every update of the round takes the same ones). */
export function microBatches(r: GrpoRound, cols: Columns, b: Batching): MicroBatch[] {
  const n = r.ids.length;
  // DAPO/CISPO normalise by the completion tokens of the whole round; the loop averages the micro-batches.
  const micro = Math.ceil(n / b.batchSize);
  const trained = (i: number) => (r.masks ? r.masks[i].reduce((a, m) => a + m, 0) : r.ids[i].length);
  const items = r.ids.reduce((a, _, i) => a + trained(i) * r.counted[i], 0) / micro;
  const out: MicroBatch[] = [];
  for (let at = 0; at < n; at += b.batchSize) {
    const idx = Array.from({ length: Math.min(b.batchSize, n - at) }, (_, k) => at + k);
    const c = collateRows(idx.map((i) => ({ promptIds: r.promptIds[i], ids: r.ids[i] })), b);
    const [rows, T] = c.feeds.input_ids.dims as number[];
    const mask = c.feeds.loss_mask.data as Float32Array;
    const feeds: Feeds = {
      input_ids: c.feeds.input_ids,
      attention_mask: c.feeds.attention_mask,
      advantages: toOrt('float32', Float32Array.from(idx, (i) => r.advantages[i]), [rows]),
    };
    if (r.old) feeds.old_token_logps = toOrt('float32', scatterTokens(idx.map((i) => r.old![i]), mask, rows, T), [rows, T]);
    if (r.ref) feeds.ref_token_logps = toOrt('float32', scatterTokens(idx.map((i) => r.ref![i]), mask, rows, T), [rows, T]);
    if (cols.teacher) {
      if (!r.teacher) throw new UserError('grpo: this round was checkpointed without the teacher\'s log-probs (distill_coef > 0 needs them); resume it as it was started', { setting: 'distill_coef' });
      feeds.teacher_token_logps = toOrt('float32', scatterTokens(idx.map((i) => r.teacher![i]), mask, rows, T), [rows, T]);
    }
    if (cols.sampling) feeds.sampling_token_logps = toOrt('float32', scatterTokens(idx.map((i) => r.sampling![i]), mask, rows, T), [rows, T]);
    if (cols.items) feeds.num_items_in_batch = toOrt('float32', Float32Array.of(Math.max(items, 1)), []);
    // The loss mask: truncated completions under mask_truncated_completions leave the loss whole, and
    // tokens the rollout masked (not the policy's own) leave it one by one — after the old and
    // reference (and teacher) log-probs were placed by the full mask.
    const lossMask = r.masks ? scatterTokens(idx.map((i) => r.masks![i]), mask, rows, T) : Float32Array.from(mask);
    idx.forEach((i, k) => {
      if (!r.counted[i]) lossMask.fill(0, k * T, (k + 1) * T);
    });
    feeds.loss_mask = toOrt('float32', lossMask, [rows, T]);
    out.push({ feeds, tokens: c.tokens });
  }
  return out;
}
