/**
 * The reference model π_ref of a training run: which weights it is (the starting policy, or a
 * separate model folder given with `train --ref DIR`), whether that folder can score the policy's
 * token ids, TR-DPO's soft update of it, and its identity (`model:DIR`, `model:DIR+adapter:DIR`),
 * which identity.ts records beside the cached reference log-probs.
 */
import { existsSync, readFileSync } from 'node:fs';
import { join, resolve } from 'node:path';
import { UserError } from '../errors.ts';
import type { FloatTensor } from '../models/checkpoint.ts';
import type { ModelConfig } from '../models/config.ts';
import { loadModel } from '../models/load.ts';
import { modelParameterShapes } from '../models/params.ts';

export interface ReferenceModel {
  config: ModelConfig;
  weights: Map<string, FloatTensor>;
  /** What produced these weights, as recorded with the cache (`model:DIR`, `model:DIR+adapter:DIR`). */
  identity: string;
}

/**
 * A separate reference model folder: any supported architecture, as long as it reads the same token
 * ids as the policy (the same tokenizer.json, or the same vocabulary size where a folder has none).
 */
export function loadReferenceModel(refDir: string, policyDir: string, policy: ModelConfig): ReferenceModel {
  if (!existsSync(join(refDir, 'config.json'))) throw new UserError(`--ref ${refDir}: not a model folder (no config.json)`);
  const ref = loadModel(refDir);
  const tokA = join(policyDir, 'tokenizer.json');
  const tokB = join(refDir, 'tokenizer.json');
  if (existsSync(tokA) && existsSync(tokB)) {
    if (!readFileSync(tokA).equals(readFileSync(tokB))) {
      throw new UserError(`--ref ${refDir}: its tokenizer.json differs from ${policyDir}'s; the reference must score the policy's token ids (use a model with the same tokenizer)`);
    }
  } else if (ref.config.vocab_size !== policy.vocab_size) {
    throw new UserError(`--ref ${refDir}: vocabulary of ${ref.config.vocab_size} tokens, the policy has ${policy.vocab_size}; the reference must score the policy's token ids`);
  }
  return { config: ref.config, weights: ref.weights, identity: `model:${resolve(refDir)}` };
}

/** Whether two configs have exactly the same parameters (names and shapes): TR-DPO mixes them elementwise. */
export function sameParameters(a: ModelConfig, b: ModelConfig): boolean {
  const sa = modelParameterShapes(a);
  const sb = modelParameterShapes(b);
  if (sa.size !== sb.size) return false;
  for (const [name, shape] of sa) {
    const o = sb.get(name);
    if (!o || o.length !== shape.length || o.some((d, i) => d !== shape[i])) return false;
  }
  return true;
}

/** Independent float32 copies (the moving reference of TR-DPO must not alias the policy's start). */
export function copyWeights(w: Map<string, FloatTensor>): Map<string, FloatTensor> {
  return new Map([...w].map(([k, t]) => [k, { shape: [...t.shape], data: Float32Array.from(t.data) }]));
}

/**
 * TR-DPO's soft update ("Learn Your Reference Model for Real Good Alignment", Gorbatovski et al.
 * 2024), in place: ref ← α·policy + (1 − α)·ref for every parameter of the reference, each element
 * formed in float64 and rounded once to float32. α = 1 is the hard update (ref becomes the policy).
 */
export function softUpdate(ref: Map<string, FloatTensor>, policy: Map<string, FloatTensor>, alpha: number): void {
  for (const [name, r] of ref) {
    const p = policy.get(name);
    if (!p || p.data.length !== r.data.length) throw new Error(`softUpdate: policy lacks ${name} or its shape differs`);
    const a = r.data;
    const b = p.data;
    for (let i = 0; i < a.length; i++) a[i] = alpha * b[i] + (1 - alpha) * a[i];
  }
}
