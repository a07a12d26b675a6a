/**
 * LoRA adapters in PEFT's folder layout, so an adapter trained here loads with
 * `PeftModel.from_pretrained(base, DIR)` and one trained with PEFT continues here (`train --adapter`).
 *
 *   adapter_model.safetensors   the adapter tensors only, named `base_model.model.<module>.lora_A.weight`
 *                               and `….lora_B.weight` (PEFT wraps the HF model twice, PeftModel →
 *                               LoraModel, and strips the adapter name on save), A `[r, in]`, B `[out, r]`
 *                               for Linear and GPT-2's Conv1D alike
 *   adapter_config.json         `peft_type: "LORA"`, `r`, `lora_alpha`, `target_modules`, the base model's
 *                               path, `fan_in_fan_out` (true for GPT-2's Conv1D), `task_type: "CAUSAL_LM"`
 *
 * Reading accepts what this trainer can run: plain LoRA (no DoRA, rsLoRA, per-module rank or alpha
 * patterns, layer subsets or bias training); anything else is a one-line error naming the field.
 */
import fs from 'node:fs';
import path from 'node:path';
import { UserError } from '../errors.ts';
import { readSafetensors, tensorToFloat32, writeSafetensors, type TensorToWrite } from './safetensors.ts';
import type { FloatTensor } from './checkpoint.ts';
import type { ModelConfig } from './config.ts';
import { loraParameterShapes, projectionModules, type LoraConfig } from './lora.ts';

export const ADAPTER_WEIGHTS = 'adapter_model.safetensors';
export const ADAPTER_CONFIG = 'adapter_config.json';
/** The prefix PEFT's PeftModel(LoraModel(model)) wrapping adds to every state-dict key. */
export const PEFT_PREFIX = 'base_model.model.';

export interface LoadedAdapter {
  lora: LoraConfig;
  /** Adapter tensors under prefzoo's names (`<module>.lora_A.weight`). */
  weights: Map<string, FloatTensor>;
}

/** Writes `lora`'s adapter tensors out of `weights` to `dir` in PEFT's layout (temporary folder, renamed). */
export function saveAdapter(dir: string, weights: Map<string, FloatTensor>, o: { config: ModelConfig; lora: LoraConfig; baseModel: string }): void {
  const tensors = new Map<string, TensorToWrite>();
  for (const name of loraParameterShapes(o.config, o.lora).keys()) {
    const t = weights.get(name);
    if (!t) throw new Error(`saveAdapter: no tensor ${name}`);
    tensors.set(PEFT_PREFIX + name, { dtype: 'F32', shape: t.shape, data: t.data });
  }
  const cfg = {
    peft_type: 'LORA',
    task_type: 'CAUSAL_LM',
    base_model_name_or_path: path.resolve(o.baseModel),
    r: o.lora.rank,
    lora_alpha: o.lora.alpha,
    lora_dropout: 0,
    // PEFT matches these against the end of each module path exactly as loraModules does.
    target_modules: o.lora.targets.includes('all-linear') ? 'all-linear' : [...o.lora.targets],
    fan_in_fan_out: projectionModules(o.config).some((m) => m.layout === 'conv1d'),
    bias: 'none',
    use_rslora: false,
    use_dora: false,
    modules_to_save: null,
    inference_mode: true,
    init_lora_weights: true,
    layers_to_transform: null,
    layers_pattern: null,
    rank_pattern: {},
    alpha_pattern: {},
    revision: null,
  };
  const tmp = `${dir}.tmp-${process.pid}`;
  fs.rmSync(tmp, { recursive: true, force: true });
  fs.mkdirSync(tmp, { recursive: true });
  writeSafetensors(path.join(tmp, ADAPTER_WEIGHTS), tensors, { format: 'pt' });
  fs.writeFileSync(path.join(tmp, ADAPTER_CONFIG), JSON.stringify(cfg, null, 2) + '\n');
  fs.rmSync(dir, { recursive: true, force: true });
  fs.renameSync(tmp, dir);
}

function isEmpty(v: unknown): boolean {
  return v === undefined || v === null || v === false || (typeof v === 'object' && Object.keys(v as object).length === 0) || (Array.isArray(v) && v.length === 0);
}

/** Reads a PEFT LoRA adapter folder for a model of `config`; every tensor is checked by name and shape. */
export function loadAdapter(dir: string, config: ModelConfig): LoadedAdapter {
  const cfgFile = path.join(dir, ADAPTER_CONFIG);
  const wFile = path.join(dir, ADAPTER_WEIGHTS);
  if (!fs.existsSync(cfgFile)) throw new UserError(`${dir}: no ${ADAPTER_CONFIG} (expected a PEFT adapter folder)`);
  if (!fs.existsSync(wFile)) throw new UserError(`${dir}: no ${ADAPTER_WEIGHTS} (only safetensors adapters are read)`);
  let raw: Record<string, unknown>;
  try {
    raw = JSON.parse(fs.readFileSync(cfgFile, 'utf8'));
  } catch (e) {
    throw new UserError(`${cfgFile}: invalid JSON (${(e as Error).message})`);
  }
  const bad = (field: string, why: string) => new UserError(`${cfgFile}: "${field}" ${why}`);
  if (raw.peft_type !== 'LORA') throw bad('peft_type', `is ${JSON.stringify(raw.peft_type)}; only LORA adapters can be trained here`);
  const r = raw.r;
  if (typeof r !== 'number' || !Number.isInteger(r) || r < 1) throw bad('r', `must be a positive integer, got ${JSON.stringify(r)}`);
  const alpha = raw.lora_alpha ?? 8;
  if (typeof alpha !== 'number' || !(alpha > 0)) throw bad('lora_alpha', `must be a positive number, got ${JSON.stringify(alpha)}`);
  const tm = raw.target_modules;
  let targets: string[];
  if (Array.isArray(tm) && tm.length > 0 && tm.every((t) => typeof t === 'string')) targets = tm as string[];
  else if (tm === 'all-linear') targets = ['all-linear'];
  else throw bad('target_modules', `must be a list of module names or "all-linear" (a regular expression is not supported), got ${JSON.stringify(tm)}`);
  for (const f of ['use_dora', 'use_rslora', 'rank_pattern', 'alpha_pattern', 'layers_to_transform', 'modules_to_save']) {
    if (!isEmpty(raw[f])) throw bad(f, `is ${JSON.stringify(raw[f])}; only plain LoRA adapters are supported`);
  }
  if (raw.bias !== undefined && raw.bias !== 'none') throw bad('bias', `is ${JSON.stringify(raw.bias)}; only "none" is supported`);
  const lora: LoraConfig = { rank: r, alpha, targets };
  const shapes = loraParameterShapes(config, lora);
  const file = readSafetensors(wFile);
  const weights = new Map<string, FloatTensor>();
  for (const [key, t] of file.tensors) {
    if (!key.startsWith(PEFT_PREFIX)) throw new UserError(`${wFile}: tensor "${key}" does not start with "${PEFT_PREFIX}" (not a PEFT LoRA state dict)`);
    const name = key.slice(PEFT_PREFIX.length);
    const shape = shapes.get(name);
    if (!shape) throw new UserError(`${wFile}: tensor "${key}" is not an adapter of this ${config.model_type} model with target_modules ${JSON.stringify(targets)}`);
    if (shape.length !== t.shape.length || shape.some((d, i) => d !== t.shape[i])) {
      throw new UserError(`${wFile}: tensor "${key}" has shape [${t.shape.join(', ')}], expected [${shape.join(', ')}]`);
    }
    weights.set(name, { shape: [...t.shape], data: tensorToFloat32(t) });
  }
  for (const name of shapes.keys()) {
    if (!weights.has(name)) throw new UserError(`${wFile}: tensor "${PEFT_PREFIX}${name}" is missing`);
  }
  return { lora, weights };
}
