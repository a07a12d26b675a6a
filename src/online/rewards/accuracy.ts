/**
 * `accuracy`: 1 when the completion's final answer equals the row's `answer` (numerically when both
 * read as numbers), else 0. The final answer is the last `\boxed{…}`, else what follows GSM8K's
 * "####", else the last number.
 */
import { RowError, type RewardFunction, type RewardKind } from './reward.ts';

/** The content of the last `\boxed{…}` (braces balanced), or null. */
function lastBoxed(text: string): string | null {
  const at = text.lastIndexOf('\\boxed{');
  if (at < 0) return null;
  let depth = 0;
  for (let i = at + '\\boxed'.length; i < text.length; i++) {
    if (text[i] === '{') depth++;
    else if (text[i] === '}' && --depth === 0) return text.slice(at + '\\boxed{'.length, i).trim();
  }
  return null;
}

const NUMBER = /-?\$?\d[\d,]*(?:\.\d+)?|-?\.\d+/g;

/** The last number written in the text (thousands commas and a leading $ allowed), or null. */
function lastNumber(text: string): string | null {
  const all = text.match(NUMBER);
  return all ? all[all.length - 1] : null;
}

/** A final answer as a number, when it reads as one ("1,234", "$18", "-3.50", "12%", "18."). */
export function asNumber(s: string): number | null {
  const t = s.trim().replace(/^\$/, '').replace(/^\\\$/, '').replace(/,/g, '').replace(/\\?%$/, '').replace(/\.$/, '').replace(/^-\$/, '-');
  if (!/^-?(\d+(\.\d*)?|\.\d+)$/.test(t)) return null;
  return Number(t);
}

/**
 * The final answer of a text: the last `\boxed{…}`; else, after GSM8K's "#### " marker, what follows
 * the last one; else the last number. Null when there is none.
 */
export function extractAnswer(text: string): string | null {
  const boxed = lastBoxed(text);
  if (boxed !== null) return boxed;
  const mark = text.lastIndexOf('####');
  if (mark >= 0) return text.slice(mark + 4).trim();
  return lastNumber(text);
}

/** Numerically equal when both read as numbers (relative 1e-9), else equal as text up to spaces and case. */
export function answersMatch(got: string, gold: string): boolean {
  const a = asNumber(got);
  const b = asNumber(gold);
  if (a !== null && b !== null) return Math.abs(a - b) <= 1e-9 * Math.max(1, Math.abs(b));
  const norm = (s: string) => s.replace(/\s+/g, '').replace(/^\$|\$$/g, '').toLowerCase();
  return norm(got) !== '' && norm(got) === norm(gold);
}

const accuracyReward: RewardFunction = {
  name: 'accuracy',
  rerunnable: true,
  score({ completions, rows }) {
    return completions.map((c, i) => {
      const gold = rows[i].answer;
      if (typeof gold !== 'string' && typeof gold !== 'number') {
        throw new RowError(i, gold === undefined ? 'the prompt has no "answer" column' : `"answer" must be text or a number, got ${JSON.stringify(gold).slice(0, 40)}`);
      }
      const want = extractAnswer(String(gold));
      if (want === null || want === '') throw new RowError(i, `no final answer in "answer" ${JSON.stringify(String(gold).slice(-40))}`);
      const got = extractAnswer(c);
      return got !== null && answersMatch(got, want) ? 1 : 0;
    });
  },
};

export const accuracy: RewardKind<'accuracy'> = {
  name: 'accuracy',
  syntax: 'accuracy',
  help: "1 when the final answer (last \\boxed{…}, else the last number) equals the row's `answer` column (numerically when both are numbers; GSM8K's \"#### N\" line in the gold), else 0",
  matches: (spec): spec is 'accuracy' => spec === 'accuracy',
  load: () => [accuracyReward],
};
