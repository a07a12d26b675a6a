/**
 * Tool calls in the text a model writes, in the formats chat templates teach: Hermes / Qwen2.5 /
 * Qwen3 (`<tool_call>{"name", "arguments"}</tool_call>`, several per turn) and Llama 3.x JSON calls
 * (`{"name", "parameters"}`, possibly after `<|python_tag|>`). The format is read off the chat
 * template's own text, so the parser always matches what the template renders.
 *
 * A malformed call is a counted, typed result (`ToolCallError`), never an exception: a policy under
 * training writes broken calls all the time, and the rollout answers them instead of stopping.
 */
import type { ToolCall } from '../chat.ts';

export type ToolCallFormat = 'hermes' | 'llama3';

export const TOOL_CALL_FORMATS: readonly ToolCallFormat[] = ['hermes', 'llama3'];

/** Why a call could not be read. */
export type ToolCallErrorKind =
  /** The call's text is not JSON. */
  | 'invalid_json'
  /** JSON, but not an object with a string `name`. */
  | 'missing_name'
  /** `arguments` / `parameters` is neither an object nor a string holding a JSON object. */
  | 'invalid_arguments'
  /** `<tool_call>` opened and never closed (the turn ran out of tokens, or the model forgot). */
  | 'unterminated';

export interface ToolCallError {
  kind: ToolCallErrorKind;
  /** The text of the call as written. */
  raw: string;
  /** One line saying what is wrong, for the tool message that answers it. */
  message: string;
}

/** One assistant turn read back: its free text, the calls it makes, and the calls that failed to parse. */
export interface ParsedTurn {
  /** The text outside the calls, trimmed. */
  content: string;
  toolCalls: ToolCall[];
  errors: ToolCallError[];
}

/**
 * The call format a chat template renders, from its text: Hermes-style templates write `<tool_call>`
 * tags; Llama 3.x templates write `"parameters"` beside `<|python_tag|>`, `<|eom_id|>` or the
 * `ipython` role. Null when the template renders no tool calls at all.
 */
export function toolCallFormatOf(template: string | null | undefined): ToolCallFormat | null {
  if (!template) return null;
  if (template.includes('<tool_call>')) return 'hermes';
  if (template.includes('parameters') && /<\|python_tag\|>|<\|eom_id\|>|ipython/.test(template)) return 'llama3';
  return null;
}

/** Whether the template reads `tools` and renders assistant `tool_calls` (so such data is not silently lost). */
export function templateToolSupport(template: string | null | undefined): { tools: boolean; toolCalls: boolean; format: ToolCallFormat | null } {
  const t = template ?? '';
  return { tools: /\btools\b/.test(t), toolCalls: /\btool_calls\b/.test(t), format: toolCallFormatOf(t) };
}

function shorten(s: string): string {
  const one = s.replace(/\s+/g, ' ').trim();
  return one.length > 80 ? `${one.slice(0, 77)}...` : one;
}

/** A parsed JSON call → a ToolCall, or the error it is. `argsKey` is where the arguments live. */
function callOf(raw: string, value: unknown, argsKeys: readonly string[]): ToolCall | ToolCallError {
  if (value === null || typeof value !== 'object' || Array.isArray(value)) {
    return { kind: 'missing_name', raw, message: `tool call ${JSON.stringify(shorten(raw))} is not a JSON object` };
  }
  const o = value as Record<string, unknown>;
  if (typeof o.name !== 'string' || o.name === '') {
    return { kind: 'missing_name', raw, message: `tool call ${JSON.stringify(shorten(raw))} has no "name"` };
  }
  const key = argsKeys.find((k) => o[k] !== undefined);
  let args: unknown = key === undefined ? {} : o[key];
  if (typeof args === 'string') {
    // Some models write the arguments as a JSON string, as the OpenAI API carries them.
    try {
      args = JSON.parse(args);
    } catch {
      return { kind: 'invalid_arguments', raw, message: `tool call "${o.name}": "${key}" is a string that is not JSON` };
    }
  }
  if (args === null || typeof args !== 'object' || Array.isArray(args)) {
    return { kind: 'invalid_arguments', raw, message: `tool call "${o.name}": "${key}" must be a JSON object` };
  }
  return { type: 'function', function: { name: o.name, arguments: args as Record<string, unknown> } };
}

function isError(x: ToolCall | ToolCallError): x is ToolCallError {
  return (x as ToolCallError).kind !== undefined;
}

function parseJson(raw: string): { ok: true; value: unknown } | { ok: false; message: string } {
  try {
    return { ok: true, value: JSON.parse(raw) };
  } catch (e) {
    return { ok: false, message: String((e as Error).message).replace(/\s+/g, ' ') };
  }
}

const OPEN = '<tool_call>';
const CLOSE = '</tool_call>';

/** Hermes / Qwen: every `<tool_call>…</tool_call>` block is one call; the rest is the turn's text. */
export function parseHermes(text: string): ParsedTurn {
  const toolCalls: ToolCall[] = [];
  const errors: ToolCallError[] = [];
  let content = '';
  let at = 0;
  for (;;) {
    const open = text.indexOf(OPEN, at);
    if (open < 0) {
      content += text.slice(at);
      break;
    }
    content += text.slice(at, open);
    const close = text.indexOf(CLOSE, open + OPEN.length);
    if (close < 0) {
      const raw = text.slice(open);
      errors.push({ kind: 'unterminated', raw, message: `${OPEN} without ${CLOSE}` });
      break;
    }
    const raw = text.slice(open + OPEN.length, close).trim();
    const json = parseJson(raw);
    if (!json.ok) errors.push({ kind: 'invalid_json', raw, message: `tool call ${JSON.stringify(shorten(raw))} is not JSON (${json.message})` });
    else {
      const call = callOf(raw, json.value, ['arguments', 'parameters']);
      if (isError(call)) errors.push(call);
      else toolCalls.push(call);
    }
    at = close + CLOSE.length;
  }
  return { content: content.trim(), toolCalls, errors };
}

/**
 * The end of the JSON value that starts at `from` (an object or array; strings and escapes
 * respected), or -1 when it never closes.
 */
function jsonEnd(s: string, from: number): number {
  let depth = 0;
  let inString = false;
  for (let i = from; i < s.length; i++) {
    const c = s[i];
    if (inString) {
      if (c === '\\') i++;
      else if (c === '"') inString = false;
    } else if (c === '"') inString = true;
    else if (c === '{' || c === '[') depth++;
    else if (c === '}' || c === ']') {
      depth--;
      if (depth === 0) return i + 1;
    }
  }
  return -1;
}

const PYTHON_TAG = '<|python_tag|>';

/**
 * Llama 3.x: a turn that is a tool call consists of JSON objects `{"name", "parameters"}` (one, or
 * several separated by `;` or whitespace), optionally after `<|python_tag|>`. A turn that does not
 * start with `{` (after the tag) is plain text; one that starts with `{` but is not such a call list
 * is a failed call. Text after `<|python_tag|>` that is not JSON (Llama's built-in Python tool) is an
 * `invalid_json` failure: prefzoo runs JSON tools only.
 */
export function parseLlama3(text: string): ParsedTurn {
  let body = text.trim();
  const tagged = body.startsWith(PYTHON_TAG);
  if (tagged) body = body.slice(PYTHON_TAG.length).trim();
  if (!body.startsWith('{')) {
    if (!tagged) return { content: text.trim(), toolCalls: [], errors: [] };
    return { content: '', toolCalls: [], errors: [{ kind: 'invalid_json', raw: body, message: `${PYTHON_TAG} call ${JSON.stringify(shorten(body))} is not a JSON tool call` }] };
  }
  const toolCalls: ToolCall[] = [];
  const errors: ToolCallError[] = [];
  let at = 0;
  while (at < body.length) {
    const end = jsonEnd(body, at);
    const raw = end < 0 ? body.slice(at) : body.slice(at, end);
    const json = end < 0 ? { ok: false as const, message: 'unterminated JSON' } : parseJson(raw);
    if (!json.ok) {
      errors.push({ kind: 'invalid_json', raw, message: `tool call ${JSON.stringify(shorten(raw))} is not JSON (${json.message})` });
      break;
    }
    const call = callOf(raw, json.value, ['parameters', 'arguments']);
    if (isError(call)) errors.push(call);
    else toolCalls.push(call);
    at = end;
    while (at < body.length && /[\s;]/.test(body[at])) at++;
    if (at < body.length && body[at] !== '{') {
      // Text after the calls: keep it as the turn's text rather than lose it.
      return { content: body.slice(at).trim(), toolCalls, errors };
    }
  }
  return { content: '', toolCalls, errors };
}

/** Reads one assistant turn's text in `format`. */
export function parseToolCalls(text: string, format: ToolCallFormat): ParsedTurn {
  return format === 'hermes' ? parseHermes(text) : parseLlama3(text);
}
