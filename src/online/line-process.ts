/**
 * A long-running helper program spoken to in JSON lines: `sh -c COMMAND` is started on first use and
 * kept running; requests are written to its stdin one line each, and its stdout is read one line per
 * answer, in order. Used by the command judge (`cmd:` in judges.ts) and command rewards (rewards.ts).
 */
import { spawn, type ChildProcessWithoutNullStreams } from 'node:child_process';
import { createInterface, type Interface } from 'node:readline';

export class LineProcess {
  private child: ChildProcessWithoutNullStreams | null = null;
  private lines: Interface | null = null;
  private queue: string[] = [];
  private waiting: ((line: string | null) => void) | null = null;
  private closed = false;
  private stderrTail = '';

  constructor(readonly command: string) {}

  private start(): ChildProcessWithoutNullStreams {
    const child = spawn('sh', ['-c', this.command], { stdio: ['pipe', 'pipe', 'pipe'] });
    child.stderr.on('data', (d: Buffer) => {
      this.stderrTail = (this.stderrTail + d.toString()).slice(-400);
    });
    // A program that exits early surfaces as an error at the next read, with its stderr.
    child.stdin.on('error', () => {});
    child.on('error', (e) => {
      this.stderrTail += ` (${e.message})`;
    });
    this.lines = createInterface({ input: child.stdout });
    this.lines.on('line', (l) => {
      if (this.waiting) {
        const w = this.waiting;
        this.waiting = null;
        w(l);
      } else this.queue.push(l);
    });
    this.lines.on('close', () => {
      this.closed = true;
      if (this.waiting) {
        const w = this.waiting;
        this.waiting = null;
        w(null);
      }
    });
    this.child = child;
    return child;
  }

  /** Writes the requests, one JSON line each (starting the program on first use). */
  send(requests: readonly unknown[]): void {
    const child = this.child ?? this.start();
    child.stdin.write(requests.map((r) => JSON.stringify(r) + '\n').join(''));
  }

  /** The next line of output, or null once the program closed its output. */
  next(): Promise<string | null> {
    if (this.queue.length) return Promise.resolve(this.queue.shift()!);
    if (this.closed) return Promise.resolve(null);
    return new Promise((resolve) => (this.waiting = resolve));
  }

  /** "; its stderr ends: …" when the program wrote to stderr, else "". */
  stderrNote(): string {
    const s = this.stderrTail.trim();
    return s ? `; its stderr ends: ${s.split('\n').slice(-2).join(' | ')}` : '';
  }

  /** Closes stdin and waits up to 2 s for the program to exit, then kills it. */
  async release(): Promise<void> {
    if (!this.child) return;
    const child = this.child;
    this.child = null;
    child.stdin.end();
    if (child.exitCode === null) {
      await new Promise<void>((resolve) => {
        const t = setTimeout(() => {
          child.kill();
          resolve();
        }, 2000);
        child.on('exit', () => {
          clearTimeout(t);
          resolve();
        });
      });
    }
    this.lines?.close();
  }

  /** Kills the program at once (a timed-out request: its later answers would be out of step). */
  kill(): void {
    if (!this.child) return;
    this.child.kill('SIGKILL');
    this.child = null;
    this.lines?.close();
  }
}

/** Why the answer at `index` (0-based, within one `ask`) is unusable. */
export class AnswerError extends Error {
  constructor(
    readonly index: number,
    readonly why: 'closed' | 'json' | 'shape',
    readonly line: string,
  ) {
    super(why);
  }
}

/**
 * The protocol the `cmd:` judge and the `cmd:` reward share: one JSON line in per request, one JSON
 * object out per request, in order, each read by the caller's `read` (undefined: not the answer's
 * shape). The program is restarted after `abandon` (a timed-out request leaves its answers out of step).
 */
export class JsonLinesProgram {
  private proc: LineProcess;
  constructor(readonly command: string) {
    this.proc = new LineProcess(command);
  }

  async ask<T>(requests: readonly unknown[], read: (answer: unknown) => T | undefined): Promise<T[]> {
    this.proc.send(requests);
    const out: T[] = [];
    for (let i = 0; i < requests.length; i++) {
      const line = await this.proc.next();
      if (line === null) throw new AnswerError(i, 'closed', '');
      let answer: unknown;
      try {
        answer = JSON.parse(line);
      } catch {
        throw new AnswerError(i, 'json', line);
      }
      const v = read(answer);
      if (v === undefined) throw new AnswerError(i, 'shape', line);
      out.push(v);
    }
    return out;
  }

  stderrNote(): string {
    return this.proc.stderrNote();
  }

  abandon(): void {
    this.proc.kill();
    this.proc = new LineProcess(this.command);
  }

  async release(): Promise<void> {
    await this.proc.release();
  }
}
