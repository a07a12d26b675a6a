/** What teacher_dtype's tests share (distill-teacher-dtype.test.ts, distill-teacher-int8.test.ts): scored rows, the scorer, the gap to a float64 forward. */
import type { ModelConfig } from '../../src/models/config.ts';
import { TeacherSpec } from '../../src/train/teacher-model.ts';
import { scoringRuntime, TeacherTopK, type TeacherQuant, type TeacherRow } from '../../src/train/teacher-topk.ts';
import type { TokenizedExample } from '../../datasets/examples.ts';
import { referenceLogits, type RefWeights } from './reference-forward.ts';
import { logSoftmax } from './distill-fixtures.ts';

/** Gap of scored rows (top K) to the float64 forward: |Δ log p| at the scorer's K ids, |Δ rest|, and the share of the float64 top K the scorer's K ids hold. */
export function teacherGap(rows: readonly TokenizedExample[], got: readonly TeacherRow[], ref: { config: ModelConfig; weights: RefWeights }, K: number) {
  const d: number[] = [];
  const rest: number[] = [];
  let agree = 0;
  let n = 0;
  rows.forEach((r, i) => {
    const logits = referenceLogits(ref.config, ref.weights, [...r.promptIds, ...r.responseIds[0]]);
    r.responseIds[0].forEach((_, k) => {
      const lp = logSoftmax(logits[r.promptIds.length - 1 + k]);
      const ids = Array.from(got[i].ids.subarray(k * K, (k + 1) * K));
      ids.forEach((id, j) => d.push(Math.abs(got[i].logps[k * K + j] - lp[id])));
      const top = new Set([...lp.keys()].sort((x, y) => lp[y] - lp[x]).slice(0, K));
      agree += ids.filter((id) => top.has(id)).length;
      n += K;
      const inTop = new Set(ids);
      rest.push(Math.abs(got[i].rest[k] - Math.log(lp.reduce((a, v, id) => a + (inTop.has(id) ? 0 : Math.exp(v)), 0))));
    });
  });
  return { mean: d.reduce((a, b) => a + b, 0) / d.length, max: Math.max(...d), rest: Math.max(...rest), agreement: agree / n };
}

/** Rows of several lengths over a teacher's V ids. */
export function teacherRows(V: number): TokenizedExample[] {
  return [3, 9, 5, 12].map((n, r) => ({
    promptIds: Array.from({ length: 2 + r }, (_, i) => 3 + ((r * 17 + i * 5) % (V - 3))),
    responseIds: [Array.from({ length: n }, (_, i) => 3 + ((r * 29 + i * 11) % (V - 3)))],
    src: r,
  }) as unknown as TokenizedExample);
}

/** The top K of the teacher in `dir` over `rows` at precision `quant`. */
export async function scoredAt(dir: string, rows: readonly TokenizedExample[], K: number, quant: TeacherQuant | null): Promise<TeacherRow[]> {
  const t = TeacherSpec.of(dir, undefined, undefined).load();
  const s = await TeacherTopK.create(t, { K, limit: t.config.vocab_size, runtime: scoringRuntime({}), padId: 0, quant });
  try {
    return await s.score(rows, { batchSize: 2, padTo: 1 });
  } finally {
    await s.release();
  }
}
