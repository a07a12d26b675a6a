/**
 * Progress of long jobs as a callback: the library reports steps through a `ProgressFactory` that its
 * caller passes in (the CLI's draws a bar, src/cli/progress.ts), so no library module writes to a
 * terminal. Without one, a job reports nothing.
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

const SILENT: ProgressReporter = { update() {}, stop() {} };

/** The reporter of a job: from `factory` when one is given and the job is not quiet, else one that reports nothing. */
export function startProgress(factory: ProgressFactory | undefined, label: string, total: number, quiet = false): ProgressReporter {
  return factory && !quiet ? factory(label, total) : SILENT;
}
