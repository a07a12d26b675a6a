/**
 * The vocabulary of preference data (kinds, roles, texts) in a module with no dependencies, so the
 * CLI and the format adapters load without Arrow or wasm.
 */
export type Kind = 'pairwise' | 'listwise' | 'single';
export const KINDS: readonly Kind[] = ['pairwise', 'listwise', 'single'];

export type Role = 'system' | 'user' | 'assistant' | 'tool';
export const ROLES: ReadonlySet<string> = new Set(['system', 'user', 'assistant', 'tool']);

export interface Message {
  role: Role;
  content: string;
}

/** One text value: a plain string or a conversation. */
export type Text = string | Message[];
