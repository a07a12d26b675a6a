/** Models and helpers of the distillation tests (distill.test.ts, distill-online.test.ts). */
import { readFileSync } from 'node:fs';
import { join } from 'node:path';
import { initModelFolder } from '../../src/models/init.ts';
import { saveCheckpoint } from '../../src/models/checkpoint.ts';
import { parseConfig } from '../../src/models/config.ts';
import { randomWeights } from './model-fixtures.ts';
import { referenceLogits, type RefWeights } from './reference-forward.ts';
import type { ModelConfig } from '../../src/models/config.ts';
import { resolveLoss } from '../../losses/index.ts';
import { runLossReference } from '../../losses/core/engine.ts';

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

type Forward = { config: ModelConfig; weights: RefWeights };

/**
 * gkd's float64 reference over sampled rows: independent float64 forwards of teacher and student over
 * each row's prompt + ids, the teacher's top K (and the log of the rest) at every position whose next
 * token counts (the mask's 1s; every token without one), the student's logits there, the loss at `beta`.
 * `M`: the counted tokens.
 */
export function float64Gkd(T: Forward, S: Forward, rows: readonly { promptIds: readonly number[]; ids: readonly number[]; mask?: readonly number[] }[], K: number, beta: number) {
  const b = { logits: [] as number[], ids: [] as number[], logps: [] as number[], rest: [] as number[] };
  for (const r of rows) {
    const seq = [...r.promptIds, ...r.ids];
    const tl = referenceLogits(T.config, T.weights, seq);
    const sl = referenceLogits(S.config, S.weights, seq);
    r.ids.forEach((_, k) => {
      if (r.mask && !r.mask[k]) return;
      const p = r.promptIds.length - 1 + k; // predicts token k
      const lp = logSoftmax(tl[p]);
      const top = [...lp.keys()].sort((x, y) => lp[y] - lp[x]).slice(0, K);
      const inTop = new Set(top);
      b.logits.push(...sl[p]);
      b.ids.push(...top);
      b.logps.push(...top.map((id) => lp[id]));
      b.rest.push(Math.log(lp.reduce((a, v, id) => a + (inTop.has(id) ? 0 : Math.exp(v)), 0)));
    });
  }
  const M = b.rest.length;
  const V = S.config.vocab_size;
  const ref = runLossReference(resolveLoss('gkd', { beta }), {
    student_logits: { dims: [1, M, V], data: Float64Array.from(b.logits) },
    teacher_topk_ids: { dims: [1, M, K], data: Float64Array.from(b.ids) },
    teacher_topk_logps: { dims: [1, M, K], data: Float64Array.from(b.logps) },
    teacher_rest_logps: { dims: [1, M], data: Float64Array.from(b.rest) },
    completion_mask: { dims: [1, M], data: new Float64Array(M).fill(1) },
  });
  return { ref, M };
}
