/**
 * OpenAI's API shapes, as pure functions: a request body checked and read into a plan (every field
 * known: supported, or refused with a 400 naming it), OpenAI's messages converted to prefzoo's
 * `Message`s, and the engine's results shaped into responses, stream chunks and error objects.
 * Nothing here decodes or touches HTTP (engine.ts, http.ts).
 */
import type { Message, ToolCall, ToolSpec } from '../chat.ts';
import type { Sampling, TopToken } from './engine.ts';

/** An error answered with OpenAI's error object `{error: {message, type, param, code}}` and `status`. */
export class ApiError extends Error {
  constructor(
    readonly status: number,
    message: string,
    readonly type: string = status === 401 ? 'authentication_error' : status === 404 ? 'not_found_error' : status === 429 ? 'rate_limit_error' : status >= 500 ? 'server_error' : 'invalid_request_error',
    readonly param: string | null = null,
    readonly code: string | null = null,
  ) {
    super(message);
    this.name = 'ApiError';
  }
}

export function errorBody(e: ApiError): { error: { message: string; type: string; param: string | null; code: string | null } } {
  return { error: { message: e.message, type: e.type, param: e.param, code: e.code } };
}

/** What a request may ask for at most. */
export interface RequestLimits {
  /** Choices per request (`n`). */
  maxN: number;
  /** `top_logprobs` (chat) / `logprobs` (completions) at most. */
  maxTopLogprobs: number;
}

export type ToolChoice = 'auto' | 'none' | 'required' | { name: string };

/** What every generation request shares. */
export interface PlanBase {
  model: string;
  n: number;
  /** temperature/top_p/top_k (top_k is vLLM's extension). */
  sampling: Sampling;
  /** max_tokens / max_completion_tokens, or null: the model's positions left after the prompt. */
  maxTokens: number | null;
  stop: string[];
  /** null: a fresh random seed. */
  seed: number | null;
  logprobs: boolean;
  topLogprobs: number;
  stream: boolean;
  includeUsage: boolean;
  /** vLLM's `return_token_ids`: `prompt_token_ids` on the response, `token_ids` on each choice. */
  returnTokenIds: boolean;
}

export interface ChatPlan extends PlanBase {
  messages: Message[];
  tools: ToolSpec[];
  toolChoice: ToolChoice;
}

export interface CompletionPlan extends PlanBase {
  /** A text, or token ids fed as they are. */
  prompt: string | number[];
}

const bad = (message: string, param: string | null = null, code: string | null = null) => new ApiError(400, message, 'invalid_request_error', param, code);

function isObject(v: unknown): v is Record<string, unknown> {
  return v !== null && typeof v === 'object' && !Array.isArray(v);
}

/** Reads one request body's fields: each known one once, the rest refused by name. */
class Fields {
  private readonly seen = new Set<string>();
  constructor(private readonly o: Record<string, unknown>) {}

  /** The field's value, absent and null alike as undefined. */
  get(name: string): unknown {
    this.seen.add(name);
    const v = this.o[name];
    return v === null ? undefined : v;
  }

  number(name: string, dflt: number, ok: (x: number) => boolean, what: string): number {
    const v = this.get(name);
    if (v === undefined) return dflt;
    if (typeof v !== 'number' || !Number.isFinite(v) || !ok(v)) throw bad(`"${name}" must be ${what}; got ${JSON.stringify(v)}`, name);
    return v;
  }

  int(name: string, dflt: number | null, lo: number, hi: number): number | null {
    const v = this.get(name);
    if (v === undefined) return dflt;
    if (typeof v !== 'number' || !Number.isInteger(v) || v < lo || v > hi) throw bad(`"${name}" must be an integer from ${lo} to ${hi}; got ${JSON.stringify(v)}`, name);
    return v;
  }

  bool(name: string): boolean {
    const v = this.get(name);
    if (v === undefined) return false;
    if (typeof v !== 'boolean') throw bad(`"${name}" must be true or false; got ${JSON.stringify(v)}`, name);
    return v;
  }

  /** Refuses every field not read. */
  done(): void {
    for (const k of Object.keys(this.o)) {
      if (!this.seen.has(k) && this.o[k] !== null && this.o[k] !== undefined) throw bad(`unsupported parameter "${k}"`, k, 'unsupported_parameter');
    }
  }
}

/** A field this server cannot honour unless it has its neutral value: refused otherwise. */
function neutral(f: Fields, name: string, isNeutral: (v: unknown) => boolean, why: string): void {
  const v = f.get(name);
  if (v !== undefined && !isNeutral(v)) throw bad(`"${name}" ${why}`, name, 'unsupported_parameter');
}

function base(f: Fields, limits: RequestLimits, maxTokensNames: string[]): Omit<PlanBase, 'logprobs' | 'topLogprobs'> {
  const model = f.get('model');
  if (typeof model !== 'string' || model === '') throw bad('"model" must be the served model\'s name', 'model');
  const n = f.int('n', 1, 1, limits.maxN)!;
  const temperature = f.number('temperature', 1, (x) => x >= 0 && x <= 2, 'a number from 0 to 2');
  const topP = f.number('top_p', 1, (x) => x > 0 && x <= 1, 'a number in (0, 1]');
  // vLLM's top_k: -1 or 0 keep every token.
  const k = f.int('top_k', 0, -1, 1 << 30)!;
  let maxTokens: number | null = null;
  for (const name of maxTokensNames) {
    const v = f.int(name, null, 1, Number.MAX_SAFE_INTEGER);
    if (v !== null) {
      if (maxTokens !== null && maxTokens !== v) throw bad(`"${maxTokensNames.join('" and "')}" differ; give one`, name);
      maxTokens = v;
    }
  }
  const stopRaw = f.get('stop');
  let stop: string[] = [];
  if (typeof stopRaw === 'string') stop = [stopRaw];
  else if (Array.isArray(stopRaw) && stopRaw.length <= 4 && stopRaw.every((s) => typeof s === 'string')) stop = stopRaw as string[];
  else if (stopRaw !== undefined) throw bad('"stop" must be a string or a list of at most 4 strings', 'stop');
  if (stop.some((s) => s === '')) throw bad('"stop" strings must not be empty', 'stop');
  const seed = f.int('seed', null, -Number.MAX_SAFE_INTEGER, Number.MAX_SAFE_INTEGER);
  const stream = f.bool('stream');
  const so = f.get('stream_options');
  let includeUsage = false;
  if (so !== undefined) {
    if (!stream) throw bad('"stream_options" is only allowed with "stream": true', 'stream_options');
    if (!isObject(so) || Object.keys(so).some((key) => key !== 'include_usage' && key !== 'continuous_usage_stats')) throw bad('"stream_options" may hold only "include_usage"', 'stream_options');
    if (so.include_usage !== undefined && typeof so.include_usage !== 'boolean') throw bad('"stream_options.include_usage" must be true or false', 'stream_options');
    if (so.continuous_usage_stats) throw bad('"stream_options.continuous_usage_stats" is not supported', 'stream_options', 'unsupported_parameter');
    includeUsage = so.include_usage === true;
  }
  const returnTokenIds = f.bool('return_token_ids');
  // Fields with no effect on the output: accepted.
  f.get('user');
  f.get('metadata');
  neutral(f, 'store', (v) => v === false, 'is not supported: nothing is stored');
  neutral(f, 'logit_bias', (v) => isObject(v) && Object.keys(v).length === 0, 'is not supported');
  neutral(f, 'frequency_penalty', (v) => v === 0, 'is not supported (only 0)');
  neutral(f, 'presence_penalty', (v) => v === 0, 'is not supported (only 0)');
  neutral(f, 'response_format', (v) => isObject(v) && v.type === 'text', 'is not supported beyond {"type": "text"} (no constrained decoding)');
  return { model, n, sampling: { temperature, topP, topK: k === -1 ? 0 : k }, maxTokens, stop, seed, stream, includeUsage, returnTokenIds };
}

/** The text of a message's content: a string, null, or text parts. */
function contentText(v: unknown, at: string): string {
  if (v === undefined || v === null) return '';
  if (typeof v === 'string') return v;
  if (Array.isArray(v)) {
    return v
      .map((p, j) => {
        if (isObject(p) && p.type === 'text' && typeof p.text === 'string') return p.text;
        throw bad(`${at}.content[${j}]: only text parts ({"type": "text", "text": ...}) are supported`, 'messages');
      })
      .join('');
  }
  throw bad(`${at}.content must be a string, null or a list of text parts`, 'messages');
}

/**
 * OpenAI's chat messages as prefzoo `Message`s (the one place this conversion lives): `developer`
 * as `system`, text parts joined, an assistant's `tool_calls` with their JSON `arguments` parsed,
 * a `tool` turn's `tool_call_id` kept and its `name` taken from the call it answers.
 */
export function toMessages(raw: unknown): Message[] {
  if (!Array.isArray(raw) || raw.length === 0) throw bad('"messages" must be a non-empty list', 'messages');
  const names = new Map<string, string>();
  return raw.map((m, i) => {
    const at = `messages[${i}]`;
    if (!isObject(m)) throw bad(`${at} must be an object`, 'messages');
    const role = m.role === 'developer' ? 'system' : m.role;
    if (role !== 'system' && role !== 'user' && role !== 'assistant' && role !== 'tool') throw bad(`${at}.role must be system, developer, user, assistant or tool; got ${JSON.stringify(m.role)}`, 'messages');
    const out: Message = { role, content: contentText(m.content, at) };
    if (role === 'assistant' && m.tool_calls !== undefined && m.tool_calls !== null) {
      if (!Array.isArray(m.tool_calls)) throw bad(`${at}.tool_calls must be a list`, 'messages');
      out.tool_calls = m.tool_calls.map((c, j): ToolCall => {
        const fn = isObject(c) ? c.function : undefined;
        if (!isObject(c) || !isObject(fn) || typeof fn.name !== 'string') throw bad(`${at}.tool_calls[${j}] must be {"id", "type": "function", "function": {"name", "arguments"}}`, 'messages');
        let args: unknown = fn.arguments ?? '{}';
        if (typeof args === 'string') {
          try {
            args = JSON.parse(args === '' ? '{}' : args);
          } catch {
            throw bad(`${at}.tool_calls[${j}].function.arguments is not JSON`, 'messages');
          }
        }
        if (!isObject(args)) throw bad(`${at}.tool_calls[${j}].function.arguments must be a JSON object`, 'messages');
        const call: ToolCall = { type: 'function', function: { name: fn.name, arguments: args } };
        if (typeof c.id === 'string') {
          call.id = c.id;
          names.set(c.id, fn.name);
        }
        return call;
      });
    }
    if (role === 'tool') {
      if (typeof m.tool_call_id === 'string') out.tool_call_id = m.tool_call_id;
      const name = typeof m.name === 'string' ? m.name : out.tool_call_id !== undefined ? names.get(out.tool_call_id) : undefined;
      if (name !== undefined) out.name = name;
    } else if (typeof m.name === 'string') out.name = m.name;
    return out;
  });
}

function toolsOf(raw: unknown): ToolSpec[] {
  if (raw === undefined) return [];
  if (!Array.isArray(raw)) throw bad('"tools" must be a list', 'tools');
  return raw.map((t, i) => {
    const fn = isObject(t) ? t.function : undefined;
    if (!isObject(t) || t.type !== 'function' || !isObject(fn) || typeof fn.name !== 'string' || fn.name === '') throw bad(`tools[${i}] must be {"type": "function", "function": {"name", "description", "parameters"}}`, 'tools');
    if (fn.parameters !== undefined && !isObject(fn.parameters)) throw bad(`tools[${i}].function.parameters must be a JSON Schema object`, 'tools');
    const spec: ToolSpec = { type: 'function', function: { name: fn.name, parameters: (fn.parameters as Record<string, unknown>) ?? { type: 'object', properties: {} } } };
    if (typeof fn.description === 'string') spec.function.description = fn.description;
    return spec;
  });
}

function toolChoiceOf(raw: unknown, tools: ToolSpec[]): ToolChoice {
  if (raw === undefined) return tools.length ? 'auto' : 'none';
  if (raw === 'auto' || raw === 'none' || raw === 'required') {
    if (raw !== 'none' && tools.length === 0) throw bad(`"tool_choice": "${raw}" needs "tools"`, 'tool_choice');
    return raw;
  }
  const fn = isObject(raw) ? raw.function : undefined;
  if (isObject(raw) && raw.type === 'function' && isObject(fn) && typeof fn.name === 'string') {
    if (!tools.some((t) => t.function.name === fn.name)) throw bad(`"tool_choice" names "${fn.name}", which is not in "tools"`, 'tool_choice');
    return { name: fn.name };
  }
  throw bad('"tool_choice" must be "auto", "none", "required" or {"type": "function", "function": {"name"}}', 'tool_choice');
}

/** A chat completion request's body, checked. */
export function chatPlan(body: unknown, limits: RequestLimits): ChatPlan {
  if (!isObject(body)) throw bad('the request body must be a JSON object');
  const f = new Fields(body);
  const b = base(f, limits, ['max_tokens', 'max_completion_tokens']);
  const messages = toMessages(f.get('messages'));
  const tools = toolsOf(f.get('tools'));
  const toolChoice = toolChoiceOf(f.get('tool_choice'), tools);
  neutral(f, 'parallel_tool_calls', (v) => v === true, 'false is not supported: every call the model writes is returned');
  const logprobs = f.bool('logprobs');
  const topLogprobs = f.int('top_logprobs', 0, 0, limits.maxTopLogprobs)!;
  if (topLogprobs > 0 && !logprobs) throw bad('"top_logprobs" needs "logprobs": true', 'top_logprobs');
  f.done();
  return { ...b, messages, tools, toolChoice, logprobs, topLogprobs };
}

/** A (legacy) completion request's body, checked. */
export function completionPlan(body: unknown, limits: RequestLimits): CompletionPlan {
  if (!isObject(body)) throw bad('the request body must be a JSON object');
  const f = new Fields(body);
  const b = base(f, limits, ['max_tokens']);
  const p = f.get('prompt');
  let prompt: string | number[];
  if (typeof p === 'string') prompt = p;
  else if (Array.isArray(p) && p.length === 1 && typeof p[0] === 'string') prompt = p[0];
  else if (Array.isArray(p) && p.length > 0 && p.every((x) => Number.isInteger(x) && x >= 0)) prompt = p as number[];
  else if (Array.isArray(p) && p.length > 1) throw bad('"prompt": one prompt per request (a string or a list of token ids)', 'prompt', 'unsupported_parameter');
  else throw bad('"prompt" must be a string or a list of token ids', 'prompt');
  const lp = f.int('logprobs', null, 0, limits.maxTopLogprobs);
  neutral(f, 'echo', (v) => v === false, 'is not supported');
  neutral(f, 'suffix', (v) => v === '', 'is not supported');
  neutral(f, 'best_of', (v) => v === b.n, 'is not supported (only equal to n)');
  f.done();
  // Completions' default max_tokens is 16 (OpenAI's).
  return { ...b, maxTokens: b.maxTokens ?? 16, prompt, logprobs: lp !== null, topLogprobs: lp ?? 0 };
}

/** The usage object. */
export function usage(prompt: number, completion: number): { prompt_tokens: number; completion_tokens: number; total_tokens: number } {
  return { prompt_tokens: prompt, completion_tokens: completion, total_tokens: prompt + completion };
}

/** How a token's text is spelled (its own decode, which may hold a partial character). */
export type TokenText = (id: number) => string;

function bytesOf(s: string): number[] {
  return Array.from(Buffer.from(s, 'utf8'));
}

export interface ChatLogprob {
  token: string;
  logprob: number;
  bytes: number[];
  top_logprobs: { token: string; logprob: number; bytes: number[] }[];
}

/** Chat's `logprobs.content` entries for tokens. */
export function chatLogprobs(text: TokenText, ids: readonly number[], logprobs: readonly number[], top: readonly TopToken[][] | null): ChatLogprob[] {
  return ids.map((id, k) => {
    const token = text(id);
    return { token, logprob: logprobs[k], bytes: bytesOf(token), top_logprobs: (top?.[k] ?? []).map((t) => ({ token: text(t.id), logprob: t.logprob, bytes: bytesOf(text(t.id)) })) };
  });
}

/** Completions' `logprobs` object for tokens whose text starts at `offset`. */
export function completionLogprobs(text: TokenText, ids: readonly number[], logprobs: readonly number[], top: readonly TopToken[][] | null, offset: number): { tokens: string[]; token_logprobs: number[]; top_logprobs: Record<string, number>[] | null; text_offset: number[] } {
  const tokens = ids.map(text);
  const text_offset: number[] = [];
  let at = offset;
  for (const t of tokens) {
    text_offset.push(at);
    at += t.length;
  }
  return { tokens, token_logprobs: [...logprobs], top_logprobs: top ? ids.map((_, k) => Object.fromEntries((top[k] ?? []).map((t) => [text(t.id), t.logprob]))) : null, text_offset };
}

/** An assistant message's tool calls in OpenAI's shape (arguments as JSON text), with fresh ids. */
export function openaiToolCalls(calls: readonly ToolCall[], id: (k: number) => string): { id: string; type: 'function'; function: { name: string; arguments: string } }[] {
  return calls.map((c, k) => ({ id: c.id ?? id(k), type: 'function', function: { name: c.function.name, arguments: typeof c.function.arguments === 'string' ? c.function.arguments : JSON.stringify(c.function.arguments) } }));
}

const TOOL_OPEN = '<tool_call>';
const PYTHON_TAG = '<|python_tag|>';

/**
 * A choice's text as it streams: each token's new text, less what may still change — an incomplete
 * character, the start of a stop string, and (where tool calls are read) a tool call and the
 * whitespace before it — so the deltas add up to the text the whole completion gives.
 */
export class TextStream {
  readonly ids: number[] = [];
  /** Characters of the text sent so far. */
  sent = 0;

  constructor(
    private readonly o: {
      decode: (ids: readonly number[]) => string;
      stopIds: ReadonlySet<number>;
      stop: readonly string[];
      /** The call format held back (null: no tools). */
      tools: 'hermes' | 'llama3' | null;
      /** Text fed before the sampled tokens (a forced tool call's opening). */
      forced?: string;
    },
  ) {}

  /** The text so far: the forced opening, the tokens without a final stop id, cut before a stop string. */
  text(): string {
    const ids = this.ids.length && this.o.stopIds.has(this.ids[this.ids.length - 1]) ? this.ids.slice(0, -1) : this.ids;
    const full = (this.o.forced ?? '') + this.o.decode(ids);
    let at = full.length;
    for (const s of this.o.stop) {
      const i = full.indexOf(s);
      if (i >= 0 && i < at) at = i;
    }
    return full.slice(0, at);
  }

  /** Takes one token; returns the text that may be sent now ('' when nothing). */
  push(id: number): string {
    this.ids.push(id);
    const full = this.text();
    let end = full.length;
    while (end > 0 && full[end - 1] === '\uFFFD') end--;
    end -= heldPrefix(full.slice(0, end), this.o.stop);
    if (this.o.tools === 'hermes') {
      const i = full.indexOf(TOOL_OPEN);
      if (i >= 0) end = Math.min(end, i);
      else end -= heldPrefix(full.slice(0, end), [TOOL_OPEN]);
    } else if (this.o.tools === 'llama3') {
      const t = full.trimStart();
      if (t === '' || t.startsWith('{') || t.startsWith(PYTHON_TAG) || PYTHON_TAG.startsWith(t)) end = 0;
    }
    if (this.o.tools) while (end > 0 && /\s/.test(full[end - 1])) end--;
    return this.take(full, end);
  }

  /** The rest of the text, at the end. */
  flush(): string {
    const full = this.text();
    return this.take(full, full.length);
  }

  private take(full: string, end: number): string {
    if (end <= this.sent) return '';
    const out = full.slice(this.sent, end);
    this.sent = end;
    return out;
  }
}

/** Length of the longest end of `text` that is a proper beginning of one of `marks`. */
function heldPrefix(text: string, marks: readonly string[]): number {
  let held = 0;
  for (const m of marks) {
    for (let n = Math.min(m.length - 1, text.length); n > held; n--) {
      if (text.endsWith(m.slice(0, n))) {
        held = n;
        break;
      }
    }
  }
  return held;
}
