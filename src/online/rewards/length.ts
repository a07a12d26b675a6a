/**
 * `length[:C]`: DAPO's soft overlong penalty (Eq. 13): 0 up to L − C tokens, then falling linearly to
 * −1 at L = max_completion_length; the buffer C defaults to L/5.
 */
import { UserError } from '../../errors.ts';
import { after, type RewardKind } from './reward.ts';

/** DAPO's soft overlong penalty of a completion of n tokens under limit L and buffer C. */
export function overlongPenalty(n: number, L: number, C: number): number {
  if (n <= L - C) return 0;
  if (n <= L) return (L - C - n) / C;
  return -1;
}

export const length: RewardKind<'length' | `length:${number}`> = {
  name: 'length',
  syntax: 'length[:TOKENS]',
  help: "DAPO's soft overlong penalty: 0 up to L − TOKENS, then down to −1 at L = max_completion_length (TOKENS defaults to L/5)",
  matches: (spec): spec is 'length' | `length:${number}` => spec === 'length' || spec.startsWith('length:'),
  load(spec) {
    const c = spec === 'length' ? null : Number(after(spec, 'length:'));
    if (c !== null && !(Number.isInteger(c) && c >= 1)) throw new UserError(`--reward ${spec}: the buffer must be an integer ≥ 1 (tokens)`);
    return [
      {
        name: 'length',
        source: spec === 'length' ? undefined : spec,
        rerunnable: true,
        score({ lengths, maxCompletionLength: L }) {
          const C = c ?? Math.max(1, Math.round(L / 5));
          if (C > L) throw new UserError(`--reward length:${C}: the buffer is longer than max_completion_length (${L})`);
          return lengths.map((n) => overlongPenalty(n, L, C));
        },
      },
    ];
  },
};
