/**
 * Parquet I/O through parquet-wasm, Arrow IPC being the hand-off format between apache-arrow (JS) and
 * the Rust writer. Writing runs on a worker thread (parquet-worker.mjs) and streams row groups to
 * disk, so memory stays bounded by a few batches, not a file; shards and the final file appear under
 * their real names only once everything succeeded.
 */
import * as arrow from './arrow.ts';
import type * as PW from 'parquet-wasm';
import { existsSync, openAsBlob, readdirSync, statSync } from 'node:fs';
import { readFile, rename, rm } from 'node:fs/promises';
import { Worker } from 'node:worker_threads';
import { basename, dirname, join } from 'node:path';
import { gunzipSync } from 'node:zlib';
import { DamagedFileError, UserError } from '../src/errors.ts';
import { fileError, releaseTemp, sweepStaleTemps, tempPath } from '../src/io/atomic.ts';
import { META_KEY, type PrefzooMeta, parseMeta, schemaProblems } from './schema.ts';

export interface WriteOptions {
  /** Start a new shard once the current one reaches this many bytes on disk (default 512 MiB). */
  shardBytes?: number;
  /** Upper bound on the uncompressed bytes of one row group (default 32 MiB, at most shardBytes). */
  rowGroupBytes?: number;
  compression?: 'zstd' | 'snappy';
}

/**
 * parquet-wasm compiles ~5 MB of wasm when imported (~0.3 s): load it only when a Parquet file is
 * read here, not for every conversion (writing happens in the worker, which loads its own).
 */
let wasm: Promise<typeof PW> | null = null;
function parquetWasm(): Promise<typeof PW> {
  wasm ??= import('parquet-wasm');
  return wasm;
}

export const DEFAULT_SHARD_BYTES = 512 * 1024 * 1024;
const DEFAULT_ROW_GROUP_BYTES = 32 * 1024 * 1024;
/** Batches handed to the encoding thread and not yet taken: enough to keep both cores busy. */
const MAX_IN_FLIGHT = 2;

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
  private readonly rowGroupBytes: number;
  private readonly tmpStem: string;
  private worker: Worker | null = null;
  private nextId = 0;
  private inFlight = 0;
  private failure: Error | null = null;
  private listeners: Array<(msg: WorkerMessage | null) => void> = [];
  private finished = false;
  private exited = false;
  rows = 0;

  constructor(
    readonly outPath: string,
    readonly meta: PrefzooMeta,
    private readonly opts: WriteOptions = {},
  ) {
    this.shardBytes = opts.shardBytes ?? DEFAULT_SHARD_BYTES;
    // Bytes reach the disk one row group at a time, so a row group must not outgrow a shard.
    this.rowGroupBytes = Math.min(opts.rowGroupBytes ?? DEFAULT_ROW_GROUP_BYTES, this.shardBytes);
    // The writer thread names its shards STEM.0, STEM.1, …; a kill -9 leaves them to the next run's sweep.
    sweepStaleTemps(dirname(outPath));
    this.tmpStem = tempPath(outPath);
  }

  private start(): Worker {
    const w = new Worker(new URL('./parquet-worker.mjs', import.meta.url), {
      workerData: {
        tmpStem: this.tmpStem,
        meta: this.meta,
        shardBytes: this.shardBytes,
        rowGroupBytes: this.rowGroupBytes,
        compression: this.opts.compression ?? 'zstd',
      },
    });
    w.on('message', (m: WorkerMessage) => {
      if (m.type === 'ack') this.inFlight--;
      if (m.type === 'error') this.failure ??= m.code ? Object.assign(new Error(m.message), { code: m.code, path: this.outPath }) : new Error(`Parquet writer: ${m.message}`);
      this.notify(m);
    });
    w.on('error', (e) => {
      this.failure ??= e;
      this.notify(null);
    });
    w.on('exit', () => {
      this.exited = true;
      if (!this.finished) this.failure ??= new Error('Parquet writer thread exited early');
      this.notify(null);
    });
    return w;
  }

  private notify(m: WorkerMessage | null): void {
    const ls = this.listeners;
    this.listeners = [];
    for (const l of ls) l(m);
  }

  /** Waits for the next message from the writer thread (null: it failed). */
  private next(): Promise<WorkerMessage | null> {
    return new Promise((r) => this.listeners.push(r));
  }

  private async waitFor(type: WorkerMessage['type']): Promise<WorkerMessage> {
    for (;;) {
      if (this.failure) throw this.failure;
      const m = await this.next();
      if (this.failure) throw this.failure;
      if (m && m.type === type) return m;
    }
  }

  async write(batch: arrow.RecordBatch): Promise<void> {
    if (this.finished) throw new Error('ParquetSink: write after close');
    if (this.failure) throw this.failure;
    // An empty batch still opens the first file, so an empty dataset has a schema on disk.
    if (batch.numRows === 0 && this.worker) return;
    this.worker ??= this.start();
    let ipc = arrow.tableToIPC(new arrow.Table([batch]), 'stream');
    if (ipc.byteOffset !== 0 || ipc.byteLength !== ipc.buffer.byteLength) ipc = ipc.slice();
    this.inFlight++;
    this.worker.postMessage({ type: 'batch', id: this.nextId++, ipc }, [ipc.buffer as ArrayBuffer]);
    this.rows += batch.numRows;
    while (this.inFlight >= MAX_IN_FLIGHT && !this.failure) await this.next();
    if (this.failure) throw this.failure;
  }

  /** Finishes the last shard and moves every file to its final name; returns those names. */
  async close(): Promise<string[]> {
    if (!this.worker) throw new Error('ParquetSink.close: nothing was written');
    this.worker.postMessage({ type: 'close' });
    const { files } = (await this.waitFor('closed')) as { files: string[] };
    this.finished = true;
    await this.worker.terminate();
    this.worker = null;
    const n = files.length;
    const finals = n === 1 ? [this.outPath] : files.map((_, i) => shardName(this.outPath, i, n));
    for (let i = 0; i < n; i++) await rename(files[i], finals[i]);
    releaseTemp(this.tmpStem);
    return finals;
  }

  /** Stops writing and removes every temporary file. */
  async abort(): Promise<void> {
    if (this.finished) return;
    this.finished = true;
    const w = this.worker;
    this.worker = null;
    if (!w) return releaseTemp(this.tmpStem);
    if (!this.exited) {
      w.postMessage({ type: 'abort' });
      for (;;) {
        const m = await this.next();
        if (m === null || m.type === 'aborted') break;
      }
    }
    await w.terminate();
    // The thread may have died before cleaning up: remove whatever it left.
    const dir = dirname(this.tmpStem);
    const prefix = basename(this.tmpStem);
    for (const f of readdirSync(dir)) if (f.startsWith(prefix)) await rm(join(dir, f), { force: true });
    releaseTemp(this.tmpStem);
  }
}

type WorkerMessage =
  | { type: 'ack'; id: number }
  | { type: 'closed'; files: string[] }
  | { type: 'aborted' }
  | { type: 'error'; message: string; code?: string };

type ReaderMessage =
  | { type: 'group'; rg: number }
  | { type: 'batch'; ipc: Uint8Array }
  | { type: 'done' }
  | { type: 'layout'; rows: number[] }
  | { type: 'probe'; rg: number; column: string }
  | { type: 'bad'; rg: number; column: string; message: string }
  | { type: 'clean' }
  | { type: 'error'; message: string }
  /** The thread ended without saying why: a WebAssembly trap on damaged data. */
  | { type: 'died'; message: string };

/** The messages of a reading thread, one at a time. */
function inbox(w: Worker): () => Promise<ReaderMessage> {
  const queue: ReaderMessage[] = [];
  let waiting: ((m: ReaderMessage) => void) | null = null;
  const push = (m: ReaderMessage) => {
    if (waiting) {
      const r = waiting;
      waiting = null;
      r(m);
    } else queue.push(m);
  };
  w.on('message', push);
  w.on('error', (e) => push({ type: 'died', message: errorText(e) }));
  w.on('exit', () => push({ type: 'died', message: 'the reading thread stopped' }));
  return () => (queue.length ? Promise.resolve(queue.shift()!) : new Promise((r) => (waiting = r)));
}

function readerThread(path: string, data: { mode: 'stream' | 'probe'; batchRows?: number; fromRowGroup?: number }): Worker {
  return new Worker(new URL('./parquet-reader.mjs', import.meta.url), { workerData: { path, batchRows: 8192, fromRowGroup: 0, ...data } });
}

/**
 * The one-line error for Parquet data that cannot be decoded: reads each column of each row group
 * from `fromRowGroup` on by itself (in a fresh thread, since a trap ends it) to name the damaged one.
 */
export async function damagedParquet(path: string, fromRowGroup: number, reason: string): Promise<UserError> {
  // parquet-wasm's release build traps ("unreachable") or strips its messages: say what they mean.
  const why = /unreachable|strings stripped/i.test(reason) ? 'the decoder stopped on invalid bytes' : reason.replace(/\s+/g, ' ').slice(0, 200);
  if (path.endsWith('.gz')) return new DamagedFileError(`${path}: damaged Parquet data (${why}); re-create or re-download the file`, { file: path });
  const w = readerThread(path, { mode: 'probe', fromRowGroup });
  const next = inbox(w);
  let rows: number[] = [];
  let at: { rg: number; column: string } | null = null;
  let bad: { rg: number; column: string } | null = null;
  try {
    for (;;) {
      const m = await next();
      if (m.type === 'layout') rows = m.rows;
      else if (m.type === 'probe') {
        at = m;
        w.postMessage('next');
      }
      else if (m.type === 'bad' || m.type === 'died') {
        bad = m.type === 'bad' ? m : at;
        break;
      } else break;
    }
  } finally {
    await w.terminate();
  }
  if (!bad) return new DamagedFileError(`${path}: unreadable Parquet data (${why}); re-create or re-download the file`, { file: path });
  const first = rows.slice(0, bad.rg).reduce((a, b) => a + b, 0);
  const span = rows.length ? `, rows ${first + 1}–${first + rows[bad.rg]}` : '';
  return new DamagedFileError(`${path}: damaged Parquet data in column "${bad.column}", row group ${bad.rg + 1} of ${rows.length || '?'}${span} (${why}); re-create or re-download the file`, { file: path, ...(rows.length ? { row: first + 1 } : {}) });
}

/**
 * Reads a Parquet file as a stream of Arrow RecordBatches without loading it whole (gzip: whole).
 * Decoding runs on a thread of its own (parquet-reader.mjs): damaged data ends that thread, not this
 * process, and becomes one line naming the column and row group.
 */
export async function* readParquetBatches(path: string, batchRows = 8192): AsyncGenerator<arrow.RecordBatch> {
  if (path.endsWith('.gz')) {
    const pw = await parquetWasm();
    let wt: PW.Table;
    try {
      wt = pw.readParquet(gunzipSync(await readFile(path)), { batchSize: batchRows });
    } catch (e) {
      throw await damagedParquet(path, 0, errorText(e));
    }
    yield* arrow.tableFromIPC(wt.intoIPCStream()).batches;
    return;
  }
  const w = readerThread(path, { mode: 'stream', batchRows });
  const next = inbox(w);
  let rg = 0;
  let started = false;
  try {
    for (;;) {
      const m = await next();
      if (m.type === 'group') {
        rg = m.rg;
        started = true;
      } else if (m.type === 'batch') {
        yield* arrow.tableFromIPC(m.ipc).batches;
        w.postMessage('next');
      } else if (m.type === 'done') {
        return;
      } else {
        const reason = 'message' in m ? m.message : 'unknown';
        // Before the first row group: the footer itself is unreadable.
        if (!started) throw new UserError(`${path}: not a readable Parquet file (${reason})`);
        throw await damagedParquet(path, rg, reason);
      }
    }
  } finally {
    await w.terminate();
  }
}

/** Row count and key-value metadata of a Parquet file, from its footer alone. */
export async function parquetFooter(path: string): Promise<{ rows: number; metadata: Map<string, string> }> {
  const pw = await parquetWasm();
  const bytes = path.endsWith('.gz') ? gunzipSync(await readFile(path)) : null;
  if (bytes) {
    const wt = pw.readParquet(bytes, { limit: 0 });
    const md = new Map(wt.schema.metadata());
    let rows = 0;
    for (const b of arrow.tableFromIPC(pw.readParquet(bytes).intoIPCStream()).batches) rows += b.numRows;
    return { rows, metadata: md };
  }
  let file: PW.ParquetFile;
  try {
    file = await pw.ParquetFile.fromFile(await openAsBlob(path));
  } catch (e) {
    throw new UserError(`${path}: not a readable Parquet file (${errorText(e)})`);
  }
  const fm = file.metadata().fileMetadata();
  return { rows: fm.numRows(), metadata: new Map(fm.keyValueMetadata()) };
}

/** Whether the file's footer (schema and row groups) can be read, in a thread of its own. */
async function footerReadable(path: string): Promise<boolean> {
  const w = readerThread(path, { mode: 'probe', fromRowGroup: 1 << 30 });
  const next = inbox(w);
  try {
    return (await next()).type === 'layout';
  } finally {
    await w.terminate();
  }
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

/** Glob characters in a file-name pattern (`*`, `?`, `[…]`). */
const GLOB = /[*?[]/;

function globRegex(pattern: string): RegExp {
  let re = '';
  for (let i = 0; i < pattern.length; i++) {
    const c = pattern[i];
    if (c === '*') re += '[^/]*';
    else if (c === '?') re += '[^/]';
    else if (c === '[') {
      const end = pattern.indexOf(']', i + 1);
      if (end < 0) throw new UserError(`${pattern}: unclosed "[" in the file pattern`);
      const body = pattern.slice(i + 1, end).replace(/\\/g, '\\\\');
      re += `[${body.startsWith('!') ? '^' + body.slice(1) : body}]`;
      i = end;
    } else re += c.replace(/[.+^${}()|\\]/g, '\\$&');
  }
  return new RegExp(`^${re}$`);
}

/**
 * The files a dataset argument names, in order: a file; the `NAME-0000i-of-0000N.parquet` shards of
 * NAME.parquet; every `*.parquet` file of a directory (what `convert --shard-size` writes, or a
 * dataset downloaded as Parquet shards); or a glob in the file name (`data/train-*.parquet`).
 */
export function resolveDataset(spec: string): string[] {
  if (existsSync(spec) && statSync(spec).isDirectory()) {
    const files = readdirSync(spec).filter((f) => f.endsWith('.parquet') && !f.startsWith('.')).sort();
    if (files.length === 0) throw new UserError(`${spec}: directory holds no .parquet files`);
    return files.map((f) => join(spec, f));
  }
  const dir = dirname(spec);
  const name = basename(spec);
  if (!existsSync(spec) && GLOB.test(dir)) throw new UserError(`${spec}: a pattern may only use *, ? and [...] in the file name, not in the folders`);
  if (!existsSync(spec) && GLOB.test(name)) {
    const re = globRegex(name);
    const files = existsSync(dir) ? readdirSync(dir).filter((f) => re.test(f) && !f.startsWith('.')).sort() : [];
    if (files.length === 0) throw new UserError(`${spec}: no file matches`);
    return files.map((f) => join(dir, f));
  }
  if (!existsSync(spec) && !spec.endsWith('.parquet')) throw new UserError(`${spec}: no such file`);
  return datasetFiles(spec);
}

/** The `prefzoo` metadata of a Parquet file (null: none, or not a readable Parquet file). */
export async function canonicalMeta(file: string): Promise<PrefzooMeta | null> {
  if (!/\.parquet(\.gz)?$/.test(file)) return null;
  let md: Map<string, string>;
  try {
    md = (await parquetFooter(file)).metadata;
  } catch {
    return null;
  }
  try {
    return parseMeta(md.get(META_KEY));
  } catch (e) {
    throw new UserError(`${file}: ${errorText(e)}`);
  }
}

export interface CanonicalBatch {
  batch: arrow.RecordBatch;
  meta: PrefzooMeta;
  file: string;
  /** Index of the batch's first row within its file. */
  fileRow: number;
}

/**
 * Streams the rows of a canonical dataset (one file, shards, a directory or a glob: resolveDataset),
 * file after file and batch after batch, so that no file is held whole; each file's metadata and
 * columns are checked, and every file must hold the kind and text mode of the first. Stops after
 * `maxRows` rows (0: all).
 */
export async function* readCanonicalBatches(spec: string | string[], o: { maxRows?: number; batchRows?: number } = {}): AsyncGenerator<CanonicalBatch> {
  const files = Array.isArray(spec) ? spec : resolveDataset(spec);
  let left = o.maxRows && o.maxRows > 0 ? o.maxRows : Infinity;
  let first: PrefzooMeta | null = null;
  for (const f of files) {
    if (left <= 0) return;
    const m = await canonicalMeta(f);
    if (!m) throw new UserError(`${f}: no "${META_KEY}" metadata; convert it first with \`prefzoo convert\``);
    if (first && (first.kind !== m.kind || first.text !== m.text)) {
      throw new UserError(`${f}: holds ${m.kind}/${m.text} data, ${files[0]} holds ${first.kind}/${first.text}`);
    }
    first ??= m;
    let fileRow = 0;
    let checked = false;
    for await (const b of readParquetBatches(f, o.batchRows)) {
      if (!checked) {
        const problems = schemaProblems(b.schema, m);
        if (problems.length) throw new UserError(`${f}: not a canonical ${m.kind} dataset: ${problems.join('; ')}`);
        checked = true;
      }
      const batch = b.numRows > left ? b.slice(0, left) : b;
      yield { batch, meta: m, file: f, fileRow };
      fileRow += batch.numRows;
      left -= batch.numRows;
      if (left <= 0) return;
    }
  }
}

export interface Canonical {
  table: arrow.Table;
  meta: PrefzooMeta;
  files: string[];
}

/**
 * Reads a canonical dataset (a file, its shards, a directory or a glob: resolveDataset; or a list of files) back into one Arrow Table, checking its
 * `prefzoo` metadata and required columns.
 */
export async function readCanonical(path: string | string[]): Promise<Canonical> {
  const files = Array.isArray(path) ? path : resolveDataset(path);
  const pw = await parquetWasm();
  const tables: arrow.Table[] = [];
  let meta: PrefzooMeta | null = null;
  for (const f of files) {
    let t: arrow.Table;
    const bytes = await readFile(f);
    try {
      t = arrow.tableFromIPC(pw.readParquet(bytes).intoIPCStream());
    } catch (e) {
      // A footer that parses but data that does not: name the damaged column and row group.
      throw (await footerReadable(f)) ? await damagedParquet(f, 0, errorText(e)) : new UserError(`${f}: not a readable Parquet file (${errorText(e)})`);
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
    throw fileError(e, outPath);
  }
}

function emptyBatch(schema: arrow.Schema): arrow.RecordBatch {
  return new arrow.RecordBatch(schema);
}
