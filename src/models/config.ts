/**
 * Hugging Face `config.json` of the architectures prefzoo builds, read, written and preset. Each
 * architecture's fields, defaults, presets and tensor names live in its family file (llama.ts and the
 * members beside it, gpt2.ts), found through the registry (families.ts); the config types are in
 * family.ts. Fields keep their HF names so a config read from a model folder is written back
 * unchanged (unknown keys such as `rope_scaling` or `transformers_version` are preserved as-is).
 */
import fs from 'node:fs';
import path from 'node:path';
import { UserError } from '../errors.ts';
import { writeFileAtomic } from '../io/atomic.ts';
import { type Arch, type LlamaConfig, type ModelConfig, type SpecialIds, FieldReader } from './family.ts';
import { ARCHES, familyFor, familyOf, releasedPreset, releasedPresets } from './families.ts';

export { ACTIVATIONS, FieldReader } from './family.ts';
export type { Activation, Arch, CommonConfig, Gpt2Config, LlamaConfig, LlamaType, ModelConfig } from './family.ts';
export { ARCHES } from './families.ts';

/** Width of the residual stream, whichever architecture. */
export function hiddenSize(c: ModelConfig): number {
  return familyFor(c).hiddenSize(c);
}

export function numLayers(c: ModelConfig): number {
  return familyFor(c).numLayers(c);
}

export function maxPositions(c: ModelConfig): number {
  return familyFor(c).maxPositions(c);
}

/** The most positions a sequence may have where positions are a learned table (GPT-2), or null where rotary positions go on. */
export function positionLimit(c: ModelConfig): number | null {
  const f = familyFor(c);
  return f.learnedPositions ? f.maxPositions(c) : null;
}

/**
 * Validates a parsed config.json and fills the defaults HF's config classes use (the family's
 * `parse`). `where` names the file in error messages.
 */
export function parseConfig(raw: unknown, where = 'config.json'): ModelConfig {
  if (raw === null || typeof raw !== 'object' || Array.isArray(raw)) throw new UserError(`${where}: must be a JSON object`);
  const obj = raw as Record<string, unknown>;
  const type = obj.model_type;
  if (typeof type !== 'string') throw new UserError(`${where}: missing "model_type" (expected one of ${ARCHES.join(', ')})`);
  const family = familyOf(type, where);
  const r = new FieldReader(obj, where);
  const ids: SpecialIds = {
    bos_token_id: r.optionalTokenId('bos_token_id'),
    eos_token_id: r.optionalTokenIds('eos_token_id'),
    pad_token_id: r.optionalTokenId('pad_token_id'),
  };
  // Keep absent optional ids absent, so a read-then-write round trip does not add keys.
  for (const k of Object.keys(ids) as (keyof SpecialIds)[]) if (ids[k] === undefined) delete ids[k];
  return family.parse(r, ids, where);
}

/** Reads and validates `DIR/config.json`. */
export function readConfig(dir: string): ModelConfig {
  const file = path.join(dir, 'config.json');
  let text: string;
  try {
    text = fs.readFileSync(file, 'utf8');
  } catch (e) {
    const code = (e as NodeJS.ErrnoException).code;
    if (code === 'ENOENT') {
      throw new UserError(fs.existsSync(dir) ? `${file}: no such file (is ${dir} a Hugging Face model folder?)` : `${dir}: no such model folder`);
    }
    throw new UserError(`${file}: cannot read (${(e as Error).message})`);
  }
  let raw: unknown;
  try {
    raw = JSON.parse(text);
  } catch (e) {
    throw new UserError(`${file}: invalid JSON (${(e as Error).message})`);
  }
  return parseConfig(raw, file);
}

/** Writes `DIR/config.json` atomically, keys in a stable order (known fields as parsed, then the rest). */
export function writeConfig(dir: string, config: ModelConfig): void {
  fs.mkdirSync(dir, { recursive: true });
  const text = JSON.stringify(config, null, 2) + '\n';
  writeFileAtomic(path.join(dir, 'config.json'), [Buffer.from(text, 'utf8')]);
}

export interface PresetOptions {
  /** Tokenizer size; the embedding gets this rounded up to a multiple of 64. Default: the preset's own (required for tiny). */
  vocabSize?: number;
  bosTokenId?: number;
  eosTokenId?: number;
  padTokenId?: number;
}

/**
 * Presets of `init-model` and `bench`: `tiny` and `small` for every architecture, and shapes of
 * released models (random weights, real shapes; each family lists its own) for their own architecture.
 */
export const PRESETS: readonly string[] = ['tiny', 'small', ...releasedPresets()];
export type Preset = string;

/** The architecture a preset builds when none is named (released shapes fix theirs). */
export function presetArch(preset: Preset): Arch | null {
  return (releasedPreset(preset)?.family.model_type as Arch | undefined) ?? null;
}

/**
 * Config of a freshly initialised model for `prefzoo init-model`.
 * - tiny: hidden 64, 2 layers, 4 heads (2 KV heads), FFN 172, tied embeddings; well under 1M parameters
 *   with a few-hundred-token vocabulary (see {@link countParameters}).
 * - small: hidden 512, 8 layers, 8 heads (4 KV heads), FFN 1376, vocabulary 32000.
 * - smollm2-360m, qwen2.5-0.5b, qwen2.5-1.5b, qwen3-0.6b: those models' shapes and vocabulary sizes;
 *   `arch` must be the model's own.
 */
export function presetConfig(arch: string, preset: Preset, opts: PresetOptions = {}): ModelConfig {
  if (!ARCHES.includes(arch)) throw new UserError(`--arch: "${arch}" is not one of ${ARCHES.join(', ')}`);
  if (!PRESETS.includes(preset)) throw new UserError(`--preset: "${preset}" is not one of ${PRESETS.join(', ')}`);
  const family = familyOf(arch);
  const ids: Record<string, number> = {};
  if (opts.bosTokenId !== undefined) ids.bos_token_id = opts.bosTokenId;
  if (opts.eosTokenId !== undefined) ids.eos_token_id = opts.eosTokenId;
  if (opts.padTokenId !== undefined) ids.pad_token_id = opts.padTokenId;
  const released = releasedPreset(preset);
  if (released) {
    const { shape } = released;
    const own = released.family.model_type;
    if (released.family !== family) throw new UserError(`--preset ${preset} is a ${own} model, not ${arch} (leave out --arch or pass --arch ${own})`);
    const vocab_size = opts.vocabSize === undefined ? shape.vocab_size : Math.ceil(opts.vocabSize / 64) * 64;
    return parseConfig({ architectures: [family.hfClass], ...shape, vocab_size, ...ids, torch_dtype: 'float32' }, `preset ${preset}`);
  }
  const tiny = preset === 'tiny';
  const wanted = opts.vocabSize ?? (tiny ? undefined : 32000);
  if (wanted === undefined) throw new Error('presetConfig: the tiny preset needs the tokenizer size (vocabSize)');
  const vocab_size = Math.ceil(wanted / 64) * 64;
  const raw = { architectures: [family.hfClass], model_type: arch, ...family.preset(tiny, vocab_size), ...ids, torch_dtype: 'float32' };
  return parseConfig(raw, `preset ${arch}/${preset}`);
}

/**
 * Parameter names and shapes of an HF checkpoint of this config (names exactly as HF saves them;
 * weights are [out, in] for llama-family Linear layers and [in, out] for GPT-2's Conv1D).
 * Tied output heads are not listed, as HF does not save them.
 */
export function parameterShapes(c: ModelConfig): Map<string, number[]> {
  return familyFor(c).parameterShapes(c);
}

/** Total number of parameters of a model with this config (tied heads counted once). */
export function countParameters(c: ModelConfig): number {
  let n = 0;
  for (const shape of parameterShapes(c).values()) n += shape.reduce((a, b) => a * b, 1);
  return n;
}
