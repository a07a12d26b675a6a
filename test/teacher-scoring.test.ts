/**
 * The teacher's top-K scoring as distill runs it (src/train/teacher-topk.ts): the input cut short of
 * each row's last token, and the rest's log-mass from one TopK of K + 1 (`topKAndRest`) instead of a
 * mask over the vocabulary (`topKAndRestMasked`). Both against the way it ran before (the whole rows;
 * the masked log-sum-exp) and against float64: a float64 forward of the tiny teacher
 * (test/helpers/reference-forward.ts) and a float64 log-sum-exp over the ids outside the K.
 */
import { describe, it, expect, beforeAll, afterAll } from 'vitest';
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { Graph } from '../src/onnx/graph.ts';
import { Session, toOrt } from '../src/runtime/session.ts';
import { collate } from '../src/models/batch.ts';
import { loadModel } from '../src/models/load.ts';
import type { ModelConfig } from '../src/models/config.ts';
import { TeacherSpec } from '../src/train/teacher-model.ts';
import { buildTopKGraph, scoreIndex, scoringRuntime, TeacherTopK, topKAndRest, topKAndRestMasked, type TeacherRow } from '../src/train/teacher-topk.ts';
import type { TokenizedExample } from '../datasets/examples.ts';
import { referenceLogits, type RefWeights } from './helpers/reference-forward.ts';
import { distillModel, logSoftmax } from './helpers/distill-fixtures.ts';

let dir: string;
beforeAll(() => {
  dir = mkdtempSync(join(tmpdir(), 'pz-teacher-scoring-'));
});
afterAll(() => rmSync(dir, { recursive: true, force: true }));

/** float64 log Σ exp over the ids of `lp` not in `ids`. */
function restOf(lp: ArrayLike<number>, ids: ArrayLike<number>): number {
  const inTop = new Set(Array.from(ids));
  let m = -Infinity;
  for (let v = 0; v < lp.length; v++) if (!inTop.has(v)) m = Math.max(m, lp[v]);
  let s = 0;
  for (let v = 0; v < lp.length; v++) if (!inTop.has(v)) s += Math.exp(lp[v] - m);
  return m + Math.log(s);
}

describe("the teacher's top-K tail", () => {
  it('gives the masked tail\'s ids and log-probs, and the rest within float32 rounding of float64: ties, peaked, flat and cut-off rows', async () => {
    const K = 4;
    const V = 40;
    // Rows of log-probs (each normalised in float64): ties across the K-th place, a peaked row whose rest
    // is ~1e-30, a flat row, a row whose ids past 30 are cut off (−1e9, as logitsAt's limit makes them).
    const z: number[][] = [
      Array.from({ length: V }, (_, v) => (v % 7 === 0 ? 2 : -0.1 * v)),
      Array.from({ length: V }, (_, v) => (v < K ? 40 - v : -30 - 0.01 * v)),
      Array.from({ length: V }, () => 0),
      Array.from({ length: V }, (_, v) => (v >= 30 ? -1e9 : Math.sin(v) * 3)),
      Array.from({ length: V }, (_, v) => Math.cos(v * 1.7) * 8),
    ];
    const lp = z.map((row) => logSoftmax(Float64Array.from(row)));
    const data = Float32Array.from(lp.flatMap((r) => Array.from(r)));
    const run = async (tail: typeof topKAndRest) => {
      const g = new Graph('tail');
      const x = g.input('logp', 'float32', ['scored', V]);
      const t = tail(g, x, K);
      g.output(t.vals, 'vals');
      g.output(t.ids, 'ids');
      g.output(t.rest, 'rest');
      const s = await Session.fromGraph(g, {});
      try {
        const r = await s.run({ logp: toOrt('float32', data, [z.length, V]) });
        return { vals: r.vals.data as Float32Array, ids: Array.from(r.ids.data as BigInt64Array, Number), rest: r.rest.data as Float32Array };
      } finally {
        await s.release();
      }
    };
    const now = await run(topKAndRest);
    const before = await run(topKAndRestMasked);
    expect(now.ids).toEqual(before.ids);
    expect(Array.from(now.vals)).toEqual(Array.from(before.vals));
    // Ties: the lower id first (ids 0, 7, 14, 21 share the largest value).
    expect(now.ids.slice(0, K)).toEqual([0, 7, 14, 21]);
    lp.forEach((row, i) => {
      const ref = restOf(Array.from(data.subarray(i * V, (i + 1) * V)), now.ids.slice(i * K, (i + 1) * K));
      // float32 rounding of a sum of at most K + V terms each ≤ 1, relative to an outside sum ≥ 1.
      expect(Math.abs(now.rest[i] - ref)).toBeLessThanOrEqual(4e-6 * Math.max(1, Math.abs(ref)));
      expect(Math.abs(before.rest[i] - ref)).toBeLessThanOrEqual(4e-6 * Math.max(1, Math.abs(ref)));
    });
    // The peaked row's rest is tiny and still exact (1 − Σ of the K would read 0 in float32).
    expect(now.rest[1]).toBeLessThan(-60);
  });
});

describe("the teacher's scoring: each row less its last token", () => {
  it('equals the whole rows\' forward (ids equal, log-probs and rest within float32 rounding) and the float64 forward', async () => {
    const teacher = TeacherSpec.of(distillModel(join(dir, 'teacher'), 1), undefined, undefined).load();
    const V = teacher.config.vocab_size;
    const K = 6;
    const rows = [3, 9, 5, 12, 1, 7].map((n, r) => ({
      promptIds: Array.from({ length: 2 + r }, (_, t) => 3 + ((r * 17 + t * 5) % (V - 3))),
      responseIds: [Array.from({ length: n }, (_, t) => 3 + ((r * 29 + t * 11) % (V - 3)))],
      src: r,
    }) as unknown as TokenizedExample);
    const scorer = await TeacherTopK.create(teacher, { K, limit: V, runtime: scoringRuntime({}), padId: 0 });
    let now: TeacherRow[];
    let padded: TeacherRow[];
    try {
      now = await scorer.score(rows, { batchSize: 3, padTo: 1 });
      padded = await scorer.score(rows, { batchSize: 3, padTo: 8 });
    } finally {
      await scorer.release();
    }
    // Before: every row whole, one row per forward (no padding either), on the same graph.
    const session = await Session.fromGraph(buildTopKGraph(teacher, K, V), scoringRuntime({}));
    const before: TeacherRow[] = [];
    try {
      for (const row of rows) {
        const c = collate([row], { kind: 'single', padTo: 1, padId: 0, dtype: 'float32' });
        const index = scoreIndex(c.feeds.loss_mask.data as Float32Array, 1, c.length);
        const r = await session.run({ ...teacher.feeds(), input_ids: c.feeds.input_ids, attention_mask: c.feeds.attention_mask, score_index: toOrt('int64', index, [index.length]) });
        before.push({ ids: Int32Array.from(r.topk_ids.data as BigInt64Array, Number), logps: r.topk_logps.data as Float32Array, rest: r.rest_logp.data as Float32Array });
      }
    } finally {
      await session.release();
    }
    const rel = (a: Float32Array, b: Float32Array) => a.reduce((m, v, i) => Math.max(m, Math.abs(v - b[i]) / Math.max(1, Math.abs(b[i]))), 0);
    const ref = loadModel(join(dir, 'teacher')) as { config: ModelConfig; weights: RefWeights };
    expect(now.map((r) => r.rest.length)).toEqual([3, 9, 5, 12, 1, 7]);
    rows.forEach((row, i) => {
      for (const got of [now, padded]) {
        expect(Array.from(got[i].ids)).toEqual(Array.from(before[i].ids));
        expect(rel(got[i].logps, before[i].logps)).toBeLessThanOrEqual(1e-5);
        expect(rel(got[i].rest, before[i].rest)).toBeLessThanOrEqual(1e-5);
      }
      // float64: the teacher's forward over the whole row, log-softmax, the rest outside the scorer's ids.
      const logits = referenceLogits(ref.config, ref.weights, [...row.promptIds, ...row.responseIds[0]]);
      row.responseIds[0].forEach((_, k) => {
        const lp = logSoftmax(logits[row.promptIds.length - 1 + k]);
        const ids = Array.from(now[i].ids.subarray(k * K, (k + 1) * K));
        const top = [...lp.keys()].sort((a, b) => lp[b] - lp[a]).slice(0, K);
        expect(new Set(ids)).toEqual(new Set(top));
        ids.forEach((id, j) => expect(Math.abs(now[i].logps[k * K + j] - lp[id])).toBeLessThan(1e-4));
        expect(Math.abs(now[i].rest[k] - restOf(lp, ids))).toBeLessThan(1e-4);
      });
    });
  });
});
