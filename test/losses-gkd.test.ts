/**
 * GKD (generalized JSD to a teacher, dense or top-K) against independent computations: the loss
 * written out in the probability domain from its definition, the published identities of the
 * divergences, central finite differences of the float64 reference, the ONNX subgraph in float64
 * and float32, and `prefzoo loss gkd` on small files.
 */
import { describe, it, expect } from 'vitest';
import { mkdtempSync, readFileSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join, resolve } from 'node:path';
import { uniform as rng } from '../src/random.ts';
import { UserError } from '../src/errors.ts';
import { resolveLoss, type BoundLoss } from '../losses/index.ts';
import { parseBatch } from '../losses/core/batch.ts';
import { runLossOnnx, runLossReference } from '../losses/core/engine.ts';
import { REST_FLOOR } from '../losses/gkd.ts';
import type { HostBatch } from '../losses/core/types.ts';
import { prefzoo } from './helpers/cli.ts';

type Grid = number[][][];
interface Json {
  student_logits: Grid;
  teacher_logits?: Grid;
  teacher_topk_ids?: Grid;
  teacher_topk_logps?: Grid;
  completion_mask: number[][];
}

const FIX = resolve(__dirname, 'fixtures', 'losses');
const BETAS = [0, 0.1, 0.5, 1];
const TEMPERATURES = [1, 2];

// ---- batches ----------------------------------------------------------------------------------

/** B = 2 completions of 3 positions over V tokens; row 1's middle position is padding holding junk. */
function denseJson(seed: number, V = 6, spread = 3): Json {
  const r = rng(seed);
  const mask = [[1, 1, 1], [1, 0, 1]];
  const logits = (junk: number) => mask.map((row) => row.map((on) => Array.from({ length: V }, () => (on ? spread * (2 * r() - 1) : junk))));
  return { student_logits: logits(40), teacher_logits: logits(-40), completion_mask: mask };
}

const sum = (xs: readonly number[]) => xs.reduce((a, b) => a + b, 0);
const logSoftmax = (xs: readonly number[]) => {
  const m = Math.max(...xs);
  const l = m + Math.log(sum(xs.map((x) => Math.exp(x - m))));
  return xs.map((x) => x - l);
};

/** The dense teacher as its top K: ids by falling logit, their log-probs at temperature 1. */
function sparseOf(json: Json, K: number): Json {
  const teacher = json.teacher_logits!;
  const ids = teacher.map((row) => row.map((pos) => pos.map((_, v) => v).sort((a, b) => pos[b] - pos[a]).slice(0, K)));
  const logps = teacher.map((row, b) => row.map((pos, t) => {
    const lp = logSoftmax(pos);
    return ids[b][t].map((v) => lp[v]);
  }));
  return { student_logits: json.student_logits, teacher_topk_ids: ids, teacher_topk_logps: logps, completion_mask: json.completion_mask };
}

function bind(beta: number, temperature: number): BoundLoss {
  return resolveLoss('gkd', { beta, temperature });
}

function batchOf(bound: BoundLoss, json: Json): HostBatch {
  return parseBatch(json, 'distill', bound.keys('distill'), 'test');
}

function without(json: Json, key: keyof Json): Record<string, unknown> {
  const { [key]: _, ...rest } = json;
  return rest;
}

function fround(batch: HostBatch): HostBatch {
  return Object.fromEntries(Object.entries(batch).map(([k, t]) => [k, { dims: t.dims, data: t.data.map(Math.fround) }]));
}

// ---- the loss from its definition, in probabilities -------------------------------------------

function softmaxAt(xs: readonly number[], tau: number): number[] {
  const m = Math.max(...xs);
  const e = xs.map((x) => Math.exp((x - m) / tau));
  const s = sum(e);
  return e.map((x) => x / s);
}

/** KL(p ‖ q) = Σ p·log(p/q), 0·log 0 = 0. */
function kl(p: readonly number[], q: readonly number[]): number {
  return sum(p.map((x, j) => (x > 0 ? x * Math.log(x / q[j]) : 0)));
}

/** β = 0: KL(T ‖ S); β = 1: KL(S ‖ T); else β·KL(T ‖ M) + (1 − β)·KL(S ‖ M), M = βT + (1 − β)S. */
function gjsdDirect(t: readonly number[], s: readonly number[], beta: number): number {
  if (beta === 0) return kl(t, s);
  if (beta === 1) return kl(s, t);
  const m = t.map((x, j) => beta * x + (1 - beta) * s[j]);
  return beta * kl(t, m) + (1 - beta) * kl(s, m);
}

/** A distribution raised to 1/τ and renormalised. */
function sharpen(p: readonly number[], tau: number): number[] {
  const q = p.map((x) => x ** (1 / tau));
  const s = sum(q);
  return q.map((x) => x / s);
}

/** The teacher's and student's distributions at one position: over V tokens, or the K ids and the rest. */
function distributions(json: Json, b: number, t: number, tau: number): { teacher: number[]; student: number[] } {
  const z = json.student_logits[b][t];
  if (json.teacher_logits) return { teacher: softmaxAt(json.teacher_logits[b][t], tau), student: softmaxAt(z, tau) };
  const ids = json.teacher_topk_ids![b][t];
  const p = softmaxAt(z, 1);
  const tk = json.teacher_topk_logps![b][t].map(Math.exp);
  const sk = ids.map((v) => p[v]);
  if (ids.length === z.length) return { teacher: sharpen(tk, tau), student: sharpen(sk, tau) };
  const outside = sum(p.filter((_, v) => !ids.includes(v)));
  return {
    teacher: sharpen([...tk, Math.max(1 - sum(tk), REST_FLOOR)], tau),
    student: sharpen([...sk, Math.max(outside, REST_FLOOR)], tau),
  };
}

/** Σ over counted positions of the per-position divergence, over their number. */
function lossDirect(json: Json, beta: number, tau: number, div = (t: number[], s: number[]) => gjsdDirect(t, s, beta)): number {
  let total = 0;
  let n = 0;
  json.completion_mask.forEach((row, b) => row.forEach((on, t) => {
    if (!on) return;
    const d = distributions(json, b, t, tau);
    total += div(d.teacher, d.student);
    n++;
  }));
  return total / Math.max(n, 1);
}

// ---- comparisons ------------------------------------------------------------------------------

const maxAbs = (xs: ArrayLike<number>) => Array.from(xs).reduce((a, x) => Math.max(a, Math.abs(x)), 0);

/** max |a − b| over the scale of b (float32 rounding is relative to the gradient's size, not each element's). */
function scaledErr(a: ArrayLike<number>, b: ArrayLike<number>): number {
  expect(a.length).toBe(b.length);
  let e = 0;
  for (let i = 0; i < b.length; i++) e = Math.max(e, Math.abs(a[i] - b[i]));
  return e / Math.max(maxAbs(b), 1e-300);
}

const relDiff = (a: number, b: number) => Math.abs(a - b) / Math.max(Math.abs(b), 1e-300);

/** Central differences of the reference's loss in every student logit. */
function finiteDiff(bound: BoundLoss, batch: HostBatch): Float64Array {
  const base = batch.student_logits.data;
  return base.map((x, i) => {
    const h = 1e-5;
    const at = (v: number) => {
      const data = Float64Array.from(base);
      data[i] = v;
      return bound.reference({ ...batch, student_logits: { dims: batch.student_logits.dims, data } }).loss;
    };
    return (at(x + h) - at(x - h)) / (2 * h);
  });
}

/** The reference, the ONNX graph in float64 and float32, and central differences, on one batch. */
async function expectAllAgree(bound: BoundLoss, json: Json, what: string): Promise<void> {
  const batch = batchOf(bound, json);
  const ref = runLossReference(bound, batch, { grad: true });
  const g = ref.grad.student_logits;
  expect(Number.isFinite(ref.loss) && g.every(Number.isFinite), `${what}: finite`).toBe(true);
  expect(scaledErr(finiteDiff(bound, batch), g), `${what}: finite differences`).toBeLessThanOrEqual(1e-7);

  const f64 = await runLossOnnx(bound, batch, { dtype: 'float64', grad: true });
  expect(relDiff(f64.loss, ref.loss), `${what}: onnx float64 loss`).toBeLessThanOrEqual(1e-12);
  expect(scaledErr(f64.grad.student_logits, g), `${what}: onnx float64 grad`).toBeLessThanOrEqual(1e-12);
  expect(scaledErr(f64.perExample, ref.perExample), `${what}: onnx float64 per_example`).toBeLessThanOrEqual(1e-12);

  const b32 = fround(batch);
  const ref32 = runLossReference(bound, b32, { grad: true });
  const f32 = await runLossOnnx(bound, b32, { dtype: 'float32', grad: true });
  expect(relDiff(f32.loss, ref32.loss), `${what}: onnx float32 loss`).toBeLessThanOrEqual(1e-5);
  expect(scaledErr(f32.grad.student_logits, ref32.grad.student_logits), `${what}: onnx float32 grad`).toBeLessThanOrEqual(1e-5);
}

// ---- tests ------------------------------------------------------------------------------------

describe('gkd: the float64 reference against the definition', () => {
  for (const form of ['dense', 'top-K'] as const) {
    it(`${form}: Σ over counted positions of the GJSD, over their number, for β ∈ {0, 0.1, 0.5, 1}, τ ∈ {1, 2}`, () => {
      for (const [i, beta] of BETAS.entries()) {
        for (const tau of [...TEMPERATURES, 0.5]) {
          const dense = denseJson(10 + i);
          const json = form === 'dense' ? dense : sparseOf(dense, 3);
          const bound = bind(beta, tau);
          const ref = bound.reference(batchOf(bound, json));
          const want = lossDirect(json, beta, tau);
          expect(relDiff(ref.loss, want), `β=${beta} τ=${tau}`).toBeLessThanOrEqual(1e-12);
          // Rows share the token count: per_example[b] = B·Σ_t m·ℓ / N, so their mean is the loss.
          expect(Math.abs(ref.perExample[0] + ref.perExample[1] - 2 * ref.loss)).toBeLessThanOrEqual(1e-14);
          expect(relDiff(ref.perExample[1], (2 * (gjsdAt(json, 1, 0, beta, tau) + gjsdAt(json, 1, 2, beta, tau))) / 5)).toBeLessThanOrEqual(1e-12);
        }
      }
    });
  }

  it('β = 0 is the forward KL(teacher ‖ student), β = 1 the reverse KL(student ‖ teacher), β = 0.5 the symmetric JSD', () => {
    const json = denseJson(21);
    const at = (beta: number, tau = 1) => bind(beta, tau).reference(batchOf(bind(beta, tau), json)).loss;
    expect(relDiff(at(0), lossDirect(json, 0, 1, (t, s) => kl(t, s)))).toBeLessThanOrEqual(1e-12);
    expect(relDiff(at(0, 2), lossDirect(json, 0, 2, (t, s) => kl(t, s)))).toBeLessThanOrEqual(1e-12);
    expect(relDiff(at(1), lossDirect(json, 1, 1, (t, s) => kl(s, t)))).toBeLessThanOrEqual(1e-12);
    const jsd = (t: number[], s: number[]) => {
      const m = t.map((x, j) => (x + s[j]) / 2);
      return (kl(t, m) + kl(s, m)) / 2;
    };
    expect(relDiff(at(0.5), lossDirect(json, 0.5, 1, jsd))).toBeLessThanOrEqual(1e-12);
    // The JSD is bounded by log 2 per position; the two KLs are not.
    expect(at(0.5)).toBeLessThan(Math.LN2);
    expect(at(0)).not.toBeCloseTo(at(1), 3);
  });

  it('swapping teacher and student maps β to 1 − β (JSD_0.5 is symmetric)', () => {
    const json = denseJson(22);
    const swapped: Json = { ...json, student_logits: json.teacher_logits!, teacher_logits: json.student_logits };
    for (const [beta, tau] of [[0.5, 1], [0.1, 2], [0.3, 1]]) {
      const a = bind(beta, tau).reference(batchOf(bind(beta, tau), json)).loss;
      const b = bind(1 - beta, tau).reference(batchOf(bind(1 - beta, tau), swapped)).loss;
      expect(relDiff(b, a), `β=${beta}`).toBeLessThanOrEqual(1e-12);
    }
    // The two KLs trade places the same way.
    const fwd = bind(0, 1).reference(batchOf(bind(0, 1), json)).loss;
    const rev = bind(1, 1).reference(batchOf(bind(1, 1), swapped)).loss;
    expect(relDiff(rev, fwd)).toBeLessThanOrEqual(1e-12);
  });

  it('is ≥ 0, and 0 with a zero gradient when the teacher is the student (dense and top-K)', () => {
    for (let seed = 30; seed < 36; seed++) {
      const json = denseJson(seed, 7, 5);
      for (const beta of BETAS) {
        const bound = bind(beta, 1 + (seed % 2));
        expect(bound.reference(batchOf(bound, json)).loss).toBeGreaterThan(0);
        expect(bound.reference(batchOf(bound, sparseOf(json, 2))).loss).toBeGreaterThan(0);
        const same = { ...json, teacher_logits: json.student_logits };
        for (const j of [same, sparseOf(same, 3)]) {
          const r = bound.reference(batchOf(bound, j));
          expect(Math.abs(r.loss)).toBeLessThanOrEqual(1e-14);
          expect(maxAbs(r.grad.student_logits)).toBeLessThanOrEqual(1e-14);
        }
      }
    }
  });

  it('a batch with no counted position gives 0 and a zero gradient', () => {
    const json = { ...denseJson(37), completion_mask: [[0, 0, 0], [0, 0, 0]] };
    const r = runLossReference(bind(0.5, 1), batchOf(bind(0.5, 1), json), { grad: true });
    expect(r.loss).toBe(0);
    expect(maxAbs(r.grad.student_logits)).toBe(0);
  });
});

/** One position's GJSD from the definition. */
function gjsdAt(json: Json, b: number, t: number, beta: number, tau: number): number {
  const d = distributions(json, b, t, tau);
  return gjsdDirect(d.teacher, d.student, beta);
}

describe('gkd: the top-K teacher against the dense form', () => {
  it('K = V − 1 (the rest is one token) and K = V (no rest): loss and gradient are the dense ones', () => {
    for (const [seed, V, K] of [[40, 6, 5], [43, 5, 5]]) {
      const json = denseJson(seed, V);
      for (const beta of BETAS) {
        for (const tau of TEMPERATURES) {
          const bound = bind(beta, tau);
          const dense = bound.reference(batchOf(bound, json));
          const sparse = bound.reference(batchOf(bound, sparseOf(json, K)));
          const what = `V=${V} K=${K} β=${beta} τ=${tau}`;
          expect(relDiff(sparse.loss, dense.loss), what).toBeLessThanOrEqual(1e-12);
          expect(scaledErr(sparse.grad.student_logits, dense.grad.student_logits), what).toBeLessThanOrEqual(1e-12);
        }
      }
    }
  });

  it("the teacher's mass all inside its top K: the dense form on the K + 1 outcomes (rest floored)", () => {
    const V = 7;
    const K = 3;
    const r = rng(41);
    const json = denseJson(42, V);
    // A teacher with support on K tokens: log-probs summing to 1.
    const ids = json.completion_mask.map((row) => row.map(() => [4, 1, 6]));
    const logps = ids.map((row) => row.map(() => logSoftmax([2 * r(), 2 * r() - 1, r() - 2])));
    const sparse: Json = { student_logits: json.student_logits, teacher_topk_ids: ids, teacher_topk_logps: logps, completion_mask: json.completion_mask };
    // The same outcomes as a dense batch: the student's K logits and log Σ exp of the others; the teacher's floor.
    const outside = [0, 2, 3, 5];
    const outcomes: Json = {
      student_logits: json.student_logits.map((row, b) => row.map((pos, t) => [...ids[b][t].map((v) => pos[v]), Math.log(sum(outside.map((v) => Math.exp(pos[v]))))])),
      teacher_logits: logps.map((row) => row.map((pos) => [...pos, Math.log(REST_FLOOR)])),
      completion_mask: json.completion_mask,
    };
    for (const beta of BETAS) {
      for (const tau of TEMPERATURES) {
        const bound = bind(beta, tau);
        const s = bound.reference(batchOf(bound, sparse));
        const d = bound.reference(batchOf(bound, outcomes));
        expect(relDiff(s.loss, d.loss), `β=${beta} τ=${tau}`).toBeLessThanOrEqual(1e-11);
        // The ids' gradients are the outcomes'; the rest's sum to the rest outcome's, spread as softmax within the rest.
        for (let i = 0; i < 6; i++) {
          const b = Math.floor(i / 3);
          const t = i % 3;
          const gs = s.grad.student_logits.subarray(i * V, (i + 1) * V);
          const gd = d.grad.student_logits.subarray(i * (K + 1), (i + 1) * (K + 1));
          ids[b][t].forEach((v, k) => expect(gs[v]).toBeCloseTo(gd[k], 13));
          expect(sum(outside.map((v) => gs[v]))).toBeCloseTo(gd[K], 13);
          const within = softmaxAt(outside.map((v) => json.student_logits[b][t][v]), 1);
          outside.forEach((v, j) => expect(gs[v]).toBeCloseTo(gd[K] * within[j], 13));
        }
      }
    }
  });

  it('a floored rest holds ε before temperature: at τ = 2 the loss is O(√ε) from the one with a rest of exactly 0', () => {
    // The teacher's K = 3 of V = 6 probabilities sum to 1: its rest is floored to ε, and ε^(1/τ) after temperature.
    const json = denseJson(44, 6);
    const ids = json.completion_mask.map((row) => row.map(() => [0, 1, 2]));
    const logps = ids.map((row) => row.map(() => logSoftmax([1, 0.3, -0.4])));
    const sparse: Json = { student_logits: json.student_logits, teacher_topk_ids: ids, teacher_topk_logps: logps, completion_mask: json.completion_mask };
    const bound = bind(0, 2);
    const got = bound.reference(batchOf(bound, sparse)).loss;
    let exact = 0;
    for (const [b, t] of [[0, 0], [0, 1], [0, 2], [1, 0], [1, 2]]) {
      const p = softmaxAt(json.student_logits[b][t], 1);
      const teacher = sharpen([...logps[b][t].map(Math.exp), 0], 2);
      const student = sharpen([p[0], p[1], p[2], p[3] + p[4] + p[5]], 2);
      exact += kl(teacher, student) / 5;
    }
    const moved = Math.abs(got - exact);
    expect(moved).toBeGreaterThan(0.1 * Math.sqrt(REST_FLOOR));
    expect(moved).toBeLessThanOrEqual(-Math.sqrt(REST_FLOOR) * Math.log(REST_FLOOR));
  });
});

describe('gkd: the KL metrics', () => {
  it('distill/kl = mean KL(S ‖ T) and distill/forward_kl = mean KL(T ‖ S) at temperature 1 over the outcomes, whatever β and τ; reference and ONNX graph', async () => {
    for (const form of ['dense', 'top-K'] as const) {
      for (const [beta, tau] of [[0.5, 2], [0.1, 1], [1, 1], [0, 1]] as const) {
        const dense = denseJson(70 + 10 * beta + tau);
        const json = form === 'dense' ? dense : sparseOf(dense, 3);
        const bound = bind(beta, tau);
        const batch = batchOf(bound, json);
        const reverse = lossDirect(json, beta, 1, (t, s) => kl(s, t));
        const forward = lossDirect(json, beta, 1, (t, s) => kl(t, s));
        expect(reverse).toBeGreaterThan(0.01); // the two models differ, so the check can fail
        expect(relDiff(reverse, forward)).toBeGreaterThan(1e-3);
        const what = `${form} β=${beta} τ=${tau}`;
        const ref = runLossReference(bound, batch);
        expect(relDiff(ref.metrics['distill/kl'], reverse), `${what}: reference reverse`).toBeLessThanOrEqual(1e-12);
        expect(relDiff(ref.metrics['distill/forward_kl'], forward), `${what}: reference forward`).toBeLessThanOrEqual(1e-12);
        const f64 = await runLossOnnx(bound, batch, { dtype: 'float64' });
        expect(relDiff(f64.metrics['distill/kl'], reverse), `${what}: onnx reverse`).toBeLessThanOrEqual(1e-12);
        expect(relDiff(f64.metrics['distill/forward_kl'], forward), `${what}: onnx forward`).toBeLessThanOrEqual(1e-12);
        // At τ = 1 the end points of β are these KLs themselves (GKD's definition).
        if (tau === 1 && beta === 1) expect(relDiff(ref.loss, reverse)).toBeLessThanOrEqual(1e-12);
        if (tau === 1 && beta === 0) expect(relDiff(ref.loss, forward)).toBeLessThanOrEqual(1e-12);
      }
    }
  });
});

describe('gkd: gradients and the ONNX subgraph', () => {
  for (const form of ['dense', 'top-K'] as const) {
    it(`${form}: reference = central differences, ONNX = reference (float64 1e-12, float32 1e-5 of the scale), masked positions included`, async () => {
      for (const [i, beta] of BETAS.entries()) {
        for (const tau of TEMPERATURES) {
          const dense = denseJson(50 + 2 * i + tau, 6, 4);
          await expectAllAgree(bind(beta, tau), form === 'dense' ? dense : sparseOf(dense, 2), `${form} β=${beta} τ=${tau}`);
        }
      }
    });
  }

  it('top-K edges: K = V, probabilities summing past 1 by rounding, a student rest below the floor, logits ±1e4', async () => {
    const full = sparseOf(denseJson(60, 5), 5);
    const base = sparseOf(denseJson(61, 6), 3);
    // Each position's K probabilities scaled to sum to 1 + 5e-3 (inside the tolerance): the rest is floored.
    const over: Json = {
      ...base,
      teacher_topk_logps: base.teacher_topk_logps!.map((row) => row.map((pos) => {
        const l = Math.log(sum(pos.map(Math.exp)));
        return pos.map((x) => Math.min(0, x - l + Math.log1p(5e-3)));
      })),
    };
    // The student's mass all but e^−60 inside the teacher's ids.
    const confident: Json = { ...base, student_logits: base.student_logits.map((row, b) => row.map((pos, t) => pos.map((x, v) => (base.teacher_topk_ids![b][t].includes(v) ? x + 30 : x - 30)))) };
    const extreme: Json = {
      student_logits: [[[1e4, -1e4, 0, 1], [-1e4, -1e4, 1e4, 0]]],
      teacher_topk_ids: [[[1, 0], [0, 3]]],
      teacher_topk_logps: [[[-1e-4, -1e4], [0, -2e4]]],
      completion_mask: [[1, 1]],
    };
    for (const beta of BETAS) {
      for (const [name, json] of [['K = V', full], ['Σ > 1', over], ['student rest < ε', confident]] as const) {
        const tau = beta === 0.5 ? 2 : 1;
        await expectAllAgree(bind(beta, tau), json, `${name} β=${beta}`);
        expect(relDiff(bind(beta, tau).reference(batchOf(bind(beta, tau), json)).loss, lossDirect(json, beta, tau)), `${name} β=${beta}`).toBeLessThanOrEqual(1e-10);
      }
      const bound = bind(beta, 1);
      const batch = batchOf(bound, extreme);
      const runs = [runLossReference(bound, batch, { grad: true }), await runLossOnnx(bound, batch, { dtype: 'float64', grad: true }), await runLossOnnx(bound, batch, { dtype: 'float32', grad: true })];
      for (const r of runs) expect([r.loss, ...r.grad.student_logits].every(Number.isFinite), `±1e4 β=${beta}`).toBe(true);
      expect(relDiff(runs[1].loss, runs[0].loss)).toBeLessThanOrEqual(1e-12);
    }
  });
});

describe('gkd: parameters and batches refused in one line', () => {
  const dense = denseJson(70, 4);
  const parse = (json: unknown) => () => parseBatch(json, 'distill', bind(0.5, 1).keys('distill'), 'f.json');
  const expectRefused = (json: unknown, re: RegExp) => {
    let err: unknown;
    try {
      parse(json)();
    } catch (e) {
      err = e;
    }
    expect(err).toBeInstanceOf(UserError);
    const msg = (err as Error).message;
    expect(msg.split('\n')).toHaveLength(1);
    expect(msg).toMatch(/^f\.json: /);
    expect(msg).toMatch(re);
  };

  it('beta outside [0, 1] and temperature ≤ 0 are refused naming the parameter', () => {
    expect(() => bind(1.5, 1)).toThrow(/^loss gkd: parameter beta must be \[0, 1\], got 1\.5$/);
    expect(() => bind(-0.1, 1)).toThrow(/parameter beta must be \[0, 1\]/);
    expect(() => bind(0.5, 0)).toThrow(/^loss gkd: parameter temperature must be \(0, ∞\), got 0$/);
    expect(resolveLoss('gkd').terms[0].params).toEqual({ beta: 0.5, temperature: 1 });
  });

  it('wrong shapes, mismatched B/T/V/K, a mask not 0/1, ids outside the vocabulary or repeated, probabilities past 1', () => {
    const sparse = sparseOf(dense, 2);
    expectRefused(without(dense, 'teacher_logits'), /missing keys: this loss needs teacher_logits, or teacher_topk_ids \+ teacher_topk_logps/);
    expectRefused({ ...dense, student_logits: dense.student_logits[0] }, /key "student_logits" must be an array of rows, each an array of positions/);
    expectRefused({ ...dense, student_logits: [[1, 2, 3, 4]] }, /key "student_logits" must be an array of rows, each an array of positions/);
    expectRefused({ ...dense, teacher_logits: dense.teacher_logits!.slice(0, 1) }, /key "teacher_logits" has 1 rows, expected 2/);
    expectRefused({ ...dense, completion_mask: [[1, 1], [1, 1]] }, /key "completion_mask" has rows of 2 tokens, expected 3/);
    expectRefused({ ...dense, teacher_logits: dense.teacher_logits!.map((row) => row.map((pos) => pos.slice(1))) }, /key "teacher_logits" has 3 logits per position, expected 4 like "student_logits"/);
    expectRefused({ ...dense, student_logits: [dense.student_logits[0], [dense.student_logits[1][0], [1, 2], dense.student_logits[1][2]]] }, /key "student_logits"\[1\]\[1\] must be an array of 4 numbers/);
    expectRefused({ ...dense, completion_mask: [[1, 2, 1], [1, 0, 1]] }, /key "completion_mask"\[0\]\[1\] must be 0 or 1/);
    expectRefused({ ...sparse, teacher_logits: dense.teacher_logits }, /give the teacher as "teacher_logits" or as "teacher_topk_ids" \+ "teacher_topk_logps", not both/);
    expectRefused(without(sparse, 'teacher_topk_logps'), /missing keys/);
    expectRefused({ ...sparse, teacher_topk_logps: sparse.teacher_topk_logps!.map((row) => row.map((pos) => [...pos, -9])) }, /key "teacher_topk_logps" has 3 entries per position, expected 2 like "teacher_topk_ids"/);
    expectRefused({ ...sparseOf(dense, 4), teacher_topk_ids: dense.student_logits.map((row) => row.map(() => [0, 1, 2, 3, 0])), teacher_topk_logps: dense.student_logits.map((row) => row.map(() => [-2, -2, -2, -2, -2])) }, /has 5 ids per position, more than the 4 logits of "student_logits"/);
    expectRefused({ ...sparse, teacher_topk_ids: [[[0, 1], [0, 4], [2, 3]], [[0, 1], [0, 1], [2, 3]]] }, /key "teacher_topk_ids"\[0\]\[1\]\[1\] is 4, outside the 4 logits of "student_logits"/);
    expectRefused({ ...sparse, teacher_topk_ids: [[[0, 1], [0, 1], [2, 3]], [[0, 1.5], [0, 1], [2, 3]]] }, /key "teacher_topk_ids"\[1\]\[0\]\[1\] must be an integer ≥ 0/);
    expectRefused({ ...sparse, teacher_topk_ids: [[[0, 1], [0, 1], [3, 3]], [[0, 1], [0, 1], [2, 3]]] }, /key "teacher_topk_ids"\[0\]\[2\] lists id 3 twice/);
    expectRefused({ ...sparse, teacher_topk_logps: [[[-0.1, -0.2], [-1, -1], [-1, -1]], [[-1, -1], [-1, -1], [-1, -1]]] }, /key "teacher_topk_logps"\[0\]\[0\] gives probabilities summing to 1\.724, more than 1/);
    expectRefused({ ...sparse, teacher_topk_logps: [[[0.5, -2], [-1, -1], [-1, -1]], [[-1, -1], [-1, -1], [-1, -1]]] }, /key "teacher_topk_logps"\[0\]\[0\]\[0\] must be a finite number ≤ 0/);
    // Padding may hold anything the loss never reads: repeated ids and probabilities past 1 at row 1's position 1.
    expect(() => parse({ ...sparse, teacher_topk_ids: [[[0, 1], [0, 1], [2, 3]], [[0, 1], [2, 2], [2, 3]]], teacher_topk_logps: [[[-1, -1], [-1, -1], [-1, -1]], [[-1, -1], [0, 0], [-1, -1]]] })()).not.toThrow();
  });
});

describe('prefzoo loss gkd', () => {
  it('prints the loss and grad.student_logits [B][T][V] (dense and top-K); a bad file is refused in one line; artifacts refuse gkd', async () => {
    const dir = mkdtempSync(join(tmpdir(), 'pz-gkd-'));
    const mismatched = join(dir, 'v.json');
    const dense = JSON.parse(readFileSync(join(FIX, 'distill.json'), 'utf8')) as Json;
    writeFileSync(mismatched, JSON.stringify({ ...dense, teacher_logits: dense.teacher_logits!.map((row) => row.map((pos) => pos.slice(0, 3))) }));
    const [a, b, c, art] = await Promise.all([
      prefzoo('loss', 'gkd', '--input', join(FIX, 'distill.json'), '--grad'),
      prefzoo('loss', 'gkd', '--input', join(FIX, 'distill-topk.json'), '--grad', '--param', 'beta=0', '--param', 'temperature=2'),
      prefzoo('loss', 'gkd', '--input', mismatched, '--grad'),
      // Refused before the model is read: its training graph computes no teacher.
      prefzoo('artifacts', '--model', dir, '--loss', 'gkd', '-o', join(dir, 'art')),
    ]);
    for (const [run, json, beta, tau] of [[a, dense, 0.5, 1], [b, JSON.parse(readFileSync(join(FIX, 'distill-topk.json'), 'utf8')) as Json, 0, 2]] as const) {
      expect(run.code, run.stderr).toBe(0);
      expect(run.stdout.trim().split('\n')).toHaveLength(1);
      const out = JSON.parse(run.stdout);
      expect(Object.keys(out)).toEqual(['loss', 'per_example', 'grad']);
      expect(relDiff(out.loss, lossDirect(json, beta, tau))).toBeLessThanOrEqual(1e-12);
      const grad = out.grad.student_logits as Grid;
      expect([grad.length, grad[0].length, grad[0][0].length]).toEqual([2, 2, 4]);
      expect(grad[1][1]).toEqual([0, 0, 0, 0]); // padding
      // Each position's gradient sums to 0 (softmax logits are shift-invariant) and is not all zero.
      for (const pos of [grad[0][0], grad[0][1], grad[1][0]]) {
        expect(Math.abs(sum(pos))).toBeLessThanOrEqual(1e-15);
        expect(maxAbs(pos)).toBeGreaterThan(1e-4);
      }
    }
    // The other refusals (mask, ids, parameters) are the parser's and resolveLoss's, tested above.
    expect(c.code).toBe(1);
    expect(c.stderr.trim().split('\n')).toHaveLength(1);
    expect(c.stderr).toMatch(/^prefzoo: .*v\.json: key "teacher_logits" has 3 logits per position, expected 4 like "student_logits"/);
    expect(art.code).toBe(1);
    expect(art.stderr).toBe("prefzoo: loss gkd reads a teacher's distribution over the vocabulary, which the training graph of prefzoo artifacts does not compute\n");
  });
});
