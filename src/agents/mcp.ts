/**
 * MCP servers as tool providers: the official SDK's `Client` over `StdioClientTransport`, started from
 * `--mcp 'COMMAND ARGS'` or the `{"mcpServers": {name: {command, args, env}}}` file Claude Desktop,
 * Cursor and verl read. A server's stderr is captured (never printed): its last line goes into the one
 * line that stops the run when the server dies, so nothing of the server's reaches the terminal first.
 */
import { readFileSync } from 'node:fs';
import { basename } from 'node:path';
import type { Client } from '@modelcontextprotocol/sdk/client/index.js';
import type { StdioClientTransport } from '@modelcontextprotocol/sdk/client/stdio.js';
import { UserError } from '../errors.ts';
import type { ToolSpec } from '../chat.ts';

/**
 * The SDK (with zod, ~0.4 s of CPU to import) is loaded when the first server starts, not with every
 * command that could start one.
 */
const loadSdk = () =>
  Promise.all([import('@modelcontextprotocol/sdk/client/index.js'), import('@modelcontextprotocol/sdk/client/stdio.js'), import('@modelcontextprotocol/sdk/types.js')]);
let sdk: ReturnType<typeof loadSdk> | null = null;
function mcpSdk(): ReturnType<typeof loadSdk> {
  sdk ??= loadSdk();
  return sdk;
}

/** How to start one server. */
export interface McpServerSpec {
  /** The server's name: the config's key, or for `--mcp` the name the server reports (set once started). */
  name?: string;
  command: string;
  args?: string[];
  /** Added to the environment: over the SDK's short default (PATH, HOME, …) for config entries, over ours for `--mcp`. */
  env?: Record<string, string>;
  cwd?: string;
  /** `--mcp` commands inherit this process's environment, as a shell command would. */
  inheritEnv?: boolean;
  /** Where the spec came from, for messages: `--mcp 'node s.mjs'` or `mcp.json: servers.memory`. */
  source?: string;
}

/** One tool result from a provider: the text for the tool message, and whether the tool said it failed. */
export interface ProviderResult {
  content: string;
  isError: boolean;
}

/** What a provider's call is given: the call's signal, its time limit, and the prompt's file:line for messages. */
export interface ProviderCallOptions {
  signal: AbortSignal;
  timeoutMs: number;
  where?: string;
  /** The prompt row and the episode seed (a `cmd:` program receives them; MCP has no place for them). */
  row?: Record<string, unknown>;
  seed?: number;
}

/**
 * Tools that live outside this process (MCP servers; a `cmd:` program). Their results are not a
 * function of the seed, so the executor journals them for `--resume`.
 */
export interface ToolProvider {
  /** Names the provider in messages: `MCP server "memory" (node dist/index.js)`. */
  readonly label: string;
  /** A short name, the prefix of its tools' names where two providers list the same name. */
  readonly name: string;
  /** The provider's tools with their JSON Schemas, under the names the provider knows them by. */
  readonly tools: readonly ToolSpec[];
  /**
   * Calls one tool. Rejects with a `ProviderDiedError` when the provider itself is gone (the run
   * stops); any other rejection is the call's failure (the model is told).
   */
  call(name: string, args: Record<string, unknown>, options: ProviderCallOptions): Promise<ProviderResult>;
  close(): Promise<void>;
}

/** A provider that is gone (its process exited): the run stops with this one line. */
export class ProviderDiedError extends UserError {
  constructor(message: string) {
    super(message);
    this.name = 'ProviderDiedError';
  }
}

/** Splits a command line into words: spaces separate, '…' and "…" quote, \ escapes (no variables, no globs). */
export function splitCommand(line: string): string[] {
  const words: string[] = [];
  let cur = '';
  let has = false;
  let quote: '"' | "'" | null = null;
  for (let i = 0; i < line.length; i++) {
    const c = line[i];
    if (quote) {
      if (c === quote) quote = null;
      else if (c === '\\' && quote === '"' && i + 1 < line.length && '"\\$`'.includes(line[i + 1])) cur += line[++i];
      else cur += c;
    } else if (c === "'" || c === '"') {
      quote = c;
      has = true;
    } else if (c === '\\' && i + 1 < line.length) {
      cur += line[++i];
      has = true;
    } else if (/\s/.test(c)) {
      if (has || cur) words.push(cur);
      cur = '';
      has = false;
    } else {
      cur += c;
      has = true;
    }
  }
  if (quote) throw new UserError(`--mcp ${line}: unclosed ${quote}`, { setting: 'mcp' });
  if (has || cur) words.push(cur);
  return words;
}

/** `--mcp 'COMMAND ARGS'` as a spec. */
export function mcpSpecFromCommand(line: string): McpServerSpec {
  const words = splitCommand(line);
  if (words.length === 0) throw new UserError('--mcp: the command is empty', { setting: 'mcp' });
  return { command: words[0], args: words.slice(1), inheritEnv: true, source: `--mcp '${line}'` };
}

/** The servers of an `mcp.json` (`{"mcpServers": {name: {command, args?, env?, cwd?}}}`), in file order. */
export function readMcpConfig(file: string): McpServerSpec[] {
  let text: string;
  try {
    text = readFileSync(file, 'utf8');
  } catch (e) {
    throw new UserError(`--mcp-config ${file}: cannot read it (${(e as NodeJS.ErrnoException).code ?? (e as Error).message})`, { file });
  }
  let json: unknown;
  try {
    json = JSON.parse(text);
  } catch (e) {
    throw new UserError(`--mcp-config ${file}: not JSON (${(e as Error).message})`, { file });
  }
  const servers = (json as { mcpServers?: unknown })?.mcpServers;
  if (!servers || typeof servers !== 'object' || Array.isArray(servers)) throw new UserError(`--mcp-config ${file}: expected {"mcpServers": {"name": {"command": …, "args": […]}}}`, { file });
  const out: McpServerSpec[] = [];
  for (const [name, raw] of Object.entries(servers as Record<string, unknown>)) {
    const where = `--mcp-config ${file}: mcpServers.${name}`;
    const s = raw as Record<string, unknown>;
    if (!s || typeof s !== 'object') throw new UserError(`${where}: expected an object with "command"`, { file });
    if (s.disabled === true) continue;
    if (typeof s.url === 'string' || s.type === 'http' || s.type === 'sse' || s.type === 'streamable-http') {
      throw new UserError(`${where}: only stdio servers (with "command") are supported, not remote ones ("url")`, { file });
    }
    if (typeof s.command !== 'string' || !s.command.trim()) throw new UserError(`${where}: "command" must be a non-empty string`, { file });
    if (s.args !== undefined && (!Array.isArray(s.args) || s.args.some((a) => typeof a !== 'string'))) throw new UserError(`${where}: "args" must be an array of strings`, { file });
    if (s.env !== undefined && (typeof s.env !== 'object' || s.env === null || Object.values(s.env).some((v) => typeof v !== 'string'))) throw new UserError(`${where}: "env" must map names to strings`, { file });
    if (s.cwd !== undefined && typeof s.cwd !== 'string') throw new UserError(`${where}: "cwd" must be a string`, { file });
    out.push({ name, command: s.command, args: (s.args as string[] | undefined) ?? [], env: s.env as Record<string, string> | undefined, cwd: s.cwd as string | undefined, source: where });
  }
  return out;
}

/** A name safe in a tool name: letters, digits, _ and - (a server reporting `mcp-servers/everything` becomes `everything`). */
function cleanName(name: string): string {
  const last = name.split('/').pop() ?? name;
  return last.replace(/[^A-Za-z0-9_-]+/g, '_').replace(/^_+|_+$/g, '').slice(0, 32) || 'server';
}

function firstLine(e: unknown): string {
  return (e instanceof Error ? e.message : String(e)).split('\n')[0];
}

/** One MCP content block as text; what cannot be text is named as omitted. */
function contentText(block: Record<string, unknown>): string {
  switch (block.type) {
    case 'text':
      return String(block.text ?? '');
    case 'resource': {
      const r = (block.resource ?? {}) as Record<string, unknown>;
      if (typeof r.text === 'string') return r.text;
      return `[resource ${String(r.uri ?? '')} (${String(r.mimeType ?? 'binary')}) omitted: not text]`;
    }
    case 'image':
    case 'audio':
      return `[${block.type} (${String(block.mimeType ?? 'unknown type')}) omitted: not text]`;
    case 'resource_link':
      return `[resource link ${String(block.uri ?? '')} omitted: not text]`;
    default:
      return `[${String(block.type)} content omitted: not text]`;
  }
}

/** An MCP tool result as one text: its text blocks joined by newlines, non-text named as omitted. */
export function mcpResultText(result: { content?: unknown; structuredContent?: unknown }): string {
  const blocks = Array.isArray(result.content) ? (result.content as Record<string, unknown>[]) : [];
  if (blocks.length === 0 && result.structuredContent !== undefined) return JSON.stringify(result.structuredContent);
  return blocks.map(contentText).join('\n');
}

/** A running MCP server: its client, its tools, the tail of its stderr. */
export class McpServer implements ToolProvider {
  private client: Client | null = null;
  private transport: StdioClientTransport | null = null;
  private stderrLines: string[] = [];
  private stderrPartial = '';
  private exited = false;
  private closing = false;
  name: string;
  tools: ToolSpec[] = [];

  private constructor(readonly spec: McpServerSpec) {
    this.name = spec.name ?? cleanName(basename(spec.args?.find((a) => !a.startsWith('-')) ?? spec.command).replace(/\.[cm]?[jt]s$/, ''));
  }

  get label(): string {
    return `MCP server "${this.name}" (${[this.spec.command, ...(this.spec.args ?? [])].join(' ')})`;
  }

  /** The last line the server wrote to stderr, or "". */
  get lastStderrLine(): string {
    const partial = this.stderrPartial.trim();
    return partial || this.stderrLines[this.stderrLines.length - 1] || '';
  }

  private stderrNote(): string {
    const l = this.lastStderrLine;
    return l ? `; its last stderr line: ${l.slice(0, 300)}` : '; it wrote nothing to stderr';
  }

  /** Starts the server, connects, and lists its tools (all pages). */
  static async start(spec: McpServerSpec): Promise<McpServer> {
    const s = new McpServer(spec);
    await s.connect();
    return s;
  }

  private async connect(): Promise<void> {
    const spec = this.spec;
    const env = spec.inheritEnv ? { ...(process.env as Record<string, string>), ...(spec.env ?? {}) } : spec.env;
    const [{ Client }, { StdioClientTransport }] = await mcpSdk();
    const transport = new StdioClientTransport({ command: spec.command, args: spec.args ?? [], env, cwd: spec.cwd, stderr: 'pipe' });
    transport.stderr?.on('data', (d: Buffer) => {
      const text = this.stderrPartial + d.toString();
      const lines = text.split('\n');
      this.stderrPartial = lines.pop() ?? '';
      for (const l of lines) if (l.trim()) this.stderrLines.push(l.trim());
      if (this.stderrLines.length > 20) this.stderrLines.splice(0, this.stderrLines.length - 20);
    });
    const client = new Client({ name: 'prefzoo', version: '0' });
    client.onclose = () => {
      this.exited = true;
    };
    // Errors of the transport (a spawn failure, a broken pipe) surface through the calls that fail.
    client.onerror = () => {};
    this.transport = transport;
    this.client = client;
    const where = spec.source ?? this.label;
    try {
      await client.connect(transport);
    } catch (e) {
      await settle();
      await this.close();
      throw new UserError(`${where}: the server did not start (${firstLine(e)})${this.stderrNote()}`, { setting: 'mcp' });
    }
    const reported = client.getServerVersion()?.name;
    if (!spec.name && reported) this.name = cleanName(reported);
    const tools: ToolSpec[] = [];
    try {
      let cursor: string | undefined;
      do {
        const page = await client.listTools(cursor ? { cursor } : undefined);
        for (const t of page.tools) {
          const fn: ToolSpec['function'] = { name: t.name, parameters: (t.inputSchema ?? { type: 'object' }) as Record<string, unknown> };
          if (t.description) fn.description = t.description;
          tools.push({ type: 'function', function: fn });
        }
        cursor = page.nextCursor;
      } while (cursor);
    } catch (e) {
      await settle();
      await this.close();
      throw new UserError(`${where}: listing the tools failed (${firstLine(e)})${this.stderrNote()}`, { setting: 'mcp' });
    }
    this.tools = tools;
  }

  /** The one line for a server that is gone, naming it, the tool, and the prompt. */
  private died(tool: string, where: string | undefined, before = false): ProviderDiedError {
    return new ProviderDiedError(`${this.label} exited ${before ? 'before' : 'during'} the call of tool "${tool}"${where ? ` for the prompt at ${where}` : ''}${this.stderrNote()}`);
  }

  async call(name: string, args: Record<string, unknown>, options: ProviderCallOptions): Promise<ProviderResult> {
    if (this.exited || !this.client) {
      await settle();
      throw this.died(name, options.where, true);
    }
    try {
      const r = await this.client.callTool({ name, arguments: args }, undefined, { signal: options.signal, timeout: options.timeoutMs });
      return { content: mcpResultText(r as { content?: unknown; structuredContent?: unknown }), isError: r.isError === true };
    } catch (e) {
      const [, , { ErrorCode, McpError }] = await mcpSdk();
      if (this.exited || (e instanceof McpError && e.code === ErrorCode.ConnectionClosed)) {
        this.exited = true;
        await settle();
        throw this.died(name, options.where);
      }
      throw e;
    }
  }

  /** The server's process id (tests kill it). */
  get pid(): number | null {
    return this.transport?.pid ?? null;
  }

  async close(): Promise<void> {
    if (this.closing) return;
    this.closing = true;
    try {
      await this.client?.close();
    } catch {
      // Closing a server that already died has nothing left to do.
    }
    this.client = null;
  }
}

/** Lets the child's last stderr bytes and its close event arrive before a message quotes them. */
function settle(): Promise<void> {
  return new Promise((r) => setTimeout(r, 20));
}

/** Starts every server (in parallel); on any failure the ones started are closed again. */
export async function startMcpServers(specs: readonly McpServerSpec[]): Promise<McpServer[]> {
  const started = await Promise.allSettled(specs.map((s) => McpServer.start(s)));
  const failed = started.find((r) => r.status === 'rejected');
  if (failed) {
    await Promise.all(started.map((r) => (r.status === 'fulfilled' ? r.value.close() : undefined)));
    throw (failed as PromiseRejectedResult).reason;
  }
  const servers = started.map((r) => (r as PromiseFulfilledResult<McpServer>).value);
  // Two servers reporting the same name (two `--mcp` of one program) get numbered.
  const count = new Map<string, number>();
  for (const s of servers) count.set(s.name, (count.get(s.name) ?? 0) + 1);
  const seen = new Map<string, number>();
  for (const s of servers) {
    if (count.get(s.name)! > 1) {
      const k = (seen.get(s.name) ?? 0) + 1;
      seen.set(s.name, k);
      s.name = `${s.name}${k}`;
    }
  }
  return servers;
}
