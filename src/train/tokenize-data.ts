/**
 * `prefzoo tokenize` as a function: adds model-ready token columns (List<Int32>) to a canonical
 * dataset with the model's tokenizer and chat template, streaming one input batch at a time to
 * Parquet shards (temporary names, then renamed; nothing is left on an error).
 */
import * as arrow from '../../datasets/arrow.ts';
import { ParquetSink, parquetFooter, readCanonicalBatches, resolveDataset } from '../../datasets/parquet.ts';
import { META_KEY, type Kind } from '../../datasets/schema.ts';
import { withTokenColumns, tokenColumnNames } from '../../datasets/tokenized.ts';
import { tableExamples, tokenizeExamples } from '../../datasets/examples.ts';
import { loadTokenizer } from '../tokenize/index.ts';
import { BadInputError, UserError } from '../errors.ts';
import { checkOutputFolder } from '../io/atomic.ts';
import { startProgress, type ProgressFactory } from '../progress.ts';
import { DEFAULT_CONFIG } from './config.ts';

export interface TokenizeOptions {
  /** Model folder with tokenizer.json (and tokenizer_config.json for chat templates). */
  model: string;
  /** Longest prompt + response in tokens (default: train's max_length). */
  maxLength?: number;
  /** Longest prompt in tokens (default: train's max_prompt_length). */
  maxPromptLength?: number;
  /** Which end of an over-long prompt to keep (default: train's truncation). */
  truncation?: 'keep_start' | 'keep_end';
  /** Tokenize only the first N rows (default: all). */
  maxRows?: number;
  /** Start a new output shard past this many bytes (default 512 MiB). */
  shardBytes?: number;
  /** A Jinja chat-template file used instead of the model's own. */
  chatTemplateFile?: string;
  progress?: ProgressFactory;
  /** Stops between input batches (nothing is left written). */
  signal?: AbortSignal;
}

export interface TokenizeSummary {
  rows: number;
  kind: Kind;
  truncated: number;
  maxLength: number;
  maxPromptLength: number;
  truncation: 'keep_start' | 'keep_end';
  /** Mean and largest prompt + longest response, in tokens. */
  meanTokens: number;
  maxTokens: number;
  columns: string[];
  outputs: string[];
}

export async function tokenizeDataset(input: string, out: string, o: TokenizeOptions): Promise<TokenizeSummary> {
  const max_length = o.maxLength ?? DEFAULT_CONFIG.max_length;
  const max_prompt_length = o.maxPromptLength ?? DEFAULT_CONFIG.max_prompt_length;
  const truncation = o.truncation ?? DEFAULT_CONFIG.truncation;
  if (max_prompt_length >= max_length) throw new BadInputError(`--max-prompt-length (${max_prompt_length}) must be smaller than --max-length (${max_length})`, { setting: 'max_prompt_length' });
  if (truncation !== 'keep_start' && truncation !== 'keep_end') throw new BadInputError(`--truncation must be keep_start or keep_end, got "${truncation}"`, { setting: 'truncation' });
  checkOutputFolder(out, '-o');
  const tok = loadTokenizer(o.model, { chatTemplateFile: o.chatTemplateFile });
  // Rows to do, from the files' footers: the progress total.
  let total = 0;
  for (const f of resolveDataset(input)) total += (await parquetFooter(f)).rows;
  if (o.maxRows) total = Math.min(total, o.maxRows);
  const progress = startProgress(o.progress, 'tokenize', total);
  const trunc = { max_length, max_prompt_length, truncation };
  let sink: ParquetSink | null = null;
  let schema: arrow.Schema | null = null;
  let kind: Kind = 'pairwise';
  let rowsOut = 0;
  let truncated = 0;
  let lenSum = 0;
  let lenMax = 0;
  try {
    for await (const b of readCanonicalBatches(input, { maxRows: o.maxRows })) {
      o.signal?.throwIfAborted();
      const examples = tableExamples(b.batch, b.meta, b.file, b.fileRow);
      const r = tokenizeExamples(examples, tok, trunc, undefined, (n) => progress.update(rowsOut + n));
      const t = withTokenColumns(new arrow.Table([b.batch]), b.meta.kind, r.rows);
      if (!schema) {
        kind = b.meta.kind;
        schema = new arrow.Schema(t.schema.fields, new Map([[META_KEY, JSON.stringify(b.meta)]]));
        sink = new ParquetSink(out, b.meta, { shardBytes: o.shardBytes ?? 512 * 1024 * 1024 });
      } else if (t.schema.fields.map((f) => f.name).join(',') !== schema.fields.map((f) => f.name).join(',')) {
        throw new BadInputError(`${b.file}: columns ${t.schema.fields.map((f) => f.name).join(', ')} differ from the first file's (${schema.fields.map((f) => f.name).join(', ')})`, { file: b.file });
      }
      for (const rb of t.batches) await sink!.write(new arrow.RecordBatch(schema, rb.data));
      rowsOut += r.rows.length;
      truncated += r.truncated;
      for (const row of r.rows) {
        const len = row.promptIds.length + Math.max(...row.responseIds.map((x) => x.length));
        lenSum += len;
        lenMax = Math.max(lenMax, len);
      }
    }
    progress.stop();
    if (!sink || rowsOut === 0) throw new UserError(`${input}: has no rows`);
    const outputs = await (sink as ParquetSink).close();
    return { rows: rowsOut, kind, truncated, maxLength: max_length, maxPromptLength: max_prompt_length, truncation, meanTokens: lenSum / rowsOut, maxTokens: lenMax, columns: tokenColumnNames(kind), outputs };
  } catch (e) {
    progress.stop();
    await (sink as ParquetSink | null)?.abort();
    throw e;
  }
}
