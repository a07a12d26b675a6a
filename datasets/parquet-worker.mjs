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
    .setMaxRowGroupBytes(rowGroupBytes)
    .build();
}

/** One Parquet file: a pull-driven stream of batches into parquet-wasm's streaming writer. */
class Shard {
  constructor(path, fh) {
    this.path = path;
    this.fh = fh;
    this.bytes = 0;
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

async function write(ipc) {
  const table = pw.Table.fromIPCStream(ipc);
  const batches = table.recordBatches();
  // Free now: left to the garbage collector, whose heap here is tiny, wasm memory only grows.
  table.free();
  if (current && current.bytes >= shardBytes) {
    await current.close();
    done.push(current.path);
    current = null;
  }
  current ??= await Shard.create(`${tmpStem}.${done.length}`);
  for (const b of batches) await current.push(b);
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
