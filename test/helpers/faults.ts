/**
 * Fault injection for the CLI tests: run `prefzoo` as a user would, kill it with SIGKILL at a
 * chosen moment, give it a disk that fills up, and check what it leaves behind.
 */
import { spawn, spawnSync, type SpawnSyncReturns } from 'node:child_process';
import { existsSync, mkdirSync, readdirSync, rmSync, statfsSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { BIN } from './cli.ts';
import { expect } from 'vitest';

/** cli.ts's path of the command; these runs need a synchronous form with env, cwd and a shell prefix. */
export const bin = BIN;

export type Result = SpawnSyncReturns<string>;

/** Runs `prefzoo ARGS` (optionally under a shell prefix such as a file-size limit). */
export function cli(args: string[], o: { env?: Record<string, string>; cwd?: string; prefix?: string } = {}): Result {
  const env = { ...process.env, ...o.env };
  if (o.prefix) return spawnSync('sh', ['-c', `${o.prefix}; exec "$0" "$@"`, process.execPath, bin, ...args], { encoding: 'utf8', env, cwd: o.cwd });
  return spawnSync(process.execPath, [bin, ...args], { encoding: 'utf8', env, cwd: o.cwd });
}

/**
 * A failed command as the project promises it: exit 1, and stderr's last line is one
 * `prefzoo: …` message matching `pattern`, with no stack trace anywhere. Returns that line.
 */
export function expectOneLineError(r: Result, pattern: RegExp): string {
  expect(r.status, `stdout: ${r.stdout}\nstderr: ${r.stderr}`).toBe(1);
  expect(r.stderr).not.toMatch(/^\s+at /m);
  expect(r.stderr).not.toMatch(/RuntimeError|Error: /);
  const last = r.stderr.trim().split('\n').pop()!;
  expect(last).toMatch(/^prefzoo: /);
  expect(last).toMatch(pattern);
  return last;
}

/** Every path under `dir` whose name marks a temporary (`.NAME.tmp-PID-RAND`, `x.tmp`, `x.tmp-PID`). */
export function temporaries(dir: string): string[] {
  if (!existsSync(dir)) return [];
  const out: string[] = [];
  for (const e of readdirSync(dir, { withFileTypes: true })) {
    const p = join(dir, e.name);
    if (/\.tmp(\b|-|$)/.test(e.name)) out.push(p);
    else if (e.isDirectory()) out.push(...temporaries(p));
  }
  return out;
}

/**
 * Starts `prefzoo ARGS`, polls `when()` every few milliseconds and sends SIGKILL as soon as it holds.
 * Fails the test if the command ends by itself first (the moment never came).
 */
export function killWhen(args: string[], when: () => boolean, env: Record<string, string> = {}): Promise<void> {
  return new Promise<void>((done, fail) => {
    const child = spawn(process.execPath, [bin, ...args], { stdio: ['ignore', 'ignore', 'pipe'], env: { ...process.env, ...env } });
    let err = '';
    child.stderr.on('data', (d) => (err += d));
    const timer = setInterval(() => {
      if (when()) {
        child.kill('SIGKILL');
        clearInterval(timer);
      }
    }, 3);
    child.on('exit', (code, signal) => {
      clearInterval(timer);
      if (signal === 'SIGKILL') done();
      else fail(new Error(`prefzoo ${args[0]} ended (code ${code}) before the kill point; stderr: ${err}`));
    });
  });
}

/** Like killWhen with a catchable signal (Ctrl-C is SIGINT): resolves with the exit code and stderr. */
export function signalWhen(args: string[], when: () => boolean, signal: NodeJS.Signals): Promise<{ code: number | null; stderr: string }> {
  return new Promise((done, fail) => {
    const child = spawn(process.execPath, [bin, ...args], { stdio: ['ignore', 'ignore', 'pipe'] });
    let err = '';
    let sent = false;
    child.stderr.on('data', (d) => (err += d));
    const timer = setInterval(() => {
      if (when()) {
        child.kill(signal);
        sent = true;
        clearInterval(timer);
      }
    }, 3);
    child.on('exit', (code) => {
      clearInterval(timer);
      if (sent) done({ code, stderr: err });
      else fail(new Error(`prefzoo ${args[0]} ended (code ${code}) before the signal; stderr: ${err}`));
    });
  });
}

/** Whether `dir` (searched to any depth) holds a file or folder whose name matches `re`. */
export function holds(dir: string, re: RegExp): boolean {
  if (!existsSync(dir)) return false;
  for (const e of readdirSync(dir, { withFileTypes: true })) {
    if (re.test(e.name)) return true;
    if (e.isDirectory() && holds(join(dir, e.name), re)) return true;
  }
  return false;
}

/**
 * A place where writes fail for lack of room: a 3 MB tmpfs where mounting is allowed (root on a
 * machine that permits it), else a file-size limit (RLIMIT_FSIZE through the shell's `ulimit -f`,
 * which Node reports as EFBIG write errors). `expected` matches the one-line message either gives;
 * a test never passes without the fault having happened, since it asserts that message.
 */
export interface SmallDisk {
  mode: 'tmpfs' | 'rlimit';
  dir: string;
  expected: RegExp;
  /**
   * Runs `prefzoo ARGS` with `room` bytes left on the tmpfs (the rest filled by a file removed
   * afterwards), or with every file limited to `fileLimit` (default `room`) bytes.
   */
  run(args: string[], o: { room: number; fileLimit?: number; cwd?: string }): Result;
  release(): void;
}

export function smallDisk(dir: string, megabytes = 3): SmallDisk {
  mkdirSync(dir, { recursive: true });
  const m = spawnSync('mount', ['-t', 'tmpfs', '-o', `size=${megabytes}m`, 'tmpfs', dir], { encoding: 'utf8' });
  if (m.status === 0) {
    expect(spawnSync('df', ['-k', dir], { encoding: 'utf8' }).stdout).toMatch(/tmpfs/);
    return {
      mode: 'tmpfs',
      dir,
      expected: /no space left on the device \(ENOSPC\)/,
      run(args, o) {
        const filler = join(dir, '.filler');
        const s = statfsSync(dir);
        const free = s.bavail * s.bsize;
        expect(free).toBeGreaterThan(o.room);
        writeFileSync(filler, Buffer.alloc(free - o.room));
        try {
          return cli(args, { cwd: o.cwd });
        } finally {
          rmSync(filler, { force: true });
        }
      },
      release: () => {
        const u = spawnSync('umount', [dir], { encoding: 'utf8' });
        if (u.status !== 0) throw new Error(`umount ${dir}: ${u.stderr}`);
      },
    };
  }
  // No mount here: limit the size of every file the command writes instead. `ulimit -f` counts
  // 1 KiB blocks in bash and 512-byte blocks in dash: the limit is at most fileLimit either way.
  return {
    mode: 'rlimit',
    dir,
    expected: /file too large for this file system \(EFBIG\)/,
    run: (args, o) => cli(args, { cwd: o.cwd, prefix: `ulimit -f ${Math.max(1, Math.floor((o.fileLimit ?? o.room) / 1024))}` }),
    release: () => {},
  };
}
