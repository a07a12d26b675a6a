// Parquet reading thread for readParquetBatches (datasets/parquet.ts). parquet-wasm's async reader
// aborts with an uncatchable WebAssembly trap ("unreachable") on a damaged data page; in a thread of
// its own the trap ends only this thread, and the main thread turns it into one line naming the file,
// the column and the row group (mode "probe" finds them). Plain JavaScript: worker threads do not
// inherit the tsx loader the CLI runs under.
import { parentPort, workerData } from 'node:worker_threads';
import { openAsBlob } from 'node:fs';
import * as pw from 'parquet-wasm';

const { path, batchRows, mode, fromRowGroup } = workerData;

/** Resolves when the main thread asks for the next batch (backpressure: one batch in flight). */
let wake = null;
parentPort.on('message', (m) => {
  if (m === 'next' && wake) {
    const w = wake;
    wake = null;
    w();
  }
});
const asked = () => new Promise((r) => (wake = r));

function message(e) {
  return e instanceof Error ? e.message : String(e);
}

async function stream(file) {
  const groups = file.metadata().numRowGroups();
  for (let rg = 0; rg < groups; rg++) {
    parentPort.postMessage({ type: 'group', rg });
    const s = await file.stream({ batchSize: batchRows, rowGroups: [rg] });
    for await (const batch of s) {
      const ipc = batch.intoIPCStream();
      const copy = ipc.slice();
      parentPort.postMessage({ type: 'batch', ipc: copy }, [copy.buffer]);
      await asked();
    }
  }
  parentPort.postMessage({ type: 'done' });
}

/**
 * Reads each top-level column of each row group alone, saying which one it starts before it does
 * and waiting for the main thread to have that message: a trap may end this thread before its
 * last messages are delivered.
 */
async function probe(file) {
  const md = file.metadata();
  parentPort.postMessage({ type: 'layout', rows: md.rowGroups().map((g) => g.numRows()) });
  for (let rg = fromRowGroup; rg < md.numRowGroups(); rg++) {
    // Top-level columns, in file order, from the row group's column chunks (nested ones share a root).
    const names = [...new Set(md.rowGroup(rg).columns().map((c) => c.columnPath()[0]))];
    for (const column of names) {
      parentPort.postMessage({ type: 'probe', rg, column });
      await asked();
      try {
        const t = await file.read({ rowGroups: [rg], columns: [column] });
        t.free();
      } catch (e) {
        parentPort.postMessage({ type: 'bad', rg, column, message: message(e) });
        return;
      }
    }
  }
  parentPort.postMessage({ type: 'clean' });
}

try {
  const file = await pw.ParquetFile.fromFile(await openAsBlob(path));
  if (mode === 'probe') await probe(file);
  else await stream(file);
} catch (e) {
  parentPort.postMessage({ type: 'error', message: message(e) });
}
