/**
 * RUN/completions.jsonl: every logged round's first prompt's completions with their rewards and
 * advantages (TRL's num_completions_to_print), one JSON line each.
 */
import { appendFileSync, existsSync, readFileSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import type { Text } from '../../../datasets/schema.ts';
import type { Completion } from './rollout.ts';

export class CompletionsLog {
  readonly file: string;
  constructor(
    run: string,
    /** Completions written per logged round (0: none). */
    private readonly show: number,
    /** Whether any of the steps a round starting at `step` feeds is a logged one. */
    private readonly logged: (step: number) => boolean,
  ) {
    this.file = join(run, 'completions.jsonl');
  }

  /** A resumed run writes the lines of the steps after its checkpoint again: those already there go. */
  truncateAfter(step: number): void {
    truncateStepsAfter(this.file, step);
  }

  /** The first `show` completions of a round (its first prompt's, when show ≤ the group size). */
  write(step: number, prompt: Text, completions: readonly Completion[], names: readonly string[], perFunction: readonly Float64Array[], rewards: Float64Array, advantages: Float64Array): void {
    if (this.show === 0 || !this.logged(step)) return;
    const reward = (x: number) => (Number.isNaN(x) ? null : x);
    const lines = Array.from({ length: Math.min(this.show, completions.length) }, (_, k) =>
      JSON.stringify({
        step,
        prompt,
        completion: completions[k].text,
        // A multi-turn rollout: the whole conversation (calls and results), its turns and why it ended.
        ...(completions[k].info.messages ? { messages: completions[k].info.messages, turns: completions[k].info.turns, stop_reason: completions[k].info.stop_reason } : {}),
        rewards: Object.fromEntries(names.map((n, f) => [n, reward(perFunction[f][k])])),
        reward: reward(rewards[k]),
        advantage: advantages[k],
      }),
    );
    appendFileSync(this.file, lines.map((l) => l + '\n').join(''));
  }
}

/** Drops the lines of a per-step JSON-lines log (each with a `step`) after `step`: a resumed run writes them again. */
export function truncateStepsAfter(file: string, step: number): void {
  if (!existsSync(file)) return;
  const keep = readFileSync(file, 'utf8').split('\n').filter((l) => l.trim() && (JSON.parse(l) as { step: number }).step <= step);
  writeFileSync(file, keep.map((l) => l + '\n').join(''));
}
