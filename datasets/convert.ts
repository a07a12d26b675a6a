/**
 * The conversion pipeline: readers → format adapter → validation → column builders → Parquet sink.
 * Streams: only the batch being built and the row group being written are in memory.
 */
import * as arrow from './arrow.ts';
import { open, rename, rm, stat, type FileHandle } from 'node:fs/promises';
import { basename, dirname, join } from 'node:path';
import { BadInputError, UserError } from '../src/errors.ts';
import { uniform } from '../src/random.ts';
import { fileError, releaseTemp, removeTemp, tempPath } from '../src/io/atomic.ts';
import { BatchBuilder } from './columns.ts';
import { ADAPTERS, type Adapter, type AdapterContext, type FormatName, type Row, detectFormat, expectedShapes } from './formats/index.ts';
import { ParquetSink, type WriteOptions } from './parquet.ts';
import { type Source, openSource, where } from './readers.ts';
import { KIND_SPECS, type Kind, type Message, type TextMode, canonicalSchema, hasToolFields, makeMeta, orderColumns } from './schema.ts';
import { type ValidateOptions, validateRow } from './validate.ts';
import { RecordError, describe, isObject, type Rec } from './values.ts';

export interface ConvertOptions extends ValidateOptions, WriteOptions {
  /** Input format; detected from the first record when absent. */
  format?: FormatName;
  /** Output kind; a listwise input becomes pairwise (binarized) when this says so. */
  kind?: Kind;
  /** `dst → src`: read canonical/format field `dst` from the input's field `src`. */
  map?: Record<string, string>;
  onInvalid?: 'error' | 'skip';
  binarize?: boolean;
  /** Seed of the binarization draw. */
  seed?: number;
  /** Rows per Arrow batch handed to the writer. */
  batchRows?: number;
  /** Bytes of text per Arrow batch handed to the writer. */
  batchBytes?: number;
  /** Stops the conversion between input batches (nothing is left written). */
  signal?: AbortSignal;
}

export interface ConvertSummary {
  read: number;
  written: number;
  skipped: number;
  kind: Kind;
  text: TextMode;
  /** Format detected (or forced) per input, in input order. */
  formats: string[];
  outputs: string[];
  /** `OUT.skipped.jsonl`, when anything was skipped. */
  skippedPath: string | null;
}

/** `out.parquet` → `out.skipped.jsonl`. */
export function skippedPathFor(out: string): string {
  return `${out.endsWith('.parquet') ? out.slice(0, -'.parquet'.length) : out}.skipped.jsonl`;
}

/** Optional columns that must be in every row once the first row has them (no silent nulls). */
const NUMERIC_OPTIONAL = ['chosen_score', 'rejected_score', 'chosen_prob', 'rejected_prob', 'weight', 'reward', 'label', 'win_probs'];

/** Whether a row's messages carry tool calls, tool_call_id or name. */
function rowHasToolFields(row: Row): boolean {
  const texts = (v: unknown): boolean => (Array.isArray(v) ? v.some((x) => (isObject(x) && typeof x.role === 'string' ? hasToolFields(x as unknown as Message) : texts(x))) : false);
  return Object.values(row).some(texts);
}

/** Whether the schema's message structs have the tool-call fields. */
function toolFieldsIn(schema: arrow.Schema): boolean {
  return schema.fields.some((f) => f.name === 'prompt' && arrow.DataType.isList(f.type) && (f.type.children[0].type as arrow.Struct).children.length > 2);
}

function applyMap(rec: Rec, map: Record<string, string>): Rec {
  const out: Rec = { ...rec };
  for (const src of Object.values(map)) delete out[src];
  for (const [dst, src] of Object.entries(map)) out[dst] = rec[src];
  return out;
}

/** The kind an adapter's records become under these options, or a UserError if they conflict. */
function outputKind(adapter: Adapter, first: Rec, opts: ConvertOptions, path: string): { kind: Kind; binarize: boolean } {
  let native = adapter.kind;
  if (adapter.name === 'csv') {
    const inner = detectFormat(first);
    if (!inner) throw new BadInputError(`${path}: the columns (${Object.keys(first).join(', ')}) match no format; expected ${expectedShapes()}`, { file: path });
    native = inner.kind;
  }
  const binarize = native === 'listwise' && (opts.binarize || opts.kind === 'pairwise');
  const kind = binarize ? 'pairwise' : native;
  if (opts.binarize && native !== 'listwise') throw new BadInputError(`--binarize applies to listwise data; ${path} is ${adapter.name} (${native})`, { file: path, setting: 'binarize' });
  if (opts.kind && opts.kind !== kind) throw new BadInputError(`${path}: format ${adapter.name} gives ${native} data, which cannot become --kind ${opts.kind}`, { file: path, setting: 'kind' });
  return { kind, binarize };
}

/**
 * Converts `inputs` to one canonical dataset at `out`. With onInvalid 'error' the first bad record
 * stops the run and nothing is left at `out`; with 'skip' bad records go to `OUT.skipped.jsonl`.
 */
export async function convert(inputs: string[], out: string, opts: ConvertOptions = {}): Promise<ConvertSummary> {
  if (inputs.length === 0) throw new UserError('no input files');
  const outDir = dirname(out);
  const dirStat = await stat(outDir).catch(() => null);
  if (!dirStat?.isDirectory()) throw new UserError(`${out}: directory ${outDir} does not exist`);
  const onInvalid = opts.onInvalid ?? 'error';
  const map = opts.map ?? {};
  const hasMap = Object.keys(map).length > 0;
  const sources: Source[] = [];
  for (const p of inputs) sources.push(await openSource(p));

  const batchRows = opts.batchRows ?? 16384;
  const batchBytes = opts.batchBytes ?? 8 * 1024 * 1024;
  // Seeded, so `--seed` reproduces a binarization exactly.
  const random = uniform(opts.seed ?? 0);
  const skippedPath = skippedPathFor(out);
  const skippedTmp = tempPath(skippedPath);

  let kind: Kind | null = null;
  let text: TextMode | null = null;
  let builder: BatchBuilder | null = null;
  let schema: arrow.Schema | null = null;
  let sink: ParquetSink | null = null;
  let skippedFile: FileHandle | null = null;
  let skippedLines: string[] = [];
  let read = 0;
  let written = 0;
  let skipped = 0;
  const formats: string[] = [];
  const numeric = new Set<string>();

  const flushSkipped = async () => {
    if (skippedLines.length === 0) return;
    skippedFile ??= await open(skippedTmp, 'wx');
    // One write call may take only part of the bytes (a filling disk): loop until all are written.
    const bytes = Buffer.from(skippedLines.join(''));
    for (let done = 0; done < bytes.byteLength; ) done += (await skippedFile.write(bytes, done, bytes.byteLength - done)).bytesWritten;
    skippedLines = [];
  };

  const flushBatch = async () => {
    if (!builder || builder.length === 0) return;
    if (!schema) {
      // The first batch fixes the optional columns: later batches must match one file schema.
      // Messages get the tool-call fields when the first batch has any (datasets/schema.ts messageType).
      schema = canonicalSchema(kind!, text!, orderColumns(kind!, builder.columns), makeMeta(kind!, text!, formats.join('+')), builder.sawToolFields);
      sink = new ParquetSink(out, makeMeta(kind!, text!, formats.join('+')), opts);
    }
    await sink!.write(builder.finish(schema));
  };

  try {
    for (const src of sources) {
      let adapter: Adapter | null = null;
      let ctx: AdapterContext | null = null;
      let fileKind: Kind | null = null;
      const readBefore = read;
      for await (const items of src.items()) {
        opts.signal?.throwIfAborted();
        for (const item of items) {
          read++;
          try {
            if (item.error !== undefined) throw new RecordError(item.error);
            const value = item.value;
            if (!isObject(value)) {
              if (!adapter) throw new BadInputError(`${where(src, item.pos)}: not preference data: expected one object per record, found ${describe(value)}`, { file: src.path, [src.unit === 'line' ? 'line' : 'row']: item.pos });
              throw new RecordError(`expected a record object, found ${describe(value)}`);
            }
            const rec: Rec = hasMap ? applyMap(value, map) : value;
            if (!adapter) {
              adapter = opts.format ? ADAPTERS[opts.format] : detectFormat(rec);
              if (!adapter) {
                const keys = Object.keys(rec);
                const hint = src.textual && keys.length === 1 ? ` (a single column: is the file delimited by ${src.format === 'tsv' ? 'tabs' : 'commas'}?)` : '';
                throw new BadInputError(
                  `${src.path}: not preference data: expected records shaped as ${expectedShapes()}; found fields ${keys.join(', ') || '(none)'}${hint}`,
                  { file: src.path },
                );
              }
              const out = outputKind(adapter, rec, opts, src.path);
              fileKind = out.kind;
              if (kind && kind !== fileKind) throw new BadInputError(`${src.path}: ${fileKind} data, but the inputs before it are ${kind}`, { file: src.path });
              kind = fileKind;
              if (!formats.includes(adapter.name)) formats.push(adapter.name);
              ctx = { textual: src.textual, map, binarize: out.binarize, random, allowTies: opts.allowTies ?? false };
            }
            const row: Row = adapter.toRow(rec, ctx!);
            const mode = validateRow(fileKind!, row, opts);
            if (text === null) text = mode;
            else if (mode !== text) {
              throw new RecordError(`field "prompt" is ${mode === 'plain' ? 'plain text' : 'a message list'}, but earlier records use ${text === 'plain' ? 'plain text' : 'message lists'}`, 'prompt');
            }
            if (!builder) {
              builder = new BatchBuilder(text, KIND_SPECS[kind!].required);
              for (const k of NUMERIC_OPTIONAL) if (row[k] !== undefined) numeric.add(k);
            }
            // Scores, probabilities, weights, rewards and labels go with every row or with none.
            for (const k of numeric) {
              if (row[k] === undefined) throw new RecordError(`missing field "${k}" (the records before it have one)`, k);
            }
            for (const k of NUMERIC_OPTIONAL) {
              if (row[k] !== undefined && !numeric.has(k)) throw new RecordError(`field "${k}" appears, but the first record has none`, k);
            }
            for (const k in row) {
              if (row[k] !== undefined && !builder.has(k)) {
                if (schema) {
                  throw new RecordError(`field "${k}" first appears after ${written} rows were written without it; put a record with it first, or drop it with --map`, k);
                }
                builder.addColumn(k);
              }
            }
            if (schema && !toolFieldsIn(schema) && rowHasToolFields(row)) {
              throw new RecordError(`tool calls (or tool_call_id, name) first appear after ${written} rows were written without them; put a record with them first`);
            }
            builder.push(row);
            written++;
            if (builder.length >= batchRows || builder.byteSize >= batchBytes) await flushBatch();
          } catch (e) {
            if (!(e instanceof RecordError)) throw e;
            const loc = where(src, item.pos);
            if (onInvalid === 'error') throw new BadInputError(`${loc}: ${e.message}`, { file: src.path, [src.unit === 'line' ? 'line' : 'row']: item.pos });
            skipped++;
            const entry = src.unit === 'line' ? { file: src.path, line: item.pos } : { file: src.path, row: item.pos };
            skippedLines.push(JSON.stringify({ ...entry, field: e.field ?? null, reason: e.message }) + '\n');
            if (skippedLines.length >= 1024) await flushSkipped();
          }
        }
      }
      if (read === readBefore) throw new UserError(`${src.path}: no records`);
    }
    if (written === 0) {
      await flushSkipped();
      if (skippedFile) {
        await (skippedFile as FileHandle).close();
        skippedFile = null;
        await rename(skippedTmp, skippedPath);
        releaseTemp(skippedTmp);
      }
      throw new UserError(`no valid records: all ${read} were skipped (reasons in ${skippedPath})`);
    }
    await flushBatch();
    const outputs = await (sink as ParquetSink | null)!.close();
    await flushSkipped();
    if (skippedFile) {
      await (skippedFile as FileHandle).sync();
      await (skippedFile as FileHandle).close();
      skippedFile = null;
      await rename(skippedTmp, skippedPath);
      releaseTemp(skippedTmp);
    } else {
      // A list from an earlier run would describe records this run kept.
      await rm(skippedPath, { force: true });
    }
    return { read, written, skipped, kind: kind!, text: text!, formats, outputs, skippedPath: skipped > 0 ? skippedPath : null };
  } catch (e) {
    await (sink as ParquetSink | null)?.abort();
    if (skippedFile) await (skippedFile as FileHandle).close().catch(() => undefined);
    removeTemp(skippedTmp);
    throw fileError(e, out);
  }
}
