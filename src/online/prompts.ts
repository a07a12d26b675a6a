/**
 * Prompts for generation: a text file (one prompt a line), or records with a `prompt` field (plain
 * text or a message list) in any format the dataset readers take (JSON, JSONL, CSV, Parquet, Arrow,
 * gzip'd), e.g. a canonical preference dataset. Bad records are named by file and line or row.
 */
import { readFileSync } from 'node:fs';
import { openSource, toPlain, where } from '../../datasets/readers.ts';
import { UserError } from '../errors.ts';
import type { LoadedTokenizer, Message } from '../tokenize/index.ts';
import type { Text } from '../../datasets/schema.ts';

function asText(v: unknown, at: string): Text {
  if (typeof v === 'string') {
    if (v.length === 0) throw new UserError(`${at}: "prompt" is empty`);
    return v;
  }
  if (Array.isArray(v) && v.length > 0 && v.every((m) => m && typeof m === 'object' && typeof m.role === 'string' && typeof m.content === 'string')) {
    return v.map((m) => ({ role: m.role, content: m.content }));
  }
  throw new UserError(`${at}: "prompt" must be a non-empty string or a list of {role, content} messages`);
}

export async function readPrompts(file: string): Promise<Text[]> {
  if (/\.txt(\.gz)?$/.test(file)) {
    let text: string;
    try {
      text = readFileSync(file, 'utf8');
    } catch (e) {
      throw new UserError(`${file}: cannot read (${(e as Error).message})`);
    }
    const lines = text.split(/\r?\n/).filter((l) => l.trim() !== '');
    if (lines.length === 0) throw new UserError(`${file}: no prompts`);
    return lines;
  }
  const src = await openSource(file);
  const out: Text[] = [];
  for await (const items of src.items()) {
    for (const it of items) {
      const at = where(src, it.pos);
      if (it.error) throw new UserError(`${at}: ${it.error}`);
      const rec = toPlain(it.value) as Record<string, unknown> | null;
      if (!rec || typeof rec !== 'object' || Array.isArray(rec)) throw new UserError(`${at}: expected an object with a "prompt" field`);
      if (!('prompt' in rec)) throw new UserError(`${at}: missing field "prompt"`);
      out.push(asText(rec.prompt, at));
    }
  }
  if (out.length === 0) throw new UserError(`${file}: no prompts`);
  return out;
}

/**
 * Token ids a response is generated after: the same prompt ids `tokenizePromptResponse` gives in
 * training (BOS + plain text, or the chat template with the assistant header for messages).
 */
export function promptIds(tok: LoadedTokenizer, prompt: Text): number[] {
  if (typeof prompt === 'string') {
    const ids = tok.encode(prompt, { addSpecialTokens: false });
    if (tok.addBosToken && tok.bosId !== null) ids.unshift(tok.bosId);
    return ids;
  }
  return tok.encode(tok.applyChatTemplate(prompt as Message[], { addGenerationPrompt: true }), { addSpecialTokens: false });
}

export function promptKey(p: Text): string {
  return typeof p === 'string' ? p : JSON.stringify(p);
}
