/**
 * Atomic writes: the bytes go to a temporary name next to the target, are flushed, and the temporary
 * file is renamed over the target, so a reader never sees half a file and a crash leaves the old one.
 */
import fs from 'node:fs';
import path from 'node:path';
import { UserError } from '../errors.ts';

/** Writes `chunks` to a temp file next to `file`, flushes it, and renames it over `file`. */
export function writeFileAtomic(file: string, chunks: readonly Uint8Array[]): void {
  const tmp = path.join(path.dirname(file), `.${path.basename(file)}.tmp-${process.pid}-${Math.random().toString(36).slice(2)}`);
  let fd: number;
  try {
    fd = fs.openSync(tmp, 'wx');
  } catch (e) {
    throw new UserError(`${file}: cannot write (${(e as Error).message})`);
  }
  try {
    for (const c of chunks) {
      let done = 0;
      while (done < c.byteLength) done += fs.writeSync(fd, c, done, c.byteLength - done);
    }
    fs.fsyncSync(fd);
    fs.closeSync(fd);
    fs.renameSync(tmp, file);
  } catch (e) {
    try {
      fs.closeSync(fd);
    } catch {
      // already closed
    }
    fs.rmSync(tmp, { force: true });
    throw e;
  }
}

/** Writes `value` as indented JSON (with a final newline) through `writeFileAtomic`. */
export function writeJsonAtomic(file: string, value: unknown): void {
  writeFileAtomic(file, [Buffer.from(JSON.stringify(value, null, 2) + '\n', 'utf8')]);
}
