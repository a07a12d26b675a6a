/**
 * A model folder's config and weights, checked against the parameters the graph needs: every
 * tensor present with its expected shape (errors name the file), older layouts' names normalised
 * by the family (GPT-2's).
 */
import { UserError } from '../errors.ts';
import { type Checkpoint, type FloatTensor, loadCheckpoint } from './checkpoint.ts';
import { type ModelConfig, readConfig } from './config.ts';
import { familyFor } from './families.ts';
import { type ParameterOptions, modelParameterShapes } from './params.ts';

export interface LoadedModel {
  dir: string;
  config: ModelConfig;
  /** Exactly the parameters of `modelParameterShapes(config, opts)`, by name. */
  weights: Map<string, FloatTensor>;
}

export function loadModel(dir: string, opts: ParameterOptions = {}): LoadedModel {
  const config = readConfig(dir);
  const ckpt: Checkpoint = loadCheckpoint(dir);
  const normalize = familyFor(config).normalizeName;
  if (normalize) {
    for (const name of [...ckpt.keys()]) {
      const to = normalize(name);
      if (to === name) continue;
      const t = ckpt.get(name)!;
      const file = ckpt.files.get(name)!;
      ckpt.delete(name);
      if (to !== null && !ckpt.has(to)) {
        ckpt.set(to, t);
        ckpt.files.set(to, file);
      }
    }
  }
  const weights = new Map<string, FloatTensor>();
  for (const [name, shape] of modelParameterShapes(config, opts)) weights.set(name, ckpt.require(name, shape));
  for (const [name, t] of weights) {
    const i = firstNonFinite(t.data);
    if (i >= 0) {
      throw new UserError(
        `${ckpt.files.get(name) ?? dir}: tensor "${name}" holds ${t.data[i]} (element ${i}); the model's weights are damaged, so nothing it computes is meaningful: load an intact copy`,
      );
    }
  }
  return { dir, config, weights };
}

/** Index of the first NaN or ±Infinity, or -1. */
function firstNonFinite(xs: Float32Array): number {
  for (let i = 0; i < xs.length; i++) {
    // x - x is 0 for every finite x and NaN for NaN and ±Infinity.
    if (xs[i] - xs[i] !== 0) return i;
  }
  return -1;
}
