/**
 * Splitting a (prompt, response) example into prompt tokens and response tokens, the unit every
 * preference loss scores: log p(response | prompt) sums over `responseIds` only.
 */
import { UserError } from '../errors.ts';
import type { LoadedTokenizer, Message } from './tokenizer.ts';

export interface PromptResponseIds {
  /** Tokens the model conditions on. */
  promptIds: number[];
  /** Tokens whose log-probabilities are scored (they end with EOS or the template's end-of-turn). */
  responseIds: number[];
}

function isMessages(x: unknown): x is readonly Message[] {
  return Array.isArray(x);
}

/**
 * Tokenizes one example. The convention:
 *
 * - **Plain text** (both strings): encoded separately. `promptIds` = [BOS if the tokenizer adds one]
 *   ++ tokens(prompt); `responseIds` = tokens(response) ++ [EOS if the tokenizer has one]. No other
 *   special tokens and no text is inserted between them (put any separator in the data itself).
 * - **Messages** (either side a message list; a plain prompt becomes one user message, a plain
 *   response one assistant message): the prompt text is the chat template of the prompt messages with
 *   `add_generation_prompt`, the full text is the template of prompt ++ response messages, and the
 *   response text is what the full text adds after the prompt text (so it carries the template's
 *   end-of-turn markers). The full text is tokenized once, as `apply_chat_template` would (no extra
 *   special tokens); `promptIds` is its longest prefix that agrees with the tokenization of the prompt
 *   text alone and `responseIds` the rest. Hence `promptIds ++ responseIds` is exactly the tokenization
 *   of the whole conversation, even when a token straddles the boundary (that token goes to the response).
 */
export function tokenizePromptResponse(
  tok: LoadedTokenizer,
  prompt: string | readonly Message[],
  response: string | readonly Message[],
): PromptResponseIds {
  if (!isMessages(prompt) && !isMessages(response)) {
    const promptIds = tok.encode(prompt, { addSpecialTokens: false });
    const responseIds = tok.encode(response, { addSpecialTokens: false });
    if (tok.addBosToken && tok.bosId !== null) promptIds.unshift(tok.bosId);
    if (tok.eosId !== null) responseIds.push(tok.eosId);
    return { promptIds, responseIds };
  }
  const promptMsgs: readonly Message[] = isMessages(prompt) ? prompt : [{ role: 'user', content: prompt }];
  const responseMsgs: readonly Message[] = isMessages(response) ? response : [{ role: 'assistant', content: response }];
  if (responseMsgs.length === 0) throw new UserError('the response has no messages');
  const promptText = tok.applyChatTemplate(promptMsgs, { addGenerationPrompt: true });
  const fullText = tok.applyChatTemplate([...promptMsgs, ...responseMsgs], { addGenerationPrompt: false });
  if (!fullText.startsWith(promptText)) {
    throw new UserError(
      `${tok.dir}: the chat template renders the prompt differently once the response is added, so the response cannot be separated (prompt text ${JSON.stringify(promptText.slice(-60))})`,
    );
  }
  const fullIds = tok.encode(fullText, { addSpecialTokens: false });
  const alone = tok.encode(promptText, { addSpecialTokens: false });
  let k = 0;
  while (k < alone.length && k < fullIds.length && alone[k] === fullIds[k]) k++;
  return { promptIds: fullIds.slice(0, k), responseIds: fullIds.slice(k) };
}
