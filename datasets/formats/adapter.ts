/**
 * What every format adapter is (one input record → one canonical row; docs/data.md) and the pieces
 * several share: optional columns under their aliases, and binarizing a scored list into a pair.
 */
import type { Kind, Text } from '../names.ts';
import { type FieldContext, type Rec, RecordError, asBool, asId, asNumber, asNumbers, asTools, describe, firstKey } from '../values.ts';

export type Row = Record<string, unknown>;

export interface AdapterContext extends FieldContext {
  /** Turn listwise records into pairs: the best response against a seeded random other. */
  binarize: boolean;
  /** Uniform in [0, 1); seeded, so binarized output is reproducible. */
  random: () => number;
  /** Binarizing may pick a rejected response that scores as high as the best. */
  allowTies: boolean;
}

export interface Adapter<N extends string = string> {
  name: N;
  /** The kind this format's records naturally become. */
  kind: Kind;
  /** What a record looks like, for messages that say what was expected. */
  shape: string;
  detect(rec: Rec): boolean;
  toRow(rec: Rec, ctx: AdapterContext): Row;
}

const ID_KEYS = ['id', 'prompt_id'];
/** Names rationale columns go by in published rationale-enriched preference sets; --map covers others. */
const RATIONALE_KEYS = ['rationale', 'rationales', 'explanation', 'preference_rationale'];

/** Optional canonical columns any record may carry, under their canonical names or common aliases. */
export function addOptional(rec: Rec, row: Row, kind: Kind, ctx: FieldContext): void {
  const idKey = firstKey(rec, ID_KEYS);
  if (idKey && rec[idKey] !== null) row.id = asId(rec[idKey], idKey);
  if (typeof rec.source === 'string') row.source = rec.source;
  if (rec.tools !== undefined) {
    // Null where a row offers none, so the column exists from the first row of a file that has one.
    const tools = rec.tools === null ? [] : asTools(rec.tools, 'tools');
    row.tools = tools.length > 0 ? JSON.stringify(tools) : null;
  }
  const num = (col: string, keys: string[]) => {
    const k = firstKey(rec, keys);
    if (k) row[col] = rec[k] === null ? null : asNumber(rec[k], k);
  };
  if (kind === 'pairwise') {
    num('chosen_score', ['chosen_score', 'score_chosen', 'chosen_rating', 'chosen-rating']);
    num('rejected_score', ['rejected_score', 'score_rejected', 'rejected_rating', 'rejected-rating']);
    num('chosen_prob', ['chosen_prob']);
    num('rejected_prob', ['rejected_prob']);
    num('weight', ['weight']);
    const rk = firstKey(rec, RATIONALE_KEYS);
    if (rk && rec[rk] !== null && rec[rk] !== undefined) {
      if (typeof rec[rk] !== 'string') throw new RecordError(`field "${rk}" must be text (a rationale), found ${describe(rec[rk])}`, rk);
      // An empty rationale is no rationale: the row adds nothing to the rationale term.
      if ((rec[rk] as string).trim() !== '') row.rationale = rec[rk];
    }
  } else if (kind === 'listwise') {
    if (rec.win_probs !== undefined) row.win_probs = asNumbers(rec.win_probs, 'win_probs', ctx);
  } else {
    if (row.reward === undefined) num('reward', ['reward', 'score']);
    if (row.label === undefined && rec.label !== undefined) row.label = asBool(rec.label, 'label');
  }
}

/**
 * The best response (first on ties) against one drawn uniformly from those scoring strictly lower
 * (any other with allowTies), so a pair always carries a preference.
 */
export function binarize(prompt: Text, responses: Text[], scores: number[], ctx: AdapterContext): Row {
  if (responses.length < 2) throw new RecordError(`field "responses": binarizing needs at least 2 responses, found ${responses.length}`, 'responses');
  if (scores.length !== responses.length) {
    throw new RecordError(`field "scores": ${scores.length} scores for ${responses.length} responses`, 'scores');
  }
  for (let i = 0; i < scores.length; i++) {
    if (!Number.isFinite(scores[i])) throw new RecordError(`field "scores[${i}]" is ${scores[i]}`, 'scores');
  }
  let best = 0;
  for (let i = 1; i < scores.length; i++) if (scores[i] > scores[best]) best = i;
  const others: number[] = [];
  for (let i = 0; i < scores.length; i++) if (i !== best && (ctx.allowTies || scores[i] < scores[best])) others.push(i);
  if (others.length === 0) throw new RecordError(`field "scores": every response scores ${scores[best]}, so no pair has a preference`, 'scores');
  const other = others[Math.floor(ctx.random() * others.length)];
  return { prompt, chosen: responses[best], rejected: responses[other], chosen_score: scores[best], rejected_score: scores[other] };
}
