/**
 * The teacher's scoring session on the runtime distill now gives it (`scoringRuntime`: ONNX Runtime's
 * arena kept whatever the teacher's size) against the low-memory runtime it ran on before: the same
 * top-K ids, and log-probs and rest masses within float32 rounding, on rows of several lengths. A
 * tiny teacher made here.
 */
import { describe, it, expect, beforeAll, afterAll } from 'vitest';
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { TeacherSpec } from '../src/train/teacher-model.ts';
import { LOW_MEMORY_RUNTIME } from '../src/train/run.ts';
import { scoringRuntime, TeacherTopK, type TeacherRow } from '../src/train/teacher-topk.ts';
import type { TokenizedExample } from '../datasets/examples.ts';
import { distillModel } from './helpers/distill-fixtures.ts';

let dir: string;
beforeAll(() => {
  dir = mkdtempSync(join(tmpdir(), 'pz-distill-perf-'));
});
afterAll(() => rmSync(dir, { recursive: true, force: true }));

describe("the teacher's scoring runtime", () => {
  it('keeps the device and threads and drops the low-memory settings', () => {
    expect(scoringRuntime({ ep: 'cpu', threads: 2, ...LOW_MEMORY_RUNTIME })).toEqual({ ep: 'cpu', threads: 2, memPattern: false });
    expect(scoringRuntime({})).toEqual({ memPattern: false });
  });

  it('gives the top K of the low-memory runtime: ids equal, log-probs and rest within float32 rounding', async () => {
    const teacher = TeacherSpec.of(distillModel(join(dir, 'teacher'), 1), undefined, undefined).load();
    const V = teacher.config.vocab_size;
    const rows = [3, 9, 5, 12, 1].map((n, r) => ({
      promptIds: Array.from({ length: 2 + r }, (_, t) => 3 + ((r * 17 + t * 5) % (V - 3))),
      responseIds: [Array.from({ length: n }, (_, t) => 3 + ((r * 29 + t * 11) % (V - 3)))],
      src: r,
    }) as unknown as TokenizedExample);
    const score = async (runtime: object): Promise<TeacherRow[]> => {
      const t = await TeacherTopK.create(teacher, { K: 6, limit: V, runtime, padId: 0 });
      try {
        return await t.score(rows, { batchSize: 2, padTo: 1 });
      } finally {
        await t.release();
      }
    };
    const before = await score({ ...LOW_MEMORY_RUNTIME });
    const after = await score(scoringRuntime({}));
    expect(after.map((r) => r.rest.length)).toEqual([3, 9, 5, 12, 1]);
    const maxDiff = (a: Float32Array, b: Float32Array) => a.reduce((m, v, i) => Math.max(m, Math.abs(v - b[i]) / Math.max(1, Math.abs(b[i]))), 0);
    after.forEach((r, i) => {
      expect(Array.from(r.ids)).toEqual(Array.from(before[i].ids));
      expect(maxDiff(r.logps, before[i].logps)).toBeLessThanOrEqual(4e-7);
      expect(maxDiff(r.rest, before[i].rest)).toBeLessThanOrEqual(4e-7);
      // Peaked weights: the K ids hold a real share of the mass, so the rest is no constant.
      expect(Math.max(...r.rest)).toBeLessThan(-0.01);
    });
  });
});
