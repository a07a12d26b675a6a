/**
 * Token in, token out on a rollout's endpoint path. An agent sends its whole history at every call,
 * with the assistant turns the endpoint answered as messages (text and parsed tool calls). Rendered
 * afresh by the chat template, such a turn need not give back the ids that were sampled (a call's
 * JSON spaced otherwise, a text that tokenizes differently), and the model would then be prompted
 * with a turn it never wrote, and the call could not extend the rollout's row.
 *
 * So where a request's messages are an earlier call's messages, then the assistant message that
 * call was answered with, then new messages (tool results, a user turn), the prompt is that call's
 * prompt ids + the ids it sampled + the bridge ids of the new messages (the template's render with
 * them minus the render without, from the sampled turn's end-of-turn token on: tokenize/
 * conversation.ts `bridgeIds`, what `--tools` rollouts extend with). The model sees its own tokens,
 * and the call merges into the rollout's row. Anything else (a rewritten or summarised history, other
 * tools, a turn cut before its end-of-turn id) is rendered afresh: a fork.
 */
import type { Message, ToolCall, ToolSpec } from '../../chat.ts';
import type { LoadedTokenizer } from '../../tokenize/index.ts';
import { bridgeIds } from '../../tokenize/conversation.ts';

/** An earlier call of the rollout: what it was asked and what it answered. */
export interface AnsweredCall {
  messages: readonly Message[];
  tools: readonly ToolSpec[];
  promptIds: readonly number[];
  completionIds: readonly number[];
  /** Whether the completion ended on an end-of-turn id (else a bridge cannot follow it). */
  ended: boolean;
  /** The assistant message the endpoint answered with. */
  answer: Message;
}

const args = (a: ToolCall['function']['arguments']): unknown => {
  if (typeof a !== 'string') return a;
  try {
    return JSON.parse(a);
  } catch {
    return a;
  }
};

function same(a: unknown, b: unknown): boolean {
  return JSON.stringify(canonical(a)) === JSON.stringify(canonical(b));
}

function canonical(v: unknown): unknown {
  if (Array.isArray(v)) return v.map(canonical);
  if (v && typeof v === 'object') return Object.fromEntries(Object.keys(v).sort().map((k) => [k, canonical((v as Record<string, unknown>)[k])]));
  return v;
}

/** Whether a message a client sent back is the assistant message it was answered with (ids of calls aside). */
export function sameAssistant(sent: Message, answer: Message): boolean {
  if (sent.role !== 'assistant') return false;
  if ((sent.content ?? '') !== (answer.content ?? '')) return false;
  const a = sent.tool_calls ?? [];
  const b = answer.tool_calls ?? [];
  return a.length === b.length && a.every((c, i) => c.function.name === b[i].function.name && same(args(c.function.arguments), args(b[i].function.arguments)));
}

function sameMessage(a: Message, b: Message): boolean {
  return a.role === b.role && (a.content ?? '') === (b.content ?? '') && (a.name ?? null) === (b.name ?? null) && (a.tool_call_id ?? null) === (b.tool_call_id ?? null) && same((a.tool_calls ?? []).map((c) => [c.function.name, args(c.function.arguments)]), (b.tool_calls ?? []).map((c) => [c.function.name, args(c.function.arguments)]));
}

/**
 * The prompt ids continuing an earlier call of `history` (the latest that `messages` extends), or
 * null when none does (the caller renders the messages afresh).
 */
export function continuedPrompt(tok: LoadedTokenizer, history: readonly AnsweredCall[], messages: readonly Message[], tools: readonly ToolSpec[]): number[] | null {
  for (let k = history.length - 1; k >= 0; k--) {
    const h = history[k];
    const n = h.messages.length;
    if (!h.ended || messages.length < n + 2 || !same(h.tools, tools)) continue;
    if (!h.messages.every((m, i) => sameMessage(m, messages[i]))) continue;
    if (!sameAssistant(messages[n], h.answer)) continue;
    try {
      const bridge = bridgeIds(tok, messages.slice(0, n + 1), messages.slice(n + 1), tools.length ? { tools } : {});
      return [...h.promptIds, ...h.completionIds, ...bridge];
    } catch {
      // The template renders the longer conversation differently: render it afresh.
      return null;
    }
  }
  return null;
}
