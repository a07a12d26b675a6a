/** KTO's unpaired records: `{prompt, completion, label}` or `{messages, label}` → single-trajectory rows. */
import { RecordError, asBool, asMessages, asText, firstKey, need } from '../values.ts';
import { type Adapter, type Row, addOptional } from './adapter.ts';

export const kto: Adapter<'kto'> = {
  name: 'kto',
  kind: 'single',
  shape: '{prompt, completion, label} or {messages, label}',
  detect: (r) => r.label !== undefined,
  toRow(rec, ctx) {
    let row: Row;
    if (rec.messages !== undefined && rec.completion === undefined) {
      const msgs = asMessages(rec.messages, 'messages');
      const last = msgs[msgs.length - 1];
      if (!last || last.role !== 'assistant') {
        throw new RecordError(`field "messages": the last message must be the assistant's response, found ${last ? `"${last.role}"` : 'no messages'}`, 'messages');
      }
      row = { prompt: msgs.slice(0, -1), response: [last] };
    } else {
      const rk = firstKey(rec, ['completion', 'response']) ?? 'completion';
      row = { prompt: asText(need(rec, 'prompt', ctx), 'prompt', ctx), response: asText(need(rec, rk, ctx), rk, ctx) };
    }
    row.label = asBool(need(rec, 'label', ctx), 'label');
    addOptional(rec, row, 'single', ctx);
    return row;
  },
};
