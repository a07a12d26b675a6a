/**
 * RUN/agent_calls.jsonl: every rollout of an `--agent` run, one JSON line each — its task's place, its
 * seed, reward and error, every call as the endpoint recorded it (prompt ids, completion ids, sampler
 * log-probs, finish reason, the row it went to) and the rows trained on (prompt ids, ids, loss mask).
 * What the model was trained on can be read back id for id; a resumed run rewrites the lines of the
 * steps after its checkpoint.
 */
import { appendFileSync } from 'node:fs';
import { join } from 'node:path';
import type { AgentRollout } from './agent-harness.ts';
import { truncateStepsAfter } from './completions-log.ts';

export const AGENT_LOG = 'agent_calls.jsonl';

export class AgentLog {
  readonly file: string;
  constructor(run: string) {
    this.file = join(run, AGENT_LOG);
  }

  truncateAfter(step: number): void {
    truncateStepsAfter(this.file, step);
  }

  write(step: number, rollouts: readonly AgentRollout[], at: (task: number) => string, rewards: ArrayLike<number>, advantages: ArrayLike<number>): void {
    const lines = rollouts.map((r, i) => {
      const rowOf = new Map<number, number>();
      r.rows.forEach((row, k) => row.calls.forEach((c) => rowOf.set(c, k)));
      return JSON.stringify({
        step,
        rollout: i,
        task: at(r.task),
        reward: Number.isNaN(rewards[i]) ? null : rewards[i],
        advantage: advantages[i],
        ...(r.error ? { error: r.error } : {}),
        calls: r.calls.map((c, k) => ({ prompt_ids: c.promptIds, completion_ids: c.completionIds, logps: c.logps, finish_reason: c.finishReason, row: rowOf.get(k) ?? null })),
        rows: r.rows.map((row) => ({ prompt_ids: row.promptIds, ids: row.ids, loss_mask: row.lossMask })),
      });
    });
    appendFileSync(this.file, lines.map((l) => l + '\n').join(''));
  }
}
