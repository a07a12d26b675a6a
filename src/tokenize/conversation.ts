/**
 * Conversations with tools as token ids, the way a rollout builds them (docs/agents.md, "Chat with
 * tools"). A turn the policy sampled is never re-tokenized: after it, the tool messages and the next
 * generation prompt enter as "bridge" ids, the text the chat template adds when it renders the
 * conversation with them, tokenized on its own (TRL's method). That needs a template that extends
 * its own render; `checkTemplateExtends` finds out when a run starts.
 *
 * Every cut is made right after the template's end-of-turn token (a special token) or right after
 * the generation prompt, so the pieces tokenized apart are the pieces the whole render tokenizes
 * into; the golden tests check that against real templates.
 */
import { UserError } from '../errors.ts';
import type { Message, ToolSpec } from '../chat.ts';
import type { LoadedTokenizer } from './tokenizer.ts';
import { templateToolSupport } from './tool-calls.ts';

/** What a chat template is given besides the messages. */
export interface ChatRenderOptions {
  /** The tools offered, as the template's `tools` variable. */
  tools?: readonly ToolSpec[];
  /** Extra template variables (`chat_template_kwargs`, e.g. `{enable_thinking: false}`). */
  templateKwargs?: Record<string, unknown>;
}

/**
 * Messages as templates expect them: only the fields a message has (a template tests
 * `message.tool_calls` for being defined), tool-call arguments as objects where they are JSON text.
 */
export function templateMessages(messages: readonly Message[]): Message[] {
  return messages.map((m) => {
    const out: Message = { role: m.role, content: m.content };
    if (m.tool_calls && m.tool_calls.length > 0) {
      out.tool_calls = m.tool_calls.map((c) => ({ ...(c.id !== undefined ? { id: c.id } : {}), type: 'function', function: { name: c.function.name, arguments: c.function.arguments } }));
    }
    if (m.tool_call_id !== undefined && m.tool_call_id !== null) out.tool_call_id = m.tool_call_id;
    if (m.name !== undefined && m.name !== null) out.name = m.name;
    return out;
  });
}

/** The template's render of `messages` with the tools and keyword arguments. */
export function renderChat(tok: LoadedTokenizer, messages: readonly Message[], opts: ChatRenderOptions & { addGenerationPrompt?: boolean } = {}): string {
  const variables: Record<string, unknown> = { ...opts.templateKwargs };
  if (opts.tools && opts.tools.length > 0) variables.tools = opts.tools;
  return tok.applyChatTemplate(templateMessages(messages), { addGenerationPrompt: opts.addGenerationPrompt ?? false, variables });
}

/**
 * The ids a rollout (or any generation from a message prompt) starts from: the template's render of
 * `messages` with the generation prompt. Refuses tools or tool calls the template would leave out.
 */
export function chatPromptIds(tok: LoadedTokenizer, messages: readonly Message[], opts: ChatRenderOptions = {}): number[] {
  checkToolSupport(tok, messages, opts);
  return tok.encode(renderChat(tok, messages, { ...opts, addGenerationPrompt: true }), { addSpecialTokens: false });
}

/** The texts of the tokens that end a turn: the stop ids (EOS and generation_config's `eos_token_id`s). */
export function endOfTurnStrings(tok: LoadedTokenizer): string[] {
  const out: string[] = [];
  for (const id of tok.stopIds) {
    const s = tok.idToToken(id);
    if (s) out.push(s);
  }
  return out;
}

/** Index just past the first end-of-turn string at or after `from`, or -1. */
function turnEnd(text: string, from: number, stops: readonly string[]): number {
  let best = -1;
  for (const s of stops) {
    const i = text.indexOf(s, from);
    if (i >= 0 && (best < 0 || i + s.length < best)) best = i + s.length;
  }
  return best;
}

/** Index just past the last end-of-turn string in `text`, or -1. */
function lastTurnEnd(text: string, stops: readonly string[]): number {
  let best = -1;
  for (const s of stops) {
    const i = text.lastIndexOf(s);
    if (i >= 0) best = Math.max(best, i + s.length);
  }
  return best;
}

function snippet(s: string): string {
  return JSON.stringify(s.length > 60 ? `…${s.slice(-57)}` : s);
}

/** Thrown where a template renders the earlier turns differently once more turns follow. */
export class TemplatePrefixError extends UserError {
  constructor(message: string, readonly at: number) {
    super(message);
    this.name = 'TemplatePrefixError';
  }
}

function checkToolSupport(tok: LoadedTokenizer, messages: readonly Message[], opts: ChatRenderOptions): void {
  const support = templateToolSupport(tok.chatTemplate);
  if (opts.tools && opts.tools.length > 0 && !support.tools) {
    throw new UserError(`${tok.dir}: the chat template does not render the "tools" variable, so the tools offered would be silently left out; pass --chat-template FILE with a template that renders tools`);
  }
  if (!support.toolCalls && messages.some((m) => m.tool_calls && m.tool_calls.length > 0)) {
    throw new UserError(`${tok.dir}: the chat template does not render assistant "tool_calls", so the calls would be silently left out; pass --chat-template FILE with a template that renders them`);
  }
}

/**
 * The bridge ids after a sampled assistant turn: the text the template adds when `added` (tool
 * results, an environment's or user's messages) and the next generation prompt follow `before`
 * (which ends with the sampled turn), starting right after that turn's end-of-turn token. Throws a
 * TemplatePrefixError when the render of `before` is not a prefix of the longer render.
 */
export function bridgeIds(tok: LoadedTokenizer, before: readonly Message[], added: readonly Message[], opts: ChatRenderOptions & { addGenerationPrompt?: boolean } = {}): number[] {
  return tok.encode(bridgeText(tok, before, added, opts), { addSpecialTokens: false });
}

/** The text `bridgeIds` tokenizes. */
export function bridgeText(tok: LoadedTokenizer, before: readonly Message[], added: readonly Message[], opts: ChatRenderOptions & { addGenerationPrompt?: boolean } = {}): string {
  const stops = endOfTurnStrings(tok);
  const a = renderChat(tok, before, { ...opts, addGenerationPrompt: false });
  const b = renderChat(tok, [...before, ...added], { ...opts, addGenerationPrompt: opts.addGenerationPrompt ?? true });
  if (!b.startsWith(a)) {
    let k = 0;
    while (k < a.length && a[k] === b[k]) k++;
    throw new TemplatePrefixError(
      `${tok.dir}: the chat template renders the conversation differently once more messages follow (at ${snippet(a.slice(0, k + 1))}), so the sampled tokens cannot be extended`,
      k,
    );
  }
  const cut = lastTurnEnd(a, stops);
  if (cut < 0) throw new UserError(`${tok.dir}: the chat template's render of the conversation has no end-of-turn token (${stops.join(', ') || 'the tokenizer has no stop tokens'})`);
  return b.slice(cut);
}

/** Which part of a conversation a run of ids is. */
export type SegmentKind = 'prompt' | 'assistant' | 'bridge' | 'tail';

export interface ConversationIds {
  ids: number[];
  /** 1 on the assistant's own tokens (its end-of-turn token included), 0 on everything else. */
  mask: number[];
  /** Ids before the first assistant turn (the prompt and its generation prompt). */
  promptLength: number;
  /** The runs of ids in order: the prompt, then each assistant turn and the bridge after it. */
  segments: { kind: SegmentKind; ids: number[]; message?: number }[];
}

/**
 * A whole conversation as ids and an assistant mask, in the pieces a rollout would produce: the
 * prompt with the generation prompt, each assistant turn up to and including its end-of-turn token
 * (mask 1), the bridge to the next assistant turn (mask 0), and whatever the template writes after
 * the last turn (mask 0). Assistant turns are cut from the template's render of the whole
 * conversation, so earlier turns look as the template renders history. With `from`, the turns
 * before message `from` are all prompt (a multi-turn prompt's assistant turns are context, mask 0).
 */
export function tokenizeConversation(tok: LoadedTokenizer, messages: readonly Message[], opts: ChatRenderOptions & { from?: number } = {}): ConversationIds {
  const from = opts.from ?? 0;
  checkToolSupport(tok, messages, opts);
  const stops = endOfTurnStrings(tok);
  if (stops.length === 0) throw new UserError(`${tok.dir}: the tokenizer has no stop token, so an assistant turn's end cannot be found`);
  const full = renderChat(tok, messages, { ...opts, addGenerationPrompt: false });
  const ids: number[] = [];
  const mask: number[] = [];
  const segments: ConversationIds['segments'] = [];
  let promptLength = -1;
  let cursor = 0;
  const push = (kind: SegmentKind, text: string, bit: number, message?: number) => {
    const part = text === '' ? [] : tok.encode(text, { addSpecialTokens: false });
    for (const id of part) {
      ids.push(id);
      mask.push(bit);
    }
    segments.push(message === undefined ? { kind, ids: part } : { kind, ids: part, message });
  };
  messages.forEach((m, i) => {
    if (m.role !== 'assistant' || i < from) return;
    const head = renderChat(tok, messages.slice(0, i), { ...opts, addGenerationPrompt: true });
    if (!full.startsWith(head) || head.length < cursor) {
      throw new TemplatePrefixError(
        `${tok.dir}: the chat template renders message ${i + 1} (assistant) differently from its generation prompt ${snippet(head)}, so the assistant's tokens cannot be told apart`,
        i,
      );
    }
    push(promptLength < 0 ? 'prompt' : 'bridge', full.slice(cursor, head.length), 0);
    if (promptLength < 0) promptLength = ids.length;
    const end = turnEnd(full, head.length, stops);
    if (end < 0) throw new UserError(`${tok.dir}: the chat template ends assistant message ${i + 1} with none of the stop tokens ${stops.join(', ')}`);
    push('assistant', full.slice(head.length, end), 1, i);
    cursor = end;
  });
  if (promptLength < 0) throw new UserError(`${tok.dir}: the conversation has no assistant message${from > 0 ? ` from message ${from + 1} on` : ''} to train on`);
  push('tail', full.slice(cursor), 0);
  return { ids, mask, promptLength, segments };
}

/** A conversation the template must carry over unchanged: one tool call, its result, the next turn. */
function probeConversation(): { before: Message[]; added: Message[]; tools: ToolSpec[] } {
  const tools: ToolSpec[] = [{ type: 'function', function: { name: 'lookup', description: 'Looks a word up.', parameters: { type: 'object', properties: { word: { type: 'string' } }, required: ['word'] } } }];
  const before: Message[] = [
    { role: 'user', content: 'What does "probe" mean?' },
    { role: 'assistant', content: '', tool_calls: [{ type: 'function', function: { name: 'lookup', arguments: { word: 'probe' } } }] },
  ];
  return { before, added: [{ role: 'tool', content: 'to examine', name: 'lookup' }], tools };
}

function extends_(tok: LoadedTokenizer, opts: ChatRenderOptions): boolean {
  const p = probeConversation();
  const tools = opts.tools && opts.tools.length > 0 ? opts.tools : p.tools;
  try {
    bridgeText(tok, p.before, p.added, { ...opts, tools });
    return true;
  } catch (e) {
    if (e instanceof TemplatePrefixError) return false;
    throw e;
  }
}

/**
 * Refuses, in one line naming the remedy, a chat template that does not extend its own render
 * (Qwen3's drops the `<think>` block of an earlier turn): renders a probe conversation with and
 * without a tool result. Call it when a run with tools starts.
 */
export function checkTemplateExtends(tok: LoadedTokenizer, opts: ChatRenderOptions = {}): void {
  const support = templateToolSupport(tok.chatTemplate);
  if (!support.toolCalls) {
    throw new UserError(`${tok.dir}: the chat template does not render tool calls; pass --chat-template FILE with one that does (Hermes/Qwen <tool_call> or Llama 3 JSON calls)`);
  }
  if (extends_(tok, opts)) return;
  const kwargs = { ...opts.templateKwargs, enable_thinking: false };
  const thinkingHelps = opts.templateKwargs?.enable_thinking !== false && /enable_thinking/.test(tok.chatTemplate ?? '') && extends_(tok, { ...opts, templateKwargs: kwargs });
  const remedy = thinkingHelps
    ? 'set chat_template_kwargs enable_thinking=false, or pass --chat-template FILE with a template that keeps earlier turns as they were rendered'
    : `pass --chat-template FILE with a template that keeps earlier turns as they were rendered${/enable_thinking/.test(tok.chatTemplate ?? '') ? ' (chat_template_kwargs enable_thinking=false does not fix this one)' : ''}`;
  throw new UserError(`${tok.dir}: the chat template renders an assistant turn differently once a tool result follows it (Qwen3's drops earlier <think> blocks), so tool results cannot be appended to the sampled tokens; ${remedy}`);
}
