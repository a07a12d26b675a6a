// Readers, column builders, the Parquet writer (zstd, metadata, shards, atomic rename), inspect, CLI.
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import * as arrow from '../datasets/arrow.ts';
import * as pw from 'parquet-wasm';
import { existsSync, mkdtempSync, readFileSync, readdirSync, rmSync, writeFileSync } from 'node:fs';
import { spawnSync } from 'node:child_process';
import { tmpdir } from 'node:os';
import { join, resolve } from 'node:path';
import { gzipSync } from 'node:zlib';
import { convert } from '../datasets/convert.ts';
import { BatchBuilder, MessagesBuilder, Utf8Builder } from '../datasets/columns.ts';
import { inspectFile } from '../datasets/inspect.ts';
import { parquetFooter, readCanonical, writeCanonical } from '../datasets/parquet.ts';
import { openSource } from '../datasets/readers.ts';
import { canonicalSchema, makeMeta } from '../datasets/schema.ts';

const repo = resolve(__dirname, '..');
const shared = resolve(repo, '..', 'shared', 'data');
let dir: string;
beforeAll(() => {
  dir = mkdtempSync(join(tmpdir(), 'prefzoo-io-'));
});
afterAll(() => rmSync(dir, { recursive: true, force: true }));

const pairs = (n: number, width = 40) =>
  Array.from({ length: n }, (_, i) => ({ prompt: `prompt ${i} ${'x'.repeat(i % width)}`, chosen: `good ${i} é中🙂`, rejected: `bad ${i}` }));

describe('column builders', () => {
  it('Utf8Builder matches apache-arrow for unicode, empty strings, nulls and growth', () => {
    const values = ['', 'a', 'é中🙂', null, 'x'.repeat(100_000), '\u0000nul', null, '\ud800 lone surrogate'];
    const b = new Utf8Builder();
    for (let k = 0; k < 50; k++) for (const v of values) b.push(v);
    const got = arrow.makeVector(b.finish());
    // apache-arrow's own builder is the independent reference (lone surrogates become U+FFFD in both).
    const ref = arrow.vectorFromArray(Array.from({ length: 50 }, () => values).flat(), new arrow.Utf8());
    expect(got.length).toBe(ref.length);
    expect(got.nullCount).toBe(100);
    expect(got.toArray()).toEqual(ref.toArray());
    expect(b.length).toBe(0);
  });

  it('MessagesBuilder writes List<Struct<role, content>>', () => {
    const b = new MessagesBuilder();
    const rows = [[{ role: 'user' as const, content: 'hi' }, { role: 'assistant' as const, content: 'yo' }], [], null, [{ role: 'system' as const, content: 's' }]];
    for (const r of rows) b.push(r);
    const v = arrow.makeVector(b.finish());
    expect(v.toJSON().map((x) => (x ? JSON.parse(JSON.stringify(x)) : x))).toEqual(rows);
  });

  it('BatchBuilder back-fills a column that appears mid-batch with nulls', () => {
    const bb = new BatchBuilder('plain', ['prompt', 'chosen', 'rejected']);
    bb.push({ prompt: 'p', chosen: 'a', rejected: 'b' });
    bb.addColumn('weight');
    bb.push({ prompt: 'q', chosen: 'c', rejected: 'd', weight: 0.5 });
    const schema = canonicalSchema('pairwise', 'plain', ['prompt', 'chosen', 'rejected', 'weight']);
    const t = new arrow.Table([bb.finish(schema)]);
    expect(t.getChild('prompt')!.toArray()).toEqual(['p', 'q']);
    expect(t.getChild('weight')!.get(0)).toBeNull();
    expect(t.getChild('weight')!.get(1)).toBe(0.5);
  });
});

describe('readers', () => {
  it('gzip inputs: .jsonl.gz, .json.gz and .csv.gz', async () => {
    const recs = pairs(30);
    const jl = join(dir, 'g.jsonl.gz');
    writeFileSync(jl, gzipSync(recs.map((r) => JSON.stringify(r)).join('\n')));
    const js = join(dir, 'g.json.gz');
    writeFileSync(js, gzipSync(JSON.stringify(recs, null, 2)));
    const cs = join(dir, 'g.csv.gz');
    writeFileSync(cs, gzipSync('prompt,chosen,rejected\n' + recs.map((r) => `${r.prompt},${r.chosen},${r.rejected}`).join('\n')));
    for (const p of [jl, js, cs]) {
      const out = join(dir, 'g.parquet');
      const s = await convert([p], out);
      expect(s.written).toBe(30);
      const { table } = await readCanonical(out);
      expect(table.toArray().map((r) => r.toJSON())).toEqual(recs);
    }
  });

  it('JSONL with a BOM, CRLF line ends and blank lines keeps true line numbers', async () => {
    const p = join(dir, 'crlf.jsonl');
    writeFileSync(p, '\ufeff' + JSON.stringify(pairs(1)[0]) + '\r\n\r\n' + '{"prompt":"p","chosen":"a"}\r\n');
    await expect(convert([p], join(dir, 'crlf.parquet'))).rejects.toThrow(`${p}:3: missing field "rejected"`);
  });

  it('a JSON array split across read chunks (escapes and braces inside strings)', async () => {
    // Strings full of the scanner's structural characters, long enough to straddle 1 MiB chunks.
    const tricky = Array.from({ length: 12 }, (_, i) => ({ prompt: `{[\\"}]${'"\\'.repeat(40_000 + i)}`, chosen: `]}${i}`, rejected: '{"' + 'y'.repeat(90_000) }));
    const p = join(dir, 'tricky.json');
    writeFileSync(p, JSON.stringify(tricky));
    const src = await openSource(p);
    const got: unknown[] = [];
    for await (const items of src.items()) for (const it of items) got.push(it.value);
    expect(got).toEqual(tricky);
  });

  it('Parquet and Arrow IPC inputs convert like JSON', async () => {
    const recs = pairs(20);
    const t = arrow.tableFromArrays({ prompt: recs.map((r) => r.prompt), chosen: recs.map((r) => r.chosen), rejected: recs.map((r) => r.rejected) });
    const ipc = join(dir, 'in.arrow');
    writeFileSync(ipc, arrow.tableToIPC(t, 'file'));
    const pq = join(dir, 'in.parquet');
    writeFileSync(pq, pw.writeParquet(pw.Table.fromIPCStream(arrow.tableToIPC(t, 'stream'))));
    for (const p of [ipc, pq]) {
      const out = join(dir, 'from-columnar.parquet');
      const s = await convert([p], out);
      expect(s).toMatchObject({ read: 20, written: 20, formats: ['trl'] });
      expect((await readCanonical(out)).table.toArray().map((r) => r.toJSON())).toEqual(recs);
    }
  });
});

describe('Parquet writer', () => {
  it('zstd, prefzoo metadata, and read back by parquet-wasm as well as through its footer', async () => {
    const out = join(dir, 'meta.parquet');
    await convert([join(shared, 'kto_en_demo.json')], out);
    const footer = await parquetFooter(out);
    expect(footer.rows).toBe(300);
    expect(JSON.parse(footer.metadata.get('prefzoo')!)).toEqual({ kind: 'single', text: 'messages', schema_version: 1, source_format: 'kto', created_by: 'prefzoo 0.1.0' });
    const file = await pw.ParquetFile.fromFile(new Blob([readFileSync(out)]));
    const rg = file.metadata().rowGroup(0);
    for (const c of rg.columns()) expect(c.compression()).toBe(pw.Compression.ZSTD);
    // Written bytes start and end with the Parquet magic.
    const bytes = readFileSync(out);
    expect(bytes.subarray(0, 4).toString()).toBe('PAR1');
    expect(bytes.subarray(-4).toString()).toBe('PAR1');
  });

  it('shards above the size threshold as NAME-0000i-of-0000N.parquet; readCanonical joins them', async () => {
    const sub = mkdtempSync(join(dir, 'shards-'));
    // Pseudo-random text, so zstd cannot shrink the output below the shard threshold.
    let x = 12345;
    const noise = () => Array.from({ length: 40 }, () => (((x = (x * 1103515245 + 12345) >>> 0) >>> 16) % 36).toString(36)).join('');
    const recs = pairs(3000).map((r) => ({ ...r, prompt: `${r.prompt} ${noise()}` }));
    const p = join(sub, 'in.jsonl');
    writeFileSync(p, recs.map((r) => JSON.stringify(r)).join('\n'));
    const s = await convert([p], join(sub, 'train.parquet'), { shardBytes: 16 * 1024, batchRows: 250 });
    expect(s.outputs.length).toBeGreaterThan(1);
    const n = s.outputs.length;
    const names = readdirSync(sub).filter((f) => f.endsWith('.parquet')).sort();
    expect(names).toEqual(Array.from({ length: n }, (_, i) => `train-${String(i).padStart(5, '0')}-of-${String(n).padStart(5, '0')}.parquet`));
    let total = 0;
    for (const f of names) total += (await parquetFooter(join(sub, f))).rows;
    expect(total).toBe(3000);
    const { table, files } = await readCanonical(join(sub, 'train.parquet'));
    expect(files.length).toBe(n);
    expect(table.toArray().map((r) => r.toJSON())).toEqual(recs);
  });

  it('atomic: a failure after batches were written leaves no output and keeps an existing file', async () => {
    const sub = mkdtempSync(join(dir, 'atomic-'));
    const recs: unknown[] = pairs(2000, 200);
    recs.push({ prompt: 'p', chosen: 'a' });
    const p = join(sub, 'in.jsonl');
    writeFileSync(p, recs.map((r) => JSON.stringify(r)).join('\n'));
    const out = join(sub, 'out.parquet');
    writeFileSync(out, 'previous contents');
    await expect(convert([p], out, { batchRows: 100, shardBytes: 32 * 1024 })).rejects.toThrow(`${p}:2001: missing field "rejected"`);
    expect(readdirSync(sub).sort()).toEqual(['in.jsonl', 'out.parquet']);
    expect(readFileSync(out, 'utf8')).toBe('previous contents');
  });

  it('writeCanonical / readCanonical round-trip messages, optional columns and nulls', async () => {
    // A key a later stage adds (tokenize) must survive the round trip.
    const meta = { ...makeMeta('pairwise', 'messages', 'test'), tokenizer: 'some-model' };
    const bb = new BatchBuilder('messages', ['prompt', 'chosen', 'rejected', 'id', 'weight']);
    const m = (role: 'user' | 'assistant', content: string) => [{ role, content }];
    bb.push({ prompt: m('user', 'q1'), chosen: m('assistant', 'a'), rejected: m('assistant', 'b'), id: '1', weight: 2 });
    bb.push({ prompt: m('user', 'q2'), chosen: m('assistant', 'c'), rejected: m('assistant', 'd'), id: null, weight: null });
    const schema = canonicalSchema('pairwise', 'messages', ['prompt', 'chosen', 'rejected', 'id', 'weight']);
    const table = new arrow.Table([bb.finish(schema)]);
    const out = join(dir, 'wc.parquet');
    expect(await writeCanonical(table, meta, out)).toEqual([out]);
    const back = await readCanonical(out);
    expect(back.meta).toEqual(meta);
    expect(back.table.toArray().map((r) => JSON.parse(JSON.stringify(r.toJSON())))).toEqual(table.toArray().map((r) => JSON.parse(JSON.stringify(r.toJSON()))));
    expect(back.table.getChild('weight')!.get(1)).toBeNull();
    await expect(readCanonical(join(shared, 'parquet', 'nulls.snappy.parquet'))).rejects.toThrow(/no "prefzoo" metadata/);
    const bad = new arrow.Table({ prompt: arrow.vectorFromArray(['x']) });
    await expect(writeCanonical(bad, meta, join(dir, 'bad.parquet'))).rejects.toThrow(/missing column "chosen"/);
    expect(existsSync(join(dir, 'bad.parquet'))).toBe(false);
  });
});

describe('inspect', () => {
  const corpus: Record<string, { rows: number; columns: number }> = {
    'alltypes_plain.snappy.parquet': { rows: 2, columns: 11 },
    'byte_stream_split.zstd.parquet': { rows: 300, columns: 2 },
    'datapage_v2.snappy.parquet': { rows: 5, columns: 5 },
    'list_columns.parquet': { rows: 3, columns: 2 },
    'nested_structs.rust.parquet': { rows: 1, columns: 36 },
    'nulls.snappy.parquet': { rows: 8, columns: 1 },
  };

  it.each(Object.entries(corpus))('reads %s: rows, schema, not preference data', async (name, want) => {
    const r = await inspectFile(join(shared, 'parquet', name));
    expect(r.rows).toBe(want.rows);
    expect(r.schema.length).toBe(want.columns);
    expect(r.kind).toBeNull();
    expect(r.prefzoo).toBeNull();
  });

  it('text length statistics agree with lengths computed from the decoded values', async () => {
    const p = join(shared, 'parquet', 'datapage_v2.snappy.parquet');
    const t = arrow.tableFromIPC(pw.readParquet(readFileSync(p)).intoIPCStream());
    const values = t.getChild('a')!.toArray() as Array<string | null>;
    const lens = values.filter((v): v is string => v !== null).map((v) => Buffer.byteLength(v)).sort((x, y) => x - y);
    const r = await inspectFile(p);
    expect(r.lengths.a).toMatchObject({ count: lens.length, nulls: values.length - lens.length, min: lens[0], max: lens[lens.length - 1] });
    expect(r.lengths.a.mean).toBeCloseTo(lens.reduce((s, x) => s + x, 0) / lens.length, 12);
    const lc = await inspectFile(join(shared, 'parquet', 'list_columns.parquet'));
    const lt = arrow.tableFromIPC(pw.readParquet(readFileSync(join(shared, 'parquet', 'list_columns.parquet'))).intoIPCStream());
    const perRow = lt.getChild('utf8_list')!.toArray().filter((x: arrow.Vector | null) => x !== null).map((l: arrow.Vector) => (l.toArray() as Array<string | null>).reduce((s, v) => s + (v ? Buffer.byteLength(v) : 0), 0));
    expect(lc.lengths.utf8_list.count).toBe(perRow.length);
    expect(lc.lengths.utf8_list.max).toBe(Math.max(...perRow));
  });

  it('a converted dataset shows its kind; message columns count their content', async () => {
    const out = join(dir, 'dpo.parquet');
    await convert([join(shared, 'dpo_en_demo.json')], out);
    const r = await inspectFile(out);
    expect(r).toMatchObject({ rows: 300, kind: 'pairwise', prefzoo: { text: 'messages', source_format: 'sharegpt' } });
    const src = JSON.parse(readFileSync(join(shared, 'dpo_en_demo.json'), 'utf8')) as Array<{ chosen: { value: string } }>;
    const chosen = src.map((s) => Buffer.byteLength(s.chosen.value));
    expect(r.lengths.chosen.max).toBe(Math.max(...chosen));
    expect(r.lengths.chosen.min).toBe(Math.min(...chosen));
    const j = await inspectFile(join(shared, 'kto_en_demo.json'));
    expect(j).toMatchObject({ rows: 300, kind: 'single', detectedFormat: 'kto', lengthUnit: 'chars' });
  });
});

describe('CLI', () => {
  const cli = (...args: string[]) => spawnSync(process.execPath, [join(repo, 'bin', 'prefzoo.mjs'), ...args], { cwd: repo, encoding: 'utf8' });

  it('convert prints read/written/skipped; a bad record is one line on stderr, exit 1, no output', () => {
    const p = join(dir, 'cli.jsonl');
    writeFileSync(p, [JSON.stringify(pairs(1)[0]), '{"prompt": "p", "chosen": "a", "rejected": "a"}'].join('\n'));
    const out = join(dir, 'cli.parquet');
    const bad = cli('convert', p, '-o', out);
    expect(bad.status).toBe(1);
    expect(bad.stderr).toBe(`prefzoo: ${p}:2: fields "chosen" and "rejected" are identical\n`);
    expect(existsSync(out)).toBe(false);
    const ok = cli('convert', p, '-o', out, '--on-invalid', 'skip');
    expect(ok.status).toBe(0);
    expect(ok.stdout).toContain('rows: read 2, written 1, skipped 1');
    expect(ok.stdout).toContain(`skipped records and reasons: ${join(dir, 'cli.skipped.jsonl')}`);
    const ins = cli('inspect', out, '--json');
    expect(ins.status).toBe(0);
    expect(JSON.parse(ins.stdout)).toMatchObject({ rows: 1, kind: 'pairwise' });
  });
});
