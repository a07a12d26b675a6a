/**
 * The configuration of a training command. Values come from, in increasing priority: the defaults
 * of TRAIN_SETTINGS (settings.ts) with the command's own defaults over them (`declareCommand`), `--config FILE` (JSON, or YAML with TRL's names: settings-trl.ts),
 * then `--param key=value`; keys that are not settings are the loss's parameters, such as `beta`.
 */
import { readFileSync } from 'node:fs';
import { createRequire } from 'node:module';
import { BadInputError, UserError } from '../errors.ts';
import { getLoss, listLosses, parseLossSpec } from '../../losses/index.ts';
import { coerceSetting, commandDecl, commandDefaults, defaultsOf, refuseUnhonoured, TRAIN_SETTINGS, unknownSetting, type SettingDecl, type TrainSettings } from './settings.ts';
import { fromTrl, type TrlFlags } from './settings-trl.ts';

/**
 * The settings of a training run, one typed field per row of TRAIN_SETTINGS (src/train/settings.ts):
 * the table is the only place a setting, its type, default, range and meaning are written.
 */
export type TrainConfig = TrainSettings;

export const DEFAULT_CONFIG: TrainConfig = defaultsOf(TRAIN_SETTINGS);

export function isConfigKey(k: string): k is keyof TrainConfig {
  return Object.prototype.hasOwnProperty.call(TRAIN_SETTINGS, k);
}

/** Splits `k=v` strings; a missing `=` is an error naming the flag. */
export function parseParams(pairs: readonly string[]): Record<string, string> {
  const out: Record<string, string> = {};
  for (const p of pairs) {
    const i = p.indexOf('=');
    if (i <= 0) throw new UserError(`--param expects key=value, got "${p}"`);
    out[p.slice(0, i).trim()] = p.slice(i + 1).trim();
  }
  return out;
}

export interface ResolvedConfig {
  config: TrainConfig;
  /** Everything that is not a trainer key: the loss's parameters, validated by the loss. */
  lossParams: Record<string, string | number | boolean>;
  /** The command's own settings (CommandDecl.own), by name. */
  own: Record<string, string | number | boolean>;
  /** What a TRL YAML config said that the command's flags say in prefzoo (model, data, output folder, loss). */
  trl?: TrlFlags;
  /** The names given by --config, --param or `settings` (settings, own settings, loss parameters), not the defaults. */
  named: Set<string>;
}

export interface ResolveOptions {
  configFile?: string;
  params?: readonly string[];
  /** Settings and loss parameters by name, typed (the library's): applied after `params`, checked and refused as they are. */
  settings?: Readonly<Record<string, unknown>>;
  /** Settings applied under --config and --param (a caller's defaults): never refused. */
  base?: Partial<TrainConfig>;
  /** The command whose settings these are (settings.ts `declareCommand`): a given setting it does not honour is refused. */
  command?: string;
  /** The loss spec (`dpo`, `dpo:0.8,sft:0.2`), so an unknown key is matched against its parameters. */
  loss?: string;
}

/** Loss parameter names (and aliases) a key may be: of the loss spec, of the command's fixed loss, or of every loss. */
function lossParamNames(spec: string | undefined): string[] | null {
  let losses = listLosses();
  if (spec) {
    try {
      losses = parseLossSpec(spec).map((t) => getLoss(t.name));
    } catch {
      return null; // an unknown loss is reported by resolveLoss, naming the losses there are
    }
  }
  return losses.flatMap((l) => l.params.flatMap((p) => [p.name, ...(p.aliases ?? [])]));
}

/** Reads a --config file: a JSON object, or YAML (`.yaml`/`.yml`), whose keys may be TRL's. */
function readConfigFile(file: string, own: Record<string, SettingDecl>): { values: Record<string, unknown>; trl?: TrlFlags } {
  const yaml = /\.ya?ml$/i.test(file);
  let parsed: unknown;
  try {
    const text = readFileSync(file, 'utf8');
    // yaml is required only here, not with every command that resolves settings.
    parsed = yaml ? (createRequire(import.meta.url)('yaml') as typeof import('yaml')).parse(text) : JSON.parse(text);
  } catch (e) {
    throw new UserError(`${file}: ${(e as Error).message.split('\n')[0]}`);
  }
  if (!parsed || typeof parsed !== 'object' || Array.isArray(parsed)) throw new UserError(`${file}: expected ${yaml ? 'a YAML mapping' : 'a JSON object'} of settings`);
  if (!yaml) return { values: parsed as Record<string, unknown> };
  const m = fromTrl(parsed as Record<string, unknown>, file, own);
  return { values: m.values, trl: m.flags };
}

/** Merges defaults, a JSON or YAML config file and --param overrides; checks every value against its declaration. */
export function resolveConfig(opts: ResolveOptions): ResolvedConfig {
  const decl = opts.command ? commandDecl(opts.command) : null;
  const ownTable: Record<string, SettingDecl> = { ...decl?.own };
  const config: TrainConfig = decl ? commandDefaults(decl.name) : { ...DEFAULT_CONFIG };
  const own: Record<string, string | number | boolean> = Object.fromEntries(Object.entries(ownTable).map(([k, d]) => [k, d.default]));
  const lossParams: Record<string, string | number | boolean> = {};
  const given = new Set<string>();
  const named = new Set<string>();
  const apply = (src: Record<string, unknown>, where: string, user: boolean) => {
    for (const [k, v] of Object.entries(src)) {
      if (user && k !== 'loss_params') named.add(k);
      if (k === 'loss_params' && v && typeof v === 'object') {
        Object.assign(lossParams, v);
        if (user) for (const p of Object.keys(v)) named.add(p);
      } else if (Object.prototype.hasOwnProperty.call(ownTable, k)) {
        own[k] = coerceSetting(k, ownTable[k], v, where);
      } else if (isConfigKey(k)) {
        (config as unknown as Record<string, unknown>)[k] = coerceSetting(k, TRAIN_SETTINGS[k], v, where);
        if (user) given.add(k);
      } else {
        lossParams[k] = v as string | number | boolean;
      }
    }
  };
  if (opts.base) apply(opts.base as Record<string, unknown>, 'defaults', false);
  let trl: TrlFlags | undefined;
  if (opts.configFile) {
    const f = readConfigFile(opts.configFile, ownTable);
    trl = f.trl;
    apply(f.values, opts.configFile, true);
  }
  apply(parseParams(opts.params ?? []), '--param', true);
  if (opts.settings) apply(Object.fromEntries(Object.entries(opts.settings).filter(([, v]) => v !== undefined).map(([k, v]) => [k, v === null ? '' : v])), 'settings', true);
  // A key that is neither a setting nor a parameter of the loss: the nearest name of either.
  const fixedLoss = decl && decl.lossParams !== 'any' ? decl.lossParams : undefined;
  const lossSpec = opts.loss ?? trl?.loss ?? (fixedLoss !== 'none' ? fixedLoss : undefined);
  const params = fixedLoss === 'none' ? [] : lossParamNames(lossSpec);
  if (params) {
    // Every setting is a candidate (one the command does not honour is then refused by name).
    const settings = [...Object.keys(TRAIN_SETTINGS), ...Object.keys(ownTable)];
    for (const k of Object.keys(lossParams)) {
      if (params.includes(k)) continue;
      // TRL's name of a setting that has another name here (GKD's max_new_tokens): say which.
      const trl = (Object.entries({ ...TRAIN_SETTINGS, ...ownTable }) as [string, SettingDecl][]).find(([, d]) => d.trl === k)?.[0];
      if (trl) throw new BadInputError(`${decl ? `${decl.name}: ` : ''}unknown setting '${k}'; TRL's ${k} is '${trl}' here (a TRL YAML --config maps it)`, { setting: k });
      throw unknownSetting(k, [...settings, ...params], decl?.name);
    }
  }
  if (decl) refuseUnhonoured(decl.name, given);
  if (config.base_dtype !== 'float32' && config.lora_r === 0) {
    throw new BadInputError(`base_dtype=${config.base_dtype} needs LoRA (lora_r > 0): without adapters every weight is trained and stays float32`, { setting: 'base_dtype' });
  }
  if (config.load_in_4bit && config.lora_r === 0) {
    throw new BadInputError('load_in_4bit=true needs LoRA (lora_r > 0): without adapters every weight is trained and stays float32', { setting: 'load_in_4bit' });
  }
  if (config.load_in_4bit && config.device !== 'cpu') {
    throw new BadInputError(`load_in_4bit=true runs on the CPU only (its dequantization kernel, GatherBlockQuantized, is not verified on ${config.device}); leave device out or set device=cpu`, { setting: 'load_in_4bit' });
  }
  for (const k of ['quant_block_size', 'bnb_4bit_quant_type'] as const) {
    if (!config.load_in_4bit && named.has(k)) throw new BadInputError(`${k} is a setting of the 4-bit base; it needs load_in_4bit=true`, { setting: k });
  }
  if (!config.save_merged && !config.save_adapter) {
    throw new BadInputError('save_merged=false needs save_adapter=true (otherwise the run would save no model)', { setting: 'save_merged' });
  }
  if (config.max_prompt_length >= config.max_length) {
    throw new BadInputError(`max_prompt_length (${config.max_prompt_length}) must be smaller than max_length (${config.max_length})`, { setting: 'max_prompt_length' });
  }
  if (config.load_best_model_at_end && !(config.eval_data && config.eval_steps > 0)) {
    throw new BadInputError('load_best_model_at_end needs eval_data and eval_steps > 0 (the best checkpoint is chosen by evaluation)', { setting: 'load_best_model_at_end' });
  }
  if (config.compute_dtype === 'float16' && config.device === 'cpu') {
    throw new BadInputError('compute_dtype=float16 is for the GPU (device=webgpu or cuda); on the CPU float32 is faster and exact', { setting: 'compute_dtype' });
  }
  if (config.eval_generate > 0 && !config.eval_data) throw new BadInputError('eval_generate needs eval_data (its prompts are generated from)', { setting: 'eval_generate' });
  return { config, lossParams, own, named, ...(trl ? { trl } : {}) };
}
