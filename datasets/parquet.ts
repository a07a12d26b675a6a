/**
 * Parquet I/O through parquet-wasm, Arrow IPC being the hand-off format between apache-arrow (JS) and
 * the Rust writer. Writing streams row groups to disk so memory stays bounded by a batch, not a file;
 * shards and the final file appear under their real names only once everything succeeded.
 */
import * as arrow from 'apache-arrow';
import * as pw from 'parquet-wasm';
import { existsSync, openAsBlob, readdirSync } from 'node:fs';
import { open, readFile, rename, rm, type FileHandle } from 'node:fs/promises';
import { basename, dirname, join } from 'node:path';
import { gunzipSync } from 'node:zlib';
import { UserError } from '../src/cli/errors.ts';
import { META_KEY, type PrefzooMeta, parseMeta, schemaProblems } from './schema.ts';

export interface WriteOptions {
  /** Start a new shard once the current one reaches this many bytes on disk (default 512 MiB). */
  shardBytes?: number;
  /** Upper bound on the uncompressed bytes of one row group (default 128 MiB). */
  rowGroupBytes?: number;
  compression?: 'zstd' | 'snappy';
}

export const DEFAULT_SHARD_BYTES = 512 * 1024 * 1024;
const DEFAULT_ROW_GROUP_BYTES = 128 * 1024 * 1024;

function writerProperties(meta: PrefzooMeta, opts: WriteOptions): pw.WriterProperties {
  return (
    new pw.WriterPropertiesBuilder()
      .setCompression(opts.compression === 'snappy' ? pw.Compression.SNAPPY : pw.Compression.ZSTD)
      .setCreatedBy(meta.created_by)
      .setKeyValueMetadata(new Map([[META_KEY, JSON.stringify(meta)]]))
      // Long unique texts make dictionary pages fill up and fall back anyway: pure wasted work.
      .setDictionaryEnabled(false)
      .setStatisticsEnabled(pw.EnabledStatistics.Chunk)
      .setMaxRowGroupSize(1 << 20)
      .setMaxRowGroupBytes(opts.rowGroupBytes ?? DEFAULT_ROW_GROUP_BYTES)
      .build()
  );
}

/** Serialises a JS RecordBatch into wasm memory (one IPC copy each way). */
function toWasmBatches(batch: arrow.RecordBatch): pw.RecordBatch[] {
  const ipc = arrow.tableToIPC(new arrow.Table([batch]), 'stream');
  return pw.Table.fromIPCStream(ipc).recordBatches();
}

/** One Parquet file being written: a pull-driven stream of batches into parquet-wasm's writer. */
class ShardStream {
  bytes = 0;
  private ctrl!: ReadableStreamDefaultController<pw.RecordBatch>;
  private wake: (() => void) | null = null;
  private failure: unknown = null;
  private readonly pump: Promise<void>;

  private constructor(
    readonly tmpPath: string,
    private readonly fh: FileHandle,
    props: pw.WriterProperties,
  ) {
    const src = new ReadableStream<pw.RecordBatch>(
      {
        start: (c) => {
          this.ctrl = c;
        },
        pull: () => {
          this.wake?.();
        },
      },
      { highWaterMark: 1 },
    );
    this.pump = (async () => {
      const out = await pw.transformParquetStream(src, props);
      for await (const chunk of out as unknown as AsyncIterable<Uint8Array>) {
        await this.fh.write(chunk);
        this.bytes += chunk.byteLength;
      }
    })().catch((e) => {
      this.failure = e;
      this.wake?.();
    });
  }

  static async create(tmpPath: string, props: pw.WriterProperties): Promise<ShardStream> {
    return new ShardStream(tmpPath, await open(tmpPath, 'wx'), props);
  }

  /** Hands one batch to the writer, waiting until it has taken it (backpressure). */
  async push(batch: pw.RecordBatch): Promise<void> {
    if (this.failure) throw this.failure;
    this.ctrl.enqueue(batch);
    while ((this.ctrl.desiredSize ?? 1) < 1 && !this.failure) {
      await new Promise<void>((r) => (this.wake = r));
      this.wake = null;
    }
    if (this.failure) throw this.failure;
  }

  async close(): Promise<void> {
    this.ctrl.close();
    await this.pump;
    await this.fh.close();
    if (this.failure) throw this.failure;
  }

  async abort(): Promise<void> {
    try {
      this.ctrl.error(new Error('aborted'));
    } catch {
      // already closed or errored
    }
    await this.pump;
    await this.fh.close().catch(() => undefined);
    await rm(this.tmpPath, { force: true });
  }
}

/** `out.parquet` → `out`, the stem shard names are built from. */
function stemOf(outPath: string): string {
  return outPath.endsWith('.parquet') ? outPath.slice(0, -'.parquet'.length) : outPath;
}

export function shardName(outPath: string, index: number, count: number): string {
  const pad = (n: number) => String(n).padStart(5, '0');
  return `${stemOf(outPath)}-${pad(index)}-of-${pad(count)}.parquet`;
}

/**
 * Streams RecordBatches into `outPath` (or `NAME-0000i-of-0000N.parquet` shards once the output grows
 * past `shardBytes`). Nothing appears under a final name until `close()`; `abort()` removes everything.
 */
export class ParquetSink {
  private readonly shardBytes: number;
  private readonly tmpStem: string;
  private current: ShardStream | null = null;
  private done: string[] = [];
  private outputsOpen = true;
  private readonly opts: WriteOptions;
  rows = 0;

  constructor(
    readonly outPath: string,
    readonly meta: PrefzooMeta,
    opts: WriteOptions = {},
  ) {
    this.shardBytes = opts.shardBytes ?? DEFAULT_SHARD_BYTES;
    // Bytes reach the disk one row group at a time, so a row group must not outgrow a shard.
    this.opts = { ...opts, rowGroupBytes: Math.min(opts.rowGroupBytes ?? DEFAULT_ROW_GROUP_BYTES, this.shardBytes) };
    const rand = Math.random().toString(36).slice(2, 8);
    this.tmpStem = join(dirname(outPath), `.${basename(outPath)}.${process.pid}.${rand}`);
  }

  async write(batch: arrow.RecordBatch): Promise<void> {
    // An empty batch still opens the first file, so an empty dataset has a schema on disk.
    if (batch.numRows === 0 && this.current) return;
    if (this.outputsOpen === false) throw new Error('ParquetSink: write after close');
    if (this.current && this.current.bytes >= this.shardBytes) {
      await this.current.close();
      this.done.push(this.current.tmpPath);
      this.current = null;
    }
    if (!this.current) {
      // A fresh properties object per shard: the wasm writer takes ownership of the one it is given.
      const props = writerProperties(this.meta, this.opts);
      this.current = await ShardStream.create(`${this.tmpStem}.${this.done.length}.tmp`, props);
    }
    for (const b of toWasmBatches(batch)) await this.current.push(b);
    this.rows += batch.numRows;
  }

  /** Finishes the last shard and moves every file to its final name; returns those names. */
  async close(): Promise<string[]> {
    if (this.current) {
      await this.current.close();
      this.done.push(this.current.tmpPath);
      this.current = null;
    }
    const n = this.done.length;
    if (n === 0) throw new Error('ParquetSink.close: nothing was written');
    const finals = n === 1 ? [this.outPath] : this.done.map((_, i) => shardName(this.outPath, i, n));
    for (let i = 0; i < n; i++) await rename(this.done[i], finals[i]);
    this.done = [];
    this.outputsOpen = false;
    return finals;
  }

  async abort(): Promise<void> {
    if (this.current) await this.current.abort();
    this.current = null;
    for (const p of this.done) await rm(p, { force: true });
    this.done = [];
    this.outputsOpen = false;
  }
}

/** Reads a Parquet file as a stream of Arrow RecordBatches without loading it whole (gzip: whole). */
export async function* readParquetBatches(path: string, batchRows = 8192): AsyncGenerator<arrow.RecordBatch> {
  if (path.endsWith('.gz')) {
    const wt = pw.readParquet(gunzipSync(await readFile(path)), { batchSize: batchRows });
    yield* arrow.tableFromIPC(wt.intoIPCStream()).batches;
    return;
  }
  let file: pw.ParquetFile;
  try {
    file = await pw.ParquetFile.fromFile(await openAsBlob(path));
  } catch (e) {
    throw new UserError(`${path}: not a readable Parquet file (${errorText(e)})`);
  }
  const stream = (await file.stream({ batchSize: batchRows })) as unknown as AsyncIterable<pw.RecordBatch>;
  for await (const b of stream) yield* arrow.tableFromIPC(b.intoIPCStream()).batches;
}

/** Row count and key-value metadata of a Parquet file, from its footer alone. */
export async function parquetFooter(path: string): Promise<{ rows: number; metadata: Map<string, string> }> {
  const bytes = path.endsWith('.gz') ? gunzipSync(await readFile(path)) : null;
  if (bytes) {
    const wt = pw.readParquet(bytes, { limit: 0 });
    const md = new Map(wt.schema.metadata());
    let rows = 0;
    for (const b of arrow.tableFromIPC(pw.readParquet(bytes).intoIPCStream()).batches) rows += b.numRows;
    return { rows, metadata: md };
  }
  let file: pw.ParquetFile;
  try {
    file = await pw.ParquetFile.fromFile(await openAsBlob(path));
  } catch (e) {
    throw new UserError(`${path}: not a readable Parquet file (${errorText(e)})`);
  }
  const fm = file.metadata().fileMetadata();
  return { rows: fm.numRows(), metadata: new Map(fm.keyValueMetadata()) };
}

export function errorText(e: unknown): string {
  return e instanceof Error ? e.message : String(e);
}

/** The files making up a canonical dataset: `path` itself, or its `-0000i-of-0000N` shards. */
export function datasetFiles(path: string): string[] {
  if (existsSync(path)) return [path];
  const stem = basename(stemOf(path));
  const dir = dirname(path);
  const re = new RegExp(`^${stem.replace(/[.*+?^${}()|[\]\\]/g, '\\$&')}-(\\d{5})-of-(\\d{5})\\.parquet$`);
  const shards = existsSync(dir) ? readdirSync(dir).filter((f) => re.test(f)).sort() : [];
  if (shards.length === 0) throw new UserError(`${path}: no such file (and no ${basename(shardName(path, 0, 1)).replace('-00000-of-00001', '-NNNNN-of-NNNNN')} shards)`);
  const count = Number(re.exec(shards[0])![2]);
  if (shards.length !== count) throw new UserError(`${path}: found ${shards.length} shards, the names say ${count}`);
  return shards.map((f) => join(dir, f));
}

export interface Canonical {
  table: arrow.Table;
  meta: PrefzooMeta;
  files: string[];
}

/**
 * Reads a canonical dataset (one file or all its shards) back into one Arrow Table, checking its
 * `prefzoo` metadata and required columns.
 */
export async function readCanonical(path: string): Promise<Canonical> {
  const files = datasetFiles(path);
  const tables: arrow.Table[] = [];
  let meta: PrefzooMeta | null = null;
  for (const f of files) {
    let t: arrow.Table;
    try {
      t = arrow.tableFromIPC(pw.readParquet(await readFile(f)).intoIPCStream());
    } catch (e) {
      throw new UserError(`${f}: not a readable Parquet file (${errorText(e)})`);
    }
    let m: PrefzooMeta | null;
    try {
      m = parseMeta(t.schema.metadata.get(META_KEY));
    } catch (e) {
      throw new UserError(`${f}: ${errorText(e)}`);
    }
    if (!m) throw new UserError(`${f}: no "${META_KEY}" metadata; convert it first with \`prefzoo convert\``);
    const problems = schemaProblems(t.schema, m);
    if (problems.length) throw new UserError(`${f}: not a canonical ${m.kind} dataset: ${problems.join('; ')}`);
    if (meta && (meta.kind !== m.kind || meta.text !== m.text)) {
      throw new UserError(`${f}: shard is ${m.kind}/${m.text}, the first shard is ${meta.kind}/${meta.text}`);
    }
    meta ??= m;
    tables.push(t);
  }
  const table = tables.length === 1 ? tables[0] : tables[0].concat(...tables.slice(1));
  return { table, meta: meta!, files };
}

/**
 * Writes `table` as a canonical dataset at `outPath` (temp file, then rename; sharded above
 * `opts.shardBytes`). Returns the final file names.
 */
export async function writeCanonical(table: arrow.Table, meta: PrefzooMeta, outPath: string, opts: WriteOptions = {}): Promise<string[]> {
  const problems = schemaProblems(table.schema, meta);
  if (problems.length) throw new Error(`writeCanonical: not a canonical ${meta.kind} table: ${problems.join('; ')}`);
  const schema = new arrow.Schema(table.schema.fields, new Map([[META_KEY, JSON.stringify(meta)]]));
  const sink = new ParquetSink(outPath, meta, opts);
  try {
    for (const b of table.batches) await sink.write(new arrow.RecordBatch(schema, b.data));
    if (sink.rows === 0) await sink.write(emptyBatch(schema));
    return await sink.close();
  } catch (e) {
    await sink.abort();
    throw e;
  }
}

function emptyBatch(schema: arrow.Schema): arrow.RecordBatch {
  return new arrow.RecordBatch(schema);
}
