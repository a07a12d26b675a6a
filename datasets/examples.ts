/**
 * Training data: any input `convert` accepts (or canonical Parquet) → typed examples → token ids
 * under the model's tokenizer and chat template, truncated to the configured lengths.
 */
import { mkdirSync } from 'node:fs';
import { basename, join } from 'node:path';
import { Table } from './arrow.ts';
import type * as arrow from './arrow.ts';
import { canonicalMeta, readCanonicalBatches, resolveDataset } from './parquet.ts';
import { convert } from './convert.ts';
import type { Kind, Message, PrefzooMeta, Role, Text, ToolCall, ToolSpec } from './schema.ts';
import { readTokenColumns, type TokenRow } from './tokenized.ts';
import { UserError } from '../src/errors.ts';
import { type ChatRenderOptions, type LoadedTokenizer, tokenizeConversation, tokenizePromptResponse } from '../src/tokenize/index.ts';

/** One row of any kind; `responses` holds [chosen, rejected] for pairs, the list for lists, [response] for singles. */
export interface Example {
  prompt: Text;
  responses: Text[];
  /** Listwise labels ψ (higher is better). */
  scores?: number[];
  /** Pairwise reward-model scores [chosen, rejected] (MPO), SPPO win-rates, single-trajectory reward/label. */
  responseScores?: number[];
  winProbs?: number[];
  reward?: number;
  label?: boolean;
  weight?: number;
  source?: string;
  /** Pairwise: why chosen beats rejected (absent on rows without one). */
  rationale?: string;
  /** The tools the row offers (the chat template's `tools`), when it has any. */
  tools?: ToolSpec[];
}

export interface TokenizedExample {
  promptIds: number[];
  responseIds: number[][];
  /** KTO: the response of another row, scored after this row's prompt for the KL estimate. */
  klResponseIds?: number[];
  /**
   * Per response, 1 on the tokens trained on and 0 on the rest, where a response is more than one
   * assistant turn (tool results, later user turns: docs/agents.md); absent where every response
   * token counts.
   */
  responseMasks?: number[][];
  /** Cut to the length limits, here or when `prefzoo tokenize` stored the ids. */
  truncated?: boolean;
  /** The rationale as a sequence of its own (src/train/rationale.ts), when the row has one and the loss reads it. */
  rationale?: { promptIds: number[]; responseIds: number[] };
  src: Example;
}

export interface LoadedData {
  kind: Kind;
  meta: PrefzooMeta;
  examples: Example[];
  /** The canonical Parquet file(s) the examples came from. */
  files: string[];
  /** Token ids stored by `prefzoo tokenize`, when the file has them. */
  tokens?: TokenRow[];
  /** The Arrow table itself (for writing derived columns), when the data is one file. */
  table?: arrow.Table;
}

function textOf(v: unknown, where: string): Text {
  if (typeof v === 'string') return v;
  if (v && typeof (v as { toArray?: unknown }).toArray === 'function') {
    return Array.from((v as { toArray(): unknown[] }).toArray(), (m) => {
      const row = m as { role: string; content: string; tool_calls?: string | null; tool_call_id?: string | null; name?: string | null };
      // Roles and tool calls were checked when the file was converted (datasets/validate.ts, values.ts).
      const msg: Message = { role: String(row.role) as Role, content: String(row.content) };
      if (row.tool_calls !== undefined && row.tool_calls !== null) {
        try {
          msg.tool_calls = JSON.parse(String(row.tool_calls)) as ToolCall[];
        } catch {
          throw new UserError(`${where}: a message's "tool_calls" is not JSON`);
        }
      }
      if (row.tool_call_id !== undefined && row.tool_call_id !== null) msg.tool_call_id = String(row.tool_call_id);
      if (row.name !== undefined && row.name !== null) msg.name = String(row.name);
      return msg;
    });
  }
  throw new UserError(`${where}: expected text or a message list`);
}

function numbersOf(v: unknown): number[] {
  return Array.from((v as { toArray(): ArrayLike<number> }).toArray(), Number);
}

/** Turns a canonical Arrow table into examples (small per-row objects; the trainer batches from these). */
export function tableExamples(table: arrow.Table | arrow.RecordBatch, meta: PrefzooMeta, file: string, firstRow = 0): Example[] {
  const col = (name: string) => table.getChild(name);
  const prompt = col('prompt')!;
  const out: Example[] = [];
  const opt = (name: string, i: number) => {
    const c = col(name);
    const v = c ? c.get(i) : null;
    return v === null || v === undefined ? undefined : v;
  };
  for (let i = 0; i < table.numRows; i++) {
    const where = `${file}: row ${firstRow + i + 1}`;
    const ex: Example = { prompt: textOf(prompt.get(i), where), responses: [] };
    if (meta.kind === 'pairwise') {
      ex.responses = [textOf(col('chosen')!.get(i), where), textOf(col('rejected')!.get(i), where)];
      const cs = opt('chosen_score', i);
      const rs = opt('rejected_score', i);
      if (cs !== undefined && rs !== undefined) ex.responseScores = [Number(cs), Number(rs)];
      const cp = opt('chosen_prob', i);
      const rp = opt('rejected_prob', i);
      if (cp !== undefined && rp !== undefined) ex.winProbs = [Number(cp), Number(rp)];
      const w = opt('weight', i);
      if (w !== undefined) ex.weight = Number(w);
      const why = opt('rationale', i);
      if (why !== undefined && String(why).trim() !== '') ex.rationale = String(why);
    } else if (meta.kind === 'listwise') {
      const rs = col('responses')!.get(i) as { toArray(): unknown[] };
      ex.responses = Array.from(rs.toArray(), (r) => textOf(r, where));
      ex.scores = numbersOf(col('scores')!.get(i));
      const wp = opt('win_probs', i);
      if (wp !== undefined) ex.winProbs = numbersOf(wp);
    } else {
      ex.responses = [textOf(col('response')!.get(i), where)];
      const r = opt('reward', i);
      if (r !== undefined) ex.reward = Number(r);
      const l = opt('label', i);
      if (l !== undefined) ex.label = Boolean(l);
    }
    const s = opt('source', i);
    if (s !== undefined) ex.source = String(s);
    const tools = opt('tools', i);
    if (tools !== undefined) {
      try {
        ex.tools = JSON.parse(String(tools)) as ToolSpec[];
      } catch {
        throw new UserError(`${where}: column "tools" is not JSON`);
      }
    }
    out.push(ex);
  }
  return out;
}

/**
 * Loads a dataset for training or evaluation: a file, shards, a directory of Parquet shards or a
 * glob (resolveDataset). Canonical Parquet is streamed batch by batch (no file is held whole);
 * anything else is converted first (into `workDir`, kept so the user can see what was trained on).
 * With `maxRows`, only the first rows (in file order) are read.
 */
export async function loadData(file: string, workDir: string, opts: { kind?: Kind; binarize?: boolean; seed?: number; maxRows?: number } = {}): Promise<LoadedData> {
  let files = resolveDataset(file);
  const metas = await Promise.all(files.map(canonicalMeta));
  if (metas.some((m) => !m)) {
    mkdirSync(workDir, { recursive: true });
    const base = files.length === 1 ? basename(files[0]).replace(/(\.gz)?$/, '').replace(/\.[^.]*$/, '') : 'data';
    const out = join(workDir, `${base}.parquet`);
    files = (await convert(files, out, { kind: opts.kind, binarize: opts.binarize, seed: opts.seed })).outputs;
  }
  let meta: PrefzooMeta | null = null;
  const examples: Example[] = [];
  let tokens: TokenRow[] | undefined = [];
  const tables: arrow.Table[] = [];
  for await (const b of readCanonicalBatches(files, { maxRows: opts.maxRows })) {
    meta ??= b.meta;
    const t = new Table([b.batch]);
    examples.push(...tableExamples(t, b.meta, b.file, b.fileRow));
    const tk = readTokenColumns(t, b.meta.kind);
    // Token ids count only when every row has them.
    if (tokens && tk) tokens.push(...tk);
    else tokens = undefined;
    if (files.length === 1) tables.push(t);
  }
  if (!meta || examples.length === 0) throw new UserError(`${file}: has no rows`);
  if (opts.kind && meta.kind !== opts.kind) {
    throw new UserError(`${file}: is ${meta.kind} data, this needs ${opts.kind}`);
  }
  const table = tables.length ? new Table(tables.flatMap((t) => t.batches)) : undefined;
  return { kind: meta.kind, meta, examples, files, tokens, table };
}

/** How rows are cut to length (the trainer's settings of the same names, src/train/config.ts). */
export interface TruncationConfig {
  /** Longest prompt + response in tokens. */
  max_length: number;
  /** Longest prompt in tokens. */
  max_prompt_length: number;
  /** Which end of an over-long prompt to keep. */
  truncation: 'keep_start' | 'keep_end';
}

/** The defaults of training and evaluation alike. */
export const DEFAULT_TRUNCATION: TruncationConfig = { max_length: 512, max_prompt_length: 256, truncation: 'keep_end' };

/**
 * Whether an example's responses hold more than the assistant's own turn (tool results, later user
 * turns) or tool calls, so its tokens need a mask (src/tokenize/conversation.ts) rather than the
 * prompt/response split.
 */
export function needsMask(ex: Example): boolean {
  if (typeof ex.prompt === 'string') return false;
  if (ex.tools && ex.tools.length > 0) return true;
  const calls = (ms: Text) => typeof ms !== 'string' && ms.some((m) => (m.tool_calls && m.tool_calls.length > 0) || m.role === 'tool');
  return calls(ex.prompt) || ex.responses.some((r) => typeof r !== 'string' && (r.length > 1 || calls(r)));
}

/**
 * A conversational example whose responses need masks: each response rendered after the prompt as
 * one conversation (its tools offered), the prompt's ids those before the first response turn.
 */
function tokenizeMasked(tok: LoadedTokenizer, ex: Example, render: ChatRenderOptions): { promptIds: number[]; responseIds: number[][]; masks: number[][] } {
  const prompt = ex.prompt as Message[];
  let promptIds: number[] | null = null;
  const responseIds: number[][] = [];
  const masks: number[][] = [];
  for (const r of ex.responses) {
    const resp: Message[] = typeof r === 'string' ? [{ role: 'assistant', content: r }] : r;
    const conv = tokenizeConversation(tok, [...prompt, ...resp], { ...render, tools: ex.tools ?? render.tools, from: prompt.length });
    const p = conv.ids.slice(0, conv.promptLength);
    if (promptIds === null) promptIds = p;
    else if (p.length !== promptIds.length || p.some((id, j) => id !== promptIds![j])) {
      throw new UserError(`${tok.dir}: the chat template renders the same prompt differently before different responses, so they cannot share it`);
    }
    responseIds.push(conv.ids.slice(conv.promptLength));
    masks.push(conv.mask.slice(conv.promptLength));
  }
  return { promptIds: promptIds ?? [], responseIds, masks };
}

/**
 * Tokenizes examples (or takes the ids a tokenized file already holds); rows that had to be
 * truncated (here, or by `prefzoo tokenize` before) are counted, never dropped. Rows with tool calls
 * or multi-turn responses get `responseMasks` (the assistant's own tokens only); their ids are
 * always made here, since stored ids carry no mask.
 */
export function tokenizeExamples(
  examples: Example[],
  tok: LoadedTokenizer,
  cfg: TruncationConfig,
  stored?: TokenRow[],
  onProgress?: (done: number) => void,
  render: ChatRenderOptions = {},
): { rows: TokenizedExample[]; truncated: number } {
  let truncated = 0;
  const rows = examples.map((ex, i) => {
    if (onProgress && i % 256 === 0) onProgress(i);
    let promptIds: number[] = stored ? stored[i].promptIds : [];
    let masks: number[][] | undefined;
    let responseIds: number[][];
    if (needsMask(ex)) {
      const t = tokenizeMasked(tok, ex, render);
      promptIds = t.promptIds;
      responseIds = t.responseIds;
      masks = t.masks;
    } else {
      responseIds = stored
        ? stored[i].responseIds
        : ex.responses.map((r, k) => {
            const ids = tokenizePromptResponse(tok, ex.prompt, r);
            if (k === 0) promptIds = ids.promptIds;
            return ids.responseIds;
          });
    }
    let cut = stored?.[i].truncated ?? false;
    if (promptIds.length > cfg.max_prompt_length) {
      promptIds = cfg.truncation === 'keep_end' ? promptIds.slice(-cfg.max_prompt_length) : promptIds.slice(0, cfg.max_prompt_length);
      cut = true;
    }
    const room = cfg.max_length - promptIds.length;
    const resp = responseIds.map((r) => {
      if (r.length > room) {
        cut = true;
        return r.slice(0, room);
      }
      return r;
    });
    if (cut) truncated++;
    if (masks) return { promptIds, responseIds: resp, responseMasks: masks.map((m) => m.slice(0, room)), truncated: cut, src: ex };
    return { promptIds, responseIds: resp, truncated: cut, src: ex };
  });
  onProgress?.(examples.length);
  return { rows, truncated };
}
