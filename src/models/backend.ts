/**
 * What the generation loop (generate.ts) asks of the place a decode runs: the CPU
 * (generate-cpu.ts) or WebGPU (generate-device.ts). The loop owns the rows — their tokens, budgets,
 * stops, random streams and which of them decode together — and a backend owns their caches: a
 * batch of rows that step together, and rows parked outside it (paused, waiting for their caller,
 * or waiting for a slot). Rows are named by the loop's ids; a backend serves every part of a
 * mixture of models (Nash-MD's), each with its own cache.
 */

/**
 * The token pick inside the graph: greedy, or a draw with each row's uniform number (no top-k/top-p),
 * with `logprobs` also each drawn token's log-probability under the distribution it was drawn from.
 */
export type PickSpec = { head: 'greedy'; limit: number } | { head: 'sample'; limit: number; temperature: number; logprobs?: boolean };

/**
 * A run's answer for its rows, in their order: the picked tokens (with a `sample` pick that asked for
 * them, their log-probabilities `logps`), or each part's logits `[n, V]` on the host.
 */
export type RunOut = { tokens: ArrayLike<number | bigint>; logps?: ArrayLike<number>; logits?: undefined } | { logits: Float32Array[]; tokens?: undefined };

/** A group of new rows prefilled in one call: their prompts (each row's whole token list). */
export interface PrefillGroup {
  rows: number[];
  prompts: number[][];
  /** Left-pad the prompts to the longest (one run for rows of unequal lengths); otherwise all have one length. */
  pad: boolean;
  /** Slots these rows are expected to need (prompt and budget): the room a new batch reserves. */
  room: number;
}

export interface DecodeBackend {
  /** New rows starting together are best prefilled in one left-padded run (the device: its batch cache is left-padded anyway). */
  readonly padPrefill: boolean;
  /** Whether `pick` can be done inside this backend's graphs (otherwise the loop asks for logits). */
  canPick(pick: PickSpec): boolean;
  /** The rows in the batch, in the order `step` answers them. */
  batchRows(): readonly number[];
  /**
   * Takes rows out of the batch (the rest keep their order): a row with `park(row)` true keeps its
   * cache outside the batch, the others' caches are freed.
   */
  leave(rows: readonly number[], park: (row: number) => boolean): Promise<void>;
  /** Appends parked rows to the batch (their caches move in); `room`: the slots they may need at most, for a batch made now. */
  join(rows: readonly number[], room?: number): Promise<void>;
  /** One token per batch row (`tokens[i]` for `batchRows()[i]`), written into each row's cache. */
  step(tokens: readonly number[], pick: PickSpec | null, uniform: Float64Array | null): Promise<RunOut>;
  /** Feeds a parked row `tokens` in one run (any number of them); the row stays parked. */
  extend(row: number, tokens: readonly number[], pick: PickSpec | null, uniform: Float64Array | null): Promise<RunOut>;
  /**
   * Feeds parked rows `tokens[i]` each (all of one length), as `extend` would row by row, in as few
   * runs as the backend can (rows whose caches have one shape in one); the rows stay parked. Optional.
   */
  extendRows?(rows: readonly number[], tokens: readonly (readonly number[])[], pick: PickSpec | null, uniform: Float64Array | null): Promise<RunOut>;
  /** Prefills new rows into the batch (appended in the group's order). */
  prefill(group: PrefillGroup, pick: PickSpec | null, uniform: Float64Array | null): Promise<RunOut>;
  /** Whether `copy` can keep only the first slots of a cache (a kept prompt's prefix, see `SessionOptions.prefixCache`). */
  readonly copiesPrefix: boolean;
  /**
   * Gives new row `to` a parked copy of row `from`'s cache (`from` in the batch or parked); with
   * `slots`, only its first `slots` slots (rows with no left padding; `copiesPrefix` backends), and
   * room for `room` slots.
   */
  copy(from: number, to: number, slots?: number, room?: number): Promise<void>;
  /** Appends new row `to` to the batch with a copy of row `from`'s cache (`from` in the batch or parked; one copy, not `copy` then `join`). */
  clone(from: number, to: number): Promise<void>;
  /** Frees a parked row's cache. */
  free(row: number): void;
  /** Frees everything. */
  close(): Promise<void>;
}
