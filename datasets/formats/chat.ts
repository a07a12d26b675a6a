/**
 * Conversations to fine-tune on (SFT), no preference: `{messages: [...]}` (OpenAI / Hugging Face
 * chat format, with `tool_calls` and `tool` messages) or `{conversations: [{from, value}...]}`
 * (ShareGPT / LLaMA-Factory, with `function_call` and `observation` turns), each with an optional
 * `tools` list (or JSON text of one) and `system` text. A row's prompt is the turns before the first
 * assistant turn, its response everything from there on (later user and tool turns included: the
 * trainer masks every token that is not the assistant's own).
 */
import { RecordError, asMessages, firstKey } from '../values.ts';
import { type Adapter, type Row, addOptional } from './adapter.ts';

export const chat: Adapter<'chat'> = {
  name: 'chat',
  kind: 'single',
  shape: '{messages: [{role, content, tool_calls?}...], tools?} or {conversations: [{from, value}...], tools?, system?} (conversations to fine-tune on)',
  detect: (r) =>
    (r.messages !== undefined || r.conversations !== undefined) &&
    r.chosen === undefined && r.rejected === undefined && r.label === undefined && r.reward === undefined && r.completion === undefined,
  toRow(rec, ctx) {
    const key = firstKey(rec, ['messages', 'conversations']) ?? 'messages';
    const msgs = asMessages(rec[key], key);
    if (typeof rec.system === 'string' && rec.system !== '' && msgs[0]?.role !== 'system') msgs.unshift({ role: 'system', content: rec.system });
    const first = msgs.findIndex((m) => m.role === 'assistant');
    if (first < 0) throw new RecordError(`field "${key}": no assistant turn to train on`, key);
    const row: Row = { prompt: msgs.slice(0, first), response: msgs.slice(first) };
    addOptional(rec, row, 'single', ctx);
    return row;
  },
};
