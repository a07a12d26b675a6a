/** `format:REGEX`: 1 when the completion matches the regular expression, else 0. */
import { UserError } from '../../errors.ts';
import { after, type RewardKind } from './reward.ts';

export const format: RewardKind<`format:${string}`> = {
  name: 'format',
  syntax: 'format:REGEX',
  help: '1 when the completion matches REGEX (JavaScript syntax, `s` flag: `.` matches newlines; anchor with ^ and $ for a whole-text match), else 0',
  matches: (spec): spec is `format:${string}` => spec.startsWith('format:'),
  load(spec) {
    const source = after(spec, 'format:');
    let re: RegExp;
    try {
      re = new RegExp(source, 'su');
    } catch (e) {
      throw new UserError(`--reward format:${source}: not a regular expression (${(e as Error).message})`);
    }
    return [{ name: 'format', source: spec, rerunnable: true, score: ({ completions }) => completions.map((c) => (re.test(c) ? 1 : 0)) }];
  },
};
