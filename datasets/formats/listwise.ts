/** Generic ranked lists: `{prompt, responses, scores}` (or a pair with --binarize). */
import { asNumbers, asText, asTexts, need } from '../values.ts';
import { type Adapter, type Row, addOptional, binarize } from './adapter.ts';

export const listwise: Adapter<'listwise'> = {
  name: 'listwise',
  kind: 'listwise',
  shape: '{prompt, responses: [...], scores: [...]}',
  detect: (r) => r.responses !== undefined || (r.scores !== undefined && r.prompt !== undefined),
  toRow(rec, ctx) {
    const prompt = asText(need(rec, 'prompt', ctx), 'prompt', ctx);
    const responses = asTexts(need(rec, 'responses', ctx), 'responses', ctx);
    const scores = asNumbers(need(rec, 'scores', ctx), 'scores', ctx);
    const row: Row = ctx.binarize ? binarize(prompt, responses, scores, ctx) : { prompt, responses, scores };
    addOptional(rec, row, ctx.binarize ? 'pairwise' : 'listwise', ctx);
    return row;
  },
};
