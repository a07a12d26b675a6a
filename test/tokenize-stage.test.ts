import { describe, it, expect, beforeAll } from 'vitest';
import { spawnSync } from 'node:child_process';
import { mkdtempSync, writeFileSync, existsSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join, resolve } from 'node:path';
import { initModelFolder } from '../src/models/init.ts';
import { loadTokenizer } from '../src/tokenize/index.ts';
import { readCanonical } from '../datasets/parquet.ts';
import { readTokenColumns, writeRefColumns, readRefColumns } from '../datasets/tokenized.ts';

const bin = resolve(__dirname, '..', 'bin', 'prefzoo.mjs');
let dir: string;
let model: string;
let canonical: string;

function cli(...args: string[]) {
  return spawnSync(process.execPath, [bin, ...args], { encoding: 'utf8' });
}

beforeAll(() => {
  dir = mkdtempSync(join(tmpdir(), 'pz-tok-'));
  model = join(dir, 'model');
  initModelFolder(model, 'llama', 'tiny', 1);
  const rows = [
    { prompt: 'What is 2+2?', chosen: 'It is 4.', rejected: 'It is 5.' },
    { prompt: 'Name a colour. '.repeat(20), chosen: 'Blue, the colour of a clear sky at noon.', rejected: 'Seven.' },
  ];
  writeFileSync(join(dir, 'in.jsonl'), rows.map((r) => JSON.stringify(r)).join('\n') + '\n');
  canonical = join(dir, 'in.parquet');
  const c = cli('convert', join(dir, 'in.jsonl'), '-o', canonical);
  expect(c.status, c.stderr).toBe(0);
});

describe('prefzoo tokenize', () => {
  it('adds List<Int32> columns equal to the tokenizer run by hand (BOS + prompt, response + EOS)', async () => {
    const out = join(dir, 'tok.parquet');
    const r = cli('tokenize', canonical, '--model', model, '-o', out);
    expect(r.status, r.stderr).toBe(0);
    expect(r.stdout).toMatch(/rows: 2 pairwise, 0 truncated/);
    const { table, meta } = await readCanonical(out);
    expect(table.schema.fields.find((f) => f.name === 'chosen_ids')!.type.toString()).toBe('List<Int32>');
    const rows = readTokenColumns(table, meta.kind)!;
    const tok = loadTokenizer(model);
    const plain = (s: string) => tok.encode(s, { addSpecialTokens: false });
    expect(rows[0].promptIds).toEqual([tok.bosId, ...plain('What is 2+2?')]);
    expect(rows[0].responseIds[0]).toEqual([...plain('It is 4.'), tok.eosId]);
    expect(rows[0].responseIds[1]).toEqual([...plain('It is 5.'), tok.eosId]);
  });

  it('truncates and counts: prompts keep their end, responses their start', async () => {
    const out = join(dir, 'short.parquet');
    const r = cli('tokenize', canonical, '--model', model, '-o', out, '--max-length', '24', '--max-prompt-length', '16');
    expect(r.status, r.stderr).toBe(0);
    expect(r.stdout).toMatch(/rows: 2 pairwise, 1 truncated/);
    const { table, meta } = await readCanonical(out);
    const rows = readTokenColumns(table, meta.kind)!;
    const tok = loadTokenizer(model);
    const full = [tok.bosId, ...tok.encode('Name a colour. '.repeat(20), { addSpecialTokens: false })];
    expect(rows[1].promptIds).toEqual(full.slice(-16));
    expect(rows[1].responseIds[0].length).toBe(8);
  });

  it('refuses bad flags in one line and writes nothing', () => {
    const out = join(dir, 'bad.parquet');
    const r = cli('tokenize', canonical, '--model', model, '-o', out, '--max-length', '8', '--max-prompt-length', '8');
    expect(r.status).toBe(1);
    expect(r.stderr.trim()).toMatch(/^prefzoo: --max-prompt-length \(8\) must be smaller than --max-length \(8\)$/);
    expect(existsSync(out)).toBe(false);
  });
});

describe('reference log-prob columns', () => {
  it('round-trip through Parquet for every kind, bit-exact', async () => {
    const cases: [Parameters<typeof writeRefColumns>[1], number[][]][] = [
      ['pairwise', [[-1.5, -2.25], [-0.1 / 3, -1e-300]]],
      ['listwise', [[-1, -2, -3], [-4.5]]],
      ['single', [[-7.125], [Math.PI]]],
    ];
    for (const [kind, ref] of cases) {
      const f = join(dir, `ref-${kind}.parquet`);
      await writeRefColumns(f, kind, ref);
      expect(await readRefColumns(f, kind)).toEqual(ref);
      expect(await readRefColumns(f, kind === 'single' ? 'pairwise' : 'single')).toBeNull();
    }
  });
});

describe('prefzoo inspect --tokenizer', () => {
  it('counts prompt and response tokens with the chat template, and refuses non-preference files', () => {
    const r = cli('inspect', join(dir, 'in.jsonl'), '--tokenizer', model, '--json');
    expect(r.status, r.stderr).toBe(0);
    const rep = JSON.parse(r.stdout);
    const tok = loadTokenizer(model);
    const want = 1 + tok.encode('What is 2+2?', { addSpecialTokens: false }).length;
    expect(rep.tokens.prompt.min).toBe(want);
    expect(rep.tokens.response.count).toBe(4);
    const bad = cli('inspect', resolve(__dirname, '..', '..', 'shared', 'data', 'parquet', 'nulls.snappy.parquet'), '--tokenizer', model);
    expect(bad.status).toBe(1);
    expect(bad.stderr).toMatch(/not preference data/);
  });
});
