/**
 * The tool executor: one assistant turn's parsed tool calls in, the tool messages to append and one
 * record per call out. Every fault the model can cause — an unknown tool, arguments that are not JSON
 * or fail the schema, a tool that throws, returns an error, or runs past `tool_timeout` — becomes a
 * tool message saying what went wrong (`{"error": "…"}`) and a failed record; the rollout goes on.
 * What the model cannot cause stops the run: an MCP server that died (`ProviderDiedError`, one line
 * naming the server, the tool and the prompt), the run's own abort signal (`AbortedError`).
 *
 * Calls of one turn run one after another, in the order the model wrote them: a tool that keeps state
 * across calls sees them in that order, and an in-process tool stays a function of its seed.
 */
import { performance } from 'node:perf_hooks';
import { AbortedError, UserError } from '../errors.ts';
import type { Message, ToolCall, ToolSpec } from '../chat.ts';
import { callRandom } from './seeds.ts';
import { TOOL_NAME, compileSchema, loadToolsModule, schemaProblem, type LoadedTool } from './tools.ts';
import { ProviderDiedError, mcpSpecFromCommand, readMcpConfig, startMcpServers, type McpServerSpec, type ToolProvider } from './mcp.ts';
import type { ToolJournal } from './journal.ts';
import { CommandTools, type LineChannel } from './command.ts';
import type { CallRecord, RolloutContext, ToolContext, ToolRound } from './types.ts';

/** The default `tool_timeout`, in seconds: the MCP SDK's own default request timeout. */
export const DEFAULT_TOOL_TIMEOUT = 60;

export interface ToolExecutorOptions {
  /** In-process tools (from `loadToolsModule`, `toolsFromValues`). */
  tools?: readonly LoadedTool[];
  /** Out-of-process tools (MCP servers); their results are journaled. */
  providers?: readonly ToolProvider[];
  /** Seconds a call may run before it is answered with a timeout error (default 60). */
  toolTimeout?: number;
  /** Where provider results are journaled and replayed from; none: no journal. */
  journal?: ToolJournal | null;
}

/** A tool as the executor routes it. */
type Route =
  | { kind: 'local'; tool: LoadedTool }
  | { kind: 'provider'; provider: ToolProvider; remoteName: string; check: (args: Record<string, unknown>) => string | null };

/** A fault: what the model is told, and the record's error. */
class Fault {
  constructor(readonly message: string) {}
}

/** The content of a failed call's tool message. */
export function errorContent(message: string): string {
  return JSON.stringify({ error: message });
}

/** Shortens text quoted in an error message. */
function clip(s: string, n = 200): string {
  const one = s.replace(/\s+/g, ' ').trim();
  return one.length > n ? one.slice(0, n - 1) + '…' : one;
}

/**
 * What an in-process tool returned, as content: a string as is, an Error as a failure, an MCP-shaped
 * `{ content: [...], isError }` by its text, anything else as JSON.
 */
export function toolOutputText(out: unknown): { content: string; ok: boolean; error?: string } {
  if (typeof out === 'string') return { content: out, ok: true };
  if (out instanceof Error) return { content: errorContent(out.message), ok: false, error: clip(out.message) };
  if (out === undefined) return { content: '', ok: true };
  if (out && typeof out === 'object' && Array.isArray((out as { content?: unknown }).content) && ('isError' in out || (out as { content: unknown[] }).content.every((b) => !!b && typeof b === 'object' && 'type' in (b as object)))) {
    const blocks = (out as { content: { type?: string; text?: string }[] }).content;
    const text = blocks.map((b) => (b.type === 'text' ? String(b.text ?? '') : `[${String(b.type)} content omitted: not text]`)).join('\n');
    if ((out as { isError?: unknown }).isError === true) return { content: errorContent(text), ok: false, error: clip(text) };
    return { content: text, ok: true };
  }
  try {
    return { content: JSON.stringify(out) ?? String(out), ok: true };
  } catch {
    return { content: String(out), ok: true };
  }
}

/** Where `ToolExecutor.open` finds tools: the command line's `--tools`, `--mcp`, `--mcp-config`. */
export interface ToolSources {
  /** `--tools` values: module files (`.mjs`, `.js`, `.ts`, `.mts`) or `cmd:COMMAND` programs. */
  tools?: readonly string[];
  /** `--mcp` command lines. */
  mcp?: readonly string[];
  /** `--mcp-config` file. */
  mcpConfig?: string;
  /** Providers the caller started. */
  providers?: readonly ToolProvider[];
  /** How to start a `cmd:` program: `(command) => new LineProcess(command)` (src/online/line-process.ts). */
  lineProcess?: (command: string) => LineChannel;
  /** Seconds (default 60). */
  toolTimeout?: number;
  journal?: ToolJournal | null;
}

export class ToolExecutor {
  private routes = new Map<string, Route>();
  /** The tools offered to the model, for the template's `tools` variable, in a fixed order. */
  readonly specs: ToolSpec[] = [];
  readonly toolTimeout: number;
  private journal: ToolJournal | null;
  private providers: readonly ToolProvider[];
  /** Per-rollout tool state of the newest step, by rollout index (older steps' are dropped). */
  private states = new Map<number, Record<string, unknown>>();
  private statesStep = -Infinity;

  constructor(options: ToolExecutorOptions) {
    const t = options.toolTimeout ?? DEFAULT_TOOL_TIMEOUT;
    if (!(t > 0)) throw new UserError(`tool_timeout must be a positive number of seconds, got ${t}`, { setting: 'tool_timeout' });
    this.toolTimeout = t;
    this.journal = options.journal ?? null;
    this.providers = options.providers ?? [];
    const origin = new Map<string, string>();
    for (const tool of options.tools ?? []) {
      const was = origin.get(tool.name);
      if (was) throw new UserError(`tool "${tool.name}" is defined twice: in ${was} and in ${tool.origin}`, { setting: 'tools' });
      origin.set(tool.name, tool.origin);
      this.routes.set(tool.name, { kind: 'local', tool });
      this.specs.push(tool.spec);
    }
    // A name two servers both list is offered as SERVER__TOOL for each of them; a unique one as is.
    const listed = new Map<string, number>();
    for (const p of this.providers) for (const s of p.tools) listed.set(s.function.name, (listed.get(s.function.name) ?? 0) + 1);
    for (const p of this.providers) {
      for (const s of p.tools) {
        const remote = s.function.name;
        const name = listed.get(remote)! > 1 ? `${p.name}__${remote}` : remote;
        if (!TOOL_NAME.test(name)) throw new UserError(`${p.label}: tool name ${JSON.stringify(name)} is not 1–64 letters, digits, _ or - (what chat formats accept)`, { setting: 'mcp' });
        const was = origin.get(name);
        if (was) throw new UserError(`tool "${name}" is defined twice: in ${was} and by ${p.label}; rename the one in your module`, { setting: 'mcp' });
        origin.set(name, p.label);
        const validate = compileSchema(s.function.parameters, `${p.label}: tool ${remote}`);
        this.routes.set(name, { kind: 'provider', provider: p, remoteName: remote, check: (a) => (validate(a) ? null : schemaProblem(validate)) });
        this.specs.push({ type: 'function', function: { ...s.function, name, parameters: stripSchemaId(s.function.parameters) } });
      }
    }
  }

  /**
   * Builds an executor from the command line's sources: `--tools` modules and `cmd:` programs, `--mcp`
   * commands, an `--mcp-config` file, and providers started by the caller. Servers and programs are
   * started here; all providers are closed by `close()` (or on a failure here).
   */
  static async open(options: ToolSources): Promise<ToolExecutor> {
    const local: LoadedTool[] = [];
    const commands: string[] = [];
    for (const m of options.tools ?? []) {
      if (m.startsWith('cmd:')) commands.push(m.slice(4));
      else local.push(...(await loadToolsModule(m)));
    }
    if (commands.length && !options.lineProcess) throw new UserError(`--tools cmd:${commands[0]}: this caller cannot run command tools (no lineProcess given)`, { setting: 'tools' });
    const specs: McpServerSpec[] = [...(options.mcpConfig ? readMcpConfig(options.mcpConfig) : []), ...(options.mcp ?? []).map(mcpSpecFromCommand)];
    const servers: ToolProvider[] = specs.length ? await startMcpServers(specs) : [];
    const providers = [...servers, ...(options.providers ?? [])];
    try {
      for (const c of commands) providers.push(await CommandTools.start(c, options.lineProcess!));
    } catch (e) {
      await Promise.all(providers.map((p) => p.close()));
      throw e;
    }
    try {
      return new ToolExecutor({ tools: local, providers, toolTimeout: options.toolTimeout, journal: options.journal });
    } catch (e) {
      await Promise.all(providers.map((s) => s.close()));
      throw e;
    }
  }

  /** Whether a tool of that name is offered. */
  has(name: string): boolean {
    return this.routes.has(name);
  }

  /** Whether any offered tool's results are journaled (MCP, `cmd:`). */
  get journaled(): boolean {
    return this.providers.length > 0;
  }

  /**
   * Answers one assistant turn's calls, in order: the tool messages to append (each with `name`, and
   * `tool_call_id` when the call had an id) and one record per call.
   */
  async execute(calls: readonly ToolCall[], ctx: RolloutContext): Promise<ToolRound> {
    const messages: Message[] = [];
    const records: CallRecord[] = [];
    const state = ctx.state ?? this.stateOf(ctx.step, ctx.rollout);
    for (let i = 0; i < calls.length; i++) {
      if (ctx.signal?.aborted) throw new AbortedError();
      const call = calls[i];
      const name = typeof call?.function?.name === 'string' ? call.function.name : '';
      const t0 = performance.now();
      let content: string;
      let ok = true;
      let error: string | undefined;
      let replayed = false;
      try {
        const r = await this.one(call, name, i, ctx, state);
        content = r.content;
        ok = r.ok;
        error = r.error;
        replayed = r.replayed;
      } catch (e) {
        if (!(e instanceof Fault)) throw e;
        content = errorContent(e.message);
        ok = false;
        error = e.message;
      }
      const msg: Message = { role: 'tool', content, name };
      if (call?.id) msg.tool_call_id = call.id;
      messages.push(msg);
      const rec: CallRecord = { name, ok, ms: replayed ? 0 : performance.now() - t0 };
      if (error !== undefined) rec.error = error;
      if (replayed) rec.replayed = true;
      records.push(rec);
    }
    return { messages, records };
  }

  /** The state object of a rollout, the same across its turns; a newer step starts them all afresh. */
  private stateOf(step: number, rollout: number): Record<string, unknown> {
    if (step !== this.statesStep) {
      this.states.clear();
      this.statesStep = step;
    }
    let s = this.states.get(rollout);
    if (!s) this.states.set(rollout, (s = {}));
    return s;
  }

  private async one(call: ToolCall, name: string, index: number, ctx: RolloutContext, state: Record<string, unknown>): Promise<{ content: string; ok: boolean; error?: string; replayed: boolean }> {
    if (call?.type !== undefined && call.type !== 'function') throw new Fault(`unsupported tool call type ${JSON.stringify(call.type)}`);
    if (!name) throw new Fault('the tool call names no tool');
    const route = this.routes.get(name);
    if (!route) {
      const names = [...this.routes.keys()];
      throw new Fault(`unknown tool "${clip(name, 64)}"; the tools are: ${names.slice(0, 12).join(', ')}${names.length > 12 ? ', …' : ''}`);
    }
    let args = call.function.arguments as unknown;
    if (typeof args === 'string') {
      if (!args.trim()) args = {};
      else {
        try {
          args = JSON.parse(args);
        } catch {
          throw new Fault(`the arguments of ${name} are not JSON: ${clip(String(call.function.arguments), 80)}`);
        }
      }
    }
    if (args === undefined || args === null) args = {};
    if (typeof args !== 'object' || Array.isArray(args)) throw new Fault(`the arguments of ${name} must be a JSON object`);
    const a = args as Record<string, unknown>;
    const problem = route.kind === 'local' ? route.tool.check(a) : route.check(a);
    if (problem) throw new Fault(`invalid arguments for ${name}: ${problem}`);

    const key = { step: ctx.step, rollout: ctx.rollout, turn: ctx.turn, call: index };
    if (route.kind === 'provider' && this.journal) {
      const e = this.journal.lookup(key, name, a);
      if (e) return { content: e.content, ok: e.ok, error: e.error, replayed: true };
    }

    const timeoutMs = this.toolTimeout * 1000;
    const controller = new AbortController();
    const onAbort = () => controller.abort(ctx.signal?.reason);
    ctx.signal?.addEventListener('abort', onAbort, { once: true });
    let timer: NodeJS.Timeout | undefined;
    const timedOut = new Promise<'timeout'>((resolve) => {
      timer = setTimeout(() => resolve('timeout'), timeoutMs);
    });
    const timeoutMessage = `${name} ran past tool_timeout (${this.toolTimeout} s) and was stopped`;
    let result: { content: string; ok: boolean; error?: string };
    try {
      if (route.kind === 'local') {
        const toolCtx: ToolContext = { rng: callRandom(ctx.seed, ctx.turn, index), seed: ctx.seed, row: ctx.row, turn: ctx.turn, call: index, signal: controller.signal, state };
        if (call.id) toolCtx.toolCallId = call.id;
        const running = Promise.resolve().then(() => route.tool.run(a, toolCtx));
        let out: unknown;
        try {
          out = await Promise.race([running, timedOut]);
        } catch (e) {
          if (ctx.signal?.aborted) throw new AbortedError();
          const m = e instanceof Error ? e.message : String(e);
          throw new Fault(`${name} failed: ${clip(m)}`);
        }
        if (out === 'timeout') {
          controller.abort(new Error('tool_timeout'));
          running.catch(() => {});
          throw new Fault(timeoutMessage);
        }
        if (ctx.signal?.aborted) throw new AbortedError();
        result = toolOutputText(out);
        if (!result.ok) result.error = `${name} returned an error: ${result.error}`;
      } else {
        const running = route.provider.call(route.remoteName, a, { signal: controller.signal, timeoutMs, where: ctx.where, row: ctx.row, seed: ctx.seed });
        let r: { content: string; isError: boolean } | 'timeout';
        try {
          r = await Promise.race([running, timedOut]);
        } catch (e) {
          if (e instanceof ProviderDiedError) throw e;
          if (ctx.signal?.aborted) throw new AbortedError();
          const m = e instanceof Error ? e.message : String(e);
          // The SDK's own request timeout (set to tool_timeout) reads the same as ours.
          if (/timed out|RequestTimeout|-32001/i.test(m)) throw new Fault(timeoutMessage);
          throw new Fault(`${name} failed: ${clip(m)}`);
        }
        if (r === 'timeout') {
          controller.abort(new Error('tool_timeout'));
          running.catch(() => {});
          throw new Fault(timeoutMessage);
        }
        result = r.isError ? { content: errorContent(r.content), ok: false, error: `${name} returned an error: ${clip(r.content)}` } : { content: r.content, ok: true };
      }
    } catch (e) {
      if (e instanceof Fault && route.kind === 'provider' && this.journal) this.journal.record({ ...key, name, arguments: a, content: errorContent(e.message), ok: false, error: e.message });
      throw e;
    } finally {
      clearTimeout(timer);
      ctx.signal?.removeEventListener('abort', onAbort);
    }
    if (route.kind === 'provider' && this.journal) {
      const entry = { ...key, name, arguments: a, content: result.content, ok: result.ok, ...(result.error !== undefined ? { error: result.error } : {}) };
      this.journal.record(entry);
    }
    return { ...result, replayed: false };
  }

  /** Stops the MCP servers (and closes the journal). */
  async close(): Promise<void> {
    await Promise.all(this.providers.map((p) => p.close()));
    this.journal?.close();
  }
}

function stripSchemaId(p: Record<string, unknown>): Record<string, unknown> {
  const { $schema: _drop, ...rest } = p;
  return rest;
}
