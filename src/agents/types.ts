/**
 * The agent vocabulary: tools written in TypeScript or JavaScript, environments, and what one tool
 * call leaves behind for the metrics. The chat types themselves (`Message`, `ToolCall`, `ToolSpec`)
 * live in src/chat.ts, shared with datasets and the tokenizer.
 */
import type { Message, ToolCall, ToolSpec } from '../chat.ts';
import type { SeededRandom } from '../random.ts';

/** What a tool's `run` receives beside its arguments. Everything here is a function of the seed. */
export interface ToolContext {
  /** A generator for this call alone: derived from the rollout's seed, its turn and the call's index. */
  rng: SeededRandom;
  /** The episode's seed (the same for the G members of a group): rebuild per-episode state from it. */
  seed: number;
  /** The prompt row the rollout answers, with its extra columns. */
  row: Record<string, unknown>;
  /** 0-based assistant turn and 0-based index of the call within that turn. */
  turn: number;
  call: number;
  /** Aborted when the call runs past `tool_timeout` or the run stops: a tool that waits should listen. */
  signal: AbortSignal;
  /** One object per rollout, shared by every call of it: state a tool keeps across turns. */
  state: Record<string, unknown>;
  /** The id of the call, when the template gives ids (AI SDK tools read it as `toolCallId`). */
  toolCallId?: string;
}

/**
 * What a tool may return: a string (the tool message's content), any JSON value (stringified), an
 * `Error` (a failure, its message shown to the model), or an MCP-shaped result
 * `{ content: [{ type: 'text', text }], isError? }`.
 */
export type ToolOutput = unknown;

/** A tool with a JSON Schema for its arguments, as `--tools` modules export them. */
export interface ToolDef<A = Record<string, unknown>> {
  name: string;
  description?: string;
  /** JSON Schema of the arguments object. */
  parameters: Record<string, unknown>;
  run(args: A, ctx: ToolContext): ToolOutput | Promise<ToolOutput>;
}

/**
 * A tool in the Vercel AI SDK's shape (`tool({ description, inputSchema, execute })`): `inputSchema`
 * a zod schema (or `parameters`, the SDK's older name), `execute(args, { toolCallId, messages,
 * abortSignal })`. Its export name is its tool name unless it carries `name`.
 */
export interface ZodToolDef {
  name?: string;
  description?: string;
  inputSchema?: unknown;
  parameters?: unknown;
  execute(args: never, options: { toolCallId: string; messages: Message[]; abortSignal: AbortSignal } & ToolContext): unknown;
}

/**
 * What `Environment.reset` gives the rollout: the prompt (replacing the row's: a string is one user
 * message), opening messages (appended to the prompt) and tools. `reset` may also return the prompt
 * alone, as a string (TRL's `reset` returning the prompt).
 */
export interface EnvironmentStart {
  /** The episode's prompt; required when the row has none (no --prompts, or a row without a prompt column). */
  prompt?: string | Message[];
  messages?: Message[];
  /** Tools this episode offers, rendered by the template; the environment answers their calls in `step`. */
  tools?: (ToolSpec | ToolDef)[];
}

/** One assistant turn as the environment sees it. */
export interface EnvironmentAction {
  text: string;
  toolCalls: ToolCall[];
}

/** The environment's answer to a turn: messages to append (user, tool), a reward so far, and whether the episode ended. */
export interface EnvironmentStep {
  messages: Message[];
  reward?: number;
  done: boolean;
}

/**
 * A game or simulator whose state changes each turn. One instance per rollout, made by the module's
 * factory; `reset` is given the episode's seed, the same for the G members of a group, so that they
 * start from the same state. Randomness only from that seed keeps a resumed run bit-exact.
 */
export interface Environment {
  reset(row: Record<string, unknown>, options: { seed: number }): EnvironmentStart | string | Promise<EnvironmentStart | string>;
  step(action: EnvironmentAction): EnvironmentStep | Promise<EnvironmentStep>;
  /** The episode's reward once it ended (logged as `rewards/env/mean`). */
  reward?(): number | null | Promise<number | null>;
  close?(): void | Promise<void>;
}

/** An `--env` module's export: a function (or class) making a fresh Environment per rollout. */
export type EnvironmentFactory = () => Environment | Promise<Environment>;

/** An `--env` module's map of factories by name; a prompt row picks one by its `environment` column (env_column). */
export type EnvironmentFactories = Readonly<Record<string, EnvironmentFactory | (new () => Environment)>>;

/** Where a rollout stands when it calls tools; the executor derives seeds and journal keys from it. */
export interface RolloutContext {
  /** The prompt row. */
  row: Record<string, unknown>;
  /** The episode seed (same for a group's members; see `episodeSeed`). */
  seed: number;
  /** The optimizer step the rollout is collected for (journal key). */
  step: number;
  /** The rollout's index within the step's batch (journal key; unique within the step). */
  rollout: number;
  /** 0-based assistant turn. */
  turn: number;
  /** The run's signal: aborting it stops the round with an AbortedError. */
  signal?: AbortSignal;
  /**
   * Per-rollout tool state (ToolContext.state). When absent the executor keeps one per (step,
   * rollout), the same across the rollout's turns, dropped once a later step calls.
   */
  state?: Record<string, unknown>;
  /** The prompt's `file:line`, named in the one line a dead MCP server or a throwing environment stops the run with. */
  where?: string;
}

/** One executed call, for the metrics. */
export interface CallRecord {
  name: string;
  ok: boolean;
  /** What went wrong, as the model was told it. */
  error?: string;
  /** Wall time of the call in milliseconds (0 when replayed from the journal). */
  ms: number;
  /** True when the result came from the journal of an earlier attempt at this step. */
  replayed?: boolean;
}

/** One assistant turn's calls answered: the tool messages to append, in call order, and one record per call. */
export interface ToolRound {
  messages: Message[];
  records: CallRecord[];
}
