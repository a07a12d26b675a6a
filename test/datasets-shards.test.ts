/**
 * Runs at the sizes people have: `convert --shard-size` shards land within 10 %
 * of the size asked for; `train`, `eval` and `tokenize` read a directory or glob of Parquet shards
 * batch by batch; `max_samples` / `eval_samples` / `--max-samples` read only the first rows.
 */
import { describe, it, expect, beforeAll, afterAll } from 'vitest';
import { spawnSync } from 'node:child_process';
import { mkdirSync, mkdtempSync, readdirSync, rmSync, statSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join, resolve } from 'node:path';
import { convert } from '../datasets/convert.ts';
import { readCanonicalBatches, resolveDataset, parquetFooter } from '../datasets/parquet.ts';
import { readRefColumns } from '../datasets/tokenized.ts';
import { initModelFolder } from '../src/models/init.ts';
import { demoPairs } from '../src/demos/task.ts';
import { train } from '../src/train/trainer.ts';
import { reporterOf } from '../src/progress.ts';

const bin = resolve(__dirname, '..', 'bin', 'prefzoo.mjs');
const root = mkdtempSync(join(tmpdir(), 'pz-shards-'));
afterAll(() => rmSync(root, { recursive: true, force: true }));

/** Text zstd cannot shrink much (a seeded generator, so the sizes are the same every run). */
function noiseRows(n: number, seed: number) {
  let x = seed;
  const word = () => Array.from({ length: 6 }, () => (((x = (Math.imul(x, 1103515245) + 12345) >>> 0) >>> 16) % 36).toString(36)).join('');
  const text = (k: number) => Array.from({ length: k }, word).join(' ');
  return Array.from({ length: n }, () => ({ prompt: text(12), chosen: text(20), rejected: text(18) }));
}

let model: string;
let shardDir: string;
let shardRows: number;
beforeAll(async () => {
  model = join(root, 'model');
  initModelFolder(model, 'llama', 'tiny', 9);
  // Demo pairs in three shards (what `convert --shard-size` writes for a large input).
  shardDir = join(root, 'pairs');
  mkdirSync(shardDir);
  const pairs = demoPairs(6, 60, 0).train;
  shardRows = pairs.length;
  const src = join(root, 'pairs.jsonl');
  writeFileSync(src, pairs.map((p) => JSON.stringify(p)).join('\n') + '\n');
  const s = await convert([src], join(shardDir, 'train.parquet'), { shardBytes: 2048, batchRows: 16 });
  expect(s.outputs.length).toBeGreaterThan(2);
});

describe('convert --shard-size', () => {
  for (const kb of [48, 96]) {
    it(`keeps every shard but the last within 10 % of ${kb} KiB`, async () => {
      const dir = join(root, `size-${kb}`);
      mkdirSync(dir);
      const src = join(dir, 'in.jsonl');
      writeFileSync(src, noiseRows(1500, kb).map((r) => JSON.stringify(r)).join('\n') + '\n');
      const s = await convert([src], join(dir, 'out.parquet'), { shardBytes: kb * 1024 });
      const sizes = s.outputs.map((f) => statSync(f).size / (kb * 1024));
      expect(sizes.length).toBeGreaterThan(2);
      for (const r of sizes.slice(0, -1)) expect(Math.abs(r - 1), sizes.join(' ')).toBeLessThan(0.1);
      expect(sizes.at(-1)!).toBeLessThan(1.1);
      let rows = 0;
      for (const f of s.outputs) rows += (await parquetFooter(f)).rows;
      expect(rows).toBe(1500);
    });
  }
});

describe('reading shards', () => {
  it('resolves a directory, a glob and a shard stem to the same files; bad patterns are one-line errors', () => {
    const files = resolveDataset(shardDir);
    expect(files.length).toBeGreaterThan(2);
    expect(files.every((f) => /train-\d{5}-of-\d{5}\.parquet$/.test(f))).toBe(true);
    expect(resolveDataset(join(shardDir, 'train-*.parquet'))).toEqual(files);
    expect(resolveDataset(join(shardDir, 'train-0000[0-1]-of-*.parquet'))).toEqual(files.slice(0, 2));
    expect(resolveDataset(join(shardDir, 'train.parquet'))).toEqual(files);
    expect(() => resolveDataset(join(shardDir, 'test-*.parquet'))).toThrow(/no file matches/);
    expect(() => resolveDataset(join(root, '*', 'train.parquet'))).toThrow(/only use \*, \? and \[\.\.\.\] in the file name/);
    const empty = join(root, 'empty');
    mkdirSync(empty);
    expect(() => resolveDataset(empty)).toThrow(/holds no \.parquet files/);
  });

  it('streams batch by batch across files and stops after maxRows', async () => {
    const seen: { file: string; rows: number }[] = [];
    for await (const b of readCanonicalBatches(shardDir, { batchRows: 8 })) seen.push({ file: b.file, rows: b.batch.numRows });
    expect(seen.reduce((n, s) => n + s.rows, 0)).toBe(shardRows);
    expect(new Set(seen.map((s) => s.file)).size).toBe(resolveDataset(shardDir).length);
    expect(Math.max(...seen.map((s) => s.rows))).toBeLessThanOrEqual(8);
    let n = 0;
    const files = new Set<string>();
    for await (const b of readCanonicalBatches(shardDir, { maxRows: 5, batchRows: 8 })) {
      n += b.batch.numRows;
      files.add(b.file);
    }
    expect(n).toBe(5);
    expect(files.size).toBeLessThan(resolveDataset(shardDir).length);
  });

  it('train reads a directory of shards; max_samples limits the rows and the reference scoring', async () => {
    const out = join(root, 'run-dir');
    const lines: string[] = [];
    await train({ model, data: shardDir, loss: 'dpo', out, params: ['batch_size=4', 'max_steps=2', 'max_samples=10', 'max_length=32', 'max_prompt_length=16', 'pad_to_multiple_of=16'], reporter: reporterOf({ info: (l) => lines.push(l) }) });
    expect(lines[0]).toMatch(new RegExp(`^data: 10 pairwise rows from ${shardDir.replace(/[.*+?^${}()|[\]\\]/g, '\\$&')}`));
    expect((await readRefColumns(join(out, 'data', 'reference.parquet'), 'pairwise'))!.length).toBe(10);
    const all = join(root, 'run-glob');
    const glob = join(shardDir, 'train-*.parquet');
    const l2: string[] = [];
    await train({ model, data: glob, loss: 'dpo', out: all, params: ['batch_size=4', 'max_steps=1', 'max_length=32', 'max_prompt_length=16', 'pad_to_multiple_of=16'], reporter: reporterOf({ info: (l) => l2.push(l) }) });
    expect(l2[0]).toContain(`data: ${shardRows} pairwise rows`);
  });

  it('eval --max-samples reads a glob from the command line', () => {
    const glob = join(shardDir, 'train-*.parquet');
    const ev = spawnSync(process.execPath, [bin, 'eval', '--model', model, '--ref', model, '--data', glob, '--max-samples', '7', '--json'], { encoding: 'utf8' });
    expect(ev.status, ev.stderr).toBe(0);
    expect(JSON.parse(ev.stdout).count).toBe(7);
  });

  it('tokenize streams a directory of shards into one file', () => {
    const tokOut = join(root, 'tok', 'train.tok.parquet');
    mkdirSync(join(root, 'tok'));
    const tk = spawnSync(process.execPath, [bin, 'tokenize', shardDir, '--model', model, '-o', tokOut, '--max-samples', '12'], { encoding: 'utf8' });
    expect(tk.status, tk.stderr).toBe(0);
    expect(tk.stdout).toContain('rows: 12 pairwise');
    expect(readdirSync(join(root, 'tok'))).toEqual(['train.tok.parquet']);
  });
});
