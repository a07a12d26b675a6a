/**
 * `cmd:COMMAND` tools: a program speaking JSON lines, one request per line on its stdin, one answer
 * per line on its stdout, in order — the protocol of `cmd:` judges and rewards. The process itself is
 * the caller's `LineProcess` (src/online/line-process.ts), made by the factory handed in
 * (`(command) => new LineProcess(command)`), so there is one implementation of the child and this
 * floor does not import the one above it.
 *
 *   → {"method":"tools/list"}
 *   ← {"tools":[{"name":"add","description":"…","parameters":{…JSON Schema…}}]}
 *   → {"method":"tools/call","name":"add","arguments":{"a":1,"b":2},"row":{…},"seed":123}
 *   ← {"content":"3"}            or   {"error":"…"}   (a failure the model reads)
 *
 * A call past `tool_timeout` kills the program (its later answers would be out of step); the next
 * call starts a fresh one (state the program kept is lost). A program that closes its output stops the run with one line.
 */
import { UserError } from '../errors.ts';
import type { ToolSpec } from '../chat.ts';
import { ProviderDiedError, type ProviderCallOptions, type ProviderResult, type ToolProvider } from './mcp.ts';

/** The child process the caller owns: `LineProcess` has this shape. */
export interface LineChannel {
  send(requests: readonly unknown[]): void;
  next(): Promise<string | null>;
  /** "; its stderr ends: …" or "". */
  stderrNote(): string;
  release(): Promise<void>;
  kill(): void;
}

export class CommandTools implements ToolProvider {
  tools: ToolSpec[] = [];
  readonly name: string;
  /** Calls wait their turn: answers come back in the order of the requests. */
  private queue: Promise<unknown> = Promise.resolve();

  private channel: LineChannel;

  private constructor(
    readonly command: string,
    private readonly makeChannel: (command: string) => LineChannel,
  ) {
    this.name = 'cmd';
    this.channel = makeChannel(command);
  }

  get label(): string {
    return `tool command "${this.command}"`;
  }

  /** Starts the program and reads its tool list. */
  static async start(command: string, makeChannel: (command: string) => LineChannel): Promise<CommandTools> {
    if (!command.trim()) throw new UserError('--tools cmd: the command is empty', { setting: 'tools' });
    const t = new CommandTools(command, makeChannel);
    const channel = t.channel;
    channel.send([{ method: 'tools/list' }]);
    const line = await channel.next();
    if (line === null) throw new UserError(`--tools cmd:${command}: the program closed its output before listing its tools${channel.stderrNote()}`, { setting: 'tools' });
    let tools: unknown;
    try {
      tools = (JSON.parse(line) as { tools?: unknown }).tools;
    } catch {
      tools = undefined;
    }
    if (!Array.isArray(tools)) {
      await channel.release();
      throw new UserError(`--tools cmd:${command}: answer {"tools":[{"name","description","parameters"}]} to {"method":"tools/list"}, got ${JSON.stringify(line.slice(0, 80))}`, { setting: 'tools' });
    }
    for (const [i, x] of tools.entries()) {
      const d = x as { name?: unknown; description?: unknown; parameters?: unknown };
      if (typeof d?.name !== 'string' || (d.parameters !== undefined && (typeof d.parameters !== 'object' || d.parameters === null))) {
        await channel.release();
        throw new UserError(`--tools cmd:${command}: tools[${i}] needs a "name" and a JSON Schema "parameters"`, { setting: 'tools' });
      }
      const fn: ToolSpec['function'] = { name: d.name, parameters: (d.parameters as Record<string, unknown>) ?? { type: 'object' } };
      if (typeof d.description === 'string') fn.description = d.description;
      t.tools.push({ type: 'function', function: fn });
    }
    return t;
  }

  call(name: string, args: Record<string, unknown>, options: ProviderCallOptions): Promise<ProviderResult> {
    const run = this.queue.then(() => this.callNow(name, args, options));
    this.queue = run.catch(() => {});
    return run;
  }

  private async callNow(name: string, args: Record<string, unknown>, options: ProviderCallOptions): Promise<ProviderResult> {
    if (options.signal.aborted) throw new Error(`${name} was stopped before it ran`);
    let stopped = false;
    const channel = this.channel;
    const onAbort = () => {
      stopped = true;
      channel.kill();
      this.channel = this.makeChannel(this.command);
    };
    options.signal.addEventListener('abort', onAbort, { once: true });
    try {
      channel.send([{ method: 'tools/call', name, arguments: args, row: options.row ?? {}, seed: options.seed ?? 0 }]);
      const line = await channel.next();
      if (stopped) throw new Error(`${name} was stopped (the program was restarted)`);
      if (line === null) {
        throw new ProviderDiedError(`${this.label} closed its output during the call of tool "${name}"${options.where ? ` for the prompt at ${options.where}` : ''}${channel.stderrNote()}`);
      }
      let answer: { content?: unknown; error?: unknown };
      try {
        answer = JSON.parse(line) as typeof answer;
      } catch {
        throw new Error(`the program's answer is not JSON: ${JSON.stringify(line.slice(0, 80))}`);
      }
      if (typeof answer?.error === 'string') return { content: answer.error, isError: true };
      if (typeof answer?.content === 'string') return { content: answer.content, isError: false };
      if (answer && 'content' in answer) return { content: JSON.stringify(answer.content), isError: false };
      throw new Error(`the program must answer {"content": …} or {"error": "…"}, got ${JSON.stringify(line.slice(0, 80))}`);
    } finally {
      options.signal.removeEventListener('abort', onAbort);
    }
  }

  async close(): Promise<void> {
    await this.channel.release();
  }
}
