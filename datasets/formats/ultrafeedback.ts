/** UltraFeedback: an instruction with scored completions → a ranked list (or a pair with --binarize). */
import type { Text } from '../names.ts';
import { type Rec, RecordError, asNumber, asText, describe, firstKey, isObject, need } from '../values.ts';
import { type Adapter, type Row, addOptional, binarize } from './adapter.ts';

/** A completion's score: overall_score, score, the mean of `ratings`, or of UltraFeedback's per-aspect annotations. */
function completionScore(c: Rec, field: string): number {
  for (const k of ['overall_score', 'score']) if (c[k] !== undefined) return asNumber(c[k], `${field}.${k}`);
  const mean = (xs: number[], what: string) => {
    if (xs.length === 0) throw new RecordError(`field "${field}.${what}": no ratings`, field);
    return xs.reduce((a, b) => a + b, 0) / xs.length;
  };
  if (Array.isArray(c.ratings)) return mean(c.ratings.map((x, i) => asNumber(x, `${field}.ratings[${i}]`)), 'ratings');
  if (isObject(c.ratings)) return mean(Object.entries(c.ratings).map(([k, x]) => asNumber(x, `${field}.ratings.${k}`)), 'ratings');
  if (isObject(c.annotations)) {
    const xs = Object.entries(c.annotations).map(([k, a]) => asNumber(isObject(a) ? a.Rating : a, `${field}.annotations.${k}.Rating`));
    return mean(xs, 'annotations');
  }
  throw new RecordError(`field "${field}": no "overall_score", "score" or "ratings"`, field);
}

export const ultrafeedback: Adapter<'ultrafeedback'> = {
  name: 'ultrafeedback',
  kind: 'listwise',
  shape: '{instruction or prompt, completions: [{response, overall_score or ratings}...]}',
  detect: (r) => r.completions !== undefined,
  toRow(rec, ctx) {
    const pk = firstKey(rec, ['instruction', 'prompt']);
    if (!pk) throw new RecordError('missing field "instruction" (or "prompt")', 'instruction');
    const prompt = asText(rec[pk], pk, ctx);
    const completions = need(rec, 'completions', ctx);
    if (!Array.isArray(completions)) throw new RecordError(`field "completions": expected a list, found ${describe(completions)}`, 'completions');
    const responses: Text[] = [];
    const scores: number[] = [];
    completions.forEach((c, i) => {
      const f = `completions[${i}]`;
      if (!isObject(c)) throw new RecordError(`field "${f}": expected {response, overall_score}, found ${describe(c)}`, 'completions');
      const rk = firstKey(c, ['response', 'completion', 'text']);
      if (!rk) throw new RecordError(`field "${f}": missing "response"`, 'completions');
      responses.push(asText(c[rk], `${f}.${rk}`, ctx));
      scores.push(completionScore(c, f));
    });
    const row: Row = ctx.binarize ? binarize(prompt, responses, scores, ctx) : { prompt, responses, scores };
    addOptional(rec, row, ctx.binarize ? 'pairwise' : 'listwise', ctx);
    return row;
  },
};
