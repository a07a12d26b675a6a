/**
 * Rules a canonical row must pass (docs/data.md, "Bad input"): records that parse but would train
 * on nothing or on noise — empty responses, identical pairs, NaN scores, lists that disagree — are
 * invalid unless a flag relaxes that rule.
 */
import type { Row } from './formats/index.ts';
import type { Kind, Message, Text, TextMode } from './schema.ts';
import { RecordError, sameMessage } from './values.ts';

export interface ValidateOptions {
  /** Accept empty prompts and responses. */
  allowEmpty?: boolean;
  /** Accept chosen identical to rejected (and repeated listwise responses). */
  allowIdentical?: boolean;
  /** Accept pairs whose chosen and rejected scores are equal (no preference). */
  allowTies?: boolean;
}

export function textMode(t: Text): TextMode {
  return typeof t === 'string' ? 'plain' : 'messages';
}

function blank(s: string): boolean {
  for (let i = 0; i < s.length; i++) {
    const c = s.charCodeAt(i);
    if (c !== 0x20 && c !== 0x0a && c !== 0x09 && c !== 0x0d) return false;
  }
  return true;
}

function isEmpty(t: Text): boolean {
  if (typeof t === 'string') return blank(t);
  // A turn that only calls tools says something.
  return t.every((m) => blank(m.content) && !(m.tool_calls && m.tool_calls.length > 0));
}

function sameText(a: Text, b: Text): boolean {
  if (typeof a === 'string' || typeof b === 'string') return a === b;
  return a.length === b.length && a.every((m, i) => sameMessage(m, b[i]));
}

function checkText(t: Text, field: string, mode: TextMode, response: boolean, opts: ValidateOptions): void {
  if (textMode(t) !== mode) {
    throw new RecordError(`field "${field}" is ${mode === 'plain' ? 'a message list' : 'plain text'}, but "prompt" is ${mode === 'plain' ? 'plain text' : 'a message list'}`, field);
  }
  if (!opts.allowEmpty && isEmpty(t)) throw new RecordError(`field "${field}" is empty`, field);
  if (response && Array.isArray(t) && t.length > 0 && (t[0] as Message).role !== 'assistant') {
    throw new RecordError(`field "${field}": a response must start with an assistant message, found "${(t[0] as Message).role}"`, field);
  }
}

function checkNumber(v: unknown, field: string, required: boolean, range?: [number, number]): void {
  if (v === undefined && !required) return;
  if (v === undefined) throw new RecordError(`missing field "${field}"`, field);
  if (v === null) throw new RecordError(`field "${field}" is null`, field);
  const n = v as number;
  if (Number.isNaN(n)) throw new RecordError(`field "${field}" is NaN`, field);
  if (!Number.isFinite(n)) throw new RecordError(`field "${field}" is ${n}`, field);
  if (range && (n < range[0] || n > range[1])) throw new RecordError(`field "${field}" is ${n}, outside [${range[0]}, ${range[1]}]`, field);
}

/** Throws a RecordError naming the first broken field of `row`; returns the row's text mode. */
export function validateRow(kind: Kind, row: Row, opts: ValidateOptions = {}): TextMode {
  const mode = textMode(row.prompt as Text);
  // Every text field must have the prompt's mode; the prompt's own check is then trivially true.
  checkText(row.prompt as Text, 'prompt', mode, false, opts);
  if (kind === 'pairwise') {
    checkText(row.chosen as Text, 'chosen', mode, true, opts);
    checkText(row.rejected as Text, 'rejected', mode, true, opts);
    if (!opts.allowIdentical && sameText(row.chosen as Text, row.rejected as Text)) {
      throw new RecordError('fields "chosen" and "rejected" are identical', 'rejected');
    }
    checkNumber(row.chosen_score, 'chosen_score', false);
    checkNumber(row.rejected_score, 'rejected_score', false);
    checkNumber(row.chosen_prob, 'chosen_prob', false, [0, 1]);
    checkNumber(row.rejected_prob, 'rejected_prob', false, [0, 1]);
    checkNumber(row.weight, 'weight', false, [0, Infinity]);
    if (!opts.allowTies && typeof row.chosen_score === 'number' && row.chosen_score === row.rejected_score) {
      throw new RecordError(`fields "chosen_score" and "rejected_score" are equal (${row.chosen_score}): no preference`, 'rejected_score');
    }
  } else if (kind === 'listwise') {
    const responses = row.responses as Text[];
    const scores = row.scores as number[];
    if (responses.length < 2) throw new RecordError(`field "responses" has ${responses.length} response(s), at least 2 are needed`, 'responses');
    if (scores.length !== responses.length) {
      throw new RecordError(`field "scores" has ${scores.length} values for ${responses.length} responses`, 'scores');
    }
    responses.forEach((t, i) => checkText(t, `responses[${i}]`, mode, true, opts));
    scores.forEach((x, i) => checkNumber(x, `scores[${i}]`, true));
    const probs = row.win_probs as number[] | undefined | null;
    if (probs !== undefined && probs !== null) {
      if (probs.length !== responses.length) {
        throw new RecordError(`field "win_probs" has ${probs.length} values for ${responses.length} responses`, 'win_probs');
      }
      probs.forEach((x, i) => checkNumber(x, `win_probs[${i}]`, true, [0, 1]));
    }
    if (!opts.allowIdentical) {
      for (let i = 0; i < responses.length; i++) {
        for (let j = i + 1; j < responses.length; j++) {
          if (sameText(responses[i], responses[j])) throw new RecordError(`field "responses": responses ${i} and ${j} are identical`, 'responses');
        }
      }
    }
  } else {
    checkText(row.response as Text, 'response', mode, true, opts);
    // Without reward or label the row is a conversation to fine-tune on (SFT).
    checkNumber(row.reward, 'reward', false);
    if (row.label === null) throw new RecordError('field "label" is null', 'label');
  }
  if (row.tools !== undefined && row.tools !== null && mode === 'plain') {
    throw new RecordError('field "tools": tools need conversational text (message lists), but "prompt" is plain text', 'tools');
  }
  return mode;
}
