/**
 * The registry of architectures: one line per family file. Everything outside the family files
 * finds an architecture here by its `model_type`, never by comparing it.
 */
import { UserError } from '../errors.ts';
import type { Family, ModelConfig } from './family.ts';
import { GEMMA } from './gemma.ts';
import { GPT2 } from './gpt2.ts';
import { LLAMA, QWEN2 } from './llama.ts';
import { MISTRAL } from './mistral.ts';
import { PHI3 } from './phi3.ts';
import { QWEN3 } from './qwen3.ts';

const FAMILIES: Family[] = [LLAMA, QWEN2, QWEN3, MISTRAL, GEMMA, PHI3, GPT2];

/** The supported model_types, in registry order (kept current by {@link registerFamily}). */
export const ARCHES: string[] = FAMILIES.map((f) => f.model_type);

/** Adds a family at run time (what a line in FAMILIES does for the shipped ones). */
export function registerFamily(f: Family): void {
  if (ARCHES.includes(f.model_type)) throw new Error(`registerFamily: model_type "${f.model_type}" is already registered`);
  FAMILIES.push(f);
  ARCHES.push(f.model_type);
}

/** The family of a model_type; an unknown one is a one-line error naming `where` and the supported ones. */
export function familyOf(type: string, where = 'config.json'): Family {
  const f = FAMILIES.find((x) => x.model_type === type);
  if (!f) throw new UserError(`${where}: model_type "${type}" is not supported (supported: ${ARCHES.join(', ')})`);
  return f;
}

/** The family of a parsed config. */
export function familyFor(c: ModelConfig): Family {
  return familyOf(c.model_type);
}

/** The family a released preset belongs to, with its config.json fields, or undefined. */
export function releasedPreset(name: string): { family: Family; shape: Record<string, unknown> } | undefined {
  for (const family of FAMILIES) {
    const shape = family.released?.[name];
    if (shape) return { family, shape };
  }
  return undefined;
}

/** Names of the released presets, in registry order. */
export function releasedPresets(): string[] {
  return FAMILIES.flatMap((f) => Object.keys(f.released ?? {}));
}
