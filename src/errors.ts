/**
 * Errors a user can fix. The CLI prints a UserError's message as one line and exits non-zero; every
 * other error is a bug and keeps its stack trace. Library callers can tell the kinds apart with
 * `instanceof` (or `kind`) and read where the problem is from `file`, `line`, `row` and `setting`
 * when the code that threw knew them.
 */

/** Where a problem is: the file (and its 1-based line or row), or the setting or flag at fault. */
export interface ErrorLocation {
  /** The file at fault (a data file, a model folder's file, a config file). */
  file?: string;
  /** 1-based line of a text file (JSONL, JSON, CSV). */
  line?: number;
  /** 1-based record number where lines do not apply (Parquet, Arrow, CSV rows). */
  row?: number;
  /** The setting (`beta`, `max_steps`) or flag (`--device`) at fault. */
  setting?: string;
}

/** What went wrong, as a machine-readable tag: the class of the error. */
export type UserErrorKind = 'user' | 'bad-input' | 'damaged-file' | 'device-unavailable' | 'aborted';

/**
 * A mistake the user can fix (bad flag, bad file, bad parameter). The subclasses below say which
 * kind; a plain UserError is any other one.
 */
export class UserError extends Error {
  readonly kind: UserErrorKind = 'user';
  declare readonly file?: string;
  declare readonly line?: number;
  declare readonly row?: number;
  declare readonly setting?: string;

  constructor(message: string, where: ErrorLocation = {}) {
    super(message);
    this.name = 'UserError';
    if (where.file !== undefined) this.file = where.file;
    if (where.line !== undefined) this.line = where.line;
    if (where.row !== undefined) this.row = where.row;
    if (where.setting !== undefined) this.setting = where.setting;
  }
}

/** Input that cannot be used as given: a malformed record, an unknown or out-of-range setting, a bad flag. */
export class BadInputError extends UserError {
  override readonly kind = 'bad-input';
  constructor(message: string, where: ErrorLocation = {}) {
    super(message, where);
    this.name = 'BadInputError';
  }
}

/** A file that exists but is damaged: truncated, corrupt, or not the format its name says. */
export class DamagedFileError extends UserError {
  override readonly kind = 'damaged-file';
  constructor(message: string, where: ErrorLocation & { file: string }) {
    super(message, where);
    this.name = 'DamagedFileError';
  }
}

/** An execution provider that cannot run here (no CUDA build, no WebGPU adapter, no float16 shaders). */
export class DeviceUnavailableError extends UserError {
  override readonly kind = 'device-unavailable';
  /** The execution provider asked for: 'webgpu' or 'cuda'. */
  readonly device: string;
  constructor(message: string, device: string) {
    super(message, { setting: 'device' });
    this.name = 'DeviceUnavailableError';
    this.device = device;
  }
}

/** A job stopped through its AbortSignal; outputs are left as they were (temporaries removed). */
export class AbortedError extends UserError {
  override readonly kind = 'aborted';
  constructor(message = 'stopped by its AbortSignal') {
    super(message);
    this.name = 'AbortedError';
  }
}

/** Throws a UserError (a BadInputError) unless `ok`. */
export function check(ok: unknown, message: string, where?: ErrorLocation): asserts ok {
  if (!ok) throw new BadInputError(message, where);
}
