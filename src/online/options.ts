/**
 * Command-line options shared by `generate`, `sppo` and `nash-md`: sampling flags parsed into
 * numbers, each bad value named by its flag. For `sppo` and `nash-md` the flags are aliases of the
 * sampling settings (sampling.ts), given only when written, so a `--param` or a config file's value
 * is not overridden by a flag's default.
 */
import { UserError } from '../errors.ts';
import { samplingOptions, type SamplingOptions } from '../models/sampling.ts';
import type { SamplingAliases } from './sampling.ts';

export interface SamplingFlags {
  maxNewTokens: string;
  temperature: string;
  topK: string;
  topP: string;
  seed?: string;
}

/** The sampling flags as aliases of the settings: only those written, each checked and named by its flag. */
export function samplingAliasFlags(o: Partial<SamplingFlags> & { samples?: string }): SamplingAliases {
  const out: SamplingAliases = {};
  if (o.maxNewTokens !== undefined) out.maxNewTokens = intFlag('--max-new-tokens', o.maxNewTokens);
  if (o.temperature !== undefined) out.temperature = num('--temperature', o.temperature, false, 0);
  if (o.topK !== undefined) out.topK = num('--top-k', o.topK, true, 0);
  if (o.topP !== undefined) out.topP = num('--top-p', o.topP, false, 0);
  if (o.samples !== undefined) out.samples = intFlag('--samples', o.samples, 2);
  return out;
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

/** The sampling flags: flag, the setting it stands for, meaning, `generate`'s default. */
export const SAMPLING_FLAGS: [string, string, string, string][] = [
  ['--max-new-tokens <n>', 'max_completion_length', 'longest response in tokens', '64'],
  ['--temperature <t>', 'temperature', 'softmax temperature; 0 is greedy', '1'],
  ['--top-k <k>', 'top_k', 'sample among the k most likely tokens; 0 keeps all', '0'],
  ['--top-p <p>', 'top_p', 'sample within the smallest set of tokens whose probability reaches p', '1'],
];

/** The sampling flags of a command whose sampling settings they alias (no default: the setting's). */
export function aliasFlags(): [string, string][] {
  return SAMPLING_FLAGS.map(([flag, key, doc]) => [flag, `${doc}; same as --param ${key}=…`]);
}

export function collect(v: string, prev: string[]): string[] {
  return [...prev, v];
}
