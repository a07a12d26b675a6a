/**
 * Tokenizers of Hugging Face model folders: `tokenizer.json` (run by @huggingface/tokenizers),
 * `tokenizer_config.json` (special tokens, chat template) and, when present, `chat_template.jinja`
 * and `generation_config.json` (extra stop tokens). Chat templates run on @huggingface/jinja with the
 * variables transformers passes (`messages`, `add_generation_prompt`, `bos_token`, `eos_token`, ...).
 */
import fs from 'node:fs';
import path from 'node:path';
import { Tokenizer } from '@huggingface/tokenizers';
import { Template } from '@huggingface/jinja';
import { UserError } from '../errors.ts';

import type { Message } from '../chat.ts';
export type { Message } from '../chat.ts';

export interface EncodeOptions {
  /** Add what the tokenizer's post-processor adds around a sequence (e.g. BOS). Default true, as in HF. */
  addSpecialTokens?: boolean;
}

export interface DecodeOptions {
  /** Drop special tokens (BOS, EOS, PAD, chat markers) from the text. Default false. */
  skipSpecialTokens?: boolean;
}

export interface ChatTemplateOptions {
  /** Append the header that starts an assistant turn (for generation and for prompts). Default false. */
  addGenerationPrompt?: boolean;
  /** Extra template variables (e.g. `{enable_thinking: false}` for Qwen3, `tools`). */
  variables?: Record<string, unknown>;
}

export interface LoadedTokenizer {
  /** Folder the tokenizer was read from (used in error messages). */
  readonly dir: string;
  /** Number of token ids: 1 + the largest id of the vocabulary and added tokens. */
  readonly vocabSize: number;
  readonly bosToken: string | null;
  readonly eosToken: string | null;
  readonly padToken: string | null;
  readonly bosId: number | null;
  readonly eosId: number | null;
  readonly padId: number | null;
  /** Whether a sequence starts with BOS (tokenizer_config `add_bos_token`, else what the post-processor does). */
  readonly addBosToken: boolean;
  /** Ids that end generation: EOS plus the `eos_token_id`s of generation_config.json. */
  readonly stopIds: number[];
  /** The Jinja chat template, or null when the folder has none. */
  readonly chatTemplate: string | null;
  encode(text: string, opts?: EncodeOptions): number[];
  decode(ids: readonly number[], opts?: DecodeOptions): string;
  tokenToId(token: string): number | undefined;
  idToToken(id: number): string | undefined;
  /** Renders `messages` with the chat template; throws a UserError when there is none. */
  applyChatTemplate(messages: readonly Message[], opts?: ChatTemplateOptions): string;
}

/** Messages from libraries may span lines; a UserError is printed as one. */
function oneLine(e: unknown): string {
  return String((e as Error)?.message ?? e).replace(/\s+/g, ' ').trim();
}

function readJsonFile(file: string): Record<string, unknown> {
  let text: string;
  try {
    text = fs.readFileSync(file, 'utf8');
  } catch (e) {
    throw new UserError(`${file}: cannot read (${oneLine(e)})`);
  }
  let json: unknown;
  try {
    json = JSON.parse(text);
  } catch (e) {
    throw new UserError(`${file}: invalid JSON (${oneLine(e)})`);
  }
  if (json === null || typeof json !== 'object' || Array.isArray(json)) throw new UserError(`${file}: must be a JSON object`);
  return json as Record<string, unknown>;
}

/** A special-token entry of tokenizer_config.json is a string, null, or an AddedToken object `{content}`. */
function tokenText(v: unknown, file: string, key: string): string | null {
  if (v === undefined || v === null) return null;
  if (typeof v === 'string') return v;
  if (typeof v === 'object' && typeof (v as { content?: unknown }).content === 'string') return (v as { content: string }).content;
  throw new UserError(`${file}: "${key}" must be a token string, got ${JSON.stringify(v)}`);
}

function readTemplateFile(file: string): { text: string; source: string } {
  try {
    return { text: fs.readFileSync(file, 'utf8'), source: file };
  } catch (e) {
    throw new UserError(`--chat-template ${file}: cannot read (${(e as NodeJS.ErrnoException).code ?? oneLine(e)})`);
  }
}

/** The chat template: chat_template.jinja wins (newer transformers save it there), then tokenizer_config. */
function findChatTemplate(dir: string, config: Record<string, unknown>, configFile: string): { text: string; source: string } | null {
  const jinjaFile = path.join(dir, 'chat_template.jinja');
  if (fs.existsSync(jinjaFile)) return { text: fs.readFileSync(jinjaFile, 'utf8'), source: jinjaFile };
  const t = config.chat_template;
  if (t === undefined || t === null) return null;
  if (typeof t === 'string') return { text: t, source: configFile };
  // A list of named templates: transformers uses the one called "default".
  if (Array.isArray(t)) {
    const named = t.find((x) => x && typeof x === 'object' && (x as { name?: unknown }).name === 'default');
    if (named && typeof (named as { template?: unknown }).template === 'string') {
      return { text: (named as { template: string }).template, source: configFile };
    }
    throw new UserError(`${configFile}: "chat_template" is a list without a template named "default"`);
  }
  throw new UserError(`${configFile}: "chat_template" must be a string or a list of {name, template}`);
}

function stopIdsFrom(dir: string, eosId: number | null): number[] {
  const ids = new Set<number>();
  if (eosId !== null) ids.add(eosId);
  const file = path.join(dir, 'generation_config.json');
  if (fs.existsSync(file)) {
    const v = readJsonFile(file).eos_token_id;
    for (const id of Array.isArray(v) ? v : v === undefined || v === null ? [] : [v]) {
      if (typeof id !== 'number' || !Number.isSafeInteger(id) || id < 0) {
        throw new UserError(`${file}: "eos_token_id" must be a token id or a list of token ids`);
      }
      ids.add(id);
    }
  }
  return [...ids];
}

function checkMessages(messages: readonly Message[], where: string): void {
  if (!Array.isArray(messages)) throw new UserError(`${where}: messages must be a list of {role, content}`);
  messages.forEach((m, i) => {
    if (!m || typeof m !== 'object' || typeof m.role !== 'string' || typeof m.content !== 'string') {
      throw new UserError(`${where}: message ${i} must be {role: string, content: string}, got ${JSON.stringify(m)}`);
    }
  });
}

/**
 * Loads the tokenizer of a model folder. Needs `tokenizer.json`; `tokenizer_config.json` is optional
 * (without it there are no named special tokens and no chat template).
 */
export interface LoadTokenizerOptions {
  /** A Jinja chat-template file that replaces the model's own (`--chat-template FILE`). */
  chatTemplateFile?: string;
}

export function loadTokenizer(dir: string, opts: LoadTokenizerOptions = {}): LoadedTokenizer {
  if (!fs.existsSync(dir)) throw new UserError(`${dir}: no such model folder`);
  const tokFile = path.join(dir, 'tokenizer.json');
  if (!fs.existsSync(tokFile)) {
    throw new UserError(`${dir}: no tokenizer.json (prefzoo needs a Hugging Face "fast" tokenizer file in the model folder)`);
  }
  const tokJson = readJsonFile(tokFile);
  const cfgFile = path.join(dir, 'tokenizer_config.json');
  const config = fs.existsSync(cfgFile) ? readJsonFile(cfgFile) : {};
  let tok: Tokenizer;
  try {
    tok = new Tokenizer(tokJson, config);
  } catch (e) {
    throw new UserError(`${tokFile}: unsupported or invalid tokenizer (${oneLine(e)})`);
  }
  const vocab = tok.get_vocab(true);
  let vocabSize = 0;
  for (const id of vocab.values()) vocabSize = Math.max(vocabSize, id + 1);

  const special = (key: string): [string | null, number | null] => {
    const text = tokenText(config[key], cfgFile, key);
    if (text === null) return [null, null];
    const id = tok.token_to_id(text);
    if (id === undefined) throw new UserError(`${cfgFile}: ${key} ${JSON.stringify(text)} is not in the vocabulary of tokenizer.json`);
    return [text, id];
  };
  const [bosToken, bosId] = special('bos_token');
  const [eosToken, eosId] = special('eos_token');
  const [padToken, padId] = special('pad_token');
  const [unkToken] = special('unk_token');

  const encode = (text: string, opts: EncodeOptions = {}): number[] => {
    if (typeof text !== 'string') throw new UserError(`${dir}: can only tokenize text, got ${typeof text}`);
    return tok.encode(text, { add_special_tokens: opts.addSpecialTokens ?? true }).ids;
  };

  let addBosToken: boolean;
  if (typeof config.add_bos_token === 'boolean') addBosToken = config.add_bos_token && bosId !== null;
  else addBosToken = bosId !== null && encode('a', { addSpecialTokens: true })[0] === bosId;

  const found = opts.chatTemplateFile ? readTemplateFile(opts.chatTemplateFile) : findChatTemplate(dir, config, cfgFile);
  let template: Template | null = null;
  if (found) {
    try {
      template = new Template(found.text);
    } catch (e) {
      throw new UserError(`${found.source}: chat template does not parse (${oneLine(e)})`);
    }
  }

  return {
    dir,
    vocabSize,
    bosToken,
    eosToken,
    padToken,
    bosId,
    eosId,
    padId,
    addBosToken,
    stopIds: stopIdsFrom(dir, eosId),
    chatTemplate: found?.text ?? null,
    encode,
    decode(ids, opts = {}) {
      if (ids.length === 0) return '';
      for (const id of ids) {
        if (!Number.isInteger(id) || tok.id_to_token(id) === undefined) {
          throw new UserError(`${dir}: token id ${id} is not in the vocabulary (${vocabSize} ids)`);
        }
      }
      // No clean-up of spaces: decode(encode(s)) must give s back.
      return tok.decode([...ids], { skip_special_tokens: opts.skipSpecialTokens ?? false, clean_up_tokenization_spaces: false });
    },
    tokenToId: (token) => tok.token_to_id(token),
    idToToken: (id) => tok.id_to_token(id),
    applyChatTemplate(messages, opts = {}) {
      if (!template) {
        throw new UserError(`${dir}: the tokenizer has no chat template (no chat_template in tokenizer_config.json or chat_template.jinja); conversational data needs one`);
      }
      checkMessages(messages, dir);
      try {
        return template.render({
          ...opts.variables,
          messages,
          add_generation_prompt: opts.addGenerationPrompt ?? false,
          bos_token: bosToken ?? '',
          eos_token: eosToken ?? '',
          pad_token: padToken ?? '',
          unk_token: unkToken ?? '',
        });
      } catch (e) {
        throw new UserError(`${found!.source}: chat template failed (${oneLine(e)})`);
      }
    },
  };
}
