/**
 * Token in, token out on a rollout's path (src/online/grpo/agent-continue.ts): when the sampled turn
 * is what the template renders, the continued prompt equals the fresh render of the whole
 * conversation (an independent computation); when it is not, the continued prompt keeps the sampled
 * ids; a changed history, other tools or a turn without its end-of-turn id give null (a fresh render).
 */
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import type { Message, ToolSpec } from '../src/chat.ts';
import { initModelFolder } from '../src/models/init.ts';
import { chatPromptIds, renderChat } from '../src/tokenize/conversation.ts';
import { loadTokenizer, type LoadedTokenizer } from '../src/tokenize/index.ts';
import { continuedPrompt, sameAssistant, type AnsweredCall } from '../src/online/grpo/agent-continue.ts';

const dir = mkdtempSync(join(tmpdir(), 'prefzoo-agent-continue-'));
afterAll(() => rmSync(dir, { recursive: true, force: true }));
let tok: LoadedTokenizer;
const TOOLS: ToolSpec[] = [{ type: 'function', function: { name: 'lookup', description: 'Looks a key up.', parameters: { type: 'object', properties: { key: { type: 'string' } } } } }];
const user: Message = { role: 'user', content: 'What is a?' };
const answer: Message = { role: 'assistant', content: '', tool_calls: [{ type: 'function', function: { name: 'lookup', arguments: { key: 'a' } } }] };
const result: Message = { role: 'tool', content: '7', tool_call_id: 'call_0', name: 'lookup' };

beforeAll(() => {
  initModelFolder(join(dir, 'm'), 'llama', 'tiny', 3);
  tok = loadTokenizer(join(dir, 'm'));
});

/** The answer's ids as the template renders the turn (render with it − render of the prompt), end-of-turn included. */
function renderedTurn(): number[] {
  const before = renderChat(tok, [user], { tools: TOOLS, addGenerationPrompt: true });
  const after = renderChat(tok, [user, answer], { tools: TOOLS });
  expect(after.startsWith(before)).toBe(true);
  const end = '<|im_end|>';
  const turn = after.slice(before.length);
  return tok.encode(turn.slice(0, turn.indexOf(end) + end.length), { addSpecialTokens: false });
}

describe('continued prompts on a rollout path', () => {
  it('a sampled turn as the template renders it: the continued prompt is the fresh render of the whole conversation', () => {
    const promptIds = chatPromptIds(tok, [user], { tools: TOOLS });
    const call: AnsweredCall = { messages: [user], tools: TOOLS, promptIds, completionIds: renderedTurn(), ended: true, answer };
    // The client sends the call back with its own id and the arguments as JSON text, as the SDKs do.
    const sent: Message = { role: 'assistant', content: '', tool_calls: [{ id: 'call_0', type: 'function', function: { name: 'lookup', arguments: '{"key":"a"}' } }] };
    const got = continuedPrompt(tok, [call], [user, sent, result], TOOLS);
    expect(got).toEqual(chatPromptIds(tok, [user, answer, result], { tools: TOOLS }));
    // Rendered afresh, the JSON text the SDK sends back is spaced otherwise: the model would be prompted
    // with a turn it did not write.
    expect(chatPromptIds(tok, [user, sent, result], { tools: TOOLS })).not.toEqual(got);
  });

  it('sampled ids the template would not give back are kept; a changed history, other tools or an unended turn give null', () => {
    const promptIds = chatPromptIds(tok, [user], { tools: TOOLS });
    const odd = [...tok.encode('<tool_call>\n{"name":"lookup","arguments":{"key":"a"}}\n</tool_call>', { addSpecialTokens: false }), tok.tokenToId('<|im_end|>')!];
    const call: AnsweredCall = { messages: [user], tools: TOOLS, promptIds, completionIds: odd, ended: true, answer };
    const got = continuedPrompt(tok, [call], [user, answer, result], TOOLS)!;
    expect(got.slice(0, promptIds.length + odd.length)).toEqual([...promptIds, ...odd]);
    // What follows the sampled turn is the fresh render's text after that turn.
    const full = renderChat(tok, [user, answer, result], { tools: TOOLS, addGenerationPrompt: true });
    expect(full.endsWith(tok.decode(got.slice(promptIds.length + odd.length), { skipSpecialTokens: false }))).toBe(true);
    expect(continuedPrompt(tok, [call], [{ role: 'user', content: 'What is b?' }, answer, result], TOOLS)).toBeNull();
    expect(continuedPrompt(tok, [call], [user, { ...answer, content: 'changed' }, result], TOOLS)).toBeNull();
    expect(continuedPrompt(tok, [call], [user, answer, result], [])).toBeNull();
    expect(continuedPrompt(tok, [{ ...call, ended: false }], [user, answer, result], TOOLS)).toBeNull();
    expect(continuedPrompt(tok, [call], [user, answer], TOOLS)).toBeNull();
  });

  it('an assistant message matches its answer whatever the call ids and the arguments\' spelling', () => {
    expect(sameAssistant({ role: 'assistant', content: null as unknown as string, tool_calls: [{ id: 'x', type: 'function', function: { name: 'lookup', arguments: '{ "key" : "a" }' } }] }, answer)).toBe(true);
    expect(sameAssistant({ role: 'assistant', content: '', tool_calls: [{ function: { name: 'lookup', arguments: { key: 'b' } } }] }, answer)).toBe(false);
    expect(sameAssistant({ role: 'user', content: '' }, { role: 'assistant', content: '' })).toBe(false);
  });
});
