/**
 * Turning one field of an input record into a canonical value, or a RecordError that names the field.
 */
import { type Message, ROLES, type Role, type Text, type ToolCall, type ToolSpec } from './names.ts';

/** A problem with one record; the converter prefixes it with file:line. */
export class RecordError extends Error {
  constructor(
    message: string,
    readonly field?: string,
  ) {
    super(message);
    this.name = 'RecordError';
  }
}

export type Rec = Record<string, unknown>;

export interface FieldContext {
  /** Values are text (CSV): numbers, booleans and message lists arrive as strings. */
  textual: boolean;
  /** `--map dst=src`, so a missing field can be named as the user knows it. */
  map: Readonly<Record<string, string>>;
}

export function describe(v: unknown): string {
  if (v === null) return 'null';
  if (Array.isArray(v)) return 'a list';
  if (typeof v === 'object') return 'an object';
  if (typeof v === 'string') return v.length > 40 ? `the text "${v.slice(0, 37)}..."` : `the text ${JSON.stringify(v)}`;
  return `${typeof v} ${String(v)}`;
}

export function isObject(v: unknown): v is Rec {
  return typeof v === 'object' && v !== null && !Array.isArray(v);
}

/** The value of a required field; `missing field "x"` otherwise. */
export function need(rec: Rec, key: string, ctx: FieldContext): unknown {
  const v = rec[key];
  if (v === undefined) {
    const src = ctx.map[key];
    throw new RecordError(src ? `missing field "${src}" (mapped to "${key}" by --map)` : `missing field "${key}"`, key);
  }
  return v;
}

/** The first of `keys` the record has, or undefined. */
export function firstKey(rec: Rec, keys: readonly string[]): string | undefined {
  for (const k of keys) if (rec[k] !== undefined) return k;
  return undefined;
}

// Sharegpt and other chat formats name roles differently; map them onto the four canonical ones.
const ROLE_ALIASES: Record<string, Role> = {
  human: 'user',
  user: 'user',
  gpt: 'assistant',
  assistant: 'assistant',
  bot: 'assistant',
  model: 'assistant',
  function_call: 'assistant',
  system: 'system',
  observation: 'tool',
  function: 'tool',
  tool: 'tool',
};

function contentText(v: unknown, field: string): string {
  if (typeof v === 'string') return v;
  // Content parts: OpenAI's [{type: "text", text}] or LLaMA-Factory's [{type: "text", value}].
  if (Array.isArray(v)) {
    let s = '';
    for (let i = 0; i < v.length; i++) {
      const part = v[i];
      const text = isObject(part) && (part.type === undefined || part.type === 'text') ? (typeof part.text === 'string' ? part.text : part.value) : undefined;
      if (typeof text === 'string') s += text;
      else if (isObject(part) && typeof part.type === 'string') {
        throw new RecordError(`field "${field}[${i}]": a "${part.type}" part; prefzoo trains on text, so only parts of type "text" are accepted`, field);
      } else throw new RecordError(`field "${field}[${i}]": expected a text part {type: "text", text} or {type: "text", value}, found ${describe(part)}`, field);
    }
    return s;
  }
  throw new RecordError(`field "${field}": expected text, found ${describe(v)}`, field);
}

/** Tool-call arguments as an object: OpenAI carries them as JSON text, HF templates take an object. */
function asArguments(v: unknown, field: string): Record<string, unknown> {
  let args = v === undefined || v === null ? {} : v;
  if (typeof args === 'string') {
    try {
      args = args.trim() === '' ? {} : JSON.parse(args);
    } catch {
      throw new RecordError(`field "${field}": tool-call arguments are not JSON: ${describe(v)}`, field);
    }
  }
  if (!isObject(args)) throw new RecordError(`field "${field}": tool-call arguments must be a JSON object, found ${describe(args)}`, field);
  return args;
}

/**
 * One tool call: OpenAI/HF `{id?, type: "function", function: {name, arguments}}` or the bare
 * `{name, arguments}` (also `parameters`, Llama's name) LLaMA-Factory and Hermes data write.
 */
export function asToolCall(v: unknown, field: string): ToolCall {
  if (!isObject(v)) throw new RecordError(`field "${field}": expected a tool call {name, arguments}, found ${describe(v)}`, field);
  const fn = isObject(v.function) ? v.function : v;
  if (typeof fn.name !== 'string' || fn.name === '') throw new RecordError(`field "${field}": a tool call needs a "name"`, field);
  const argsKey = fn.arguments !== undefined ? 'arguments' : 'parameters';
  const call: ToolCall = { type: 'function', function: { name: fn.name, arguments: asArguments(fn[argsKey], `${field}.${argsKey}`) } };
  if (v.id !== undefined && v.id !== null) call.id = asId(v.id, `${field}.id`);
  return call;
}

/** A message's `tool_calls`: a list, or JSON text of one (how canonical Parquet stores them, datasets/schema.ts). */
function asToolCalls(v: unknown, field: string): ToolCall[] {
  let list = v;
  if (typeof v === 'string') {
    try {
      list = JSON.parse(v);
    } catch {
      throw new RecordError(`field "${field}": expected a list of tool calls (or JSON text of one), found ${describe(v)}`, field);
    }
  }
  if (!Array.isArray(list)) throw new RecordError(`field "${field}": expected a list of tool calls, found ${describe(v)}`, field);
  return list.map((c, i) => asToolCall(c, `${field}[${i}]`));
}

/** LLaMA-Factory's `function_call` turn: its value is the JSON of one call or of a list of calls. */
function functionCallTurn(value: unknown, field: string): ToolCall[] {
  let parsed = value;
  if (typeof value === 'string') {
    try {
      parsed = JSON.parse(value);
    } catch {
      throw new RecordError(`field "${field}": a function_call turn must hold a JSON tool call {"name", "arguments"}, found ${describe(value)}`, field);
    }
  }
  return Array.isArray(parsed) ? parsed.map((c, i) => asToolCall(c, `${field}[${i}]`)) : [asToolCall(parsed, field)];
}

/**
 * One chat message: {role, content} or sharegpt's {from, value}, with OpenAI/HF `tool_calls`,
 * `tool_call_id` and `name` kept. LLaMA-Factory's `function_call` turn becomes an assistant message
 * whose `tool_calls` are the call(s) its value holds; `observation` a tool message.
 */
export function asMessage(v: unknown, field: string): Message {
  if (!isObject(v)) throw new RecordError(`field "${field}": expected a message {role, content}, found ${describe(v)}`, field);
  const rawRole = v.role ?? v.from;
  if (typeof rawRole !== 'string') throw new RecordError(`field "${field}": message has no "role" (or "from")`, field);
  const role = ROLE_ALIASES[rawRole.toLowerCase()];
  if (!role || !ROLES.has(role)) throw new RecordError(`field "${field}.role": unknown role "${rawRole}" (expected system, user, assistant or tool; or human, gpt, function_call, observation)`, field);
  const rawContent = v.content !== undefined ? v.content : v.value;
  if (rawRole.toLowerCase() === 'function_call') {
    return { role: 'assistant', content: '', tool_calls: functionCallTurn(rawContent, `${field}.${v.content !== undefined ? 'content' : 'value'}`) };
  }
  if (rawContent === undefined && v.tool_calls === undefined) throw new RecordError(`field "${field}": message has no "content" (or "value")`, field);
  // A message that only carries tool calls has null content; it is still a turn.
  const content = rawContent === null || rawContent === undefined ? '' : contentText(rawContent, `${field}.content`);
  const msg: Message = { role, content };
  if (v.tool_calls !== undefined && v.tool_calls !== null) {
    if (role !== 'assistant') throw new RecordError(`field "${field}.tool_calls": only assistant messages make tool calls, this one is "${rawRole}"`, field);
    const calls = asToolCalls(v.tool_calls, `${field}.tool_calls`);
    if (calls.length > 0) msg.tool_calls = calls;
  }
  // OpenAI's older `function_call` field on an assistant message: one call.
  if (isObject(v.function_call) && role === 'assistant') msg.tool_calls = [...(msg.tool_calls ?? []), asToolCall(v.function_call, `${field}.function_call`)];
  if (v.tool_call_id !== undefined && v.tool_call_id !== null) msg.tool_call_id = asId(v.tool_call_id, `${field}.tool_call_id`);
  if (v.name !== undefined && v.name !== null) {
    if (typeof v.name !== 'string') throw new RecordError(`field "${field}.name": expected text, found ${describe(v.name)}`, field);
    msg.name = v.name;
  }
  return msg;
}

/**
 * The tools a row offers, as chat templates take them (`{type: "function", function: {name,
 * description, parameters}}`): a list, or JSON text of one (LLaMA-Factory's `tools` column), whose
 * entries are that shape or the bare `{name, description, parameters}`. Empty text is no tools.
 */
export function asTools(v: unknown, field: string): ToolSpec[] {
  let list = v;
  if (typeof v === 'string') {
    if (v.trim() === '') return [];
    try {
      list = JSON.parse(v);
    } catch {
      throw new RecordError(`field "${field}": expected a JSON list of tools, found ${describe(v)}`, field);
    }
  }
  if (isObject(list)) list = [list];
  if (!Array.isArray(list)) throw new RecordError(`field "${field}": expected a list of tools, found ${describe(v)}`, field);
  return list.map((t, i) => {
    const f = `${field}[${i}]`;
    if (!isObject(t)) throw new RecordError(`field "${f}": expected a tool {name, description, parameters}, found ${describe(t)}`, field);
    const fn = isObject(t.function) ? t.function : t;
    if (typeof fn.name !== 'string' || fn.name === '') throw new RecordError(`field "${f}": a tool needs a "name"`, field);
    if (fn.description !== undefined && typeof fn.description !== 'string') throw new RecordError(`field "${f}.description": expected text`, field);
    const params = fn.parameters === undefined ? { type: 'object', properties: {} } : fn.parameters;
    if (!isObject(params)) throw new RecordError(`field "${f}.parameters": expected a JSON Schema object, found ${describe(params)}`, field);
    const spec: ToolSpec = { type: 'function', function: { name: fn.name, parameters: params } };
    if (typeof fn.description === 'string') spec.function = { name: fn.name, description: fn.description, parameters: params };
    return spec;
  });
}

/** Same turn: role, content, tool calls, the call a tool message answers, and the name. */
export function sameMessage(a: Message, b: Message): boolean {
  const calls = (m: Message) => (m.tool_calls && m.tool_calls.length > 0 ? JSON.stringify(m.tool_calls) : '');
  return a.role === b.role && a.content === b.content && calls(a) === calls(b) && (a.tool_call_id ?? null) === (b.tool_call_id ?? null) && (a.name ?? null) === (b.name ?? null);
}

export function asMessages(v: unknown, field: string): Message[] {
  if (isObject(v)) return [asMessage(v, field)];
  if (!Array.isArray(v)) throw new RecordError(`field "${field}": expected a list of messages, found ${describe(v)}`, field);
  return v.map((m, i) => asMessage(m, `${field}[${i}]`));
}

/** Plain text or a conversation; in textual inputs a cell holding a JSON message list counts as one. */
export function asText(v: unknown, field: string, ctx: FieldContext): Text {
  if (typeof v === 'string') {
    if (ctx.textual && v.charCodeAt(0) === 0x5b) {
      try {
        const parsed: unknown = JSON.parse(v);
        if (Array.isArray(parsed) && parsed.length > 0 && parsed.every((m) => isObject(m) && ('role' in m || 'from' in m))) {
          return asMessages(parsed, field);
        }
      } catch {
        // not JSON: plain text that happens to start with "["
      }
    }
    return v;
  }
  if (Array.isArray(v) || isObject(v)) return asMessages(v, field);
  throw new RecordError(`field "${field}": expected text or a list of messages, found ${describe(v)}`, field);
}

/** A number; numeric text is accepted (CSV, and JSON written by spreadsheets). NaN stays NaN for validation to name. */
export function asNumber(v: unknown, field: string): number {
  if (typeof v === 'number') return v;
  if (typeof v === 'string') {
    const t = v.trim();
    if (/^[+-]?nan$/i.test(t)) return NaN;
    const n = t === '' ? NaN : Number(t);
    if (!Number.isNaN(n)) return n;
  }
  if (v === null) throw new RecordError(`field "${field}" is null`, field);
  throw new RecordError(`field "${field}": expected a number, found ${describe(v)}`, field);
}

export function asNumbers(v: unknown, field: string, ctx: FieldContext): number[] {
  let list = v;
  if (typeof v === 'string' && ctx.textual) {
    try {
      list = JSON.parse(v);
    } catch {
      throw new RecordError(`field "${field}": expected a JSON list of numbers, found ${describe(v)}`, field);
    }
  }
  if (!Array.isArray(list)) throw new RecordError(`field "${field}": expected a list of numbers, found ${describe(v)}`, field);
  return list.map((x, i) => asNumber(x, `${field}[${i}]`));
}

export function asBool(v: unknown, field: string): boolean {
  if (typeof v === 'boolean') return v;
  if (v === 1 || v === 0) return v === 1;
  if (typeof v === 'string') {
    const t = v.trim().toLowerCase();
    if (t === 'true' || t === '1') return true;
    if (t === 'false' || t === '0') return false;
  }
  throw new RecordError(`field "${field}": expected true or false, found ${describe(v)}`, field);
}

export function asId(v: unknown, field: string): string {
  if (typeof v === 'string') return v;
  if (typeof v === 'number' || typeof v === 'bigint') return String(v);
  throw new RecordError(`field "${field}": expected a text or number id, found ${describe(v)}`, field);
}

/** A list of texts (listwise responses). */
export function asTexts(v: unknown, field: string, ctx: FieldContext): Text[] {
  let list = v;
  if (typeof v === 'string' && ctx.textual) {
    try {
      list = JSON.parse(v);
    } catch {
      throw new RecordError(`field "${field}": expected a JSON list of texts, found ${describe(v)}`, field);
    }
  }
  if (!Array.isArray(list)) throw new RecordError(`field "${field}": expected a list of responses, found ${describe(v)}`, field);
  return list.map((x, i) => asText(x, `${field}[${i}]`, { ...ctx, textual: false }));
}
