/**
 * Token-length statistics of a preference dataset under a model's tokenizer and chat template
 * (`prefzoo inspect FILE --tokenizer DIR`): how long prompts and responses are in tokens, and how
 * many rows the trainer's default lengths would truncate.
 */
import { loadTokenizer } from '../tokenize/index.ts';
import { DEFAULT_CONFIG } from './config.ts';
import { loadData, tokenizeExamples } from '../../datasets/examples.ts';

export interface TokenLengths {
  count: number;
  min: number;
  mean: number;
  p50: number;
  p95: number;
  max: number;
}

export interface TokenReport {
  tokenizer: string;
  rows: number;
  prompt: TokenLengths;
  response: TokenLengths;
  /** Rows longer than the default max_length / max_prompt_length (they would be truncated, not dropped). */
  over_default_lengths: number;
  default_max_length: number;
  default_max_prompt_length: number;
}

function stats(xs: number[]): TokenLengths {
  const s = [...xs].sort((a, b) => a - b);
  const at = (q: number) => s[Math.min(s.length - 1, Math.floor(q * (s.length - 1) + 0.5))];
  return { count: s.length, min: s[0] ?? 0, mean: s.reduce((a, b) => a + b, 0) / Math.max(1, s.length), p50: at(0.5) ?? 0, p95: at(0.95) ?? 0, max: s[s.length - 1] ?? 0 };
}

export async function tokenReport(file: string, tokenizerDir: string, workDir: string): Promise<TokenReport> {
  const tok = loadTokenizer(tokenizerDir);
  const data = await loadData(file, workDir);
  const huge = { max_length: 1 << 30, max_prompt_length: (1 << 30) - 1, truncation: 'keep_end' as const };
  const { rows } = tokenizeExamples(data.examples, tok, huge, data.tokens);
  const prompts = rows.map((r) => r.promptIds.length);
  const responses = rows.flatMap((r) => r.responseIds.map((x) => x.length));
  const over = rows.filter(
    (r) => r.promptIds.length > DEFAULT_CONFIG.max_prompt_length || r.responseIds.some((x) => Math.min(r.promptIds.length, DEFAULT_CONFIG.max_prompt_length) + x.length > DEFAULT_CONFIG.max_length),
  ).length;
  return {
    tokenizer: tokenizerDir,
    rows: rows.length,
    prompt: stats(prompts),
    response: stats(responses),
    over_default_lengths: over,
    default_max_length: DEFAULT_CONFIG.max_length,
    default_max_prompt_length: DEFAULT_CONFIG.max_prompt_length,
  };
}

export function formatTokenReport(r: TokenReport): string {
  const line = (name: string, s: TokenLengths) =>
    `  ${name.padEnd(9)} ${String(s.count).padStart(7)} ${String(s.min).padStart(7)} ${s.mean.toFixed(1).padStart(9)} ${String(s.p50).padStart(7)} ${String(s.p95).padStart(7)} ${String(s.max).padStart(7)}`;
  return [
    `token lengths (tokenizer ${r.tokenizer}, chat template applied to messages):`,
    `  ${'field'.padEnd(9)} ${'count'.padStart(7)} ${'min'.padStart(7)} ${'mean'.padStart(9)} ${'p50'.padStart(7)} ${'p95'.padStart(7)} ${'max'.padStart(7)}`,
    line('prompt', r.prompt),
    line('response', r.response),
    `  ${r.over_default_lengths} of ${r.rows} rows exceed the default max_length ${r.default_max_length} / max_prompt_length ${r.default_max_prompt_length} (train truncates them and counts them)`,
  ].join('\n');
}
