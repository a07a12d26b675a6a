/** Scored single responses: `{prompt, response, reward}` → single-trajectory rows. */
import { asNumber, asText, firstKey, need } from '../values.ts';
import { type Adapter, type Row, addOptional } from './adapter.ts';

export const rewards: Adapter<'rewards'> = {
  name: 'rewards',
  kind: 'single',
  shape: '{prompt, response, reward}',
  detect: (r) => r.reward !== undefined,
  toRow(rec, ctx) {
    const rk = firstKey(rec, ['response', 'completion']) ?? 'response';
    const row: Row = {
      prompt: asText(need(rec, 'prompt', ctx), 'prompt', ctx),
      response: asText(need(rec, rk, ctx), rk, ctx),
      reward: asNumber(need(rec, 'reward', ctx), 'reward'),
    };
    addOptional(rec, row, 'single', ctx);
    return row;
  },
};
