/**
 * The rationale of a preference pair as a sequence of its own, for the `rationale_weight` term
 * γ·(−log π(r | x, y_w, y_l)) ("Data-Centric Human Preference Optimization with Rationales", 2024).
 * The policy reads the prompt and both responses, then writes the rationale; only the rationale's
 * tokens are scored. The prompt of that sequence is, with plain-text data:
 *
 *   {prompt}
 *
 *   Response A:
 *   {chosen}
 *
 *   Response B:
 *   {rejected}
 *
 *   Why is Response A better than Response B?
 *
 * and the response is the rationale (the tokenizer's BOS/EOS rules as for any prompt and response).
 * With conversational data the same text is one user message, the conversation written out as
 * `role: content` lines in place of {prompt} and each response's message contents joined, and the
 * rationale is the assistant's reply under the model's chat template.
 */
import type { LoadedTokenizer } from '../tokenize/index.ts';
import { tokenizePromptResponse } from '../tokenize/index.ts';
import type { TokenizedExample } from '../../datasets/examples.ts';
import type { Message, Text } from '../../datasets/schema.ts';
import type { TruncationConfig } from '../../datasets/examples.ts';

export const RATIONALE_QUESTION = 'Why is Response A better than Response B?';

function flat(t: Text): string {
  return typeof t === 'string' ? t : t.map((m) => m.content).join('\n');
}

/** The prompt and response of the rationale sequence of one pair (layout above). */
export function rationaleTexts(prompt: Text, chosen: Text, rejected: Text, rationale: string): { prompt: Text; response: Text } {
  const context = typeof prompt === 'string' ? prompt : prompt.map((m) => `${m.role}: ${m.content}`).join('\n');
  const body = `${context}\n\nResponse A:\n${flat(chosen)}\n\nResponse B:\n${flat(rejected)}\n\n${RATIONALE_QUESTION}`;
  if (typeof prompt === 'string') return { prompt: `${body}\n`, response: rationale };
  const user: Message = { role: 'user', content: body };
  return { prompt: [user], response: [{ role: 'assistant', content: rationale }] };
}

/**
 * Adds each pair's rationale sequence to the rows that have a rationale. The rationale keeps at most
 * max_length − max_prompt_length tokens (the room a response has) and its prompt the rest, cut from
 * the side `truncation` names; returns how many rows had to be cut.
 */
export function tokenizeRationales(rows: TokenizedExample[], tok: LoadedTokenizer, cfg: TruncationConfig): { withRationale: number; truncated: number } {
  let withRationale = 0;
  let truncated = 0;
  for (const r of rows) {
    const ex = r.src;
    if (ex.rationale === undefined) continue;
    const t = rationaleTexts(ex.prompt, ex.responses[0], ex.responses[1], ex.rationale);
    const ids = tokenizePromptResponse(tok, t.prompt, t.response);
    let cut = false;
    let responseIds = ids.responseIds;
    const room = cfg.max_length - cfg.max_prompt_length;
    if (responseIds.length > room) {
      responseIds = responseIds.slice(0, room);
      cut = true;
    }
    let promptIds = ids.promptIds;
    const promptRoom = cfg.max_length - responseIds.length;
    if (promptIds.length > promptRoom) {
      promptIds = cfg.truncation === 'keep_end' ? promptIds.slice(-promptRoom) : promptIds.slice(0, promptRoom);
      cut = true;
    }
    if (cut) truncated++;
    if (responseIds.length === 0) continue;
    r.rationale = { promptIds, responseIds };
    withRationale++;
  }
  return { withRationale, truncated };
}
