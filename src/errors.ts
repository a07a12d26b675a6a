/**
 * A mistake the user can fix (bad flag, bad file, bad parameter). The CLI prints its message as one
 * line and exits non-zero; every other error is a bug and keeps its stack trace.
 */
export class UserError extends Error {
  constructor(message: string) {
    super(message);
    this.name = 'UserError';
  }
}

/** Throws a UserError unless `ok`. */
export function check(ok: unknown, message: string): asserts ok {
  if (!ok) throw new UserError(message);
}
