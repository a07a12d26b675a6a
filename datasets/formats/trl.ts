/** TRL's preference records: `{prompt, chosen, rejected}`, plain or conversational; an implicit prompt is the shared start of chosen and rejected. */
import type { Message, Text } from '../names.ts';
import { RecordError, asText, need, sameMessage } from '../values.ts';
import { type Adapter, type Row, addOptional } from './adapter.ts';

/** Leading messages shared by both lists. */
export function commonMessages(a: Message[], b: Message[]): number {
  let n = 0;
  while (n < a.length && n < b.length && sameMessage(a[n], b[n])) n++;
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

export const trl: Adapter<'trl'> = {
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
