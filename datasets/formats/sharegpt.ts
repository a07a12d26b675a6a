/** ShareGPT/LLaMA-Factory pairs: `{conversations, chosen, rejected}` with `{from, value}` messages. */
import { asMessages, need } from '../values.ts';
import { type Adapter, type Row, addOptional } from './adapter.ts';

export const sharegpt: Adapter<'sharegpt'> = {
  name: 'sharegpt',
  kind: 'pairwise',
  shape: '{conversations: [{from, value}...], chosen: {from, value}, rejected: {from, value}}',
  detect: (r) => r.conversations !== undefined && (r.chosen !== undefined || r.rejected !== undefined),
  toRow(rec, ctx) {
    const prompt = asMessages(need(rec, 'conversations', ctx), 'conversations');
    if (typeof rec.system === 'string' && rec.system !== '') prompt.unshift({ role: 'system', content: rec.system });
    const row: Row = {
      prompt,
      chosen: asMessages(need(rec, 'chosen', ctx), 'chosen'),
      rejected: asMessages(need(rec, 'rejected', ctx), 'rejected'),
    };
    addOptional(rec, row, 'pairwise', ctx);
    return row;
  },
};
