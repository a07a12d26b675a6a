/**
 * The calls an agent made through the run's endpoint (src/serve: each recorded as sampled — prompt
 * ids, completion ids, the sampler's log-prob of each completion id) become training rows:
 *
 *   - a call whose prompt ids start with a row's prompt + completion ids (every token the row holds)
 *     extends that row: the ids between (the tool results, the next user turn, the template's
 *     headers) enter with mask 0, its completion with mask 1 — one row for the whole conversation;
 *   - a call that extends no row starts a new row of the same rollout (a fork): the agent rewrote or
 *     summarised its history, or the template rendered the sampled turn back differently from how it
 *     was sampled (a re-tokenisation fork: the call's prompt leaves the row inside the row's own
 *     sampled ids or right after them, not inside its prompt).
 *
 * Nothing is re-tokenized: every id of a row is an id the model was prompted with or sampled. The
 * latest row is tried first, then earlier ones (an agent that returns to an earlier branch).
 */

/** One chat call as the endpoint recorded it. */
export interface RecordedCall {
  promptIds: readonly number[];
  /** The sampled ids, the stop id included when one ended the turn. */
  completionIds: readonly number[];
  /** The sampler's log-prob of each completion id (under the distribution it was drawn from). */
  logps: readonly number[];
  /** OpenAI's finish_reason: 'stop', 'tool_calls' or 'length' (cut by max_tokens or the positions). */
  finishReason: string;
}

/** One training row of a rollout: a prompt and the ids after it, masks 1 on sampled ids of trained calls. */
export interface AgentRow {
  promptIds: number[];
  ids: number[];
  lossMask: number[];
  /** Per id of `ids`: the sampler's log-prob (0 where the mask is 0). */
  logps: number[];
  /** Indexes of the calls this row holds, in order. */
  calls: number[];
  /** Whether the row's last call ended on a stop id (false: cut by a token limit). */
  stopped: boolean;
}

export interface RowStats {
  calls: number;
  rows: number;
  /** Calls that extended a row. */
  merged: number;
  /** Calls after the first that started a row of their own. */
  forked: number;
  /** Forks where the call's prompt left the row inside or right after its sampled ids. */
  retokenized: number;
  /** Calls not trained (train_calls) — their ids stay in rows with mask 0. */
  untrained: number;
}

function startsWith(ids: readonly number[], prefix: readonly number[]): boolean {
  if (prefix.length > ids.length) return false;
  for (let i = 0; i < prefix.length; i++) if (ids[i] !== prefix[i]) return false;
  return true;
}

/** How many leading ids two sequences share. */
function commonPrefix(a: readonly number[], b: readonly number[]): number {
  const n = Math.min(a.length, b.length);
  let i = 0;
  while (i < n && a[i] === b[i]) i++;
  return i;
}

/**
 * A rollout's calls, in the order they were made, as rows (see the file's comment). `trained(i)`
 * says whether call i's sampled ids are trained on (mask 1); a row left with no trained id is dropped.
 */
export function rowsOfCalls(calls: readonly RecordedCall[], trained: (i: number) => boolean = () => true): { rows: AgentRow[]; stats: RowStats } {
  const rows: AgentRow[] = [];
  const stats: RowStats = { calls: calls.length, rows: 0, merged: 0, forked: 0, retokenized: 0, untrained: 0 };
  calls.forEach((c, i) => {
    if (c.logps.length !== c.completionIds.length) throw new Error(`agent rows: call ${i} has ${c.logps.length} log-probs for ${c.completionIds.length} ids`);
    const on = trained(i);
    if (!on) stats.untrained++;
    const mask = c.completionIds.map(() => (on ? 1 : 0));
    const logps = c.completionIds.map((_, k) => (on ? c.logps[k] : 0));
    let row: AgentRow | undefined;
    for (let r = rows.length - 1; r >= 0 && !row; r--) {
      const held = rows[r].promptIds.concat(rows[r].ids);
      if (startsWith(c.promptIds, held)) row = rows[r];
    }
    if (row) {
      const bridge = c.promptIds.slice(row.promptIds.length + row.ids.length);
      row.ids.push(...bridge, ...c.completionIds);
      row.lossMask.push(...bridge.map(() => 0), ...mask);
      row.logps.push(...bridge.map(() => 0), ...logps);
      row.calls.push(i);
      row.stopped = c.finishReason !== 'length';
      stats.merged++;
      return;
    }
    if (rows.length > 0) {
      stats.forked++;
      const last = rows[rows.length - 1];
      if (commonPrefix(c.promptIds, last.promptIds.concat(last.ids)) >= last.promptIds.length) stats.retokenized++;
    }
    rows.push({ promptIds: c.promptIds.slice(), ids: c.completionIds.slice(), lossMask: mask, logps, calls: [i], stopped: c.finishReason !== 'length' });
  });
  const kept = rows.filter((r) => r.lossMask.some((m) => m === 1));
  stats.rows = kept.length;
  return { rows: kept, stats };
}

/**
 * Per rollout, the factor its rows' advantages are multiplied by so that the loss weighs each rollout
 * once however many rows it made (Agent Lightning's per_rollout_mean): (R / N) / k for a rollout of k
 * rows, R rows and N rollouts with rows in the round. The policy-gradient term of every `grpo`
 * loss_type is linear in the advantage (its clip acts on the ratio, its masks on the sign), so a row
 * scaled by 1/k counts as 1/k of a row; R / N turns the loss's mean over rows into a mean over
 * rollouts. With one row a rollout every factor is 1: plain GRPO.
 */
export function perRolloutScale(rowsPerRollout: readonly number[]): number[] {
  const R = rowsPerRollout.reduce((a, k) => a + k, 0);
  const N = rowsPerRollout.filter((k) => k > 0).length;
  return rowsPerRollout.map((k) => (k > 0 ? R / N / k : 0));
}
