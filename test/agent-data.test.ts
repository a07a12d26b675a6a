/**
 * Agent data (docs/data.md, docs/agents.md): tool calls kept by `convert` (LLaMA-Factory's real
 * glaive file, OpenAI messages), bad calls named by file:line, conversations as SFT rows, and
 * training on the assistant's own tokens only (SFT on the glaive file, DPO on trajectories).
 */
import { mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join, resolve } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { convert } from '../datasets/convert.ts';
import { loadData, tokenizeExamples } from '../datasets/examples.ts';
import { readCanonical } from '../datasets/parquet.ts';
import { BadInputError, UserError } from '../src/errors.ts';
import type { Message, ToolCall } from '../src/chat.ts';
import { initModelFolder } from '../src/models/init.ts';
import { collate } from '../src/models/batch.ts';
import { loadTokenizer, type LoadedTokenizer } from '../src/tokenize/index.ts';
import { trainAny } from '../src/train/mpo.ts';
import { evaluateRows } from '../src/eval/evaluate.ts';


const glaive = resolve(__dirname, '../../shared/data/glaive_toolcall_zh_demo.json');
let dir: string;
let model: string;
let tok: LoadedTokenizer;
let glaiveParquet: string;

beforeAll(async () => {
  dir = mkdtempSync(join(tmpdir(), 'pz-agent-data-'));
  model = join(dir, 'model');
  initModelFolder(model, 'llama', 'tiny', 1);
  tok = loadTokenizer(model);
  glaiveParquet = join(dir, 'glaive.parquet');
  await convert([glaive], glaiveParquet);
});
afterAll(() => rmSync(dir, { recursive: true, force: true }));

function jsonl(name: string, rows: unknown[]): string {
  const f = join(dir, name);
  writeFileSync(f, rows.map((r) => (typeof r === 'string' ? r : JSON.stringify(r))).join('\n') + '\n');
  return f;
}

async function badInput(p: Promise<unknown>): Promise<BadInputError> {
  try {
    await p;
  } catch (e) {
    expect(e).toBeInstanceOf(BadInputError);
    expect((e as Error).message).not.toContain('\n');
    return e as BadInputError;
  }
  throw new Error('expected a BadInputError');
}

/** JSON as Python's json.dumps(ensure_ascii=False) writes it, which templates' tojson follows. */
function pyJson(v: unknown): string {
  if (Array.isArray(v)) return `[${v.map(pyJson).join(', ')}]`;
  if (v !== null && typeof v === 'object') return `{${Object.entries(v).map(([k, x]) => `${JSON.stringify(k)}: ${pyJson(x)}`).join(', ')}}`;
  return JSON.stringify(v);
}

/** An assistant turn as the generated template writes it, spelled out here independently of the template. */
function assistantTurn(m: Message): string {
  let s = m.content;
  (m.tool_calls ?? []).forEach((c: ToolCall, i) => {
    if (m.content || i > 0) s += '\n';
    s += `<tool_call>\n{"name": "${c.function.name}", "arguments": ${pyJson(c.function.arguments)}}\n</tool_call>`;
  });
  return `${s}<|im_end|>`;
}

describe('convert keeps tool calls', () => {
  it('reads LLaMA-Factory\'s glaive file: function_call turns become tool_calls, observations tool messages, the tools column kept', async () => {
    const raw = JSON.parse(readFileSync(glaive, 'utf8')) as { conversations: { from: string; value: string }[]; tools: string }[];
    const calls = raw.flatMap((r) => r.conversations.filter((m) => m.from === 'function_call').map((m) => JSON.parse(m.value) as { name: string; arguments: unknown }));
    const observations = raw.flatMap((r) => r.conversations.filter((m) => m.from === 'observation').map((m) => m.value));
    const { table, meta } = await readCanonical(glaiveParquet);
    expect(meta).toMatchObject({ kind: 'single', text: 'messages', source_format: 'chat' });
    expect(table.numRows).toBe(raw.length);
    const data = await loadData(glaiveParquet, dir);
    const all = data.examples.map((e) => [...(e.prompt as Message[]), ...(e.responses[0] as Message[])]);
    const got = all.flat().filter((m) => m.tool_calls).flatMap((m) => m.tool_calls!.map((c) => ({ name: c.function.name, arguments: c.function.arguments })));
    expect(got).toEqual(calls);
    expect(all.flat().filter((m) => m.role === 'tool').map((m) => m.content)).toEqual(observations);
    // The 100 rows with an empty tools list have none; the others their list, in the templates' shape.
    expect(data.examples.filter((e) => e.tools).length).toBe(raw.filter((r) => JSON.parse(r.tools || '[]').length > 0).length);
    const firstTools = JSON.parse(raw[0].tools) as { name: string; description: string; parameters: unknown }[];
    expect(data.examples[0].tools).toEqual(firstTools.map((t) => ({ type: 'function', function: t })));
    // Rows and turns in order: the prompt is everything before the first assistant turn.
    raw.forEach((r, i) => {
      const ex = data.examples[i];
      expect((ex.prompt as Message[]).length + (ex.responses[0] as Message[]).length).toBe(r.conversations.length);
      expect((ex.responses[0] as Message[])[0].role).toBe('assistant');
    });
  });

  it('keeps OpenAI tool_calls, tool_call_id and name; arguments given as JSON text become objects', async () => {
    const f = jsonl('openai-tools.jsonl', [
      {
        messages: [
          { role: 'user', content: 'What is 2 + 3?' },
          { role: 'assistant', content: null, tool_calls: [{ id: 'c1', type: 'function', function: { name: 'add', arguments: '{"a": 2, "b": 3}' } }] },
          { role: 'tool', tool_call_id: 'c1', name: 'add', content: '5' },
          { role: 'assistant', content: '5.' },
        ],
      },
    ]);
    const out = join(dir, 'openai-tools.parquet');
    await convert([f], out);
    const ex = (await loadData(out, dir)).examples[0];
    expect(ex.prompt).toEqual([{ role: 'user', content: 'What is 2 + 3?' }]);
    expect(ex.responses[0]).toEqual([
      { role: 'assistant', content: '', tool_calls: [{ id: 'c1', type: 'function', function: { name: 'add', arguments: { a: 2, b: 3 } } }] },
      { role: 'tool', content: '5', tool_call_id: 'c1', name: 'add' },
      { role: 'assistant', content: '5.' },
    ]);
  });

  it('stops at a bad tool call or an unknown role with file:line; --on-invalid skip counts it', async () => {
    const ok = { conversations: [{ from: 'human', value: 'hi' }, { from: 'gpt', value: 'hello' }] };
    const cases: [unknown, RegExp][] = [
      [{ conversations: [{ from: 'human', value: 'hi' }, { from: 'function_call', value: '{"name": "f", "arguments": ' }] }, /:2: field "conversations\[1\]\.value": a function_call turn must hold a JSON tool call/],
      [{ messages: [{ role: 'user', content: 'hi' }, { role: 'assistant', content: null, tool_calls: [{ type: 'function', function: { name: 'f', arguments: '{oops' } }] }] }, /:2: field "messages\[1\]\.tool_calls\[0\]\.arguments": tool-call arguments are not JSON/],
      [{ messages: [{ role: 'user', content: 'hi' }, { role: 'assistant', content: null, tool_calls: [{ type: 'function', function: { arguments: '{}' } }] }] }, /:2: field "messages\[1\]\.tool_calls\[0\]": a tool call needs a "name"/],
      [{ conversations: [{ from: 'human', value: 'hi' }, { from: 'wizard', value: 'hello' }] }, /:2: field "conversations\[1\]\.role": unknown role "wizard"/],
      [{ conversations: [{ from: 'human', value: 'hi' }, { from: 'gpt', value: 'hello' }], tools: '[{"name": ' }, /:2: field "tools": expected a JSON list of tools/],
    ];
    for (const [i, [bad, re]] of cases.entries()) {
      const f = jsonl(`bad-${i}.jsonl`, [ok, bad, ok]);
      const e = await badInput(convert([f], join(dir, `bad-${i}.parquet`)));
      expect(e.message).toMatch(re);
      expect(e.line).toBe(2);
      const s = await convert([f], join(dir, `bad-${i}-skip.parquet`), { onInvalid: 'skip' });
      expect(s).toMatchObject({ read: 3, written: 2, skipped: 1 });
    }
  });

  it('refuses tool calls that first appear after rows were written without the tool fields', async () => {
    const plain = { messages: [{ role: 'user', content: 'hi' }, { role: 'assistant', content: 'hello' }] };
    const withCall = { messages: [{ role: 'user', content: 'hi' }, { role: 'assistant', content: '', tool_calls: [{ function: { name: 'f', arguments: {} } }] }] };
    const f = jsonl('late-calls.jsonl', [plain, plain, withCall]);
    const e = await badInput(convert([f], join(dir, 'late.parquet'), { batchRows: 1 }));
    expect(e.message).toMatch(/:3: tool calls .* first appear after 2 rows/);
    // In the first batch they widen the message struct for every row.
    const s = await convert([f], join(dir, 'late-ok.parquet'));
    expect(s.written).toBe(3);
  });
});

describe('masks: only the assistant\'s own tokens are trained', () => {
  it('on the glaive file, the mask is 1 exactly on each assistant message\'s own tokens (tokenized independently)', async () => {
    // The first 120 rows hold every shape of the file (tool turns, several user turns, plain answers).
    const data = await loadData(glaiveParquet, dir, { maxRows: 120 });
    const { rows, truncated } = tokenizeExamples(data.examples, tok, { max_length: 1 << 20, max_prompt_length: 1 << 20, truncation: 'keep_end' });
    expect(truncated).toBe(0);
    let assistantTurns = 0;
    let plain = 0;
    rows.forEach((r, i) => {
      const ids = r.responseIds[0];
      if (!r.responseMasks) {
        // A single plain answer keeps the prompt/response split: its whole turn (and the newline after) counts.
        plain++;
        const turn = data.examples[i].responses[0] as Message[];
        expect(turn.length === 1 && !turn[0].tool_calls && !data.examples[i].tools).toBe(true);
        expect(tok.decode(ids)).toBe(`${assistantTurn(turn[0])}\n`);
        return;
      }
      const mask = r.responseMasks[0];
      expect(mask.length).toBe(ids.length);
      // The runs of 1s, in order, are the assistant messages' turns, each ending with <|im_end|>.
      const runs: number[][] = [];
      ids.forEach((id, t) => {
        if (mask[t] === 1 && (t === 0 || mask[t - 1] === 0)) runs.push([]);
        if (mask[t] === 1) runs.at(-1)!.push(id);
      });
      const turns = (data.examples[i].responses[0] as Message[]).filter((m) => m.role === 'assistant');
      expect(runs.map((x) => tok.decode(x))).toEqual(turns.map(assistantTurn));
      expect(runs).toEqual(turns.map((m) => tok.encode(assistantTurn(m), { addSpecialTokens: false })));
      assistantTurns += turns.length;
      // Everything else (tool results, later user turns, the template's markup) is masked.
      const masked = tok.decode(ids.filter((_, t) => mask[t] === 0));
      for (const m of data.examples[i].responses[0] as Message[]) if (m.role !== 'assistant') expect(masked).toContain(m.content);
      // The prompt is the template's prompt with its generation prompt.
      expect(tok.decode(r.promptIds).endsWith('<|im_start|>assistant\n')).toBe(true);
    });
    expect(assistantTurns).toBeGreaterThan(250);
    expect(plain).toBeLessThan(rows.length / 5);
  });

  it('collation scores the masked tokens only, in both layouts', () => {
    const ex = {
      prompt: [{ role: 'user', content: 'add 2 3' }] as Message[],
      responses: [
        [{ role: 'assistant', content: '', tool_calls: [{ type: 'function', function: { name: 'add', arguments: { a: 2, b: 3 } } }] }, { role: 'tool', content: '5' }, { role: 'assistant', content: '5' }] as Message[],
        [{ role: 'assistant', content: 'no idea' }] as Message[],
      ],
    };
    const [row] = tokenizeExamples([ex], tok, { max_length: 4096, max_prompt_length: 4096, truncation: 'keep_end' }).rows;
    const m = row.responseMasks!;
    // The trajectory's tool result is masked inside it; the plain answer counts up to its end-of-turn.
    expect(m[0][0]).toBe(1);
    expect(m[0].slice(0, -1).includes(0)).toBe(true);
    expect(m[1].slice(0, -1).every((x) => x === 1)).toBe(true);
    expect(m[1].at(-1)).toBe(0);
    const P = row.promptIds.length;
    const unpacked = collate([row], { kind: 'pairwise', padTo: 8, padId: 0, dtype: 'float64' });
    const T = unpacked.length;
    const lossMask = unpacked.feeds.loss_mask.data as Float64Array;
    for (let k = 0; k < 2; k++) {
      const want = Array.from({ length: T }, (_, t) => (t >= P && t < P + m[k].length ? m[k][t - P] : 0));
      expect(Array.from(lossMask.subarray(k * T, (k + 1) * T))).toEqual(want);
    }
    const packed = collate([row], { kind: 'pairwise', padTo: 8, padId: 0, dtype: 'float64', packed: true });
    const select = packed.feeds.score_select.data as Float64Array;
    const M = select.length / 2;
    const perSeq = [0, 1].map((s) => select.subarray(s * M, (s + 1) * M).reduce((a, b) => a + b, 0));
    expect(perSeq).toEqual(m.map((x) => x.reduce((a, b) => a + b, 0)));
  });
});

describe('training on agent data', () => {
  it('prefzoo train --loss sft runs on the converted glaive conversations and its loss drops', async () => {
    const r = await trainAny({ model, data: glaiveParquet, loss: 'sft', out: join(dir, 'run-sft'), params: ['max_steps=2', 'batch_size=2', 'max_samples=2', 'learning_rate=1e-2', 'max_length=256', 'max_prompt_length=128', 'logging_steps=1'] });
    expect(r.steps).toBe(2);
    const m = readFileSync(join(dir, 'run-sft', 'metrics.jsonl'), 'utf8').trim().split('\n').map((l) => JSON.parse(l) as { loss?: number });
    const losses = m.filter((x) => typeof x.loss === 'number').map((x) => x.loss!);
    expect(losses.length).toBe(2);
    expect(losses[1]).toBeLessThan(losses[0]);
    // eval's metrics rank rows by reward; SFT conversations have none, which is said in one line.
    const refused = await evaluateRows({ policy: r.finalDir, ref: model, data: glaiveParquet, workDir: dir }).catch((e: unknown) => e);
    expect(refused).toBeInstanceOf(UserError);
    expect((refused as Error).message).toMatch(/without reward or label \(SFT data\)/);
  });

  it('DPO on chosen/rejected trajectories with tool calls trains and its loss drops', async () => {
    const call = (a: number, b: number) => ({ type: 'function', function: { name: 'add', arguments: { a, b } } });
    const tools = [{ type: 'function', function: { name: 'add', description: 'Adds.', parameters: { type: 'object', properties: { a: { type: 'number' }, b: { type: 'number' } } } } }];
    const rows = [1, 2, 3, 4].map((a) => ({
      prompt: [{ role: 'user', content: `What is ${a} + 3?` }],
      chosen: [{ role: 'assistant', content: '', tool_calls: [call(a, 3)] }, { role: 'tool', content: String(a + 3) }, { role: 'assistant', content: `It is ${a + 3}.` }],
      rejected: [{ role: 'assistant', content: `It is ${a + 4}.` }],
      tools,
    }));
    const f = jsonl('trajectories.jsonl', rows);
    const r = await trainAny({ model, data: f, loss: 'dpo', out: join(dir, 'run-dpo'), params: ['max_steps=2', 'batch_size=4', 'learning_rate=1e-2', 'logging_steps=1'] });
    expect(r.steps).toBe(2);
    const m = readFileSync(join(dir, 'run-dpo', 'metrics.jsonl'), 'utf8').trim().split('\n').map((l) => JSON.parse(l) as { loss?: number });
    const losses = m.filter((x) => typeof x.loss === 'number').map((x) => x.loss!);
    expect(losses[0]).toBeCloseTo(Math.log(2), 6);
    expect(losses[1]).toBeLessThan(losses[0]);
  });
});
