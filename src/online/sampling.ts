/**
 * The sampling settings, declared once: what `generate`, `grpo`, `sppo` and `nash-md` take as
 * settings (`--param`, `--config`, the library's `settings`), and `generate`, `sppo` and `nash-md`
 * also under their older names, the flags `--temperature`, `--top-k`, `--top-p`, `--max-new-tokens`,
 * `--samples` (aliases: `fromAliases`). A command takes the ones it uses, with its own defaults where
 * they differ (`samplingSettings`); the ranges, meanings and TRL names are these.
 *
 * max_completion_length: one declaration, default 256 — long enough for a GSM8K chain of thought,
 * half of TRL's 512 because every token is sampled on the CPU here. `grpo` passes it to the `grpo`
 * loss (dr_grpo's normaliser), so a run never reaches the loss's own default; `sppo` and `nash-md`
 * keep 64, the `--max-new-tokens` default they always had, and so does `generate`.
 */
import { resolveConfig } from '../train/config.ts';
import { declareCommand, defineSettings, type SettingDecl, type SettingTable, type SettingsOf } from '../train/settings.ts';

const GROUP = 'Sampling';

export const SAMPLING_SETTINGS = defineSettings({
  num_generations: { type: 'int', default: 8, min: 2, max: 1 << 16, group: GROUP, trl: 'num_generations', doc: 'completions sampled per prompt (GRPO: the group, G ≥ 2; SPPO: K, alias --samples)' },
  max_completion_length: { type: 'int', default: 256, min: 1, max: 1 << 20, group: GROUP, trl: 'max_completion_length', doc: "longest completion in tokens, alias --max-new-tokens (GRPO: also dr_grpo's normaliser; TRL's default is 512)" },
  temperature: { type: 'number', default: 1, min: 0, max: 100, group: GROUP, trl: 'temperature', doc: 'sampling temperature, 0: greedy (GRPO: > 0; its log-probs and entropies use the same tempered logits)' },
  top_p: { type: 'number', default: 1, min: 0, minOpen: true, max: 1, group: GROUP, trl: 'top_p', doc: 'nucleus sampling: the smallest set of tokens whose probability reaches p (1: all)' },
  top_k: { type: 'int', default: 0, min: 0, max: 1 << 24, group: GROUP, trl: 'top_k', doc: 'sample among the k most likely tokens (0: all)' },
});

type SamplingKey = keyof typeof SAMPLING_SETTINGS;

/** A method's sampling settings: the declared ones it uses, with its own defaults where given. */
export function samplingSettings<const K extends SamplingKey>(keys: readonly K[], defaults: Partial<Record<K, number>> = {}): { [P in K]: (typeof SAMPLING_SETTINGS)[P] } {
  const out: Record<string, SettingDecl> = {};
  for (const k of keys) {
    const d = SAMPLING_SETTINGS[k];
    out[k] = defaults[k] === undefined ? d : { ...d, default: defaults[k]! };
  }
  return defineSettings(out as SettingTable) as unknown as { [P in K]: (typeof SAMPLING_SETTINGS)[P] };
}

/** The older names of the sampling settings (the library's fields, the flags' values), as settings. */
export interface SamplingAliases {
  /** max_completion_length (--max-new-tokens). */
  maxNewTokens?: number;
  temperature?: number;
  /** top_k (--top-k). */
  topK?: number;
  /** top_p (--top-p). */
  topP?: number;
  /** num_generations (SPPO's --samples). */
  samples?: number;
}

export function fromAliases(o: SamplingAliases): Record<string, number> {
  const out: Record<string, number> = {};
  if (o.maxNewTokens !== undefined) out.max_completion_length = o.maxNewTokens;
  if (o.temperature !== undefined) out.temperature = o.temperature;
  if (o.topK !== undefined) out.top_k = o.topK;
  if (o.topP !== undefined) out.top_p = o.topP;
  if (o.samples !== undefined) out.num_generations = o.samples;
  return out;
}

/** Resolved sampling settings as the sampler takes them. */
export function samplerOptions(s: { temperature: number; top_k: number; top_p: number; max_completion_length: number }) {
  return { temperature: s.temperature, topK: s.top_k, topP: s.top_p, maxNewTokens: s.max_completion_length };
}

/** `prefzoo generate`'s settings: the sampling ones, 64 tokens at most unless told. */
export const GENERATE_SETTINGS = samplingSettings(['max_completion_length', 'temperature', 'top_p', 'top_k'], { max_completion_length: 64 });
declareCommand('generate', { honours: [], own: GENERATE_SETTINGS, lossParams: 'none' });
export type GenerateSettings = SettingsOf<typeof GENERATE_SETTINGS>;

/** `generate`'s sampling as the sampler takes it: defaults → `configFile` → `params` → the older names → `settings`, each checked against its declaration. */
export function generateSampling(o: SamplingAliases & { params?: string[]; configFile?: string; settings?: Partial<GenerateSettings> }) {
  const { own } = resolveConfig({ configFile: o.configFile, params: o.params, settings: { ...fromAliases(o), ...o.settings }, command: 'generate' });
  return samplerOptions(own as GenerateSettings);
}
