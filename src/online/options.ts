/**
 * Command-line options shared by `generate`, `sppo` and `nash-md`: sampling flags parsed into
 * numbers, each bad value named by its flag.
 */
import { UserError } from '../errors.ts';
import { samplingOptions, type SamplingOptions } from '../models/sampling.ts';

export interface SamplingFlags {
  maxNewTokens: string;
  temperature: string;
  topK: string;
  topP: string;
  seed?: string;
}

function num(flag: string, v: string, integer: boolean, min: number): number {
  const n = Number(v);
  if (v.trim() === '' || !Number.isFinite(n) || (integer && !Number.isInteger(n)) || n < min) {
    throw new UserError(`${flag} must be ${integer ? 'an integer' : 'a number'} ≥ ${min}, got "${v}"`);
  }
  return n;
}

export function intFlag(flag: string, v: string, min = 1): number {
  return num(flag, v, true, min);
}

export function parseSampling(o: SamplingFlags): SamplingOptions & { maxNewTokens: number } {
  const s = samplingOptions({ temperature: num('--temperature', o.temperature, false, 0), topK: num('--top-k', o.topK, true, 0), topP: num('--top-p', o.topP, false, 0) });
  return { ...s, maxNewTokens: intFlag('--max-new-tokens', o.maxNewTokens) };
}

/** Adds the sampling flags with their defaults to a command. */
export const SAMPLING_FLAGS: [string, string, string][] = [
  ['--max-new-tokens <n>', 'longest response in tokens', '64'],
  ['--temperature <t>', 'softmax temperature; 0 is greedy', '1'],
  ['--top-k <k>', 'sample among the k most likely tokens; 0 keeps all', '0'],
  ['--top-p <p>', 'sample within the smallest set of tokens whose probability reaches p', '1'],
];

export function collect(v: string, prev: string[]): string[] {
  return [...prev, v];
}
