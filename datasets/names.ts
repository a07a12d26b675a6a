/**
 * The vocabulary of preference data (kinds, roles, texts) in a module with no dependencies, so the
 * CLI and the format adapters load without Arrow or wasm.
 */
export type Kind = 'pairwise' | 'listwise' | 'single';
export const KINDS: readonly Kind[] = ['pairwise', 'listwise', 'single'];

export { type Message, ROLES, type Role, type Text, type ToolCall, type ToolSpec } from '../src/chat.ts';
