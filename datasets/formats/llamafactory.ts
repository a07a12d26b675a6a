/**
 * LLaMA-Factory's newer pair samples: `chosen_messages` and `rejected_messages`, each the whole
 * conversation with content parts `[{type: "text", value}]` (values.ts reads the parts); their
 * shared leading turns are the prompt, the rest the two responses.
 */
import { RecordError, asMessages, need } from '../values.ts';
import { type Adapter, type Row, addOptional } from './adapter.ts';
import { commonMessages } from './trl.ts';

export const llamafactory: Adapter<'llamafactory'> = {
  name: 'llamafactory',
  kind: 'pairwise',
  shape: '{chosen_messages: [{role, content: [{type: "text", value}]}...], rejected_messages: [...]} (shared leading turns are the prompt)',
  detect: (r) => r.chosen_messages !== undefined || r.rejected_messages !== undefined,
  toRow(rec, ctx) {
    const chosen = asMessages(need(rec, 'chosen_messages', ctx), 'chosen_messages');
    const rejected = asMessages(need(rec, 'rejected_messages', ctx), 'rejected_messages');
    const n = commonMessages(chosen, rejected);
    if (n === 0) throw new RecordError('fields "chosen_messages" and "rejected_messages" share no leading turn to take the prompt from', 'chosen_messages');
    const row: Row = { prompt: chosen.slice(0, n), chosen: chosen.slice(n), rejected: rejected.slice(n) };
    addOptional(rec, row, 'pairwise', ctx);
    return row;
  },
};
