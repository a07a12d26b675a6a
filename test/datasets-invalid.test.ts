// Bad input (docs/data.md): every rule names file:line (or row) and field; `error` leaves no output,
// `skip` lists each skipped record with its reason and keeps read = written + skipped.
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { existsSync, mkdtempSync, readFileSync, readdirSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { type ConvertOptions, convert } from '../datasets/convert.ts';
import { readCanonical } from '../datasets/parquet.ts';
import { BadInputError } from '../src/errors.ts';

let dir: string;
beforeAll(() => {
  dir = mkdtempSync(join(tmpdir(), 'prefzoo-invalid-'));
});
afterAll(() => rmSync(dir, { recursive: true, force: true }));

let n = 0;
function file(ext: string, text: string): string {
  const p = join(dir, `in${n++}${ext}`);
  writeFileSync(p, text);
  return p;
}
const lines = (...recs: unknown[]) => recs.map((r) => (typeof r === 'string' ? r : JSON.stringify(r))).join('\n') + '\n';
const good = { prompt: 'p', chosen: 'a', rejected: 'b' };

/** Runs convert expecting failure; returns the message and checks no output (nor temp file) was left. */
async function rejects(input: string, opts: ConvertOptions = {}): Promise<string> {
  const sub = mkdtempSync(join(dir, 'out-'));
  const out = join(sub, 'out.parquet');
  let message = '';
  await convert([input], out, opts).then(
    () => expect.unreachable('conversion should have failed'),
    (e: Error) => {
      // A BadInputError (a UserError) that carries the input file and the line or row it names.
      expect(e).toBeInstanceOf(BadInputError);
      const b = e as BadInputError;
      expect(b.file).toBe(input);
      if (b.line !== undefined || b.row !== undefined) expect(e.message.startsWith(`${input}:${b.line ?? `row ${b.row}`}`)).toBe(true);
      message = e.message;
    },
  );
  expect(readdirSync(sub)).toEqual([]);
  return message;
}

/** Runs convert in skip mode; returns summary and the parsed skipped list. */
async function skips(input: string, opts: ConvertOptions = {}) {
  const out = join(mkdtempSync(join(dir, 'out-')), 'out.parquet');
  const summary = await convert([input], out, { ...opts, onInvalid: 'skip' });
  const skipped = summary.skippedPath
    ? readFileSync(summary.skippedPath, 'utf8').trim().split('\n').map((l) => JSON.parse(l) as Record<string, unknown>)
    : [];
  const { table } = await readCanonical(out);
  expect(summary.read).toBe(summary.written + summary.skipped);
  expect(table.numRows).toBe(summary.written);
  expect(skipped.length).toBe(summary.skipped);
  return { summary, skipped, table, out };
}

describe('each bad-input rule names file:line and field', () => {
  it('invalid JSON', async () => {
    const p = file('.jsonl', lines(good, '{"prompt": "p", "chosen": ', good));
    expect(await rejects(p)).toMatch(new RegExp(`^${p}:2: invalid JSON \\(.+\\)$`));
  });

  it('missing field', async () => {
    const p = file('.jsonl', lines(good, good, { prompt: 'p', chosen: 'a' }));
    expect(await rejects(p)).toBe(`${p}:3: missing field "rejected"`);
  });

  it('missing field under --map is named by its source name', async () => {
    const p = file('.jsonl', lines({ q: 'p', chosen: 'a', rejected: 'b' }, { chosen: 'a', rejected: 'b' }));
    expect(await rejects(p, { map: { prompt: 'q' } })).toBe(`${p}:2: missing field "q" (mapped to "prompt" by --map)`);
  });

  it('empty response (and whitespace-only), unless --allow-empty', async () => {
    const p = file('.jsonl', lines(good, { prompt: 'p', chosen: '  \n', rejected: 'b' }));
    expect(await rejects(p)).toBe(`${p}:2: field "chosen" is empty`);
    const { summary } = await skips(p, { allowEmpty: true });
    expect(summary.written).toBe(2);
    const m = file('.jsonl', lines({ prompt: [{ role: 'user', content: 'q' }], chosen: [{ role: 'assistant', content: '' }], rejected: [{ role: 'assistant', content: 'x' }] }));
    expect(await rejects(m)).toBe(`${m}:1: field "chosen" is empty`);
  });

  it('chosen identical to rejected, unless --allow-identical', async () => {
    const p = file('.jsonl', lines(good, { prompt: 'p', chosen: 'same', rejected: 'same' }));
    expect(await rejects(p)).toBe(`${p}:2: fields "chosen" and "rejected" are identical`);
    const { summary } = await skips(p, { allowIdentical: true });
    expect(summary.skipped).toBe(0);
  });

  it('NaN and null scores (CSV "NaN", JSON null)', async () => {
    const c = file('.csv', 'prompt,chosen,rejected,chosen_score,rejected_score\np,a,b,1,2\np,a,b,NaN,2\n');
    expect(await rejects(c)).toBe(`${c}:row 2: field "chosen_score" is NaN`);
    const j = file('.jsonl', lines({ prompt: 'p', response: 'r', reward: null }));
    expect(await rejects(j)).toBe(`${j}:1: field "reward" is null`);
    const s = file('.jsonl', lines({ prompt: 'p', responses: ['a', 'b'], scores: [1, null] }));
    expect(await rejects(s)).toBe(`${s}:1: field "scores[1]" is null`);
  });

  it('list lengths that disagree', async () => {
    const p = file('.jsonl', lines({ prompt: 'p', responses: ['a', 'b', 'c'], scores: [1, 2] }));
    expect(await rejects(p)).toBe(`${p}:1: field "scores" has 2 values for 3 responses`);
    const w = file('.jsonl', lines({ prompt: 'p', responses: ['a', 'b'], scores: [1, 2], win_probs: [1] }));
    expect(await rejects(w)).toBe(`${w}:1: field "win_probs" has 1 values for 2 responses`);
  });

  it('scores in some records but not others', async () => {
    const p = file('.jsonl', lines({ ...good, chosen_score: 1, rejected_score: 0 }, good));
    expect(await rejects(p)).toBe(`${p}:2: missing field "chosen_score" (the records before it have one)`);
    const q = file('.jsonl', lines(good, { ...good, weight: 2 }));
    expect(await rejects(q)).toBe(`${q}:2: field "weight" appears, but the first record has none`);
  });

  it('binarizing a record whose responses all score the same', async () => {
    const p = file('.jsonl', lines({ prompt: 'p', responses: ['a', 'b'], scores: [2, 2] }));
    expect(await rejects(p, { binarize: true })).toBe(`${p}:1: field "scores": every response scores 2, so no pair has a preference`);
  });

  it('tied scores in a pair carry no preference, unless --allow-ties', async () => {
    const p = file('.jsonl', lines({ ...good, chosen_score: 3, rejected_score: 3 }));
    expect(await rejects(p)).toMatch(/:1: fields "chosen_score" and "rejected_score" are equal/);
    expect((await skips(p, { allowTies: true })).summary.written).toBe(1);
  });

  it('wrong value types: label, roles, text vs messages', async () => {
    const k = file('.jsonl', lines({ prompt: 'p', completion: 'c', label: 'maybe' }));
    expect(await rejects(k)).toBe(`${k}:1: field "label": expected true or false, found the text "maybe"`);
    const r = file('.jsonl', lines({ prompt: [{ role: 'wizard', content: 'x' }], chosen: [{ role: 'assistant', content: 'a' }], rejected: [{ role: 'assistant', content: 'b' }] }));
    expect(await rejects(r)).toMatch(/:1: field "prompt\[0\]\.role": unknown role "wizard"/);
    const later = file('.jsonl', lines(good, { prompt: [{ role: 'user', content: 'q' }], chosen: [{ role: 'assistant', content: 'a' }], rejected: [{ role: 'assistant', content: 'b' }] }));
    expect(await rejects(later)).toMatch(/:2: field "prompt" is a message list, but earlier records use plain text/);
  });

  it('a JSON array names the line each broken element starts on', async () => {
    const p = file('.json', `[\n  ${JSON.stringify(good)},\n  {"prompt": "p",\n   "chosen": "a"}\n]\n`);
    expect(await rejects(p)).toBe(`${p}:3: missing field "rejected"`);
    const t = file('.json', `[\n${JSON.stringify(good)},\n{"prompt": "p", "cho`);
    expect(await rejects(t)).toBe(`${t}:3: invalid JSON (the file ends inside this record)`);
    const g = file('.json', `[${JSON.stringify(good)} ${JSON.stringify(good)}]`);
    expect(await rejects(g)).toBe(`${g}:1: invalid JSON (expected "," or "]" between records)`);
  });

  it('CSV rows with the wrong number of columns', async () => {
    const p = file('.csv', 'prompt,chosen,rejected\np,a,b\np,a\n');
    expect(await rejects(p)).toBe(`${p}:row 2: expected 3 columns (as in the header), found 2`);
  });

  it('a file that is not preference data is refused, saying what was expected', async () => {
    const p = file('.jsonl', lines({ name: 'x', age: 3 }, { name: 'y', age: 4 }));
    const msg = await rejects(p);
    expect(msg).toMatch(new RegExp(`^${p}: not preference data: expected records shaped as .*trl \\{prompt, chosen, rejected\\}.*found fields name, age$`));
    const a = file('.json', '[1, 2, 3]');
    expect(await rejects(a)).toBe(`${a}:1: not preference data: expected one object per record, found number 1`);
    expect(await rejects(join(dir, 'no-such.jsonl'))).toMatch(/no-such\.jsonl: no such file/);
    const parquetLike = file('.bin', 'hello world');
    expect(await rejects(parquetLike)).toMatch(/unknown input format/);
    // Skip mode refuses too: the whole file is wrong, not some records.
    await expect(convert([p], join(dir, 'x.parquet'), { onInvalid: 'skip' })).rejects.toThrow(/not preference data/);
  });

  it('--kind and --binarize that do not fit the data are refused', async () => {
    const p = file('.jsonl', lines(good));
    expect(await rejects(p, { kind: 'single' })).toMatch(/format trl gives pairwise data, which cannot become --kind single/);
    expect(await rejects(p, { binarize: true })).toMatch(/--binarize applies to listwise data/);
  });
});

describe('--on-invalid skip', () => {
  it('lists every skipped record with file, line and reason; read = written + skipped', async () => {
    const p = file('.jsonl', lines(good, 'not json', { prompt: 'p', chosen: 'x', rejected: 'x' }, good, { prompt: 'p', chosen: 'a' }, '', good));
    const { summary, skipped, table } = await skips(p);
    expect(summary).toMatchObject({ read: 6, written: 3, skipped: 3 });
    expect(skipped).toEqual([
      { file: p, line: 2, field: null, reason: expect.stringMatching(/^invalid JSON/) },
      { file: p, line: 3, field: 'rejected', reason: 'fields "chosen" and "rejected" are identical' },
      { file: p, line: 5, field: 'rejected', reason: 'missing field "rejected"' },
    ]);
    expect(table.getChild('prompt')!.toArray()).toEqual(['p', 'p', 'p']);
  });

  it('names CSV records by row, and a clean rerun removes the stale list', async () => {
    const p = file('.csv', 'prompt,chosen,rejected\np,a,b\np,a,a\n');
    const { skipped, out } = await skips(p);
    expect(skipped).toEqual([{ file: p, row: 2, field: 'rejected', reason: 'fields "chosen" and "rejected" are identical' }]);
    const skippedPath = out.replace(/\.parquet$/, '.skipped.jsonl');
    expect(existsSync(skippedPath)).toBe(true);
    const clean = file('.csv', 'prompt,chosen,rejected\np,a,b\n');
    await convert([clean], out, { onInvalid: 'skip' });
    expect(existsSync(skippedPath)).toBe(false);
  });

  it('all records invalid: an error, the list of reasons, and no Parquet file', async () => {
    const sub = mkdtempSync(join(dir, 'out-'));
    const p = file('.jsonl', lines({ prompt: 'p', chosen: 'a' }, { prompt: 'p', chosen: '', rejected: 'b' }));
    await expect(convert([p], join(sub, 'o.parquet'), { onInvalid: 'skip' })).rejects.toThrow(/no valid records: all 2 were skipped/);
    expect(readdirSync(sub)).toEqual(['o.skipped.jsonl']);
  });
});
