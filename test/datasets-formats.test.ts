// Format adapters on hand-written records of every format, and on the two real files in shared/data.
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { existsSync, mkdtempSync, readdirSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join, resolve } from 'node:path';
import { convert } from '../datasets/convert.ts';
import { uniform } from '../src/random.ts';
import { FORMATS, splitCommonPrefix } from '../datasets/formats/index.ts';
import { readCanonical } from '../datasets/parquet.ts';

const shared = resolve(__dirname, '..', '..', 'shared', 'data');
let dir: string;
beforeAll(() => {
  dir = mkdtempSync(join(tmpdir(), 'prefzoo-formats-'));
});
afterAll(() => rmSync(dir, { recursive: true, force: true }));

function jsonl(name: string, records: unknown[]): string {
  const p = join(dir, name);
  writeFileSync(p, records.map((r) => JSON.stringify(r)).join('\n') + '\n');
  return p;
}

/** Converts and reads the result back as plain row objects. */
async function roundTrip(input: string | string[], opts: Parameters<typeof convert>[2] = {}) {
  const inputs = Array.isArray(input) ? input : [input];
  const out = join(dir, `${Math.random().toString(36).slice(2)}.parquet`);
  const summary = await convert(inputs, out, opts);
  const { table, meta } = await readCanonical(out);
  const rows = table.toArray().map((r) => JSON.parse(JSON.stringify(r.toJSON())) as Record<string, unknown>);
  return { summary, meta, rows, table };
}

const user = (content: string) => ({ role: 'user', content });
const assistant = (content: string) => ({ role: 'assistant', content });

const fixtures = resolve(__dirname, 'fixtures', 'formats');

describe('every adapter has fixtures', () => {
  it('test/fixtures/formats/<name>.jsonl (csv: .csv) holds records the adapter reads, detected as that format, none skipped', async () => {
    const names = FORMATS.map((a) => a.name);
    expect(readdirSync(fixtures).map((f) => f.replace(/\.[^.]+$/, '')).sort()).toEqual([...names].sort());
    for (const a of FORMATS) {
      const file = join(fixtures, `${a.name}.${a.name === 'csv' ? 'csv' : 'jsonl'}`);
      expect(existsSync(file), file).toBe(true);
      const lines = readFileSync(file, 'utf8').trim().split('\n').length - (a.name === 'csv' ? 1 : 0);
      const { summary } = await roundTrip(file);
      // A CSV row is read by the format its header names (the fixture's: trl).
      expect(summary, a.name).toMatchObject({ read: lines, written: lines, skipped: 0, kind: a.kind, formats: [a.name === 'csv' ? 'trl' : a.name] });
    }
  });
});

describe('trl', () => {
  it('standard: prompt/chosen/rejected strings, with optional score and id columns', async () => {
    const p = jsonl('trl.jsonl', [
      { prompt: 'What is 2+2?', chosen: '4', rejected: '5', score_chosen: 9, score_rejected: 2, id: 7 },
      { prompt: 'Capital of France?', chosen: 'Paris', rejected: 'Lyon', score_chosen: 8.5, score_rejected: 1, id: 'x' },
    ]);
    const { summary, meta, rows, table } = await roundTrip(p);
    expect(summary).toMatchObject({ read: 2, written: 2, skipped: 0, kind: 'pairwise', text: 'plain', formats: ['trl'] });
    expect(meta).toMatchObject({ kind: 'pairwise', text: 'plain', source_format: 'trl', schema_version: 1 });
    expect(table.schema.fields.map((f) => `${f.name}:${f.type}`)).toEqual([
      'prompt:Utf8',
      'chosen:Utf8',
      'rejected:Utf8',
      'id:Utf8',
      'chosen_score:Float64',
      'rejected_score:Float64',
    ]);
    expect(rows[1]).toEqual({ prompt: 'Capital of France?', chosen: 'Paris', rejected: 'Lyon', id: 'x', chosen_score: 8.5, rejected_score: 1 });
    expect(rows[0].id).toBe('7');
  });

  it('implicit prompt: the shared start of chosen and rejected, cut at a word boundary', async () => {
    expect(splitCommonPrefix('The answer is yes', 'The answer is yeah')).toEqual(['The answer is', ' yes', ' yeah']);
    expect(splitCommonPrefix('Q: hi\nA: good', 'Q: hi\nA: bad')).toEqual(['Q: hi\nA:', ' good', ' bad']);
    const p = jsonl('implicit.jsonl', [{ chosen: 'Sky colour? It is blue.', rejected: 'Sky colour? It is green.' }]);
    const { rows } = await roundTrip(p);
    expect(rows[0]).toEqual({ prompt: 'Sky colour? It is', chosen: ' blue.', rejected: ' green.' });
  });

  it('conversational: message lists, explicit or implicit prompt', async () => {
    const explicit = jsonl('conv.jsonl', [{ prompt: [user('hi')], chosen: [assistant('hello!')], rejected: [assistant('go away')] }]);
    const a = await roundTrip(explicit);
    expect(a.summary.text).toBe('messages');
    expect(a.rows[0]).toEqual({ prompt: [user('hi')], chosen: [assistant('hello!')], rejected: [assistant('go away')] });
    const implicit = jsonl('conv-implicit.jsonl', [
      { chosen: [user('hi'), assistant('hello!')], rejected: [user('hi'), assistant('go away')] },
    ]);
    const b = await roundTrip(implicit);
    expect(b.rows[0]).toEqual({ prompt: [user('hi')], chosen: [assistant('hello!')], rejected: [assistant('go away')] });
  });

  it('mixed forms in one record are lifted to messages (UltraFeedback-binarized shape)', async () => {
    const p = jsonl('mixed.jsonl', [
      // prompt as text, responses repeating the conversation, scores under HF names
      { prompt: 'hi', prompt_id: 'a1', chosen: [user('hi'), assistant('hello!')], rejected: [user('hi'), assistant('no')], score_chosen: 8, score_rejected: 3 },
      // prompt as text, responses as bare assistant turns
      { prompt: 'yo', chosen: [assistant('hey')], rejected: 'meh', score_chosen: 1, score_rejected: 0 },
    ]);
    const { rows, summary } = await roundTrip(p);
    expect(summary.text).toBe('messages');
    expect(rows[0]).toEqual({ prompt: [user('hi')], chosen: [assistant('hello!')], rejected: [assistant('no')], id: 'a1', chosen_score: 8, rejected_score: 3 });
    // A string id is optional per row (null when absent); scores are not (see the invalid-input tests).
    expect(rows[1]).toEqual({ prompt: [user('yo')], chosen: [assistant('hey')], rejected: [assistant('meh')], id: null, chosen_score: 1, rejected_score: 0 });
  });
});

describe('sharegpt', () => {
  it('maps from/value and the sharegpt role names onto role/content; a function_call turn becomes tool_calls', async () => {
    const p = jsonl('sharegpt.jsonl', [
      {
        system: 'Be brief.',
        conversations: [
          { from: 'human', value: 'Weather in Oslo?' },
          { from: 'function_call', value: '{"name":"weather"}' },
          { from: 'observation', value: '{"temp":3}' },
        ],
        chosen: { from: 'gpt', value: 'It is 3 degrees.' },
        rejected: { from: 'gpt', value: 'Sunny and hot.' },
      },
    ]);
    const { rows, meta } = await roundTrip(p);
    expect(meta.source_format).toBe('sharegpt');
    // With tool calls in the data, every message carries the three tool fields (null where unused).
    const m = (role: string, content: string, tool_calls: string | null = null) => ({ role, content, tool_calls, tool_call_id: null, name: null });
    expect(rows[0]).toEqual({
      prompt: [
        m('system', 'Be brief.'),
        m('user', 'Weather in Oslo?'),
        m('assistant', '', JSON.stringify([{ type: 'function', function: { name: 'weather', arguments: {} } }])),
        m('tool', '{"temp":3}'),
      ],
      chosen: [m('assistant', 'It is 3 degrees.')],
      rejected: [m('assistant', 'Sunny and hot.')],
    });
  });
});

describe('hh', () => {
  it('splits full transcripts at the last "\\n\\nAssistant:"', async () => {
    const prompt = '\n\nHuman: Hi\n\nAssistant: Hello.\n\nHuman: Tell me a joke.\n\nAssistant:';
    const p = jsonl('hh.jsonl', [{ chosen: `${prompt} Why did the chicken...`, rejected: `${prompt} No.` }]);
    const { rows, meta } = await roundTrip(p);
    expect(meta.source_format).toBe('hh');
    expect(rows[0]).toEqual({ prompt, chosen: ' Why did the chicken...', rejected: ' No.' });
  });
});

describe('ultrafeedback and listwise', () => {
  const records = [
    {
      instruction: 'Name a prime.',
      completions: [
        { response: '4', overall_score: 1 },
        { response: '7', overall_score: 9 },
        { response: '9', overall_score: 2 },
        { response: '2', overall_score: 8 },
      ],
    },
    { prompt: 'Say hi.', completions: [{ response: 'hi', ratings: [4, 5] }, { response: 'no', ratings: { honesty: 1, helpfulness: 2 } }] },
  ];

  it('becomes listwise with scores (overall_score, or the mean of ratings)', async () => {
    const { rows, summary, table } = await roundTrip(jsonl('uf.jsonl', records));
    expect(summary.kind).toBe('listwise');
    expect(String(table.schema.fields[2].type)).toBe('List<Float64>');
    expect(rows[0]).toEqual({ prompt: 'Name a prime.', responses: ['4', '7', '9', '2'], scores: [1, 9, 2, 8] });
    expect(rows[1]).toEqual({ prompt: 'Say hi.', responses: ['hi', 'no'], scores: [4.5, 1.5] });
  });

  it('--binarize: the best against a seeded random other, reproducible by seed', async () => {
    const many = Array.from({ length: 40 }, () => records[0]);
    const p = jsonl('uf-many.jsonl', many);
    const a = await roundTrip(p, { binarize: true, seed: 3 });
    const b = await roundTrip(p, { binarize: true, seed: 3 });
    const c = await roundTrip(p, { kind: 'pairwise', seed: 4 });
    expect(a.summary.kind).toBe('pairwise');
    for (const r of a.rows) {
      expect(r.chosen).toBe('7');
      expect(r.chosen_score).toBe(9);
      expect(['4', '9', '2']).toContain(r.rejected);
      expect(r.rejected_score).toBe({ '4': 1, '9': 2, '2': 8 }[r.rejected as string]);
    }
    expect(b.rows).toEqual(a.rows);
    // The draw is the documented generator's: index floor(u * 3) among the non-best, in order.
    const rand = uniform(3);
    const expected = a.rows.map(() => ['4', '9', '2'][Math.floor(rand() * 3)]);
    expect(a.rows.map((r) => r.rejected)).toEqual(expected);
    expect(c.rows.map((r) => r.rejected)).not.toEqual(expected);
    // Every non-best response is drawn at some point in 40 draws.
    expect(new Set(a.rows.map((r) => r.rejected)).size).toBe(3);
  });

  it('--binarize never pairs the best with an equally scored response (unless --allow-ties)', async () => {
    const p = jsonl('uf-ties.jsonl', Array.from({ length: 30 }, () => ({ prompt: 'q', responses: ['a', 'b', 'c'], scores: [5, 5, 1] })));
    const strict = await roundTrip(p, { binarize: true });
    expect(new Set(strict.rows.map((r) => `${r.chosen}>${r.rejected}`))).toEqual(new Set(['a>c']));
    const loose = await roundTrip(p, { binarize: true, allowTies: true, allowIdentical: true });
    expect(new Set(loose.rows.map((r) => `${r.chosen}>${r.rejected}`))).toEqual(new Set(['a>b', 'a>c']));
  });

  it('listwise responses may be conversations', async () => {
    const p = jsonl('lw-msgs.jsonl', [{ prompt: [user('q')], responses: [[assistant('a')], [assistant('b')]], scores: [0, 1] }]);
    const { rows, table } = await roundTrip(p);
    expect(String(table.schema.fields[1].type)).toBe('List<List<Struct<{role:Utf8, content:Utf8}>>>');
    expect(rows[0]).toEqual({ prompt: [user('q')], responses: [[assistant('a')], [assistant('b')]], scores: [0, 1] });
  });

  it('generic listwise {prompt, responses, scores} with win_probs', async () => {
    const p = jsonl('lw.jsonl', [{ prompt: 'p', responses: ['a', 'b', 'c'], scores: [1, 2, 3], win_probs: [0.2, 0.3, 0.5] }]);
    const { rows, meta } = await roundTrip(p);
    expect(meta.kind).toBe('listwise');
    expect(rows[0]).toEqual({ prompt: 'p', responses: ['a', 'b', 'c'], scores: [1, 2, 3], win_probs: [0.2, 0.3, 0.5] });
  });
});

describe('openai', () => {
  it('input.messages / preferred_output / non_preferred_output, content parts flattened', async () => {
    const p = jsonl('openai.jsonl', [
      {
        input: { messages: [{ role: 'user', content: [{ type: 'text', text: 'Hello ' }, { type: 'text', text: 'there' }] }] },
        preferred_output: [assistant('Hi! How can I help?')],
        non_preferred_output: [assistant('What.')],
      },
    ]);
    const { rows, meta } = await roundTrip(p);
    expect(meta.source_format).toBe('openai');
    expect(rows[0]).toEqual({ prompt: [user('Hello there')], chosen: [assistant('Hi! How can I help?')], rejected: [assistant('What.')] });
  });
});

describe('kto and rewards (single-trajectory)', () => {
  it('kto {prompt, completion, label} and {messages, label}', async () => {
    const a = await roundTrip(jsonl('kto.jsonl', [{ prompt: 'p1', completion: 'good', label: true }, { prompt: 'p2', completion: 'bad', label: false }]));
    expect(a.meta.kind).toBe('single');
    expect(a.rows).toEqual([
      { prompt: 'p1', response: 'good', label: true },
      { prompt: 'p2', response: 'bad', label: false },
    ]);
    const b = await roundTrip(jsonl('kto-msgs.jsonl', [{ messages: [user('q'), assistant('a')], label: false }]));
    expect(b.rows[0]).toEqual({ prompt: [user('q')], response: [assistant('a')], label: false });
  });

  it('rewards {prompt, response, reward}', async () => {
    const { rows, meta, table } = await roundTrip(jsonl('rw.jsonl', [{ prompt: 'p', response: 'r', reward: -1.25 }]));
    expect(meta).toMatchObject({ kind: 'single', source_format: 'rewards' });
    expect(table.schema.fields.map((f) => f.name)).toEqual(['prompt', 'response', 'reward']);
    expect(rows[0]).toEqual({ prompt: 'p', response: 'r', reward: -1.25 });
  });
});

describe('csv', () => {
  it('header row, --map renames, numbers and booleans from text', async () => {
    const p = join(dir, 'data.csv');
    writeFileSync(p, 'question,good,bad,chosen_score\nq1,yes,no,1.5\n');
    const { rows, summary } = await roundTrip(p, { map: { prompt: 'question', chosen: 'good', rejected: 'bad' } });
    expect(summary.kind).toBe('pairwise');
    expect(rows[0]).toEqual({ prompt: 'q1', chosen: 'yes', rejected: 'no', chosen_score: 1.5 });
    const k = join(dir, 'kto.csv');
    writeFileSync(k, 'prompt,completion,label\np,c,true\np,d,0\n');
    const kto = await roundTrip(k, { format: 'csv' });
    expect(kto.rows).toEqual([
      { prompt: 'p', response: 'c', label: true },
      { prompt: 'p', response: 'd', label: false },
    ]);
  });

  it('RFC 4180 quoting, BOM, CRLF, and TSV', async () => {
    const p = join(dir, 'quirks.csv');
    const body = 'prompt,chosen,rejected\r\n"a, b","line1\r\nline2","say ""hi"""\r\n\r\nplain,x,y\r\n';
    writeFileSync(p, Buffer.concat([Buffer.from([0xef, 0xbb, 0xbf]), Buffer.from(body)]));
    const { rows } = await roundTrip(p);
    expect(rows).toEqual([
      { prompt: 'a, b', chosen: 'line1\r\nline2', rejected: 'say "hi"' },
      { prompt: 'plain', chosen: 'x', rejected: 'y' },
    ]);
    const t = join(dir, 'data.tsv');
    writeFileSync(t, 'prompt\tresponse\treward\nwhat, then\tok\t0.5\n');
    const tsv = await roundTrip(t);
    expect(tsv.rows).toEqual([{ prompt: 'what, then', response: 'ok', reward: 0.5 }]);
  });
});

describe('several inputs', () => {
  it('are concatenated in order when they give the same kind, whatever their formats', async () => {
    const a = jsonl('multi-a.jsonl', [{ prompt: 'p1', chosen: 'a', rejected: 'b' }]);
    const b = join(dir, 'multi-b.csv');
    writeFileSync(b, 'prompt,chosen,rejected\np2,c,d\n');
    const { rows, summary } = await roundTrip([a, b]);
    expect(summary).toMatchObject({ read: 2, written: 2, formats: ['trl'] });
    expect(rows.map((r) => r.prompt)).toEqual(['p1', 'p2']);
    const k = jsonl('multi-k.jsonl', [{ prompt: 'p', completion: 'c', label: true }]);
    await expect(convert([a, k], join(dir, 'multi.parquet'))).rejects.toThrow(`${k}: single data, but the inputs before it are pairwise`);
  });
});

describe('real data in shared/data', () => {
  it('dpo_en_demo.json: 300 sharegpt pairs → pairwise messages, values intact', async () => {
    const src = JSON.parse(readFileSync(join(shared, 'dpo_en_demo.json'), 'utf8')) as Array<Record<string, any>>;
    const { rows, summary, meta, table } = await roundTrip(join(shared, 'dpo_en_demo.json'));
    expect(summary).toMatchObject({ read: 300, written: 300, skipped: 0, kind: 'pairwise', text: 'messages' });
    expect(meta.source_format).toBe('sharegpt');
    expect(table.schema.fields.map((f) => f.name)).toEqual(['prompt', 'chosen', 'rejected']);
    const roles: Record<string, string> = { human: 'user', gpt: 'assistant', system: 'system', observation: 'tool', function_call: 'assistant' };
    for (const i of [0, 137, 299]) {
      const s = src[i];
      expect(rows[i].prompt).toEqual(s.conversations.map((m: any) => ({ role: roles[m.from], content: m.value })));
      expect(rows[i].chosen).toEqual([{ role: 'assistant', content: s.chosen.value }]);
      expect(rows[i].rejected).toEqual([{ role: 'assistant', content: s.rejected.value }]);
    }
  });

  it('kto_en_demo.json: 300 single rows with response and label, 150/150', async () => {
    const src = JSON.parse(readFileSync(join(shared, 'kto_en_demo.json'), 'utf8')) as Array<Record<string, any>>;
    const { rows, summary, table } = await roundTrip(join(shared, 'kto_en_demo.json'));
    expect(summary).toMatchObject({ read: 300, written: 300, kind: 'single' });
    expect(table.schema.fields.map((f) => f.name)).toEqual(['prompt', 'response', 'label']);
    expect(rows.filter((r) => r.label === true).length).toBe(150);
    expect(rows.filter((r) => r.label === false).length).toBe(150);
    for (const i of [0, 150, 299]) {
      const msgs = src[i].messages;
      expect(rows[i].response).toEqual([{ role: 'assistant', content: msgs[msgs.length - 1].content }]);
      expect(rows[i].prompt).toEqual(msgs.slice(0, -1));
      expect(rows[i].label).toBe(src[i].label);
    }
  });
});
