/**
 * What an export reads: a model folder (config.json, safetensors, tokenizer files), with a PEFT LoRA
 * adapter merged into it when one is given (`--adapter`) or when the folder itself is an adapter
 * folder whose `adapter_config.json` names its base model. The result is plain HF weights by name.
 */
import fs from 'node:fs';
import path from 'node:path';
import { UserError } from '../errors.ts';
import type { FloatTensor } from '../models/checkpoint.ts';
import type { ModelConfig } from '../models/config.ts';
import { loadModel } from '../models/load.ts';
import { mergeLora } from '../models/lora.ts';
import { ADAPTER_CONFIG, loadAdapter } from '../models/peft.ts';

export interface ExportSource {
  /** The folder holding config.json and the tokenizer files. */
  dir: string;
  config: ModelConfig;
  /** Base weights with any adapter merged in. */
  weights: Map<string, FloatTensor>;
  /** The adapter folder merged, if any. */
  adapter: string | null;
}

/** Reads `dir` (a model folder, or a PEFT adapter folder naming its base) and merges `adapter` if given. */
export function readExportSource(dir: string, adapter?: string): ExportSource {
  let base = dir;
  let adapterDir = adapter ?? null;
  if (!fs.existsSync(path.join(dir, 'config.json')) && fs.existsSync(path.join(dir, ADAPTER_CONFIG))) {
    if (adapterDir) throw new UserError(`--model ${dir} is an adapter folder and --adapter ${adapter} is another: give the base model as --model`);
    const file = path.join(dir, ADAPTER_CONFIG);
    let raw: Record<string, unknown>;
    try {
      raw = JSON.parse(fs.readFileSync(file, 'utf8'));
    } catch (e) {
      throw new UserError(`${file}: invalid JSON (${(e as Error).message})`);
    }
    const named = raw.base_model_name_or_path;
    if (typeof named !== 'string' || named === '') throw new UserError(`${file}: "base_model_name_or_path" is missing; pass the base model folder as --model and this folder as --adapter`);
    const resolved = path.isAbsolute(named) ? named : fs.existsSync(named) ? named : path.resolve(dir, named);
    if (!fs.existsSync(path.join(resolved, 'config.json'))) {
      throw new UserError(`${file}: base model "${named}" is not a model folder here; pass it as --model and this folder as --adapter`);
    }
    adapterDir = dir;
    base = resolved;
  }
  const m = loadModel(base);
  if (!adapterDir) return { dir: base, config: m.config, weights: m.weights, adapter: null };
  const a = loadAdapter(adapterDir, m.config);
  const all = new Map(m.weights);
  for (const [k, v] of a.weights) all.set(k, v);
  return { dir: base, config: m.config, weights: mergeLora(all, m.config, a.lora), adapter: adapterDir };
}

/** The tokenizer files a runtime reads beside the weights, copied as they are. */
export const TOKENIZER_FILES = /^(tokenizer\.json|tokenizer_config\.json|special_tokens_map\.json|generation_config\.json|chat_template\.jinja)$/;

/** Reads a JSON file of the model folder, or null when it is absent. */
export function readJsonIfAny(dir: string, name: string): Record<string, unknown> | null {
  const file = path.join(dir, name);
  if (!fs.existsSync(file)) return null;
  try {
    const v = JSON.parse(fs.readFileSync(file, 'utf8'));
    if (v === null || typeof v !== 'object' || Array.isArray(v)) throw new Error('not a JSON object');
    return v as Record<string, unknown>;
  } catch (e) {
    throw new UserError(`${file}: invalid JSON (${(e as Error).message})`);
  }
}
