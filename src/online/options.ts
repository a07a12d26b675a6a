/**
 * Command-line options shared by `generate`, `sppo` and `nash-md`: sampling flags parsed into
 * numbers, each bad value named by its flag. The flags are aliases of the sampling settings
 * (sampling.ts), given only when written, so a `--param` or a config file's value is not overridden
 * by a flag's default.
 */
import { UserError } from '../errors.ts';
import { coerceSetting } from '../train/settings.ts';
import { SAMPLING_SETTINGS, type SamplingAliases } from './sampling.ts';

export interface SamplingFlags {
  maxNewTokens: string;
  temperature: string;
  topK: string;
  topP: string;
  seed?: string;
}

/** The sampling flags as aliases of the settings: only those written, each checked against its setting's declaration and named by its flag. */
export function samplingAliasFlags(o: Partial<SamplingFlags> & { samples?: string }): SamplingAliases {
  const out: SamplingAliases = {};
  const checked = (flag: string, key: keyof typeof SAMPLING_SETTINGS, v: number) => coerceSetting(key, SAMPLING_SETTINGS[key], v, flag) as number;
  if (o.maxNewTokens !== undefined) out.maxNewTokens = checked('--max-new-tokens', 'max_completion_length', intFlag('--max-new-tokens', o.maxNewTokens));
  if (o.temperature !== undefined) out.temperature = checked('--temperature', 'temperature', num('--temperature', o.temperature, false, 0));
  if (o.topK !== undefined) out.topK = checked('--top-k', 'top_k', num('--top-k', o.topK, true, 0));
  if (o.topP !== undefined) out.topP = checked('--top-p', 'top_p', num('--top-p', o.topP, false, 0));
  if (o.samples !== undefined) out.samples = checked('--samples', 'num_generations', intFlag('--samples', o.samples, 2));
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

/** The sampling flags: flag, the setting it stands for, meaning. */
const SAMPLING_FLAGS: [string, string, string][] = [
  ['--max-new-tokens <n>', 'max_completion_length', 'longest response in tokens'],
  ['--temperature <t>', 'temperature', 'softmax temperature; 0 is greedy'],
  ['--top-k <k>', 'top_k', 'sample among the k most likely tokens; 0 keeps all'],
  ['--top-p <p>', 'top_p', 'sample within the smallest set of tokens whose probability reaches p'],
];

/** The sampling flags, each an alias of its setting (no default: the setting's, the command's own). */
export function aliasFlags(): [string, string][] {
  return SAMPLING_FLAGS.map(([flag, key, doc]) => [flag, `${doc}; same as --param ${key}=…`]);
}

export function collect(v: string, prev: string[]): string[] {
  return [...prev, v];
}
