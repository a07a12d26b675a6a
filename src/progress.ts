/**
 * What a long job tells its caller while it runs, as one {@link Reporter} built where the job starts
 * (the CLI's draws bars and prints notes on stderr, src/cli/progress.ts; the library's comes from its
 * caller's `progress` and `log`) and passed down, so no library module writes to a terminal or asks
 * whether it should. Without one, a job reports nothing.
 */

/** Named figures shown beside the count (`loss`, `acc`, …). */
export interface ProgressFields {
  [key: string]: string | number;
}

/** One job's progress: `update` after each unit of work (value = units done so far), `stop` at the end. */
export interface ProgressReporter {
  update(value: number, fields?: ProgressFields): void;
  stop(): void;
}

/** Starts the progress of a job named `label` with `total` units of work. */
export type ProgressFactory = (label: string, total: number) => ProgressReporter;

/** The progress of each stage and one-line notes on what the job does ("resuming from step 40"). */
export interface Reporter {
  readonly progress: ProgressFactory;
  readonly info: (line: string) => void;
}

const SILENT_PROGRESS: ProgressReporter = { update() {}, stop() {} };

/** Reports nothing: what a job uses when its caller gives no reporter. */
export const SILENT: Reporter = { progress: () => SILENT_PROGRESS, info: () => {} };

/** A reporter from its parts; a part not given reports nothing. */
export function reporterOf(parts: { progress?: ProgressFactory; info?: (line: string) => void }): Reporter {
  return { progress: parts.progress ?? SILENT.progress, info: parts.info ?? SILENT.info };
}

/** The progress of a job from `factory`, or one that reports nothing when there is none. */
export function startProgress(factory: ProgressFactory | undefined, label: string, total: number): ProgressReporter {
  return factory ? factory(label, total) : SILENT_PROGRESS;
}
