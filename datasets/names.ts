/**
 * The names the CLI offers as choices, in a module with no dependencies, so registering commands
 * does not load Arrow or wasm.
 */
export type Kind = 'pairwise' | 'listwise' | 'single';
export const KINDS: readonly Kind[] = ['pairwise', 'listwise', 'single'];

export const FORMAT_NAMES = ['trl', 'sharegpt', 'llamafactory', 'hh', 'ultrafeedback', 'openai', 'kto', 'rewards', 'listwise', 'csv'] as const;
export type FormatName = (typeof FORMAT_NAMES)[number];
