/**
 * A model folder's tokenizer as GGUF metadata (llama.cpp's `tokenizer.ggml.*` keys):
 *
 * - byte-level BPE (GPT-2's byte-to-character alphabet, `ByteLevel` pre-tokenizer or decoder):
 *   model `gpt2`, the tokens, their types, the merges as "a b" strings, and `tokenizer.ggml.pre`, the
 *   name llama.cpp gives the pre-tokenizer's split pattern (gpt-2, qwen2, llama-bpe, smollm);
 * - SentencePiece-style BPE (`▁` for spaces, `<0xNN>` byte fallback): model `llama`, with scores
 *   that order the merges (a token made by merge k scores −k);
 * - Unigram: model `llama`, with the tokenizer's own scores.
 *
 * Token types: 1 normal, 2 unknown, 3 control (special added tokens), 4 user-defined (other added
 * tokens), 5 unused (padding rows of an embedding larger than the vocabulary, `[PADn]`), 6 byte.
 * Special ids come from tokenizer_config.json's tokens and config.json; the chat template from
 * tokenizer_config.json (or chat_template.jinja).
 */
import fs from 'node:fs';
import path from 'node:path';
import { UserError } from '../errors.ts';
import type { ModelConfig } from '../models/config.ts';
import { type GgufValue, ggufValue as meta } from '../models/family.ts';
import { readJsonIfAny } from './source.ts';

const NORMAL = 1;
const UNKNOWN = 2;
const CONTROL = 3;
const USER_DEFINED = 4;
const UNUSED = 5;
const BYTE = 6;

/** Split patterns of byte-level pre-tokenizers and llama.cpp's names for them (llama-vocab.cpp). */
const PRE_PATTERNS: Record<string, string> = {
  "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+": 'qwen2',
  "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+": 'llama-bpe',
};

interface PreTok {
  type?: string;
  use_regex?: boolean;
  individual_digits?: boolean;
  pattern?: { Regex?: string; String?: string };
  pretokenizers?: PreTok[];
}

/** llama.cpp's name of a byte-level BPE tokenizer's pre-tokenizer, or a one-line refusal. */
function preName(pre: PreTok | null, file: string): string {
  const list = pre?.type === 'Sequence' ? (pre.pretokenizers ?? []) : pre ? [pre] : [];
  const kinds = list.map((p) => p.type).join('+');
  if (kinds === 'ByteLevel' && list[0].use_regex !== false) return 'gpt-2';
  if (kinds === 'Digits+ByteLevel' && list[0].individual_digits === true && list[1].use_regex !== false) return 'smollm';
  if (kinds === 'Split+ByteLevel' && list[1].use_regex === false) {
    const name = PRE_PATTERNS[list[0].pattern?.Regex ?? ''];
    if (name) return name;
  }
  throw new UserError(`${file}: pre_tokenizer ${JSON.stringify(pre)} has no llama.cpp name known here (known: GPT-2's ByteLevel, SmolLM's Digits+ByteLevel, the Qwen2 and Llama-3 split patterns)`);
}

function specialContent(v: unknown): string | null {
  if (typeof v === 'string') return v;
  if (v && typeof v === 'object' && typeof (v as { content?: unknown }).content === 'string') return (v as { content: string }).content;
  return null;
}

function firstId(v: number | number[] | null | undefined): number | undefined {
  if (Array.isArray(v)) return v[0];
  return v ?? undefined;
}

/** The `tokenizer.*` metadata of the model folder `dir`, padded to the embedding's `vocab_size` rows. */
export function ggufTokenizer(dir: string, config: ModelConfig): Map<string, GgufValue> {
  const file = path.join(dir, 'tokenizer.json');
  const tj = readJsonIfAny(dir, 'tokenizer.json');
  if (!tj) throw new UserError(`${dir}: no tokenizer.json; the GGUF file carries the tokenizer, so the fast tokenizer file is needed`);
  const tc = readJsonIfAny(dir, 'tokenizer_config.json') ?? {};
  const model = tj.model as { type?: string; vocab?: unknown; merges?: unknown; byte_fallback?: boolean; unk_id?: number | null } | undefined;
  if (!model || typeof model !== 'object') throw new UserError(`${file}: no "model"`);
  const added = (Array.isArray(tj.added_tokens) ? tj.added_tokens : []) as { id: number; content: string; special?: boolean }[];

  const V = config.vocab_size;
  const tokens: (string | undefined)[] = new Array(V);
  const types = new Int32Array(V);
  const scores = new Float32Array(V);
  const put = (id: number, text: string, type: number, score = 0) => {
    if (!Number.isInteger(id) || id < 0) throw new UserError(`${file}: token "${text}" has id ${id}`);
    if (id >= V) throw new UserError(`${file}: token "${text}" has id ${id}, beyond the model's ${V} embedding rows`);
    tokens[id] = text;
    types[id] = type;
    scores[id] = score;
  };

  const out = new Map<string, GgufValue>();
  if (model.type === 'BPE') {
    const vocab = model.vocab as Record<string, number>;
    const merges = ((model.merges ?? []) as (string | [string, string])[]).map((m) => (Array.isArray(m) ? `${m[0]} ${m[1]}` : m));
    if (model.byte_fallback) {
      // SentencePiece converted to BPE: the token a merge makes scores by the merge's rank.
      const rank = new Map<string, number>();
      merges.forEach((m, k) => {
        const sp = m.indexOf(' ', 1);
        const t = m.slice(0, sp) + m.slice(sp + 1);
        if (!rank.has(t)) rank.set(t, k);
      });
      for (const [t, id] of Object.entries(vocab)) put(id, t, /^<0x[0-9A-F]{2}>$/.test(t) ? BYTE : NORMAL, -(rank.get(t) ?? 0));
      out.set('tokenizer.ggml.model', meta.str('llama'));
    } else {
      for (const [t, id] of Object.entries(vocab)) put(id, t, NORMAL);
      out.set('tokenizer.ggml.model', meta.str('gpt2'));
      out.set('tokenizer.ggml.pre', meta.str(preName((tj.pre_tokenizer ?? null) as PreTok | null, file)));
      out.set('tokenizer.ggml.merges', meta.strings(merges));
    }
  } else if (model.type === 'Unigram') {
    const vocab = model.vocab as [string, number][];
    vocab.forEach(([t, s], id) => put(id, t, /^<0x[0-9A-F]{2}>$/.test(t) ? BYTE : NORMAL, s));
    if (typeof model.unk_id === 'number') types[model.unk_id] = UNKNOWN;
    out.set('tokenizer.ggml.model', meta.str('llama'));
  } else {
    throw new UserError(`${file}: tokenizer model "${model.type}" is not exported to GGUF (supported: BPE, Unigram)`);
  }
  for (const a of added) put(a.id, a.content, a.special ? CONTROL : USER_DEFINED, scores[a.id]);
  const unk = specialContent(tc.unk_token);
  for (let id = 0; id < V; id++) {
    if (tokens[id] === undefined) {
      tokens[id] = `[PAD${id}]`;
      types[id] = UNUSED;
    } else if (unk !== null && tokens[id] === unk) types[id] = UNKNOWN;
  }
  // Keys in the order llama.cpp's converter writes them.
  const ordered = new Map<string, GgufValue>([['tokenizer.ggml.model', out.get('tokenizer.ggml.model')!]]);
  if (out.has('tokenizer.ggml.pre')) ordered.set('tokenizer.ggml.pre', out.get('tokenizer.ggml.pre')!);
  ordered.set('tokenizer.ggml.tokens', meta.strings(tokens as string[]));
  if (model.type !== 'BPE' || model.byte_fallback) ordered.set('tokenizer.ggml.scores', meta.f32s(scores));
  ordered.set('tokenizer.ggml.token_type', meta.i32s(types));
  if (out.has('tokenizer.ggml.merges')) ordered.set('tokenizer.ggml.merges', out.get('tokenizer.ggml.merges')!);

  const idOf = (key: string): number | undefined => {
    const content = specialContent(tc[key]);
    if (content === null) return undefined;
    const i = tokens.indexOf(content);
    return i >= 0 ? i : undefined;
  };
  const ids: [string, number | undefined][] = [
    ['bos_token_id', idOf('bos_token') ?? firstId(config.bos_token_id)],
    ['eos_token_id', idOf('eos_token') ?? firstId(config.eos_token_id)],
    ['unknown_token_id', idOf('unk_token')],
    ['padding_token_id', idOf('pad_token') ?? firstId(config.pad_token_id)],
  ];
  for (const [k, v] of ids) if (v !== undefined) ordered.set(`tokenizer.ggml.${k}`, meta.u32(v));
  if (typeof tc.add_bos_token === 'boolean') ordered.set('tokenizer.ggml.add_bos_token', meta.bool(tc.add_bos_token));
  if (typeof tc.add_eos_token === 'boolean') ordered.set('tokenizer.ggml.add_eos_token', meta.bool(tc.add_eos_token));
  const jinja = path.join(dir, 'chat_template.jinja');
  const template = typeof tc.chat_template === 'string' ? tc.chat_template : fs.existsSync(jinja) ? fs.readFileSync(jinja, 'utf8') : null;
  if (template !== null) ordered.set('tokenizer.chat_template', meta.str(template));
  return ordered;
}
