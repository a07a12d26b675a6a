/** Runs `bin/prefzoo.mjs` as a user would and returns what it printed and its exit code. */
import { execFile } from 'node:child_process';
import { resolve } from 'node:path';
import { promisify } from 'node:util';

export const BIN = resolve(__dirname, '..', '..', 'bin', 'prefzoo.mjs');

const run = promisify(execFile);

export async function prefzoo(...args: string[]): Promise<{ stdout: string; stderr: string; code: number }> {
  try {
    const r = await run(process.execPath, [BIN, ...args], { encoding: 'utf8' });
    return { ...r, code: 0 };
  } catch (e) {
    const err = e as { stdout: string; stderr: string; code: number };
    return { stdout: err.stdout, stderr: err.stderr, code: err.code };
  }
}
