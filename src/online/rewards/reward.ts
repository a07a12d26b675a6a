/**
 * What a reward function is and what a reward kind (one `--reward` prefix) declares. Each kind is one
 * file of this folder and one row of REWARD_KINDS (index.ts).
 */
import type { RuntimeOptions } from '../../runtime/session.ts';
import type { Text } from '../../../datasets/schema.ts';

/** One completion's prompt record: the prompt and the other columns of its row. */
export type RewardRow = Record<string, unknown> & { prompt: Text };

/** What a reward function is given: completions (text), their rows, token counts, and the length limit. */
export interface RewardBatch {
  completions: string[];
  rows: RewardRow[];
  /** Completion lengths in tokens (the policy's own: a tool's tokens are not counted). */
  lengths: number[];
  maxCompletionLength: number;
  /**
   * Per completion of a multi-turn rollout (tools, an environment): its whole conversation, its tool
   * calls, turns and the environment's reward (online/grpo/agent-rollout.ts `AgentRolloutInfo`); a
   * module's function receives it as its third argument. Absent for single-turn completions.
   */
  rollouts?: Record<string, unknown>[];
}

export interface RewardFunction {
  /** The metric name, `rewards/<name>/mean`: the function's own name, never a path. */
  readonly name: string;
  /** Where it comes from, for messages (the `--reward` spec, when it says more than the name). */
  readonly source?: string;
  /** One number per completion, or null: "does not apply" (TRL's None). */
  score(batch: RewardBatch): Promise<(number | null)[]> | (number | null)[];
  /** After a timeout: the function's later answers would be out of step (a program restarts). */
  abandon?(): void;
  /** Whether a failure on the batch may be narrowed down by scoring completions one at a time (default true; false for a program with state). */
  readonly rerunnable?: boolean;
  release?(): Promise<void>;
}

/** A user's reward function: TRL's callable in TypeScript form. */
export type UserRewardFn = (completions: string[], rows: RewardRow[], rollouts?: Record<string, unknown>[]) => (number | null)[] | Promise<(number | null)[]>;

/** A function's answer on one completion is unusable: `index` names the completion. */
export class RowError extends Error {
  constructor(readonly index: number, message: string) {
    super(message);
  }
}

/** What loading a reward may use: the run's device (reward models run where the policy does). */
export interface RewardEnv {
  runtime?: RuntimeOptions;
}

/**
 * A kind of reward: the `--reward` specs it takes, their syntax and one help line, and how a spec
 * becomes reward functions. `S` is the specs' TypeScript type (the library's `RewardSpec` is their union).
 */
export interface RewardKind<S extends string = string> {
  /** The kind's name (the built-ins' functions are named after it). */
  readonly name: string;
  /** How a spec is written, for --help and docs: `format:REGEX`. */
  readonly syntax: string;
  /** One line: what the reward is. */
  readonly help: string;
  /** Whether a `--reward` spec is of this kind. */
  matches(spec: string): spec is S;
  /** The functions the spec names (a module may give several). */
  load(spec: S, env: RewardEnv): Promise<RewardFunction[]> | RewardFunction[];
}

/** A spec's value part after its `prefix:`. */
export const after = (spec: string, prefix: string): string => spec.slice(prefix.length);
