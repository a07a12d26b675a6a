/**
 * Turning one field of an input record into a canonical value, or a RecordError that names the field.
 */
import { type Message, ROLES, type Role, type Text } from './names.ts';

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

/** One chat message: {role, content} or sharegpt's {from, value}. */
export function asMessage(v: unknown, field: string): Message {
  if (!isObject(v)) throw new RecordError(`field "${field}": expected a message {role, content}, found ${describe(v)}`, field);
  const rawRole = v.role ?? v.from;
  if (typeof rawRole !== 'string') throw new RecordError(`field "${field}": message has no "role" (or "from")`, field);
  const role = ROLE_ALIASES[rawRole.toLowerCase()];
  if (!role || !ROLES.has(role)) throw new RecordError(`field "${field}.role": unknown role "${rawRole}" (expected system, user, assistant or tool)`, field);
  const rawContent = v.content !== undefined ? v.content : v.value;
  if (rawContent === undefined) throw new RecordError(`field "${field}": message has no "content" (or "value")`, field);
  // A message that only carries tool calls has null content; it is still a turn.
  const content = rawContent === null ? '' : contentText(rawContent, `${field}.content`);
  return { role, content };
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
