/** Parsers shared by the commands' flags; errors name the flag and what it takes. */
import { UserError } from '../errors.ts';

/** Commander collector for a repeatable flag (`--param a=1 --param b=2`). */
export function collect(v: string, prev: string[]): string[] {
  return [...prev, v];
}

/** A positive integer flag; `dflt` when the flag was not given. */
export function positiveInt(flag: string, v: string | undefined, dflt: number): number;
export function positiveInt(flag: string, v: string | undefined): number | undefined;
export function positiveInt(flag: string, v: string | undefined, dflt?: number): number | undefined {
  if (v === undefined) return dflt;
  if (!/^\d+$/.test(v.trim()) || Number(v) < 1) throw new UserError(`${flag} must be a positive integer, got "${v}"`);
  return Number(v);
}
