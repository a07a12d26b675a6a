/**
 * teacher_dtype: the teacher's top-K scoring with its linear weights block-quantized once (q8/q4,
 * MatMulNBits). Its top-K log-probs and rest against a float64 forward of the float32 teacher
 * (test/helpers/reference-forward.ts) within the tolerances docs/distill.md states, q4 further off
 * than q8; the cache's record naming the precision (a q8 cache refused to a float32 run); and the
 * refusals. A tiny teacher made here.
 */
import { describe, it, expect, beforeAll, afterAll } from 'vitest';
import { mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { loadModel } from '../src/models/load.ts';
import type { ModelConfig } from '../src/models/config.ts';
import { TeacherSpec } from '../src/train/teacher-model.ts';
import { scoringRuntime, TeacherTopK, type TeacherRow } from '../src/train/teacher-topk.ts';
import { distill } from '../src/train/distill.ts';
import { dequantizeBlocks, quantizeBlocks, type ProductQuant } from '../src/models/quantize.ts';
import type { TokenizedExample } from '../datasets/examples.ts';
import { referenceLogits, type RefWeights } from './helpers/reference-forward.ts';
import { distillModel, logSoftmax } from './helpers/distill-fixtures.ts';

const K = 6;
let dir: string;
let teacher: string;
beforeAll(() => {
  dir = mkdtempSync(join(tmpdir(), 'pz-teacher-dtype-'));
  teacher = distillModel(join(dir, 'teacher'), 1);
});
afterAll(() => rmSync(dir, { recursive: true, force: true }));

/** Gap of scored rows to the float64 forward: |Δ log p| at the scorer's K ids, |Δ rest|, and the share of the float64 top K the scorer's K ids hold. */
function gap(rows: readonly TokenizedExample[], got: readonly TeacherRow[], ref: { config: ModelConfig; weights: RefWeights }) {
  const d: number[] = [];
  const rest: number[] = [];
  let agree = 0;
  let n = 0;
  rows.forEach((r, i) => {
    const seq = [...r.promptIds, ...r.responseIds[0]];
    const logits = referenceLogits(ref.config, ref.weights, seq);
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

/** Rows of several lengths over the teacher's ids. */
function rowsOf(V: number): TokenizedExample[] {
  return [3, 9, 5, 12].map((n, r) => ({
    promptIds: Array.from({ length: 2 + r }, (_, i) => 3 + ((r * 17 + i * 5) % (V - 3))),
    responseIds: [Array.from({ length: n }, (_, i) => 3 + ((r * 29 + i * 11) % (V - 3)))],
    src: r,
  }) as unknown as TokenizedExample);
}

async function scored(dir: string, rows: readonly TokenizedExample[], quant: ProductQuant | null): Promise<TeacherRow[]> {
  const t = TeacherSpec.of(dir, undefined, undefined).load();
  const s = await TeacherTopK.create(t, { K, limit: t.config.vocab_size, runtime: scoringRuntime({}), padId: 0, quant });
  try {
    return await s.score(rows, { batchSize: 2, padTo: 1 });
  } finally {
    await s.release();
  }
}

describe('teacher_dtype', () => {
  it("holds Q8_0's and Q4_0's weights: with float32 activations, the float64 forward of the dequantized weights to 1e-3", async () => {
    const untied = distillModel(join(dir, 'teacher-untied'), 3, { tied: false });
    const ref = loadModel(untied) as { config: ModelConfig; weights: RefWeights };
    const rows = rowsOf(ref.config.vocab_size);
    for (const bits of [8, 4] as const) {
      // Every product's weight (2-D, the embedding table aside: a Gather reads it) as its blocks read back.
      const deq: RefWeights = new Map([...ref.weights].map(([name, w]) => {
        if (w.shape.length !== 2 || name.includes('embed_tokens')) return [name, w];
        const [N, Kin] = w.shape;
        return [name, { shape: w.shape, data: dequantizeBlocks(quantizeBlocks(Float32Array.from(w.data), N, Kin, bits, 32)) }];
      }));
      const got = gap(rows, await scored(untied, rows, { bits, block: 32, accuracy: 0 }), { config: ref.config, weights: deq });
      expect(got.max).toBeLessThanOrEqual(1e-3);
      expect(got.rest).toBeLessThanOrEqual(1e-3);
      // ... and not the float32 weights' forward.
      expect(gap(rows, await scored(untied, rows, { bits, block: 32, accuracy: 0 }), ref).max).toBeGreaterThan(1e-2);
    }
  });

  it("teacher_dtype's q8 top K (int8 activations) against the float32 teacher's float64 forward: |Δ log p| mean ≤ 0.15, max ≤ 0.75, ids agree ≥ 0.9; q4 4× further off", async () => {
    const ref = loadModel(teacher) as { config: ModelConfig; weights: RefWeights };
    const rows = rowsOf(ref.config.vocab_size);
    const f32 = gap(rows, await scored(teacher, rows, null), ref);
    const q8 = gap(rows, await scored(teacher, rows, { bits: 8, block: 32 }), ref);
    const q4 = gap(rows, await scored(teacher, rows, { bits: 4, block: 32 }), ref);
    // The float32 scorer is the forward to float32 rounding; the quantized ones are not (they ran quantized).
    expect(f32.max).toBeLessThan(1e-4);
    expect(f32.agreement).toBe(1);
    expect(q8.max).toBeGreaterThan(1e-3);
    expect(q8.mean).toBeLessThanOrEqual(0.15);
    expect(q8.max).toBeLessThanOrEqual(0.75);
    expect(q8.rest).toBeLessThanOrEqual(0.25);
    expect(q8.agreement).toBeGreaterThanOrEqual(0.9);
    expect(q4.mean).toBeGreaterThan(4 * q8.mean);
  });

  it('records the precision in the cache: a q8 cache is refused to a float32 run; refusals in one line', async () => {
    const pairs = join(dir, 'pairs.jsonl');
    writeFileSync(pairs, Array.from({ length: 6 }, (_, i) => JSON.stringify({ prompt: `What is ${i} plus ${i + 1}?`, chosen: `It is ${2 * i + 1}.`, rejected: 'No idea.' })).join('\n') + '\n');
    const student = distillModel(join(dir, 'student'), 2, { tied: false, layers: 1 });
    const params = ['max_steps=1', 'save_steps=1', 'batch_size=6', `distill_topk=${K}`, 'pad_to_multiple_of=16'];
    const run = join(dir, 'run-q8');
    const r = await distill({ teacher, model: student, data: pairs, out: run, params: [...params, 'teacher_dtype=q8'] });
    expect(r.cached).toBe(false);
    expect(Number.isFinite(r.last.loss)).toBe(true);
    // The same precision reads the cache; the float32 teacher does not take a q8 teacher's targets.
    const again = await distill({ teacher, model: student, data: pairs, out: run, resume: true, params: [...params, 'max_steps=2', 'teacher_dtype=q8'] });
    expect(again.cached).toBe(true);
    await expect(distill({ teacher, model: student, data: pairs, out: run, resume: true, params: [...params, 'max_steps=3'] }))
      .rejects.toThrow(/teacher\.parquet: cached by a run with different teacher_dtype; a run keeps its teacher's targets/);
    const refused = (extra: string[]) => distill({ teacher, model: student, data: pairs, out: join(dir, 'run-refused'), params: [...params, ...extra] });
    await expect(refused(['teacher_dtype=f16'])).rejects.toThrow(/^teacher_dtype=f16: ONNX Runtime's CPU provider has no fast float16 product/);
    await expect(refused(['teacher_block_size=64'])).rejects.toThrow(/^teacher_block_size=64: read by teacher_dtype q8\/q4 only/);
    await expect(refused(['teacher_dtype=q8', 'teacher_block_size=48'])).rejects.toThrow(/^teacher_block_size=48: MatMulNBits takes a power of two/);
    await expect(refused(['teacher_dtype=q4', 'seq_kd=true', 'max_completion_length=4'])).rejects.toThrow(/^teacher_dtype=q4 with seq_kd/);
  });
});
