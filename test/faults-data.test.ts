/**
 * Fault injection on the data commands: a disk that fills up, kill -9 in the middle of
 * a write, damaged Parquet pages, invalid and truncated records, a format that was not detected.
 * Each case asserts the exit code, a one-line message without a stack trace, and what is left on
 * disk: no temporaries, no half-written output, nothing lost without being counted.
 */
import { describe, it, expect, beforeAll, afterAll } from 'vitest';
import { existsSync, mkdirSync, mkdtempSync, readFileSync, readdirSync, rmSync, writeFileSync } from 'node:fs';
import { openAsBlob } from 'node:fs';
import { tmpdir } from 'node:os';
import { join, resolve } from 'node:path';
import * as pw from 'parquet-wasm';
import * as arrow from '../datasets/arrow.ts';
import { initModelFolder } from '../src/models/init.ts';
import { readCanonical, writeCanonical } from '../datasets/parquet.ts';
import { cli, expectOneLineError, holds, killWhen, signalWhen, smallDisk, temporaries, type SmallDisk } from './helpers/faults.ts';

// ../shared beside the clone, as CI has it.
const SHAREGPT = resolve(__dirname, '../../shared/data/dpo_en_demo.json');
let dir: string;
let model: string;
let canonical: string;
/** The first 100 pairs: enough to write for a while, few enough to tokenize quickly. */
let small: string;
/** ~3.2 MB of incompressible text (random base64), so outputs outgrow a small disk and shard. */
let bigJsonl: string;
let disk: SmallDisk;

function randomText(n: number, seed: number): string {
  let x = seed >>> 0;
  const abc = 'ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/ ';
  let s = '';
  for (let i = 0; i < n; i++) {
    x = (Math.imul(x, 1664525) + 1013904223) >>> 0;
    s += abc[x >>> 26];
  }
  return s;
}

beforeAll(() => {
  dir = mkdtempSync(join(tmpdir(), 'pz-faults-data-'));
  model = join(dir, 'model');
  initModelFolder(model, 'llama', 'tiny', 3);
  canonical = join(dir, 'd.parquet');
  const c = cli(['convert', SHAREGPT, '-o', canonical]);
  expect(c.status, c.stderr).toBe(0);
  writeFileSync(join(dir, 'd100.json'), JSON.stringify((JSON.parse(readFileSync(SHAREGPT, 'utf8')) as unknown[]).slice(0, 100)));
  small = join(dir, 'd100.parquet');
  const s = cli(['convert', join(dir, 'd100.json'), '-o', small]);
  expect(s.status, s.stderr).toBe(0);
  bigJsonl = join(dir, 'big.jsonl');
  const lines: string[] = [];
  for (let i = 0; i < 400; i++) lines.push(JSON.stringify({ prompt: `q${i} ${randomText(2000, i)}`, chosen: randomText(3000, 7 * i + 1), rejected: randomText(3000, 7 * i + 2) }));
  writeFileSync(bigJsonl, lines.join('\n') + '\n');
  disk = smallDisk(join(dir, 'small'));
});

afterAll(() => {
  disk?.release();
  rmSync(dir, { recursive: true, force: true });
});

describe('a disk that fills up (tmpfs of 3 MB, or a file-size limit where mounting is not allowed)', () => {
  it('convert: exit 1, one line naming the output, no truncated file and no temporaries', () => {
    const out = join(disk.dir, 'c1', 'd.parquet');
    mkdirSync(join(disk.dir, 'c1'));
    const r = disk.run(['convert', SHAREGPT, '-o', out], { room: 100_000 });
    expectOneLineError(r, new RegExp(`${out.replace(/[.*+?^${}()|[\]\\]/g, '\\$&')}: .*${disk.expected.source}.*nothing was written`));
    expect(r.stdout).not.toMatch(/wrote/);
    expect(readdirSync(join(disk.dir, 'c1'))).toEqual([]);
    rmSync(join(disk.dir, 'c1'), { recursive: true });
  });

  it('sharded convert: the shards written so far are removed too', () => {
    const sub = join(disk.dir, 'c2');
    mkdirSync(sub);
    const r = disk.run(['convert', bigJsonl, '-o', join(sub, 'big.parquet'), '--shard-size', '1'], { room: 1_500_000, fileLimit: 512 * 1024 });
    expectOneLineError(r, disk.expected);
    expect(readdirSync(sub)).toEqual([]);
    rmSync(sub, { recursive: true });
  });

  it('tokenize: exit 1, one line, the input untouched and no output or temporaries', () => {
    const sub = join(disk.dir, 't1');
    mkdirSync(sub);
    const r = disk.run(['tokenize', small, '--model', model, '-o', join(sub, 'd.tok.parquet')], { room: 64 * 1024 });
    expectOneLineError(r, disk.expected);
    expect(readdirSync(sub)).toEqual([]);
    rmSync(sub, { recursive: true });
  });
});

describe('kill -9 in the middle of a write', () => {
  it('convert: no output under the final name; the rerun sweeps the dead process\'s temporaries and succeeds', async () => {
    const sub = join(dir, 'k1');
    mkdirSync(sub);
    const out = join(sub, 'big.parquet');
    await killWhen(['convert', bigJsonl, '-o', out], () => temporaries(sub).length > 0);
    expect(existsSync(out)).toBe(false);
    const r = cli(['convert', bigJsonl, '-o', out]);
    expect(r.status, r.stderr).toBe(0);
    expect(temporaries(sub)).toEqual([]);
    expect((await readCanonical(out)).table.numRows).toBe(400);
  });

  it('Ctrl-C (SIGINT) instead: exit 130 and the temporaries are gone at once', async () => {
    const sub = join(dir, 'k3');
    mkdirSync(sub);
    const r = await signalWhen(['convert', bigJsonl, '-o', join(sub, 'big.parquet')], () => temporaries(sub).length > 0, 'SIGINT');
    expect(r.code).toBe(130);
    expect(r.stderr.trim()).toBe('prefzoo: stopped by SIGINT; temporary files removed');
    expect(readdirSync(sub)).toEqual([]);
  });

  it('tokenize: the same for its output', async () => {
    const sub = join(dir, 'k2');
    mkdirSync(sub);
    const out = join(sub, 'd.tok.parquet');
    await killWhen(['tokenize', small, '--model', model, '-o', out], () => temporaries(sub).length > 0);
    expect(existsSync(out)).toBe(false);
    const r = cli(['tokenize', small, '--model', model, '-o', out]);
    expect(r.status, r.stderr).toBe(0);
    expect(temporaries(sub)).toEqual([]);
    expect((await readCanonical(out)).table.numRows).toBe(100);
  });
});

describe('damaged Parquet data pages', () => {
  let damaged: string;
  let groups: number;
  let span: [number, number];

  beforeAll(async () => {
    // Several row groups (small ones), then invalid bytes in the middle of row group 2's "rejected"
    // text chunk.
    const { table, meta } = await readCanonical(canonical);
    const intact = join(dir, 'groups.parquet');
    await writeCanonical(new arrow.Table([0, 100, 200].flatMap((i) => table.slice(i, i + 100).batches)), meta, intact, { rowGroupBytes: 96 * 1024 });
    const file = await pw.ParquetFile.fromFile(await openAsBlob(intact));
    const md = file.metadata();
    groups = md.numRowGroups();
    expect(groups).toBeGreaterThanOrEqual(3);
    // Column chunks lie one after another after the 4-byte magic, row group by row group.
    let offset = 4;
    let target: [number, number] | null = null;
    let first = 0;
    for (let g = 0; g < groups; g++) {
      const rg = md.rowGroup(g);
      for (const c of rg.columns()) {
        const size = Number(c.compressedSize());
        if (g === 1 && c.columnPath().join('.') === 'rejected.list.item.content') target = [offset, size];
        offset += size;
      }
      if (g === 1) span = [first + 1, first + rg.numRows()];
      first += rg.numRows();
    }
    expect(target).not.toBeNull();
    const bytes = readFileSync(intact);
    const at = target![0] + Math.floor(target![1] / 2);
    for (let i = at; i < at + 64; i++) bytes[i] ^= 0x5a;
    damaged = join(dir, 'damaged.parquet');
    writeFileSync(damaged, bytes);
  });

  const where = () => new RegExp(`damaged\\.parquet: damaged Parquet data in column "rejected", row group 2 of ${groups}, rows ${span[0]}–${span[1]}`);

  it('inspect names the file, the column and the row group', () => {
    const r = cli(['inspect', damaged]);
    expectOneLineError(r, where());
  });

  it('convert says the same and writes nothing', () => {
    const out = join(dir, 'from-damaged.parquet');
    expectOneLineError(cli(['convert', damaged, '-o', out]), where());
    expect(existsSync(out)).toBe(false);
    expect(temporaries(dir)).toEqual([]);
  });

  it('train and eval say the same instead of "Error strings stripped"; train leaves no run folder', () => {
    const run = join(dir, 'run-damaged');
    expectOneLineError(cli(['train', '--model', model, '--data', damaged, '--loss', 'dpo', '-o', run, '--param', 'max_steps=1', '--quiet']), where());
    expect(existsSync(run)).toBe(false);
    expectOneLineError(cli(['eval', '--model', model, '--ref', model, '--data', damaged, '--quiet']), where());
  });
});

describe('invalid and truncated records', () => {
  it('inspect counts and lists them (file:line and reason) where it used to drop them silently', () => {
    const src = readFileSync(SHAREGPT, 'utf8');
    const records = (JSON.parse(src) as unknown[]).slice(0, 8).map((r) => JSON.stringify(r));
    records[2] = records[2].slice(0, 60); // cut short
    records[5] = '[1, 2]'; // not a record
    const file = join(dir, 'bad.jsonl');
    writeFileSync(file, records.join('\n') + '\n');
    const r = cli(['inspect', file]);
    expect(r.status, r.stderr).toBe(0);
    expect(r.stdout).toMatch(/rows: {3}6 readable of 8 records; 2 invalid/);
    expect(r.stdout).toMatch(/bad\.jsonl:3: invalid JSON/);
    expect(r.stdout).toMatch(/bad\.jsonl:6: expected a record object, found a list/);
    const j = JSON.parse(cli(['inspect', file, '--json']).stdout);
    expect(j.rows + j.invalid.length).toBe(8);
    // convert agrees on the first one.
    expectOneLineError(cli(['convert', file, '-o', join(dir, 'bad.parquet')]), /bad\.jsonl:3: invalid JSON/);
  });
});

describe('formats', () => {
  const turn = (role: string, text: string) => ({ role, content: [{ type: 'text', value: text }], loss_weight: role === 'assistant' ? 1 : 0 });
  const rec = (q: string, good: string, bad: string) => ({
    chosen_messages: [turn('system', 'Be brief.'), turn('user', q), turn('assistant', good)],
    rejected_messages: [turn('system', 'Be brief.'), turn('user', q), turn('assistant', bad)],
  });

  it("LLaMA-Factory's chosen_messages / rejected_messages with content parts are detected, and --map reads them too", async () => {
    const file = join(dir, 'lf.jsonl');
    writeFileSync(file, [rec('2+2?', '4', '5'), rec('Capital of France?', 'Paris', 'Lyon')].map((x) => JSON.stringify(x)).join('\n') + '\n');
    const out = join(dir, 'lf.parquet');
    const r = cli(['convert', file, '-o', out]);
    expect(r.status, r.stderr).toBe(0);
    expect(r.stdout).toMatch(/format: llamafactory → pairwise \(messages text\)/);
    const { table } = await readCanonical(out);
    const prompt = table.getChild('prompt')!.get(1).toArray().map((m: { role: string; content: string }) => [m.role, m.content]);
    expect(prompt).toEqual([['system', 'Be brief.'], ['user', 'Capital of France?']]);
    expect(table.getChild('chosen')!.get(1).toArray()[0].content).toBe('Paris');
    expect(table.getChild('rejected')!.get(1).toArray()[0].content).toBe('Lyon');
    const mapped = cli(['convert', file, '-o', join(dir, 'lf2.parquet'), '--format', 'trl', '--map', 'chosen=chosen_messages,rejected=rejected_messages']);
    expect(mapped.status, mapped.stderr).toBe(0);
    // A non-text part is named, not mangled.
    const img = { chosen_messages: [turn('user', 'q'), { role: 'assistant', content: [{ type: 'image_url', value: 'x.png' }] }], rejected_messages: [turn('user', 'q'), turn('assistant', 'no')] };
    writeFileSync(join(dir, 'img.jsonl'), JSON.stringify(img) + '\n');
    expectOneLineError(cli(['convert', join(dir, 'img.jsonl'), '-o', join(dir, 'img.parquet')]), /img\.jsonl:1: .*"image_url" part/);
  });
});

describe('tokenize', () => {
  it('-o into a missing folder is one line; progress shows on stderr', () => {
    expectOneLineError(cli(['tokenize', small, '--model', model, '-o', join(dir, 'no', 'such', 'out.parquet')]), /-o .*no\/such\/out\.parquet: folder .* does not exist/);
    const r = cli(['tokenize', small, '--model', model, '-o', join(dir, 'tok.parquet')]);
    expect(r.status, r.stderr).toBe(0);
    expect(r.stderr).toMatch(/^tokenize 100\/100/m);
    expect(holds(dir, /^\.tok\.parquet\.tmp/)).toBe(false);
  });
});
