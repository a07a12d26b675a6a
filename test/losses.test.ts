/**
 * The loss zoo against independent computations: hand values from the formulas, central finite
 * differences of the float64 reference, the ONNX subgraph (float64 1e-9, float32 1e-5) with its
 * autodiff gradients, extreme log-ratios, and the published identities of docs/losses.md.
 */
import { describe, it, expect } from 'vitest';
import { UserError } from '../src/errors.ts';
import { uniform as rng } from '../src/random.ts';
import { getLoss, listLosses, parseLossSpec, resolveLoss, mpoSplit, quantile, scheduleOf, type BoundLoss } from '../losses/index.ts';
import { parseBatch, detectKind } from '../losses/core/batch.ts';
import { runLossOnnx, runLossReference, type LossRun } from '../losses/core/engine.ts';
import { MPO_STAGE2_LOSSES } from '../losses/mpo.ts';
import type { HostBatch, Kind } from '../losses/core/types.ts';

// ---- batches ----------------------------------------------------------------------------------

type Json = Record<string, unknown>;

function pairJson(seed = 1, B = 5): Json {
  const r = rng(seed);
  const u = (lo: number, hi: number) => lo + (hi - lo) * r();
  const pw = Array.from({ length: B }, () => -u(5, 40));
  const pl = Array.from({ length: B }, () => -u(5, 40));
  return {
    policy_chosen_logps: pw,
    policy_rejected_logps: pl,
    ref_chosen_logps: pw.map((x) => x + u(-4, 4)),
    ref_rejected_logps: pl.map((x) => x + u(-4, 4)),
    chosen_tokens: pw.map(() => 1 + Math.floor(u(0, 20))),
    rejected_tokens: pw.map(() => 1 + Math.floor(u(0, 20))),
    chosen_probs: pw.map(() => u(0, 1)),
    rejected_probs: pw.map(() => u(0, 1)),
    chosen_wpo_logps: pw.map((x) => x - u(0, 3)),
    rejected_wpo_logps: pl.map((x) => x - u(0, 3)),
  };
}

function listJson(seed = 2, B = 3, K = 5): Json {
  const r = rng(seed);
  const u = (lo: number, hi: number) => lo + (hi - lo) * r();
  const mat = (f: (b: number, k: number) => number) => Array.from({ length: B }, (_, b) => Array.from({ length: K }, (_, k) => f(b, k)));
  const policy = mat(() => -u(2, 30));
  // Row 1 has two padded entries holding values that would dominate if they leaked in.
  const mask = mat((b, k) => (b === 1 && k >= K - 2 ? 0 : 1));
  return {
    policy_logps: mat((b, k) => (mask[b][k] ? policy[b][k] : 50)),
    ref_logps: mat((b, k) => (mask[b][k] ? policy[b][k] + u(-3, 3) : -50)),
    scores: mat((b, k) => (mask[b][k] ? Math.floor(u(0, 4)) : 90)),
    mask,
    win_probs: mat(() => u(0, 1)),
  };
}

function singleJson(seed = 3, B = 5): Json {
  const r = rng(seed);
  const u = (lo: number, hi: number) => lo + (hi - lo) * r();
  const lp = Array.from({ length: B }, () => -u(2, 30));
  return {
    policy_logps: lp,
    ref_logps: lp.map((x) => x + u(-3, 3)),
    rewards: lp.map(() => u(-2, 2)),
    values: lp.map(() => u(-1, 1)),
    labels: lp.map((_, i) => i % 2),
    probs: lp.map(() => u(0, 1)),
    policy_kl_logps: [-12.5, -8.25, -20.0],
    ref_kl_logps: [-13.0, -9.0, -19.0],
  };
}

/** GRPO's per-token batch: 4 completions of up to 3 tokens, row 3 shorter (padding holds junk). */
function grpoJson(seed = 4): Json {
  const r = rng(seed);
  const u = (lo: number, hi: number) => lo + (hi - lo) * r();
  const mask = [[1, 1, 1], [1, 1, 1], [1, 1, 1], [1, 0, 0]];
  const old = mask.map((row) => row.map(() => -u(0.1, 4)));
  return {
    old_token_logps: old,
    policy_token_logps: old.map((row, b) => row.map((o, t) => (mask[b][t] ? o + u(-0.4, 0.4) : 40))),
    ref_token_logps: old.map((row) => row.map((o) => o + u(-0.5, 0.5))),
    completion_mask: mask,
    advantages: [1.1, -0.6, 0.3, -0.8],
  };
}

/** GKD's batch: 2 completions of up to 3 positions over a vocabulary of 5, row 1 shorter (padding holds junk). */
function distillJson(seed = 8): Json {
  const r = rng(seed);
  const mask = [[1, 1, 1], [1, 1, 0]];
  const logits = (junk: number) => mask.map((row) => row.map((on) => Array.from({ length: 5 }, () => (on ? 6 * r() - 3 : junk))));
  return { student_logits: logits(50), teacher_logits: logits(-50), completion_mask: mask };
}

/** The teacher of a dense distillation batch as its top K: ids by falling logit, log-probs at temperature 1. */
function topkOf(json: Json, K: number): Json {
  const teacher = json.teacher_logits as number[][][];
  const ids = teacher.map((row) => row.map((pos) => pos.map((_, v) => v).sort((a, b) => pos[b] - pos[a]).slice(0, K)));
  const logps = teacher.map((row, b) => row.map((pos, t) => {
    const lse = Math.log(pos.reduce((a, x) => a + Math.exp(x), 0));
    return ids[b][t].map((v) => pos[v] - lse);
  }));
  return { teacher_topk_ids: ids, teacher_topk_logps: logps };
}

/** Log-ratios at ±1e4 (and 0): policy/ref log-probs in {−1, −10001}, one token per response. */
function extremeJson(kind: Kind): Json {
  const hi = -1;
  const lo = -10001;
  if (kind === 'pairwise') {
    return {
      policy_chosen_logps: [hi, lo, hi, lo, hi, hi],
      ref_chosen_logps: [lo, hi, lo, hi, hi, lo],
      policy_rejected_logps: [lo, hi, hi, lo, lo, hi],
      ref_rejected_logps: [hi, lo, lo, hi, lo, hi],
      chosen_tokens: [1, 1, 1, 1, 1, 2],
      rejected_tokens: [1, 1, 1, 1, 1, 3],
      chosen_probs: [1, 0, 0.5, 1, 0, 0.25],
      rejected_probs: [0, 1, 0.5, 0, 1, 0.75],
    };
  }
  if (kind === 'reward_pairs') return { chosen_rewards: [1e4, -1e4, 0, 3], rejected_rewards: [-1e4, 1e4, 0, 3 + 1e-3] };
  if (kind === 'grpo') {
    // Log-probs at −1e4 (importance ratios stay moderate: exp of ±1e4 is no ratio a sampler produces).
    return {
      policy_token_logps: [[lo, hi, lo], [hi, lo + 0.3, hi]],
      old_token_logps: [[lo + 0.5, hi, lo], [hi - 0.1, lo, hi + 0.2]],
      ref_token_logps: [[lo, hi, lo + 1], [hi, lo, hi]],
      completion_mask: [[1, 1, 1], [1, 1, 0]],
      advantages: [1, -1],
    };
  }
  if (kind === 'distill') {
    // Logits ±1e4 apart: one-hot distributions, a forward or reverse KL of 2e4 where they disagree.
    return {
      student_logits: [[[1e4, -1e4, 0, 1], [-1e4, -1e4, 1e4, 0]], [[0, 0, 0, 0], [1e4, 1e4, -1e4, 3]]],
      teacher_logits: [[[-1e4, 1e4, 0, 1], [1e4, -1e4, 0, 0]], [[0, 1e4, 0, 0], [-1e4, 1e4, 1e4, 3]]],
      completion_mask: [[1, 1], [1, 0]],
    };
  }
  if (kind === 'listwise') {
    return {
      policy_logps: [[hi, lo, hi, lo], [lo, hi, lo, hi]],
      ref_logps: [[lo, hi, hi, lo], [hi, lo, lo, hi]],
      scores: [[3, 0, 1, 2], [2, 1, 0, 0]],
      mask: [[1, 1, 1, 1], [1, 1, 1, 0]],
      win_probs: [[1, 0, 0.5, 0.2], [0, 1, 0.5, 0.5]],
    };
  }
  return {
    policy_logps: [hi, lo, hi, lo],
    ref_logps: [lo, hi, hi, lo],
    rewards: [1e4, -1e4, 0, 5],
    values: [-1e4, 1e4, 0, 1],
    labels: [1, 0, 1, 0],
    probs: [1, 0, 0.5, 0.9],
    policy_kl_logps: [hi, lo],
    ref_kl_logps: [lo, hi],
  };
}

/** A reward model's scores of 6 pairs, one a tie (counted as wrong by accuracy). */
function rewardPairsJson(seed = 5, B = 6): Json {
  const r = rng(seed);
  const u = (lo: number, hi: number) => lo + (hi - lo) * r();
  const rw = Array.from({ length: B }, () => u(-3, 3));
  return { chosen_rewards: rw, rejected_rewards: rw.map((x, i) => (i === 2 ? x : x + u(-4, 4))) };
}

const JSON_OF: Record<Kind, () => Json> = { pairwise: pairJson, listwise: listJson, single: singleJson, nash_md: singleJson, grpo: grpoJson, reward_pairs: rewardPairsJson, distill: distillJson };

/** The subset of a JSON batch a bound loss reads, validated. */
function batchFor(bound: BoundLoss, kind: Kind, json: Json, drop: string[] = []): HostBatch {
  const ks = bound.keys(kind);
  const want = new Set([...ks.required, ...ks.optional]);
  const obj = Object.fromEntries(Object.entries(json).filter(([k]) => want.has(k) && !drop.includes(k)));
  return parseBatch(obj, kind, ks);
}

/** float32-representable copy of a batch (so float32 runs and the float64 reference see the same inputs). */
function fround(batch: HostBatch): HostBatch {
  return Object.fromEntries(Object.entries(batch).map(([k, t]) => [k, { dims: t.dims, data: t.data.map(Math.fround) }]));
}

// ---- comparisons ------------------------------------------------------------------------------

/** max |a − b| / (|b| + floor·scale), scale = max |b| over the vector. */
function relErr(a: ArrayLike<number>, b: ArrayLike<number>, floor = 1e-6): number {
  expect(a.length).toBe(b.length);
  let scale = 0;
  for (let i = 0; i < b.length; i++) scale = Math.max(scale, Math.abs(b[i]));
  let e = 0;
  for (let i = 0; i < b.length; i++) {
    const d = Math.abs(a[i] - b[i]);
    if (d === 0) continue;
    e = Math.max(e, d / (Math.abs(b[i]) + floor * scale + 1e-300));
  }
  return e;
}

function expectFinite(run: LossRun, what: string) {
  const all = [run.loss, ...run.perExample, ...Object.values(run.grad).flatMap((g) => Array.from(g)), ...Object.values(run.metrics)];
  const bad = all.findIndex((v) => !Number.isFinite(v));
  expect(bad, `${what}: non-finite output`).toBe(-1);
}

function expectRunsClose(got: LossRun, want: LossRun, tol: number, what: string) {
  expect(relErr([got.loss], [want.loss]), `${what} loss`).toBeLessThanOrEqual(tol);
  expect(relErr(got.perExample, want.perExample), `${what} per_example`).toBeLessThanOrEqual(tol);
  expect(Object.keys(got.grad).sort(), `${what} grad keys`).toEqual(Object.keys(want.grad).sort());
  for (const k of Object.keys(want.grad)) expect(relErr(got.grad[k], want.grad[k]), `${what} grad ${k}`).toBeLessThanOrEqual(tol);
  for (const k of Object.keys(want.metrics)) {
    expect(got.metrics[k], `${what} metric ${k}`).toBeDefined();
    expect(relErr([got.metrics[k]], [want.metrics[k]]), `${what} metric ${k}`).toBeLessThanOrEqual(tol);
  }
}

/** Central finite differences of the reference's mean loss w.r.t. every element of `key`. */
function finiteDiff(bound: BoundLoss, batch: HostBatch, key: string): Float64Array {
  const base = batch[key].data;
  return base.map((x, i) => {
    const h = 1e-6 * Math.max(1, Math.abs(x));
    const at = (v: number) => {
      const data = Float64Array.from(base);
      data[i] = v;
      return bound.reference({ ...batch, [key]: { dims: batch[key].dims, data } }).loss;
    };
    return (at(x + h) - at(x - h)) / (2 * h);
  });
}

// ---- the cases --------------------------------------------------------------------------------

interface Case {
  spec: string;
  params?: Record<string, unknown>;
  /** Batch keys to leave out (e.g. KTO's alternative KL source). */
  drop?: string[];
  /** Batch keys to add. */
  extra?: Json;
  weighted?: boolean;
  /**
   * The loss stops gradients through a differentiable input (DRO's V and ℓ, Nash-MD's ℓ, WPO's
   * weight from policy log-probs): finite differences of the value are not its gradient, so those
   * are checked against frozen surrogates below instead.
   */
  stopsGradient?: boolean;
}

const CASES: Case[] = [
  { spec: 'dpo' },
  { spec: 'dpo', params: { label_smoothing: 0.2, beta: 0.5 }, weighted: true },
  { spec: 'dpo', params: { f_divergence: 'forward_kl' } },
  { spec: 'dpo', params: { f_divergence: 'js' } },
  { spec: 'dpo', params: { f_divergence: 'alpha_divergence', f_alpha: 0.3 } },
  { spec: 'dpo', params: { wpo: true, rpo_alpha: 0.5 } },
  // Rationale NLL on rows 0, 2, 3 only (rows 1 and 4 have none: their rationale log-probs must not matter).
  { spec: 'dpo', params: { rationale_weight: 0.7 }, weighted: true, extra: { policy_rationale_logps: [-12.5, -3.25, -30, -7.75, -1e4], rationale_mask: [1, 0, 1, 1, 0] } },
  { spec: 'simpo', params: { rationale_weight: 2 }, weighted: true, extra: { policy_rationale_logps: [-2, -4, -6, -8, -10], rationale_mask: [0, 1, 0, 1, 1] } },
  { spec: 'dpo', params: { wpo: true }, drop: ['chosen_wpo_logps', 'rejected_wpo_logps'], stopsGradient: true },
  { spec: 'ipo' },
  { spec: 'ipo', params: { length_normalize: false, f_divergence: 'js' } },
  { spec: 'rdpo' },
  { spec: 'rdpo', params: { epsilon: 0.3, wpo: true }, weighted: true },
  { spec: 'dro', stopsGradient: true },
  { spec: 'dro', params: { tau: 0.3 }, weighted: true, stopsGradient: true },
  { spec: 'mpo', params: { delta: 0.5 } },
  { spec: 'mpo', params: { rpo_alpha: 0.5 } },
  ...['lambda', 'pair_logistic', 'pair_hinge', 'list_mle', 'softmax'].map((variant) => ({ spec: 'lipo', params: { variant, beta: 0.5 } })),
  { spec: 'lipo', weighted: true },
  { spec: 'sppo' },
  { spec: 'sppo_hard' },
  { spec: 'sppo_hard', params: { f_divergence: 'alpha_divergence', beta: 0.1 } },
  { spec: 'nash_md', stopsGradient: true },
  { spec: 'hinge' },
  { spec: 'exo_pair' },
  { spec: 'exo_pair', params: { label_smoothing: 0.3 } },
  { spec: 'nca_pair' },
  { spec: 'bco_pair', params: { f_divergence: 'forward_kl' } },
  { spec: 'aot' },
  { spec: 'aot_unpaired', params: { label_smoothing: 0.1 } },
  { spec: 'apo_zero' },
  { spec: 'apo_down', params: { rpo_alpha: 1 } },
  { spec: 'discopop' },
  { spec: 'discopop', params: { tau: 1, beta: 0.3 } },
  { spec: 'sigmoid_norm' },
  { spec: 'sft' },
  { spec: 'simpo' },
  { spec: 'simpo', params: { label_smoothing: 0.1, gamma: 0.3 } },
  { spec: 'orpo' },
  { spec: 'kto' },
  { spec: 'kto', drop: ['policy_kl_logps', 'ref_kl_logps'], extra: { kl: 0.4 } },
  { spec: 'kto', params: { desirable_weight: 1.5, undesirable_weight: 0.7 }, weighted: true },
  { spec: 'dpo:0.8,bco_pair:0.2,sft:1', params: { beta: 0.2 } },
  // GRPO's every loss type and level are in test/losses-grpo.test.ts.
  { spec: 'grpo', params: { beta: 0.04 } },
  { spec: 'grpo', params: { loss_type: 'cispo', importance_sampling_level: 'sequence', epsilon_high: 1.1 }, stopsGradient: true },
  { spec: 'bradley_terry' },
  { spec: 'bradley_terry', weighted: true },
  // GKD's grid of β and τ (whose sharper cases need a float32 tolerance relative to the gradient's
  // scale, not to each element), its identities and the sparse teacher's edges: test/losses-gkd.test.ts.
  { spec: 'gkd' },
  { spec: 'gkd', params: { beta: 0, temperature: 2 } },
  { spec: 'gkd', params: { beta: 1, temperature: 2 } },
  { spec: 'gkd', params: { beta: 0.1, temperature: 2 }, drop: ['teacher_logits'], extra: topkOf(distillJson(), 2) },
];

/** A key holding one entry per row: the policy's log-probs, a reward model's scores, or the student's logits. */
function rowKey(b: HostBatch): string {
  return Object.keys(b).find((k) => k.startsWith('policy') || k === 'chosen_rewards' || k === 'student_logits')!;
}

function caseName(c: Case, kind: Kind) {
  return `${c.spec} ${kind} ${JSON.stringify(c.params ?? {})}${c.drop ? ` without ${c.drop.join(',')}` : ''}${c.weighted ? ' weighted' : ''}`;
}

function caseBatch(c: Case, bound: BoundLoss, kind: Kind, json: Json): HostBatch {
  const b = batchFor(bound, kind, { ...json, ...c.extra }, c.drop ?? []);
  if (c.weighted) {
    const B = b[rowKey(b)].dims[0];
    b.weight = { dims: [B], data: Float64Array.from({ length: B }, (_, i) => 0.5 + (i % 3)) };
  }
  return b;
}

describe('schedules', () => {
  it('a lone loss name runs under the schedule its module declares; mixtures and unknown names as one run', () => {
    expect(listLosses().filter((l) => scheduleOf(l.name) !== 'single').map((l) => l.name)).toEqual(['mpo']);
    expect(scheduleOf(' mpo ')).toBe('mpo_stages');
    expect(scheduleOf('mpo:1,sft:0.1')).toBe('single');
    expect(scheduleOf('no_such_loss')).toBe('single');
  });
});

describe('every loss: reference vs ONNX vs finite differences', () => {
  it('covers every registered loss', () => {
    const covered = new Set(CASES.flatMap((c) => parseLossSpec(c.spec).map((t) => t.name)));
    expect(listLosses().map((l) => l.name).filter((n) => !covered.has(n))).toEqual([]);
  });

  for (const c of CASES) {
    const bound = resolveLoss(c.spec, c.params ?? {});
    for (const kind of bound.kinds) {
      it(caseName(c, kind), async () => {
        const batch = caseBatch(c, bound, kind, JSON_OF[kind]());
        const ref = runLossReference(bound, batch, { grad: true });
        expect(ref.perExample.length).toBe(batch[rowKey(batch)].dims[0]);
        expectFinite(ref, 'reference');

        // The reference's analytic gradients against central differences of its own loss.
        for (const key of c.stopsGradient ? [] : Object.keys(ref.grad)) {
          expect(relErr(ref.grad[key], finiteDiff(bound, batch, key), 1e-4), `finite differences ${key}`).toBeLessThanOrEqual(1e-6);
        }

        const f64 = await runLossOnnx(bound, batch, { dtype: 'float64', grad: true });
        expectRunsClose(f64, ref, 1e-9, 'onnx float64');

        const b32 = fround(batch);
        const ref32 = runLossReference(bound, b32, { grad: true });
        const f32 = await runLossOnnx(bound, b32, { dtype: 'float32', grad: true });
        expectRunsClose(f32, ref32, 1e-5, 'onnx float32');

        if (!c.weighted && !c.drop) {
          const ext = caseBatch(c, bound, kind, extremeJson(kind));
          const extRef = runLossReference(bound, ext, { grad: true });
          expectFinite(extRef, 'reference at ±1e4');
          const ext64 = await runLossOnnx(bound, ext, { dtype: 'float64', grad: true });
          expectFinite(ext64, 'onnx float64 at ±1e4');
          expectRunsClose(ext64, extRef, 1e-9, 'onnx float64 at ±1e4');
          const ext32 = await runLossOnnx(bound, ext, { dtype: 'float32', grad: true });
          expectFinite(ext32, 'onnx float32 at ±1e4');
        }
      });
    }
  }
});

describe('gradients through stop-gradients, against frozen surrogates', () => {
  /** Central differences of f at x. */
  const fd = (f: (x: number) => number, x: number) => {
    const h = 1e-6 * Math.max(1, Math.abs(x));
    return (f(x + h) - f(x - h)) / (2 * h);
  };

  it('dro: the gradients of ½(r − V − τℓ)², the policy one divided by τ', () => {
    const j = singleJson(5);
    const tau = 0.7;
    const bound = resolveLoss('dro', { tau });
    const b = batchFor(bound, 'single', j);
    const ref = runLossReference(bound, b, { grad: true });
    const [lp, rf, r, V] = ['policy_logps', 'ref_logps', 'rewards', 'values'].map((k) => (j as Record<string, number[]>)[k]);
    const B = lp.length;
    const J = (i: number, logp: number, v: number) => 0.5 * (r[i] - v - tau * (logp - rf[i])) ** 2;
    for (let i = 0; i < B; i++) {
      expect(ref.grad.policy_logps[i]).toBeCloseTo(fd((x) => J(i, x, V[i]), lp[i]) / tau / B, 8);
      expect(ref.grad.values[i]).toBeCloseTo(fd((v) => J(i, lp[i], v), V[i]) / B, 8);
    }
  });

  it('nash_md: the gradient with the KL estimate\'s ℓ frozen', () => {
    const j = singleJson(6);
    const bound = resolveLoss('nash_md', { beta: 0.3 });
    const ref = runLossReference(bound, batchFor(bound, 'nash_md', j), { grad: true });
    const [lp, rf, P] = ['policy_logps', 'ref_logps', 'probs'].map((k) => (j as Record<string, number[]>)[k]);
    lp.forEach((x, i) => {
      const frozen = x - rf[i];
      const f = (v: number) => 0.3 * frozen * v - (P[i] - 0.5) * v;
      expect(ref.grad.policy_logps[i]).toBeCloseTo(fd(f, x) / lp.length, 8);
    });
  });

  it('wpo from policy log-probs: the DPO gradient times the frozen weight', () => {
    const j = pairJson(7);
    const { chosen_wpo_logps: _a, rejected_wpo_logps: _b, ...plain } = j;
    const w = (plain.policy_chosen_logps as number[]).map((x, i) =>
      Math.exp(x / (plain.chosen_tokens as number[])[i] + (plain.policy_rejected_logps as number[])[i] / (plain.rejected_tokens as number[])[i]));
    const weighted = refOf('dpo', { wpo: true }, plain);
    const base = refOf('dpo', {}, plain);
    expect(relErr(weighted.grad.policy_chosen_logps, base.grad.policy_chosen_logps.map((g, i) => g * w[i]))).toBeLessThanOrEqual(1e-14);
    expect(relErr(weighted.perExample, base.perExample.map((v, i) => v * w[i]))).toBeLessThanOrEqual(1e-14);
  });
});

// ---- hand values ------------------------------------------------------------------------------

/** A pairwise batch with given log-ratios (policy = ℓ − 10, ref = −10) and token counts. */
function pairBatch(lw: number[], ll: number[], extra: Json = {}): Json {
  return {
    policy_chosen_logps: lw.map((l) => l - 10),
    ref_chosen_logps: lw.map(() => -10),
    policy_rejected_logps: ll.map((l) => l - 10),
    ref_rejected_logps: ll.map(() => -10),
    chosen_tokens: lw.map(() => 1),
    rejected_tokens: ll.map(() => 1),
    ...extra,
  };
}

function refOf(spec: string, params: Record<string, unknown>, json: Json): LossRun {
  const bound = resolveLoss(spec, params);
  const kind = detectKind(bound.kinds, json);
  return runLossReference(bound, batchFor(bound, kind, json), { grad: true });
}

const LN2 = Math.log(2);
const sp = (x: number) => Math.log(1 + Math.exp(x));

describe('hand values from the formulas', () => {
  const zero = pairBatch([0, 0], [0, 0]);
  it('at h = 0: dpo, sigmoid_norm, aot, mpo give log 2; rdpo too; hinge 1; bco/nca 2 log 2; apo 1', () => {
    for (const s of ['dpo', 'sigmoid_norm', 'aot', 'aot_unpaired', 'mpo']) expect(refOf(s, {}, zero).loss).toBeCloseTo(LN2, 14);
    expect(refOf('rdpo', { epsilon: 0.25 }, zero).loss).toBeCloseTo(LN2, 14);
    expect(refOf('dpo', { label_smoothing: 0.3 }, zero).loss).toBeCloseTo(LN2, 14);
    expect(refOf('hinge', {}, zero).loss).toBe(1);
    expect(refOf('bco_pair', {}, zero).loss).toBeCloseTo(2 * LN2, 14);
    expect(refOf('nca_pair', {}, zero).loss).toBeCloseTo(2 * LN2, 14);
    expect(refOf('apo_zero', {}, zero).loss).toBeCloseTo(1, 14);
    expect(refOf('apo_down', {}, zero).loss).toBeCloseTo(1, 14);
    expect(refOf('discopop', {}, zero).loss).toBeCloseTo((LN2 + 1) / 2, 14);
    const e = 1e-3;
    expect(refOf('exo_pair', {}, zero).loss).toBeCloseTo(-LN2 - 0.5 * Math.log(e * (1 - e)), 12);
  });

  it('dpo gradient at h = 0 is ∓β/2 per pair, divided by B', () => {
    const r = refOf('dpo', { beta: 0.4 }, zero);
    expect(Array.from(r.grad.policy_chosen_logps)).toEqual([-0.1, -0.1].map((v) => expect.closeTo(v, 15)));
    expect(Array.from(r.grad.policy_rejected_logps)).toEqual([0.1, 0.1].map((v) => expect.closeTo(v, 15)));
  });

  it('dpo, cDPO and rdpo at βh = 1', () => {
    const b = pairBatch([3], [1]); // h = 2
    expect(refOf('dpo', { beta: 0.5 }, b).loss).toBeCloseTo(sp(-1), 14);
    expect(refOf('dpo', { beta: 0.5, label_smoothing: 0.1 }, b).loss).toBeCloseTo(0.9 * sp(-1) + 0.1 * sp(1), 14);
    expect(refOf('rdpo', { beta: 0.5, epsilon: 0.1 }, b).loss).toBeCloseTo((0.9 * sp(-1) - 0.1 * sp(1)) / 0.8, 14);
  });

  it('ipo uses per-token log-ratios and is zero at the target margin', () => {
    const b = pairBatch([4], [-1], { chosen_tokens: [2], rejected_tokens: [1] }); // h̄ = 2 + 1 = 3
    expect(refOf('ipo', { beta: 0.25 }, b).loss).toBeCloseTo((3 - 2) ** 2, 14);
    expect(refOf('ipo', { beta: 0.25, length_normalize: false }, b).loss).toBeCloseTo((5 - 2) ** 2, 14);
  });

  it('sppo_hard, simpo, orpo, sft', () => {
    expect(refOf('sppo_hard', { beta: 0.5 }, zero).loss).toBeCloseTo(2, 14);
    const simpo = { policy_chosen_logps: [-6], policy_rejected_logps: [-3], chosen_tokens: [4], rejected_tokens: [2] };
    expect(refOf('simpo', { gamma: 1 }, simpo).loss).toBeCloseTo(sp(1), 14);
    // Mean token probability ½ on both sides: odds 1, log-odds ratio 0.
    const half = { policy_chosen_logps: [3 * Math.log(0.5)], policy_rejected_logps: [2 * Math.log(0.5)], chosen_tokens: [3], rejected_tokens: [2] };
    expect(refOf('orpo', { lambda: 0.2 }, half).loss).toBeCloseTo(LN2 + 0.2 * LN2, 14);
    expect(refOf('sft', {}, { policy_chosen_logps: [-6, -1], chosen_tokens: [3, 4] }).loss).toBeCloseTo((2 + 0.25) / 2, 14);
  });

  it('dro, nash_md, kto', () => {
    // ℓ = −1, r − V = 0.5: policy 0.5·2 + ½ = 1.5, value ½(0.5 + 1)² = 1.125.
    const d = refOf('dro', { tau: 1 }, { policy_logps: [-2], ref_logps: [-1], rewards: [1], values: [0.5] });
    expect(d.loss).toBeCloseTo(2.625, 14);
    expect(d.grad.policy_logps[0]).toBeCloseTo(-0.5 - 1, 14);
    expect(d.grad.values[0]).toBeCloseTo(-1.5, 14);
    const n = refOf('nash_md', {}, { policy_logps: [-2], ref_logps: [-2], probs: [1] });
    expect(n.loss).toBeCloseTo(1, 14);
    expect(n.grad.policy_logps[0]).toBeCloseTo(-0.5, 14);
    const k = refOf('kto', { desirable_weight: 3 }, { policy_logps: [-1.5, -2], ref_logps: [-2, -1], labels: [1, 0], kl: 0.5 });
    expect(k.perExample[0]).toBeCloseTo(1.5, 14);
    expect(k.perExample[1]).toBeCloseTo(1 / (1 + Math.exp(0.15)), 14);
    const k2 = refOf('kto', {}, { policy_logps: [-1], ref_logps: [-1], labels: [1], policy_kl_logps: [-3, -5], ref_kl_logps: [-1, -4] });
    expect(k2.metrics.kl).toBe(0); // mean −0.5 clamps to 0
  });

  it('lipo: λ-weights, Plackett–Luce and ListNet at equal scores', () => {
    const eq = (K: number, psi: number[]) => ({ policy_logps: [Array(K).fill(-1)], ref_logps: [Array(K).fill(-1)], scores: [psi] });
    // τ = (1, 2) by index; Δ = |2¹ − 1 − 0|·|1/log2 2 − 1/log2 3|.
    expect(refOf('lipo', {}, eq(2, [1, 0])).loss).toBeCloseTo((1 - 1 / Math.log2(3)) * LN2, 14);
    expect(refOf('lipo', { variant: 'pair_logistic' }, eq(3, [2, 1, 0])).loss).toBeCloseTo(3 * LN2, 14);
    expect(refOf('lipo', { variant: 'pair_hinge' }, eq(3, [2, 1, 1])).loss).toBeCloseTo(2, 14);
    expect(refOf('lipo', { variant: 'list_mle' }, eq(3, [0, 2, 1])).loss).toBeCloseTo(Math.log(6), 14);
    expect(refOf('lipo', { variant: 'softmax' }, eq(2, [5, 5])).loss).toBeCloseTo(LN2, 14);
  });

  it('f-divergence scores, WPO weights and the RPO term', () => {
    const b = pairBatch([0.5], [-0.7], { chosen_tokens: [2], rejected_tokens: [4] });
    const fk = Math.exp(0.7) - Math.exp(-0.5); // u_w − u_l with u = −e^(−ℓ)
    expect(refOf('dpo', { f_divergence: 'forward_kl' }, b).loss).toBeCloseTo(sp(-0.1 * fk), 14);
    const ls = (x: number) => -sp(-x);
    expect(refOf('dpo', { f_divergence: 'js' }, b).loss).toBeCloseTo(sp(-0.1 * (ls(0.5) - ls(-0.7))), 14);
    const a = 0.3;
    const ad = (-Math.exp(-a * 0.5) + Math.exp(-a * -0.7)) / a;
    expect(refOf('dpo', { f_divergence: 'alpha_divergence', f_alpha: a }, b).loss).toBeCloseTo(sp(-0.1 * ad), 14);
    const w = Math.exp((0.5 - 10) / 2 + (-0.7 - 10) / 4);
    expect(refOf('dpo', { wpo: true }, b).loss).toBeCloseTo(w * sp(-0.1 * 1.2), 14);
    expect(refOf('dpo', { rpo_alpha: 2 }, b).loss).toBeCloseTo(sp(-0.1 * 1.2) + 2 * (9.5 / 2), 13);
  });

  it('the rationale term: γ·(−log π(r)) on rows with a rationale, nothing on rows without', () => {
    const b = pairBatch([0.5, -0.2, 1], [-0.7, 0.3, 0], { policy_rationale_logps: [-6, -1e3, -2], rationale_mask: [1, 0, 1] });
    const dpo = (sp(-0.1 * 1.2) + sp(-0.1 * -0.5) + sp(-0.1 * 1)) / 3;
    const r = refOf('dpo', { rationale_weight: 0.5 }, b);
    expect(r.loss).toBeCloseTo(dpo + (0.5 * (6 + 2)) / 3, 13);
    expect(r.metrics['nll/rationale']).toBeCloseTo(4, 13);
    expect(Array.from(r.grad.policy_rationale_logps, (v) => v + 0)).toEqual([-0.5 / 3, 0, -0.5 / 3]);
    // Weight 0 (the default) reads no rationale columns at all.
    expect(resolveLoss('dpo', {}).keys('pairwise').required).not.toContain('policy_rationale_logps');
  });
});

// ---- identities -------------------------------------------------------------------------------

describe('identities of docs/losses.md (reference and ONNX)', () => {
  const json = pairJson(11, 6);

  async function both(spec: string, params: Record<string, unknown>, j: Json): Promise<[LossRun, LossRun]> {
    const bound = resolveLoss(spec, params);
    const kind = detectKind(bound.kinds, j);
    const b = batchFor(bound, kind, j);
    return [runLossReference(bound, b, { grad: true }), await runLossOnnx(bound, b, { grad: true })];
  }

  it('dpo with label_smoothing 0 equals rdpo with ε = 0', async () => {
    const [d, dOnnx] = await both('dpo', { beta: 0.3, label_smoothing: 0 }, json);
    const [r, rOnnx] = await both('rdpo', { beta: 0.3, epsilon: 0 }, json);
    expectRunsClose(r, d, 1e-15, 'rdpo vs dpo (reference)');
    expect(relErr(rOnnx.perExample, dOnnx.perExample)).toBeLessThanOrEqual(1e-15);
    expect(relErr(rOnnx.grad.policy_chosen_logps, dOnnx.grad.policy_chosen_logps)).toBeLessThanOrEqual(1e-15);
  });

  it('lipo pair_logistic with K = 2 equals dpo', async () => {
    const B = (json.policy_chosen_logps as number[]).length;
    const two = (a: string, b: string) => Array.from({ length: B }, (_, i) => [(json[a] as number[])[i], (json[b] as number[])[i]]);
    const list = {
      policy_logps: two('policy_chosen_logps', 'policy_rejected_logps'),
      ref_logps: two('ref_chosen_logps', 'ref_rejected_logps'),
      scores: Array.from({ length: B }, () => [1, 0]),
    };
    const [d, dOnnx] = await both('dpo', { beta: 0.7 }, json);
    const [l, lOnnx] = await both('lipo', { beta: 0.7, variant: 'pair_logistic' }, list);
    for (const [x, y] of [[l, d], [lOnnx, dOnnx]]) {
      expect(relErr(x.perExample, y.perExample)).toBeLessThanOrEqual(1e-14);
      expect(relErr(Array.from(x.grad.policy_logps).filter((_, i) => i % 2 === 0), y.grad.policy_chosen_logps)).toBeLessThanOrEqual(1e-14);
      expect(relErr(Array.from(x.grad.policy_logps).filter((_, i) => i % 2 === 1), y.grad.policy_rejected_logps)).toBeLessThanOrEqual(1e-14);
    }
  });

  it('ipo is minimised at h̄ = 1/(2β)', async () => {
    const beta = 0.2;
    const at = (m: number) => pairBatch([m / 2], [-m / 2]);
    const [r0, o0] = await both('ipo', { beta, length_normalize: false }, at(1 / (2 * beta)));
    expect(r0.loss).toBe(0);
    expect(o0.loss).toBe(0);
    expect(Array.from(o0.grad.policy_chosen_logps)).toEqual([0]);
    for (const d of [-1, -1e-3, 1e-3, 1]) expect(refOf('ipo', { beta, length_normalize: false }, at(1 / (2 * beta) + d)).loss).toBeGreaterThan(0);
    // With length normalisation the minimum is at ℓ_w/n_w − ℓ_l/n_l = 1/(2β).
    const n = pairBatch([3 * 1.25], [-1.25 * 2], { chosen_tokens: [3], rejected_tokens: [2] });
    expect(refOf('ipo', { beta }, n).loss).toBeCloseTo(0, 25);
  });

  it('sppo with P̂ ∈ {1, 0} equals sppo_hard', async () => {
    const hard = { ...json, chosen_probs: (json.chosen_probs as number[]).map(() => 1), rejected_probs: (json.rejected_probs as number[]).map(() => 0) };
    const [s, sOnnx] = await both('sppo', { beta: 0.05 }, hard);
    const [h, hOnnx] = await both('sppo_hard', { beta: 0.05 }, hard);
    expectRunsClose(s, h, 1e-14, 'sppo vs sppo_hard (reference)');
    expectRunsClose(sOnnx, hOnnx, 1e-14, 'sppo vs sppo_hard (onnx)');
  });

  it('a mixture is the weighted sum of its terms, per row and in the gradient', () => {
    const mix = refOf('dpo:0.8,bco_pair:0.2,sft:1', { beta: 0.2, 'dpo.beta': 0.3 }, json);
    const d = refOf('dpo', { beta: 0.3 }, json);
    const b = refOf('bco_pair', { beta: 0.2 }, json);
    const s = refOf('sft', {}, json);
    const want = d.perExample.map((v, i) => 0.8 * v + 0.2 * b.perExample[i] + s.perExample[i]);
    expect(relErr(mix.perExample, want)).toBeLessThanOrEqual(1e-15);
    const g = d.grad.policy_chosen_logps.map((v, i) => 0.8 * v + 0.2 * b.grad.policy_chosen_logps[i] + s.grad.policy_chosen_logps[i]);
    expect(relErr(mix.grad.policy_chosen_logps, g)).toBeLessThanOrEqual(1e-15);
  });

  it('row weights give the weighted mean', async () => {
    const bound = resolveLoss('dpo');
    const b = batchFor(bound, 'pairwise', json);
    const w = [1, 0, 2, 0.5, 3, 1];
    const per = runLossReference(bound, b).perExample;
    const want = per.reduce((a, v, i) => a + w[i] * v, 0) / w.reduce((a, v) => a + v, 0);
    const wb = { ...b, weight: { dims: [6], data: Float64Array.from(w) } };
    expect(runLossReference(bound, wb).loss).toBeCloseTo(want, 14);
    expect((await runLossOnnx(bound, wb)).loss).toBeCloseTo(want, 14);
  });

  it('pairwise metrics: TRL names, ties count as wrong', async () => {
    const j = pairBatch([1, 0, -1, 2], [0, 0, 1, 1]);
    const bound = resolveLoss('dpo', { beta: 0.5 });
    const b = batchFor(bound, 'pairwise', j);
    for (const run of [runLossReference(bound, b), await runLossOnnx(bound, b)]) {
      expect(run.metrics['rewards/accuracies']).toBe(0.5);
      expect(run.metrics['rewards/chosen']).toBeCloseTo(0.25, 15);
      expect(run.metrics['rewards/rejected']).toBeCloseTo(0.25, 15);
      expect(run.metrics['rewards/margins']).toBeCloseTo(0, 15);
      expect(run.metrics['logps/chosen']).toBeCloseTo(-9.5, 15);
      expect(run.metrics['logps/rejected']).toBeCloseTo(-9.5, 15);
    }
  });
});

// ---- MPO split --------------------------------------------------------------------------------

describe('MPO easy/hard split', () => {
  const sw = [1.0, 0.5, 3.0, -1.0];
  const sl = [0.9, 0.0, 2.1, 1.0]; // margins 0.1, 0.5, 0.9, 2.0

  it('splits at the median margin by default (linear quantile)', () => {
    const s = mpoSplit(sw, sl);
    expect(s.delta).toBeCloseTo(0.7, 15);
    expect(s.easy).toEqual([2, 3]);
    expect(s.hard).toEqual([0, 1]);
  });

  it('splits at an absolute δ or another quantile', () => {
    expect(mpoSplit(sw, sl, { delta: 0.5 })).toEqual({ delta: 0.5, easy: [1, 2, 3], hard: [0] });
    expect(mpoSplit(sw, sl, { delta: 0 }).hard).toEqual([]);
    expect(mpoSplit(sw, sl, { quantile: 1 }).easy).toEqual([3]);
    expect(quantile([4, 1, 3, 2], 0.25)).toBeCloseTo(1.75, 15);
  });

  it('rejects mismatched or non-finite scores', () => {
    expect(() => mpoSplit([1], [1, 2])).toThrow(UserError);
    expect(() => mpoSplit([NaN], [1])).toThrow(/row 0/);
    expect(() => mpoSplit([1], [1], { delta: -1 })).toThrow(/delta/);
  });

  it('stage2_loss choices are exactly the pairwise losses', () => {
    const pairwise = listLosses().filter((l) => l.kinds.includes('pairwise')).map((l) => l.name).sort();
    expect([...MPO_STAGE2_LOSSES].sort()).toEqual(pairwise);
  });
});

// ---- parameters and batches -------------------------------------------------------------------

describe('parameter validation', () => {
  const msg = (f: () => unknown) => {
    try {
      f();
    } catch (e) {
      expect(e).toBeInstanceOf(UserError);
      return (e as Error).message;
    }
    throw new Error('no error thrown');
  };

  it('names the parameter and its range', () => {
    expect(msg(() => resolveLoss('dpo', { beta: '-1' }))).toMatch(/beta must be \(0, ∞\), got "-1"/);
    expect(msg(() => resolveLoss('dpo', { label_smoothing: 0.7 }))).toMatch(/label_smoothing must be \[0, 0\.5\], got 0\.7/);
    expect(msg(() => resolveLoss('rdpo', { epsilon: '0.5' }))).toMatch(/epsilon must be \[0, 0\.5\)/);
    expect(msg(() => resolveLoss('ipo', { length_normalize: 'maybe' }))).toMatch(/length_normalize must be true or false/);
    expect(msg(() => resolveLoss('lipo', { variant: 'ndcg' }))).toMatch(/variant must be one of lambda, pair_logistic, pair_hinge, list_mle, softmax/);
    expect(msg(() => resolveLoss('dpo', { beta: 'abc' }))).toMatch(/beta/);
    expect(msg(() => resolveLoss('discopop', { tau: 2 }))).toMatch(/tau must be \(0, 1\]/);
    expect(msg(() => resolveLoss('dpo', { f_alpha: 1 }))).toMatch(/f_alpha must be \(0, 1\)/);
  });

  it('lists the valid parameters for an unknown one', () => {
    expect(msg(() => resolveLoss('dpo', { betta: 1 }))).toMatch(/unknown parameter "betta" for loss dpo; valid parameters: beta, label_smoothing, f_divergence, f_alpha, wpo, rpo_alpha/);
    expect(msg(() => resolveLoss('dpo:1,sft:1', { tau: 1 }))).toMatch(/unknown parameter "tau".*dpo: beta/);
    expect(msg(() => resolveLoss('dpo:1,sft:1', { 'ipo.beta': 1 }))).toMatch(/ipo/);
  });

  it('accepts aliases and scoped mixture parameters', () => {
    expect(resolveLoss('rdpo', { label_smoothing: 0.2 }).terms[0].params.epsilon).toBe(0.2);
    expect(resolveLoss('orpo', { beta: 0.3 }).terms[0].params.lambda).toBe(0.3);
    const m = resolveLoss('dpo:0.5,ipo:2', { beta: 0.2, 'ipo.beta': 0.05 });
    expect(m.terms.map((t) => t.params.beta)).toEqual([0.2, 0.05]);
  });

  it('parses loss specs and rejects bad ones', () => {
    expect(parseLossSpec('dpo:0.8,bco_pair:0.2,sft:1')).toEqual([
      { name: 'dpo', weight: 0.8 }, { name: 'bco_pair', weight: 0.2 }, { name: 'sft', weight: 1 },
    ]);
    expect(msg(() => parseLossSpec('dpo:0'))).toMatch(/weight of loss dpo/);
    expect(msg(() => parseLossSpec('dpo,dpo'))).toMatch(/twice/);
    expect(msg(() => parseLossSpec('dpoo'))).toMatch(/unknown loss "dpoo"; available: dpo, ipo/);
    expect(msg(() => parseLossSpec('dpo,,sft'))).toMatch(/empty term/);
    expect(msg(() => resolveLoss('dpo,lipo'))).toMatch(/different kinds/);
    expect(msg(() => resolveLoss('aot', { wpo: true }))).toMatch(/unknown parameter "wpo"/);
    expect(getLoss('dpo').paper).toMatch(/Direct Preference Optimization/);
  });
});

describe('batch validation', () => {
  const bound = resolveLoss('dpo');
  const ks = bound.keys('pairwise');
  const good = pairBatch([1, 2], [0, 1]);
  const msg = (json: unknown, kind: Kind = 'pairwise', keys = ks) => {
    try {
      parseBatch(json, kind, keys, 'b.json');
    } catch (e) {
      expect(e).toBeInstanceOf(UserError);
      return (e as Error).message;
    }
    throw new Error('no error thrown');
  };

  it('names the missing, ill-shaped or out-of-domain key', () => {
    const { ref_rejected_logps: _, ...missing } = good;
    expect(msg(missing)).toMatch(/^b\.json: missing key "ref_rejected_logps"/);
    expect(msg({ ...good, ref_rejected_logps: [1, 2, 3] })).toMatch(/"ref_rejected_logps" has 3 rows, expected 2/);
    expect(msg({ ...good, policy_chosen_logps: [1, 'x'] })).toMatch(/"policy_chosen_logps"\[1\] must be a finite number, got "x"/);
    expect(msg({ ...good, policy_chosen_logps: 3 })).toMatch(/"policy_chosen_logps" must be an array/);
    expect(msg({ ...good, polcy: [1, 2] })).toMatch(/unknown key "polcy"/);
    expect(msg({ ...good, weight: [0, 0] })).toMatch(/"weight" must have a positive sum/);
    const ipo = resolveLoss('ipo').keys('pairwise');
    expect(msg({ ...good, chosen_tokens: [0, 2] }, 'pairwise', ipo)).toMatch(/"chosen_tokens"\[0\] must be a number > 0/);
    const lk = resolveLoss('lipo').keys('listwise');
    expect(msg({ policy_logps: [[1, 2], [3]], ref_logps: [[1, 2], [3, 4]], scores: [[1, 0], [1, 0]] }, 'listwise', lk)).toMatch(/"policy_logps" row 1 must be an array of 2 numbers/);
    expect(msg({ policy_logps: [[1, 2]], ref_logps: [[1, 2]], scores: [[1, 0]], mask: [[1, 2]] }, 'listwise', lk)).toMatch(/"mask"\[0\]\[1\] must be 0 or 1/);
    expect(msg({ policy_logps: [1], ref_logps: [1], labels: [1] }, 'single', resolveLoss('kto').keys('single'))).toMatch(/kl, or policy_kl_logps \+ ref_kl_logps/);
  });

  it('refuses row weights for losses that sort the batch', () => {
    const b = batchFor(resolveLoss('aot'), 'pairwise', { ...pairJson(), weight: [1, 1, 1, 1, 1] });
    expect(() => resolveLoss('aot').reference(b)).toThrow(/sorts the batch/);
  });
});
