/** Models and helpers of the distillation tests (distill.test.ts, distill-online.test.ts). */
import { readFileSync } from 'node:fs';
import { join } from 'node:path';
import { initModelFolder } from '../../src/models/init.ts';
import { saveCheckpoint } from '../../src/models/checkpoint.ts';
import { parseConfig } from '../../src/models/config.ts';
import { randomWeights } from './model-fixtures.ts';

/** A model folder with the generated tokenizer and spread-out random weights (peaked distributions), untied when asked. */
export function distillModel(out: string, seed: number, o: { tied?: boolean; layers?: number } = {}): string {
  initModelFolder(out, 'llama', 'tiny', seed, {}, o.layers ? { num_hidden_layers: o.layers } : {});
  const raw = JSON.parse(readFileSync(join(out, 'config.json'), 'utf8'));
  const config = parseConfig({ ...raw, tie_word_embeddings: o.tied ?? true });
  saveCheckpoint(out, randomWeights(config, seed), { config });
  return out;
}

/** Runs `run` with the fault hook that makes the loss NaN at `step` (the run stops there, its last checkpoint kept). */
export async function withNanAt<T>(step: number, run: () => Promise<T>): Promise<T> {
  process.env.PREFZOO_FAULT_NAN_AT_STEP = String(step);
  try {
    return await run();
  } finally {
    delete process.env.PREFZOO_FAULT_NAN_AT_STEP;
  }
}

/** log-softmax in float64. */
export function logSoftmax(x: Float64Array): Float64Array {
  const m = Math.max(...x);
  const lse = m + Math.log(x.reduce((a, v) => a + Math.exp(v - m), 0));
  return x.map((v) => v - lse);
}
