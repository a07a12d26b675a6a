// Parquet encoding thread for ParquetSink (datasets/parquet.ts). Plain JavaScript because worker
// threads do not inherit the tsx loader the CLI runs under. Runs zstd and Parquet encoding in wasm
// while the main thread parses and builds the next Arrow batch: the two cores work in parallel.
import { parentPort, workerData } from 'node:worker_threads';
import { open, rm } from 'node:fs/promises';
import * as pw from 'parquet-wasm';

const { tmpStem, meta, shardBytes, rowGroupBytes, compression } = workerData;

function properties() {
  return new pw.WriterPropertiesBuilder()
    .setCompression(compression === 'snappy' ? pw.Compression.SNAPPY : pw.Compression.ZSTD)
    .setCreatedBy(meta.created_by)
    .setKeyValueMetadata(new Map([['prefzoo', JSON.stringify(meta)]]))
    // Long unique texts make dictionary pages fill up and fall back anyway: pure wasted work.
    .setDictionaryEnabled(false)
    // Min/max of long texts prune nothing and cost ~10% of encoding time.
    .setStatisticsEnabled(pw.EnabledStatistics.None)
    .setMaxRowGroupSize(1 << 20)
    // The writer checks this after each batch it is handed: 1 makes every slice (below) its own
    // row group, flushed to disk at once, so the shard's size on disk is known as it grows.
    .setMaxRowGroupBytes(1)
    .build();
}

/**
 * A shard is closed once its bytes on disk come within one slice of shardBytes; a slice is about
 * 1/SLICES_PER_SHARD of a shard once compressed (and at most rowGroupBytes uncompressed), so a
 * shard ends within a few percent of --shard-size (the last one may be smaller).
 */
const SLICES_PER_SHARD = 40;

/** One Parquet file: a pull-driven stream of batches into parquet-wasm's streaming writer. */
class Shard {
  constructor(path, fh) {
    this.path = path;
    this.fh = fh;
    this.bytes = 0;
    /** Arrow bytes handed to the writer (for the compression ratio). */
    this.arrowBytes = 0;
    this.failure = null;
    this.wake = null;
    const src = new ReadableStream(
      { start: (c) => (this.ctrl = c), pull: () => this.wake?.() },
      { highWaterMark: 1 },
    );
    this.pump = (async () => {
      const out = await pw.transformParquetStream(src, properties());
      for await (const chunk of out) {
        // A write may take only part of the bytes (a disk filling up): loop until all are on disk,
        // so the error comes out instead of a silently truncated file.
        let done = 0;
        while (done < chunk.byteLength) {
          const { bytesWritten } = await this.fh.write(chunk, done, chunk.byteLength - done);
          done += bytesWritten;
        }
        this.bytes += chunk.byteLength;
      }
      // A full disk may only show when the data is flushed.
      await this.fh.sync();
    })().catch((e) => {
      this.failure = e;
      this.wake?.();
    });
  }

  static async create(path) {
    return new Shard(path, await open(path, 'wx'));
  }

  /** Resolves once the writer has taken the batch (backpressure). */
  async push(batch) {
    if (this.failure) throw this.failure;
    this.ctrl.enqueue(batch);
    while ((this.ctrl.desiredSize ?? 1) < 1 && !this.failure) {
      await new Promise((r) => (this.wake = r));
      this.wake = null;
    }
    if (this.failure) throw this.failure;
  }

  async close() {
    this.ctrl.close();
    await this.pump;
    await this.fh.close();
    if (this.failure) throw this.failure;
  }

  async abort() {
    try {
      this.ctrl.error(new Error('aborted'));
    } catch {
      // already closed
    }
    await this.pump;
    await this.fh.close().catch(() => undefined);
    await rm(this.path, { force: true });
  }
}

let current = null;
const done = [];
/**
 * Bytes on disk per Arrow byte: measured on the first slice alone (encoded once more, into memory)
 * until a shard is done, then that shard's own ratio.
 */
let ratio = null;

/** Encoded bytes of `batch` alone, less those of an empty file with the same schema. */
function trialRatio(batch, arrowBytes) {
  const encode = (b) => {
    // writeParquet takes ownership of the table (and frees it).
    return pw.writeParquet(pw.Table.fromIPCStream(b.intoIPCStream()), properties()).byteLength;
  };
  return Math.max(1e-3, (encode(batch.slice(0, batch.numRows)) - encode(batch.slice(0, 0))) / Math.max(1, arrowBytes));
}

async function write(ipc) {
  const table = pw.Table.fromIPCStream(ipc);
  const batches = table.recordBatches();
  // Free now: left to the garbage collector, whose heap here is tiny, wasm memory only grows.
  table.free();
  // Arrow bytes per row, from the IPC message (getArrayMemorySize counts whole shared buffers).
  const perRow = ipc.byteLength / Math.max(1, batches.reduce((n, b) => n + b.numRows, 0));
  for (const b of batches) {
    if (ratio === null && b.numRows > 0) {
      const probe = Math.max(1, Math.min(b.numRows, Math.floor(shardBytes / SLICES_PER_SHARD / Math.max(1, perRow))));
      ratio = trialRatio(b.slice(0, probe), perRow * probe);
    }
    const sliceArrow = Math.min(rowGroupBytes, shardBytes / SLICES_PER_SHARD / (ratio ?? 1));
    const rows = Math.max(1, Math.floor(sliceArrow / Math.max(1, perRow)));
    let at = 0;
    do {
      // Bytes reach the disk some slices after they are handed over: the slices in flight are
      // counted at the compression ratio.
      const size = current ? Math.max(current.bytes, current.arrowBytes * (ratio ?? 0)) : 0;
      if (current && size >= shardBytes - shardBytes / SLICES_PER_SHARD) {
        await current.close();
        if (current.arrowBytes > 0) ratio = current.bytes / current.arrowBytes;
        done.push(current.path);
        current = null;
      }
      current ??= await Shard.create(`${tmpStem}.${done.length}`);
      const n = Math.min(rows, b.numRows - at);
      const piece = n === b.numRows ? b : b.slice(at, n);
      current.arrowBytes += perRow * n;
      await current.push(piece);
      at += n;
    } while (at < b.numRows);
  }
}

async function close() {
  if (current) {
    await current.close();
    done.push(current.path);
    current = null;
  }
  return done.splice(0);
}

async function abort() {
  if (current) await current.abort();
  current = null;
  for (const p of done.splice(0)) await rm(p, { force: true });
}

// Messages are handled strictly in order: each waits for the one before it.
let queue = Promise.resolve();
parentPort.on('message', (msg) => {
  queue = queue.then(async () => {
    try {
      if (msg.type === 'batch') {
        await write(msg.ipc);
        parentPort.postMessage({ type: 'ack', id: msg.id });
      } else if (msg.type === 'close') {
        parentPort.postMessage({ type: 'closed', files: await close() });
      } else if (msg.type === 'abort') {
        await abort();
        parentPort.postMessage({ type: 'aborted' });
      }
    } catch (e) {
      parentPort.postMessage({ type: 'error', message: e instanceof Error ? e.message : String(e), code: e?.code, path: e?.path });
    }
  });
});
