/** OpenAI preference fine-tuning records: `{input: {messages}, preferred_output, non_preferred_output}`. */
import { RecordError, asMessages, describe, isObject, need } from '../values.ts';
import { type Adapter, type Row, addOptional } from './adapter.ts';

export const openai: Adapter<'openai'> = {
  name: 'openai',
  kind: 'pairwise',
  shape: '{input: {messages}, preferred_output: [message], non_preferred_output: [message]}',
  detect: (r) => r.preferred_output !== undefined || r.non_preferred_output !== undefined,
  toRow(rec, ctx) {
    const input = need(rec, 'input', ctx);
    if (!isObject(input)) throw new RecordError(`field "input": expected {messages: [...]}, found ${describe(input)}`, 'input');
    if (input.messages === undefined) throw new RecordError('missing field "input.messages"', 'input.messages');
    const row: Row = {
      prompt: asMessages(input.messages, 'input.messages'),
      chosen: asMessages(need(rec, 'preferred_output', ctx), 'preferred_output'),
      rejected: asMessages(need(rec, 'non_preferred_output', ctx), 'non_preferred_output'),
    };
    addOptional(rec, row, 'pairwise', ctx);
    return row;
  },
};
