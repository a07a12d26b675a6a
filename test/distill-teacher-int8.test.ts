/**
 * teacher_dtype=int8: the W8A8 products (src/models/quantize-int8.ts) against a float64 product of the
 * same quantized integers and scales (exact up to float32 rounding), the quantization rules themselves
 * against float64, per-token activations (a row's integers independent of the other rows), the
 * scorer's top K at int8 against the float32 teacher's float64 forward within the bounds docs/distill.md
 * states, the cache's record, and the refusals. A tiny teacher made here.
 */
import { describe, it, expect, beforeAll, afterAll } from 'vitest';
import { mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { Graph } from '../src/onnx/graph.ts';
import { Session, toOrt } from '../src/runtime/session.ts';
import { int8ExactHere, int8Initializers, matmulInt8, quantizeInt8Columns } from '../src/models/quantize-int8.ts';
import { loadModel } from '../src/models/load.ts';
import type { ModelConfig } from '../src/models/config.ts';
import { INT8_TEACHER, resolveTeacherDtype, teacherQuant, type TeacherQuant } from '../src/train/teacher-topk.ts';
import { distill } from '../src/train/distill.ts';
import { uniform } from '../src/random.ts';
import type { TokenizedExample } from '../datasets/examples.ts';
import type { RefWeights } from './helpers/reference-forward.ts';
import { distillModel } from './helpers/distill-fixtures.ts';
import { scoredAt, teacherGap, teacherRows } from './helpers/teacher-gap.ts';

const K = 6;
let dir: string;
let teacher: string;
beforeAll(() => {
  dir = mkdtempSync(join(tmpdir(), 'pz-teacher-int8-'));
  teacher = distillModel(join(dir, 'teacher'), 1);
});
afterAll(() => rmSync(dir, { recursive: true, force: true }));

/** The per-token product's output and its quantized activations and row scales, run on ONNX Runtime. */
async function int8Product(x: Float32Array, M: number, Kin: number, w: ReturnType<typeof quantizeInt8Columns>) {
  const g = new Graph('int8_product');
  const xi = g.input('x', 'float32', ['M', Kin]);
  const p = matmulInt8(g, xi, int8Initializers(g, 'w', w), { N: w.N, act: 'token' });
  g.output(p.y, 'y');
  g.output(p.u!, 'u');
  g.output(p.rowScale!, 's');
  const s = await Session.fromGraph(g, { threads: 1 });
  try {
    const r = await s.run({ x: toOrt('float32', x, [M, Kin]) });
    return { y: r.y.data as Float32Array, u: r.u.data as Uint8Array, s: r.s.data as Float32Array };
  } finally {
    await s.release();
  }
}

describe('teacher_dtype=int8: the W8A8 product', () => {
  const [M, Kin, N] = [5, 48, 7];
  // Weights of several magnitudes per channel; activations with one outlier token (row 2) and a zero row (4).
  const draws = (n: number, lo: number, hi: number, seed: number) => {
    const r = uniform(seed);
    return Float32Array.from({ length: n }, () => lo + (hi - lo) * r());
  };
  const W = Float32Array.from(draws(N * Kin, -1, 1, 11), (v, i) => v * (1 + Math.floor(i / Kin)));
  const x = Float32Array.from(draws(M * Kin, -2, 2, 12), (v, i) => (Math.floor(i / Kin) === 2 ? 300 * v : Math.floor(i / Kin) === 4 ? 0 : v));
  const w = quantizeInt8Columns(W, N, Kin);

  it('quantizes each weight channel symmetrically: s = max|W|/127, q = round(W/s), |q·s − W| ≤ s/2 (float64); a Conv1D [K, N] weight read transposed gives the same', () => {
    for (let n = 0; n < N; n++) {
      let amax = 0;
      for (let k = 0; k < Kin; k++) amax = Math.max(amax, Math.abs(W[n * Kin + k]));
      expect(w.scales[n]).toBe(Math.fround(amax / 127));
      let top = 0;
      for (let k = 0; k < Kin; k++) {
        const q = w.q[k * N + n];
        top = Math.max(top, Math.abs(q));
        expect(Math.abs(q * w.scales[n] - W[n * Kin + k])).toBeLessThanOrEqual(w.scales[n] / 2 + 1e-12);
      }
      expect(top).toBe(127);
    }
    const Wt = new Float32Array(Kin * N);
    for (let n = 0; n < N; n++) for (let k = 0; k < Kin; k++) Wt[k * N + n] = W[n * Kin + k];
    const t = quantizeInt8Columns(Wt, N, Kin, true);
    expect(t.q).toEqual(w.q);
    expect(t.scales).toEqual(w.scales);
  });

  it('is refused in one line on a CPU not known to have VNNI (its products can saturate there)', () => {
    expect(() => teacherQuant('int8', 32, 'cpu', { dtype: 'teacher_dtype', block: 'teacher_block_size' }, false)).toThrow(/^teacher_dtype=int8: this CPU is not known to have VNNI/);
    expect(teacherQuant('int8', 32, 'cpu', { dtype: 'teacher_dtype', block: 'teacher_block_size' }, true)).toEqual(INT8_TEACHER);
  });

  // The int8 kernels run exactly only with VNNI (int8ExactHere): elsewhere teacher_dtype=int8 is refused, above.
  it.skipIf(!int8ExactHere())('equals a float64 product of its own integers and scales to float32 rounding; each token quantized on its own scale', async () => {
    const { y, u, s } = await int8Product(x, M, Kin, w);
    for (let m = 0; m < M; m++) {
      let amax = 0;
      for (let k = 0; k < Kin; k++) amax = Math.max(amax, Math.abs(x[m * Kin + k]));
      // The row's scale is max|x|/127 and its integers are x/s rounded (within float32's rounding of the division).
      if (amax > 0) expect(Math.abs(s[m] - amax / 127)).toBeLessThanOrEqual(amax / 127 * 2 ** -23);
      for (let k = 0; k < Kin; k++) {
        expect(u[m * Kin + k]).toBeGreaterThanOrEqual(1);
        if (amax > 0) expect(Math.abs(u[m * Kin + k] - 128 - x[m * Kin + k] / s[m])).toBeLessThanOrEqual(0.5 + 1e-4);
        else expect(u[m * Kin + k]).toBe(128);
      }
      for (let n = 0; n < N; n++) {
        let acc = 0;
        for (let k = 0; k < Kin; k++) acc += (u[m * Kin + k] - 128) * w.q[k * N + n];
        const ref = s[m] * w.scales[n] * acc; // float64; the integer sum is exact
        // Two float32 roundings (the column scale's product, the row scale's): 2 units of 2^-24 relative.
        expect(Math.abs(y[m * N + n] - ref)).toBeLessThanOrEqual(Math.abs(ref) * 2.5 * 2 ** -24);
      }
    }
    // Per token: the outlier row leaves the others' integers alone (a per-tensor scale would flatten them).
    const calm = Float32Array.from(x, (v, i) => (Math.floor(i / Kin) === 2 ? v / 300 : v));
    const other = await int8Product(calm, M, Kin, w);
    for (const m of [0, 1, 3, 4]) expect(other.u.subarray(m * Kin, (m + 1) * Kin)).toEqual(u.subarray(m * Kin, (m + 1) * Kin));
    expect(new Set(u.subarray(0, Kin)).size).toBeGreaterThan(20);
  });
});

const scored = (rows: readonly TokenizedExample[], quant: TeacherQuant | null) => scoredAt(teacher, rows, K, quant);

describe.skipIf(!int8ExactHere())('teacher_dtype=int8: the scorer (a CPU with VNNI)', () => {
  it("top K against the float32 teacher's float64 forward: |Δ log p| mean ≤ 0.15, max ≤ 0.75, ids agree ≥ 0.9 (as q8's bounds)", async () => {
    const ref = loadModel(teacher) as { config: ModelConfig; weights: RefWeights };
    const rows = teacherRows(ref.config.vocab_size);
    const int8 = teacherGap(rows, await scored(rows, INT8_TEACHER), ref, K);
    const head = teacherGap(rows, await scored(rows, { ...INT8_TEACHER, head: true }), ref, K);
    // Quantized (not the float32 forward), and within the bounds.
    for (const q of [int8, head]) {
      expect(q.max).toBeGreaterThan(1e-3);
      expect(q.mean).toBeLessThanOrEqual(0.15);
      expect(q.max).toBeLessThanOrEqual(0.75);
      expect(q.agreement).toBeGreaterThanOrEqual(0.9);
    }
  });

  it('records int8 in the cache (read by the default, auto; an int8 cache refused to a q8 run); refused with teacher_block_size, seq_kd and off the CPU', async () => {
    const pairs = join(dir, 'pairs.jsonl');
    writeFileSync(pairs, Array.from({ length: 6 }, (_, i) => JSON.stringify({ prompt: `What is ${i} plus ${i + 1}?`, chosen: `It is ${2 * i + 1}.`, rejected: 'No idea.' })).join('\n') + '\n');
    const student = distillModel(join(dir, 'student'), 2, { tied: false, layers: 1 });
    const params = ['max_steps=1', 'save_steps=1', 'batch_size=6', `distill_topk=${K}`, 'pad_to_multiple_of=16'];
    const run = join(dir, 'run-int8');
    const r = await distill({ teacher, model: student, data: pairs, out: run, params: [...params, 'teacher_dtype=int8'] });
    expect(r.cached).toBe(false);
    expect(Number.isFinite(r.last.loss)).toBe(true);
    const again = await distill({ teacher, model: student, data: pairs, out: run, resume: true, params: [...params, 'max_steps=2', 'teacher_dtype=int8'] });
    expect(again.cached).toBe(true);
    // auto, the default, is int8 on a CPU with VNNI, as here: the same cache serves it.
    const byDefault = await distill({ teacher, model: student, data: pairs, out: run, resume: true, params: [...params, 'max_steps=3'] });
    expect(byDefault.cached).toBe(true);
    expect([resolveTeacherDtype('auto', 'cpu', false, true), resolveTeacherDtype('auto', 'cpu', true, true), resolveTeacherDtype('auto', 'webgpu', false, true), resolveTeacherDtype('auto', 'cpu', false, false), resolveTeacherDtype('q8', 'cpu', true)]).toEqual(['int8', 'f32', 'f32', 'f32', 'q8']);
    await expect(distill({ teacher, model: student, data: pairs, out: run, resume: true, params: [...params, 'max_steps=4', 'teacher_dtype=q8'] }))
      .rejects.toThrow(/teacher\.parquet: cached by a run with different teacher_dtype/);
    const refused = (extra: string[]) => distill({ teacher, model: student, data: pairs, out: join(dir, 'run-refused'), params: [...params, ...extra] });
    await expect(refused(['teacher_dtype=int8', 'teacher_block_size=64'])).rejects.toThrow(/^teacher_block_size=64: read by teacher_dtype q8\/q4 only, and teacher_dtype is int8/);
    await expect(refused(['teacher_dtype=int8', 'seq_kd=true', 'max_completion_length=4'])).rejects.toThrow(/^teacher_dtype=int8 with seq_kd/);
    expect(() => teacherQuant('int8', 32, 'webgpu', { dtype: 'teacher_dtype', block: 'teacher_block_size' })).toThrow(/^teacher_dtype=int8: the integer products .* on webgpu use f32/);
    expect(() => teacherQuant('int4', 32, 'cpu', { dtype: 'teacher_dtype', block: 'teacher_block_size' })).toThrow(/^teacher_dtype: "int4" is not one of auto, f32, f16, q8, q4, int8/);
  });
});
