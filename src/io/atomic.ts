/**
 * Atomic writes, so that a failure leaves nothing behind: every output goes to a temporary name
 * (`.NAME.tmp-PID-RAND` beside it) and is renamed into place only once complete; temporaries are
 * removed on any error, on Ctrl-C / SIGTERM, and, after a kill -9 (which nothing can catch), by the
 * next run that writes into the same folder (a temporary whose process is gone is stale). File
 * system errors (a full disk, a read-only folder) become one-line messages naming the file.
 */
import * as fs from 'node:fs';
import * as path from 'node:path';
import { UserError } from '../errors.ts';

/** Temporaries of this process (files or folders) and temp-name stems whose files are temporaries. */
const live = new Set<string>();

/** `.NAME.tmp-PID-RAND` beside `file` (a folder works the same way); removed on signals until released. */
export function tempPath(file: string): string {
  const rand = Math.random().toString(36).slice(2, 8);
  const tmp = path.join(path.dirname(file), `.${path.basename(file)}.tmp-${process.pid}-${rand}`);
  live.add(tmp);
  return tmp;
}

/** Forgets a temporary: it was renamed into place or removed. */
export function releaseTemp(tmp: string): void {
  live.delete(tmp);
}

/** Removes a temporary (file or folder) and forgets it. */
export function removeTemp(tmp: string): void {
  fs.rmSync(tmp, { recursive: true, force: true });
  live.delete(tmp);
}

/** Removes every temporary of this process now (signal handlers; the worker threads' files by stem). */
export function removeAllTemps(): void {
  for (const t of live) {
    try {
      const dir = path.dirname(t);
      const stem = path.basename(t);
      for (const f of fs.readdirSync(dir)) if (f === stem || f.startsWith(`${stem}.`)) fs.rmSync(path.join(dir, f), { recursive: true, force: true });
    } catch {
      // the folder itself is gone
    }
  }
  live.clear();
}

const TEMP_NAME = /^\..+\.tmp-(\d+)-[a-z0-9]+(\.\d+)?$/;

function alive(pid: number): boolean {
  if (pid === process.pid) return true;
  try {
    process.kill(pid, 0);
    return true;
  } catch (e) {
    return (e as NodeJS.ErrnoException).code === 'EPERM';
  }
}

/**
 * Removes the temporaries in `dir` (and, with `deep`, its subfolders) that a process which no
 * longer runs left behind (a kill -9, a power cut). Returns how many were removed.
 */
export function sweepStaleTemps(dir: string, deep = false): number {
  let removed = 0;
  let entries: fs.Dirent[];
  try {
    entries = fs.readdirSync(dir, { withFileTypes: true });
  } catch {
    return 0;
  }
  for (const e of entries) {
    const m = TEMP_NAME.exec(e.name);
    if (m && !alive(Number(m[1]))) {
      fs.rmSync(path.join(dir, e.name), { recursive: true, force: true });
      removed++;
    } else if (deep && e.isDirectory()) {
      removed += sweepStaleTemps(path.join(dir, e.name), true);
    }
  }
  return removed;
}

/** Writes `chunks` to a temporary beside `file`, checks every byte reached the disk, and renames it over `file`. */
export function writeFileAtomic(file: string, chunks: string | Uint8Array | readonly Uint8Array[]): void {
  const list = typeof chunks === 'string' ? [Buffer.from(chunks)] : chunks instanceof Uint8Array ? [chunks] : chunks;
  const tmp = tempPath(file);
  let fd = -1;
  try {
    fd = fs.openSync(tmp, 'wx');
    for (const c of list) {
      let done = 0;
      while (done < c.byteLength) done += fs.writeSync(fd, c, done, c.byteLength - done);
    }
    // A full disk can report itself only when the data is flushed.
    fs.fsyncSync(fd);
    fs.closeSync(fd);
    fd = -1;
    fs.renameSync(tmp, file);
    releaseTemp(tmp);
  } catch (e) {
    if (fd >= 0) {
      try {
        fs.closeSync(fd);
      } catch {
        // already failing
      }
    }
    removeTemp(tmp);
    // Name the file being written, not its temporary; callers writing inside a temporary folder
    // re-name it for their own target (fileError).
    if (isFileError(e)) e.path = file;
    throw e;
  }
}

/** `JSON.stringify(value)` pretty-printed into `file`, atomically. */
export function writeJsonAtomic(file: string, value: unknown): void {
  writeFileAtomic(file, JSON.stringify(value, null, 2) + '\n');
}

/** Appends one line to `file` (metrics logs), checking that all of it was written. */
export function appendLine(file: string, line: string): void {
  try {
    fs.appendFileSync(file, line.endsWith('\n') ? line : line + '\n');
  } catch (e) {
    throw fileError(e, file);
  }
}

const WHAT: Record<string, string> = {
  ENOSPC: 'no space left on the device',
  EDQUOT: 'disk quota exceeded',
  EFBIG: 'file too large for this file system',
  EROFS: 'read-only file system',
  EACCES: 'permission denied',
  EPERM: 'operation not permitted',
  EIO: 'input/output error',
  ENOENT: 'no such file or directory',
  ENOTDIR: 'a part of the path is not a folder',
  EISDIR: 'is a folder, not a file',
  EEXIST: 'already exists',
  EMFILE: 'too many open files',
  ENAMETOOLONG: 'name too long',
  ENOTEMPTY: 'folder not empty',
};

/** Whether `e` is an operating-system file error (it has an errno code this module names). */
export function isFileError(e: unknown): e is NodeJS.ErrnoException {
  return !!e && typeof e === 'object' && typeof (e as NodeJS.ErrnoException).code === 'string' && (e as NodeJS.ErrnoException).code! in WHAT;
}

/**
 * A file-system error as a one-line UserError naming `file` (or the path the system reported):
 * `out/d.parquet: no space left on the device (ENOSPC); nothing was written`. Other errors pass through.
 */
export function fileError(e: unknown, file?: string): unknown {
  if (e instanceof UserError || !isFileError(e)) return e;
  const where = file ?? e.path ?? (e as { dest?: string }).dest ?? '(unknown file)';
  const tail = e.code === 'ENOSPC' || e.code === 'EDQUOT' || e.code === 'EFBIG' ? '; nothing was written (free some space and run again)' : '';
  return new UserError(`${where}: ${WHAT[e.code!]} (${e.code})${tail}`);
}

/** Creates the parent folder of an output file when asked to, or says in one line that it is missing. */
export function checkOutputFolder(file: string, flag: string): void {
  const dir = path.dirname(path.resolve(file));
  let st: fs.Stats | null = null;
  try {
    st = fs.statSync(dir);
  } catch {
    st = null;
  }
  if (!st?.isDirectory()) throw new UserError(`${flag} ${file}: folder ${path.dirname(file)} does not exist; create it first`);
}
