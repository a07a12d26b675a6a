/**
 * Format adapters: one input record → one canonical row. Each adapter knows the shape it reads, how
 * to recognise it from a record's fields, and which kind it produces (shared/DATA.md).
 */
import { type FormatName, FORMAT_NAMES } from './names.ts';
import type { Kind, Message, Text } from './schema.ts';
import {
  type FieldContext,
  type Rec,
  RecordError,
  asBool,
  asId,
  asMessages,
  asNumber,
  asNumbers,
  asText,
  asTexts,
  describe,
  firstKey,
  isObject,
  need,
} from './values.ts';

export type Row = Record<string, unknown>;

export interface AdapterContext extends FieldContext {
  /** Turn listwise records into pairs: the best response against a seeded random other. */
  binarize: boolean;
  /** Uniform in [0, 1); seeded, so binarized output is reproducible. */
  random: () => number;
  /** Binarizing may pick a rejected response that scores as high as the best. */
  allowTies: boolean;
}

export interface Adapter {
  name: FormatName;
  /** The kind this format's records naturally become. */
  kind: Kind;
  /** What a record looks like, for messages that say what was expected. */
  shape: string;
  detect(rec: Rec): boolean;
  toRow(rec: Rec, ctx: AdapterContext): Row;
}

export { type FormatName, FORMAT_NAMES };

const ID_KEYS = ['id', 'prompt_id'];
/** Names rationale columns go by in published rationale-enriched preference sets; --map covers others. */
const RATIONALE_KEYS = ['rationale', 'rationales', 'explanation', 'preference_rationale'];

/** Optional canonical columns any record may carry, under their canonical names or common aliases. */
function addOptional(rec: Rec, row: Row, kind: Kind, ctx: FieldContext): void {
  const idKey = firstKey(rec, ID_KEYS);
  if (idKey && rec[idKey] !== null) row.id = asId(rec[idKey], idKey);
  if (typeof rec.source === 'string') row.source = rec.source;
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

/** Leading messages shared by both lists. */
function commonMessages(a: Message[], b: Message[]): number {
  let n = 0;
  while (n < a.length && n < b.length && a[n].role === b[n].role && a[n].content === b[n].content) n++;
  return n;
}

function isSpace(c: number): boolean {
  return c === 0x20 || c === 0x0a || c === 0x09 || c === 0x0d;
}

/**
 * Implicit prompt of plain texts: their longest common prefix, cut back to a whitespace boundary so
 * that a word both texts merely begin alike ("yes"/"yeah") stays whole in the responses, which then
 * start with the whitespace, as tokenizers expect.
 */
export function splitCommonPrefix(a: string, b: string): [string, string, string] {
  let n = 0;
  const max = Math.min(a.length, b.length);
  while (n < max && a.charCodeAt(n) === b.charCodeAt(n)) n++;
  if (n < a.length || n < b.length) {
    while (n > 0 && !isSpace(a.charCodeAt(n - 1))) n--;
    while (n > 0 && isSpace(a.charCodeAt(n - 1))) n--;
  }
  return [a.slice(0, n), a.slice(n), b.slice(n)];
}

/**
 * Mixed forms within one record (a plain prompt with conversational responses, as in UltraFeedback
 * binarized, or the reverse) are lifted to messages: a lossless change. Returns the lifted texts.
 */
function liftMixed(prompt: Text | undefined, chosen: Text, rejected: Text): [Text | undefined, Text, Text] {
  const anyMessages = Array.isArray(prompt) || Array.isArray(chosen) || Array.isArray(rejected);
  const anyPlain = typeof prompt === 'string' || typeof chosen === 'string' || typeof rejected === 'string';
  if (!anyMessages || !anyPlain) return [prompt, chosen, rejected];
  const asAssistant = (t: Text): Message[] => (typeof t === 'string' ? [{ role: 'assistant', content: t }] : t);
  if (typeof prompt === 'string' && Array.isArray(chosen) && Array.isArray(rejected)) {
    // Responses that repeat the conversation: their shared start is the prompt, in message form.
    const n = commonMessages(chosen, rejected);
    if (n > 0) return [chosen.slice(0, n), chosen.slice(n), rejected.slice(n)];
  }
  const p = typeof prompt === 'string' ? [{ role: 'user' as const, content: prompt }] : prompt;
  return [p, asAssistant(chosen), asAssistant(rejected)];
}

function pairwiseTexts(rawPrompt: Text | undefined, rawChosen: Text, rawRejected: Text): Row {
  const [prompt, chosen, rejected] = liftMixed(rawPrompt, rawChosen, rawRejected);
  if (prompt !== undefined) return { prompt, chosen, rejected };
  const none = () => new RecordError('missing field "prompt" ("chosen" and "rejected" share no start to take it from)', 'prompt');
  if (typeof chosen === 'string' && typeof rejected === 'string') {
    const [p, c, r] = splitCommonPrefix(chosen, rejected);
    if (p === '' && chosen !== rejected) throw none();
    return { prompt: p, chosen: c, rejected: r };
  }
  // liftMixed left both as message lists.
  const [c, r] = [chosen as Message[], rejected as Message[]];
  const n = commonMessages(c, r);
  if (n === 0) throw none();
  return { prompt: c.slice(0, n), chosen: c.slice(n), rejected: r.slice(n) };
}

const trl: Adapter = {
  name: 'trl',
  kind: 'pairwise',
  shape: '{prompt, chosen, rejected} (or {chosen, rejected} with the prompt as their shared start)',
  detect: (r) => r.chosen !== undefined || r.rejected !== undefined,
  toRow(rec, ctx) {
    // A prompt named by --map is required, not inferred.
    const explicit = rec.prompt !== undefined || ctx.map.prompt !== undefined;
    const prompt = explicit ? asText(need(rec, 'prompt', ctx), 'prompt', ctx) : undefined;
    const chosen = asText(need(rec, 'chosen', ctx), 'chosen', ctx);
    const rejected = asText(need(rec, 'rejected', ctx), 'rejected', ctx);
    const row = pairwiseTexts(prompt, chosen, rejected);
    addOptional(rec, row, 'pairwise', ctx);
    return row;
  },
};

const HH_ASSISTANT = '\n\nAssistant:';

const hh: Adapter = {
  name: 'hh',
  kind: 'pairwise',
  shape: '{chosen, rejected} transcripts "\\n\\nHuman: ...\\n\\nAssistant: ..."',
  detect: (r) =>
    r.prompt === undefined && typeof r.chosen === 'string' && (r.chosen.includes(HH_ASSISTANT) || r.chosen.startsWith('Human:')),
  toRow(rec, ctx) {
    const chosen = need(rec, 'chosen', ctx);
    const rejected = need(rec, 'rejected', ctx);
    if (typeof chosen !== 'string') throw new RecordError(`field "chosen": expected a transcript, found ${describe(chosen)}`, 'chosen');
    if (typeof rejected !== 'string') throw new RecordError(`field "rejected": expected a transcript, found ${describe(rejected)}`, 'rejected');
    const cut = chosen.lastIndexOf(HH_ASSISTANT);
    if (cut < 0) throw new RecordError('field "chosen": no "\\n\\nAssistant:" turn in the transcript', 'chosen');
    const prompt = chosen.slice(0, cut + HH_ASSISTANT.length);
    if (!rejected.startsWith(prompt)) {
      throw new RecordError('field "rejected": its transcript does not start with the same conversation as "chosen"', 'rejected');
    }
    const row: Row = { prompt, chosen: chosen.slice(prompt.length), rejected: rejected.slice(prompt.length) };
    addOptional(rec, row, 'pairwise', ctx);
    return row;
  },
};

const sharegpt: Adapter = {
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

/**
 * LLaMA-Factory's newer pair samples: `chosen_messages` and `rejected_messages`, each the whole
 * conversation with content parts `[{type: "text", value}]`; their shared leading turns are the prompt.
 */
const llamafactory: Adapter = {
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

const openai: Adapter = {
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

/**
 * The best response (first on ties) against one drawn uniformly from those scoring strictly lower
 * (any other with allowTies), so a pair always carries a preference.
 */
function binarize(prompt: Text, responses: Text[], scores: number[], ctx: AdapterContext): Row {
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

const ultrafeedback: Adapter = {
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

const listwise: Adapter = {
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

const kto: Adapter = {
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

const rewards: Adapter = {
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

/** Detection order: the most specific signatures first, trl (any chosen/rejected) last. */
const DETECT_ORDER: readonly Adapter[] = [openai, sharegpt, llamafactory, ultrafeedback, listwise, kto, rewards, hh, trl];

/** CSV: columns named as any of the other formats (after --map); the kind follows from the columns. */
const csv: Adapter = {
  name: 'csv',
  kind: 'pairwise',
  shape: 'a header row naming the columns of one of the formats above',
  detect: () => false,
  toRow(rec, ctx) {
    const inner = detectFormat(rec);
    if (!inner) throw new RecordError(`columns ${Object.keys(rec).join(', ')} match no format`);
    return inner.toRow(rec, ctx);
  },
};

export const ADAPTERS: Readonly<Record<FormatName, Adapter>> = { trl, sharegpt, llamafactory, hh, ultrafeedback, openai, kto, rewards, listwise, csv };

/** The adapter whose signature the record has, or null when it looks like no preference format. */
export function detectFormat(rec: Rec): Adapter | null {
  for (const a of DETECT_ORDER) if (a.detect(rec)) return a;
  return null;
}

/** What "preference data" means, listed for the refusal message. */
export function expectedShapes(): string {
  return DETECT_ORDER.map((a) => `${a.name} ${a.shape}`).join('; ');
}
