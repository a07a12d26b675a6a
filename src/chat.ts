/**
 * The chat vocabulary every layer shares — datasets, the tokenizer's chat templates, generation and
 * the online methods — in the Hugging Face / OpenAI chat format. No dependencies, so any floor may
 * import it.
 */

export type Role = 'system' | 'user' | 'assistant' | 'tool';
export const ROLES: ReadonlySet<string> = new Set(['system', 'user', 'assistant', 'tool']);

/** One call the assistant asked for. `arguments` is an object once parsed (templates take either). */
export interface ToolCall {
  /** The id a `tool` message answers through `tool_call_id`; absent where the template has none. */
  id?: string;
  type?: 'function';
  function: { name: string; arguments: Record<string, unknown> | string };
}

/** One chat message. `tool_calls` only on assistant turns; `tool_call_id` and `name` on tool turns. */
export interface Message {
  role: Role;
  content: string;
  tool_calls?: ToolCall[];
  tool_call_id?: string;
  name?: string;
}

/** A tool as chat templates receive it in their `tools` variable (a JSON Schema for its arguments). */
export interface ToolSpec {
  type: 'function';
  function: { name: string; description?: string; parameters: Record<string, unknown> };
}

/** One text value: a plain string or a conversation. */
export type Text = string | Message[];
