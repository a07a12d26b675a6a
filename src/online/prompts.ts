/**
 * Prompts for generation: a text file (one prompt a line), or records with a `prompt` field (plain
 * text or a message list) in any format the dataset readers take (JSON, JSONL, CSV, Parquet, Arrow,
 * gzip'd), e.g. a canonical preference dataset. A message list is read by `convert`'s own reader
 * (datasets/values.ts `asText`), so `tool_calls` (OpenAI or HF shape, arguments as JSON text or an
 * object), `tool_call_id`, `name`, `content: null` beside tool calls and text content parts are kept
 * as convert keeps them. `readPromptRows` (GRPO) keeps each record's other columns (an `answer` for
 * the accuracy reward) and takes math sets' `question` (GSM8K) or `problem` (MATH) column for a
 * missing `prompt`. Bad records are named by file and line or row.
 */
import { readFileSync } from 'node:fs';
import { openSource, toPlain, where, type Source } from '../../datasets/readers.ts';
import { RecordError, asText } from '../../datasets/values.ts';
import { BadInputError, UserError } from '../errors.ts';
import type { LoadedTokenizer } from '../tokenize/index.ts';
import { chatPromptIds } from '../tokenize/conversation.ts';
import type { Text } from '../../datasets/schema.ts';

/** A record's prompt column as convert reads it; a bad value is one line naming the file:line and the field. */
function promptOf(v: unknown, column: string, src: Source, pos: number): Text {
  const at = where(src, pos);
  const place = { file: src.path, [src.unit === 'line' ? 'line' : 'row']: pos };
  let prompt: Text;
  try {
    prompt = asText(v, column, { textual: src.textual, map: {} });
  } catch (e) {
    if (e instanceof RecordError) throw new BadInputError(`${at}: ${e.message}`, place);
    throw e;
  }
  if (prompt.length === 0) throw new BadInputError(`${at}: field "${column}" is empty`, place);
  return prompt;
}

export async function readPrompts(file: string): Promise<Text[]> {
  return (await readPromptRows(file, ['prompt'])).map(rowPrompt);
}

/** A prompt with its whole record (extra columns such as `answer` go to reward functions) and where it stands. */
export interface PromptRow {
  /** null: the row has none, and its environment's `reset` gives it (GRPO with --env). */
  prompt: Text | null;
  /** The record as read (for a text file: `{prompt}`); its prompt column is named `prompt` here. */
  row: Record<string, unknown>;
  /** "FILE:LINE" or "FILE:row N" (as the dataset readers name places), for messages about this prompt. */
  at: string;
}

/** A row's prompt, where only the row can give one (no environment): a row without one is one line naming it. */
export function rowPrompt(r: PromptRow): Text {
  if (r.prompt === null) throw new UserError(`${r.at}: no prompt; only an --env environment whose reset() returns one can answer a row without`);
  return r.prompt;
}

/** Prompt columns of GRPO's prompt files, by preference: `prompt`, else the question column of math sets (GSM8K's `question`, MATH's `problem`). */
export const PROMPT_COLUMNS = ['prompt', 'question', 'problem'] as const;

/**
 * Like `readPrompts`, keeping each record's other columns and its place in the file; the prompt is
 * the first of `columns` a record has (`readPrompts`: `prompt` only). With `promptOptional` (an
 * environment gives the prompts) a record without any of them is kept with a null prompt.
 */
export async function readPromptRows(file: string, columns: readonly string[] = PROMPT_COLUMNS, o: { promptOptional?: boolean } = {}): Promise<PromptRow[]> {
  if (/\.txt(\.gz)?$/.test(file)) {
    let text: string;
    try {
      text = readFileSync(file, 'utf8');
    } catch (e) {
      throw new UserError(`${file}: cannot read (${(e as Error).message})`);
    }
    const out: PromptRow[] = [];
    text.split(/\r?\n/).forEach((l, i) => {
      if (l.trim() !== '') out.push({ prompt: l, row: { prompt: l }, at: `${file}:${i + 1}` });
    });
    if (out.length === 0) throw new UserError(`${file}: no prompts`);
    return out;
  }
  const src = await openSource(file);
  const out: PromptRow[] = [];
  for await (const items of src.items()) {
    for (const it of items) {
      const at = where(src, it.pos);
      if (it.error) throw new UserError(`${at}: ${it.error}`);
      const rec = toPlain(it.value) as Record<string, unknown> | null;
      if (!rec || typeof rec !== 'object' || Array.isArray(rec)) throw new UserError(`${at}: expected an object with a "prompt" field`);
      const column = columns.find((c) => c in rec);
      if (!column && o.promptOptional) {
        out.push({ prompt: null, row: { ...rec }, at });
        continue;
      }
      if (!column) throw new UserError(`${at}: missing field "prompt"${columns.length > 1 ? ` (or ${columns.slice(1).map((c) => `"${c}"`).join(' / ')})` : ''}`);
      const prompt = promptOf(rec[column], column, src, it.pos);
      const row: Record<string, unknown> = { ...rec, prompt };
      if (column !== 'prompt') delete row[column];
      out.push({ prompt, row, at });
    }
  }
  if (out.length === 0) throw new UserError(`${file}: no prompts`);
  return out;
}

/**
 * Token ids a response is generated after: the same prompt ids training gives (BOS + plain text, or
 * the chat template's render with the generation prompt for messages, tool calls included).
 */
export function promptIds(tok: LoadedTokenizer, prompt: Text): number[] {
  if (typeof prompt === 'string') {
    const ids = tok.encode(prompt, { addSpecialTokens: false });
    if (tok.addBosToken && tok.bosId !== null) ids.unshift(tok.bosId);
    return ids;
  }
  return chatPromptIds(tok, prompt);
}

export function promptKey(p: Text): string {
  return typeof p === 'string' ? p : JSON.stringify(p);
}
