/**
 * The grpo loss against an independent float64 transcription of TRL's `_compute_loss` (written
 * here as whole-tensor steps, not the module's per-row loop), central finite differences of that
 * transcription, the ONNX subgraph with its autodiff gradients (float64 and float32), the on-policy
 * identity, and `prefzoo loss grpo` end to end.
 */
import { describe, it, expect } from 'vitest';
import { mkdtempSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { uniform } from '../src/random.ts';
import { resolveLoss, GRPO_LOSS_TYPES } from '../losses/index.ts';
import { appliedEntropyCoef, nextEntropyCoef } from '../losses/grpo.ts';
import { parseBatch } from '../losses/core/batch.ts';
import { buildLossGraph, runLossOnnx, runLossReference } from '../losses/core/engine.ts';
import type { HostBatch } from '../losses/core/types.ts';
import type { LossRun } from '../losses/core/engine.ts';
import { prefzoo } from './helpers/cli.ts';

type Mat = number[][];
interface Batch {
  policy_token_logps: Mat;
  old_token_logps: Mat;
  ref_token_logps: Mat;
  teacher_token_logps: Mat;
  token_entropies: Mat;
  completion_mask: Mat;
  advantages: number[];
  sampling_token_logps?: Mat;
  entropy_coef?: number;
  last_world_entropy?: number;
  num_items_in_batch?: number;
}

/**
 * 6 completions of up to 5 tokens; row 2 is shorter, row 4 fully masked (a truncated completion); padding holds large junk.
 * Also the sampler's log-probs (drawn last, so the other columns do not depend on whether they are used).
 */
function makeBatch(seed: number): Batch & { sampling: Mat } {
  const r = uniform(seed);
  const u = (lo: number, hi: number) => lo + (hi - lo) * r();
  const B = 6;
  const T = 5;
  const mask = Array.from({ length: B }, (_, b) => Array.from({ length: T }, (_, t) => (b === 4 ? 0 : b === 2 && t >= 2 ? 0 : b === 0 && t === 4 ? 0 : 1)));
  const old = mask.map((row) => row.map((m) => (m ? -u(0.1, 4) : 0)));
  return {
    completion_mask: mask,
    old_token_logps: old,
    // Log-ratios in ±0.45: some inside the clip range (0.8, 1.2), some outside on either side.
    policy_token_logps: old.map((row, b) => row.map((o, t) => (mask[b][t] ? o + u(-0.45, 0.45) : 60))),
    ref_token_logps: old.map((row, b) => row.map((o, t) => (mask[b][t] ? o + u(-0.5, 0.5) : -80))),
    token_entropies: mask.map((row) => row.map(() => u(0, 3))),
    advantages: [1.2, -0.7, 0.4, -1.5, 0.9, -0.3],
    sampling: old.map((row, b) => row.map((o, t) => (mask[b][t] ? o + u(-0.45, 0.45) : 7))),
    // The teacher's log-probs (distill_coef), drawn after all the others.
    teacher_token_logps: old.map((row, b) => row.map((o, t) => (mask[b][t] ? o + u(-0.8, 0.6) : -70))),
  };
}

/** The batch a case feeds: with or without the sampler's log-probs, the bonus's scalars. */
function batchOf(x: Batch & { sampling: Mat }, extra: Partial<Batch> & { withSampling?: boolean } = {}): Batch {
  const { sampling, ...rest } = x;
  const { withSampling, ...more } = extra;
  return { ...rest, ...(withSampling ? { sampling_token_logps: sampling } : {}), ...more };
}

interface P {
  loss_type: string;
  importance_sampling_level: string;
  epsilon: number;
  epsilon_high: number | null;
  delta: number | null;
  beta: number;
  distill_coef: number | null;
  max_completion_length: number;
  top_entropy_quantile: number;
  sapo_temperature_pos: number;
  sapo_temperature_neg: number;
  vespo_k_pos: number;
  vespo_lambda_pos: number;
  vespo_k_neg: number;
  vespo_lambda_neg: number;
  off_policy_mask_threshold: number | null;
  use_bias_correction_kl: boolean;
  vllm_importance_sampling_correction: boolean;
  vllm_importance_sampling_mode: string;
  vllm_importance_sampling_clip_max: number;
  vllm_importance_sampling_clip_min: number | null;
  entropy_coef: number;
  use_adaptive_entropy: boolean;
  entropy_target: number;
}
const DEFAULTS: P = {
  loss_type: 'dapo', importance_sampling_level: 'token', epsilon: 0.2, epsilon_high: null, delta: null, beta: 0, distill_coef: null, max_completion_length: 8, top_entropy_quantile: 1,
  sapo_temperature_pos: 1, sapo_temperature_neg: 1.05, vespo_k_pos: 2, vespo_lambda_pos: 3, vespo_k_neg: 3, vespo_lambda_neg: 2,
  off_policy_mask_threshold: null, use_bias_correction_kl: false,
  vllm_importance_sampling_correction: true, vllm_importance_sampling_mode: 'sequence_mask', vllm_importance_sampling_clip_max: 3, vllm_importance_sampling_clip_min: null,
  entropy_coef: 0, use_adaptive_entropy: false, entropy_target: 0.2,
};

const map = (x: Mat, f: (v: number, b: number, t: number) => number): Mat => x.map((row, b) => row.map((v, t) => f(v, b, t)));
const sum = (x: Mat) => x.flat().reduce((a, v) => a + v, 0);
const rowSum = (x: Mat) => x.map((row) => row.reduce((a, v) => a + v, 0));
const col1 = (v: number[]): Mat => v.map((x) => [x]);
/** Elementwise product with torch's broadcasting of [B][1] against [B][T]. */
const bmul = (x: Mat, y: Mat): Mat => {
  const T = Math.max(x[0].length, y[0].length);
  return x.map((row, b) => Array.from({ length: T }, (_, t) => row[row.length === 1 ? 0 : t] * y[b][y[b].length === 1 ? 0 : t]));
};
const badd = (x: Mat, y: Mat): Mat => {
  const T = Math.max(x[0].length, y[0].length);
  return x.map((row, b) => Array.from({ length: T }, (_, t) => row[row.length === 1 ? 0 : t] + y[b][y[b].length === 1 ? 0 : t]));
};
const clamp = (v: number, lo: number | null, hi: number | null) => Math.min(Math.max(v, lo ?? -Infinity), hi ?? Infinity);
const sig = (v: number) => 1 / (1 + Math.exp(-v));

/** torch.quantile (linear) of the counted entropies, then TRL's mask. */
function entropyMask(ent: Mat, mask: Mat, rho: number): Mat {
  const vals = ent.flat().filter((_, i) => mask.flat()[i] === 1).sort((a, b) => a - b);
  const pos = (1 - rho) * (vals.length - 1);
  const lo = Math.floor(pos);
  const thr = vals[lo] + (pos - lo) * (vals[Math.ceil(pos)] - vals[lo]);
  return map(ent, (e, b, t) => (e * mask[b][t] >= thr && mask[b][t] === 1 ? 1 : 0));
}

/** TRL's vllm importance-sampling ratio (`_generate_and_score_completions`): [B][T] or [B][1]. */
function samplingRatio(x: Batch, p: P): Mat | null {
  if (!x.sampling_token_logps || !p.vllm_importance_sampling_correction) return null;
  const m = x.completion_mask;
  const diff = map(x.old_token_logps, (o, b, t) => (m[b][t] ? o - x.sampling_token_logps![b][t] : 0));
  const seq = p.vllm_importance_sampling_mode.startsWith('sequence');
  const r = map(seq ? col1(rowSum(diff)) : diff, Math.exp);
  const lo = p.vllm_importance_sampling_clip_min;
  const hi = p.vllm_importance_sampling_clip_max;
  return p.vllm_importance_sampling_mode.endsWith('truncate')
    ? map(r, (v) => clamp(v, lo, hi))
    : map(r, (v) => (v < (lo ?? -Infinity) || v > hi ? 0 : v));
}

/** The values a detached factor takes (cispo's clamped weight, VESPO's φ), frozen for the finite differences. */
interface Frozen {
  cispo?: Mat;
  phi?: Mat;
}

/**
 * TRL's `_compute_loss` from policy log-probs `lp` and entropies `ent` (whole-tensor steps, torch's
 * broadcasting of [B][1] per-sequence values); `frozen` replaces detached factors by fixed values
 * (the surrogate whose derivative autodiff gives).
 */
function trlLoss(x: Batch, lp: Mat, p: P, frozen: Frozen = {}, ent: Mat = x.token_entropies): number {
  const m = x.completion_mask;
  const B = lp.length;
  const epsHigh = p.epsilon_high ?? p.epsilon;
  const A = col1(x.advantages);
  const counts = rowSum(m);
  const total = sum(m);
  const logRatio = map(lp, (v, b, t) => (m[b][t] ? v - x.old_token_logps[b][t] : 0));
  const isRatio = samplingRatio(x, p);
  let offPolicy: Mat | null = null;
  if (p.off_policy_mask_threshold !== null) {
    const src = x.sampling_token_logps ?? x.old_token_logps;
    const kl = map(src, (s, b, t) => (s - lp[b][t]) * m[b][t]);
    offPolicy = col1(rowSum(kl).map((s, b) => (x.advantages[b] >= 0 || s / Math.max(counts[b], 1) <= p.off_policy_mask_threshold! ? 1 : 0)));
  }
  const logW: Mat = p.importance_sampling_level === 'token' ? logRatio : col1(rowSum(map(logRatio, (v, b, t) => v * m[b][t])).map((s, b) => s / Math.max(counts[b], 1)));
  const coef1 = map(logW, Math.exp);
  let perTokenKl: Mat | null = null;
  if (p.beta > 0) {
    perTokenKl = map(lp, (v, b, t) => Math.exp(x.ref_token_logps[b][t] - v) - (x.ref_token_logps[b][t] - v) - 1);
    if (p.use_bias_correction_kl) perTokenKl = bmul(perTokenKl, coef1);
  }
  let perToken: Mat;
  const lt = p.loss_type;
  if (lt === 'cispo') {
    const clamped = frozen.cispo ?? map(coef1, (c) => Math.min(c, epsHigh));
    perToken = bmul(bmul(map(clamped, (c) => -c), A), lp);
  } else if (lt === 'sapo') {
    perToken = map(bmul(coef1, map(A, () => 1)), (c, b) => {
      const tau = x.advantages[b] > 0 ? p.sapo_temperature_pos : p.sapo_temperature_neg;
      return -(sig(tau * (c - 1)) * 4) / tau * x.advantages[b];
    });
  } else if (lt === 'vespo') {
    let phi = frozen.phi;
    if (!phi) {
      const lower = Math.log(1e-8);
      const seqLog = rowSum(map(logRatio, (v, b, t) => clamp(v, -20, 20) * m[b][t]));
      const withIs = isRatio ? seqLog.map((s, b) => s + isRatio[b].reduce((a, r) => a + clamp(Math.log(r), lower, 20), 0)) : seqLog;
      phi = col1(withIs.map((s, b) => {
        const lw = clamp(s, lower, 20);
        const pos = x.advantages[b] >= 0;
        const k = pos ? p.vespo_k_pos : p.vespo_k_neg;
        const lam = Math.max(pos ? p.vespo_lambda_pos : p.vespo_lambda_neg, 1e-4);
        const v = Math.exp(lam + k * lw - lam * Math.exp(lw));
        return Number.isFinite(v) ? v : 0;
      }));
    }
    perToken = bmul(bmul(map(phi, (v) => -v), A), lp);
  } else {
    const coef2 = map(coef1, (c) => clamp(c, 1 - p.epsilon, 1 + epsHigh));
    const c1 = p.delta === null ? coef1 : map(coef1, (c) => Math.min(c, p.delta!));
    const l1 = bmul(c1, A);
    const l2 = bmul(coef2, A);
    perToken = map(l1, (v, b, t) => -Math.min(v, l2[b][t]));
  }
  if (offPolicy) perToken = bmul(perToken, offPolicy);
  let em: Mat | null = null;
  if (p.top_entropy_quantile < 1) {
    em = entropyMask(ent, m, p.top_entropy_quantile);
    perToken = bmul(perToken, em);
  }
  if (isRatio && lt !== 'vespo') perToken = bmul(perToken, isRatio);
  if (perTokenKl) perToken = badd(perToken, map(perTokenKl, (v) => p.beta * v));
  // The teacher's KL (distill_coef λ): the same k3 estimator against teacher_token_logps.
  const lambda = p.distill_coef ?? 0;
  if (lambda > 0) {
    let teacherKl = map(lp, (v, b, t) => Math.exp(x.teacher_token_logps[b][t] - v) - (x.teacher_token_logps[b][t] - v) - 1);
    if (p.use_bias_correction_kl) teacherKl = bmul(teacherKl, coef1);
    perToken = badd(perToken, map(teacherKl, (v) => lambda * v));
  }
  const masked = bmul(perToken, m);
  const N = Math.max(x.num_items_in_batch ?? total, 1);
  let loss: number;
  switch (lt) {
    case 'grpo':
    case 'sapo':
      loss = rowSum(masked).reduce((a, s, b) => a + s / Math.max(counts[b], 1), 0) / B;
      break;
    case 'bnpo':
      loss = sum(masked) / Math.max(total, 1);
      break;
    case 'dr_grpo':
      loss = sum(masked) / (B * p.max_completion_length);
      break;
    case 'luspo': {
      const scaled = bmul(perToken, col1(counts));
      loss = sum(scaled) / (scaled.length * scaled[0].length);
      break;
    }
    default:
      loss = sum(masked) / N;
  }
  if (p.entropy_coef !== 0 || p.use_adaptive_entropy) {
    const eff = em ? bmul(m, em) : m;
    const hm = sum(bmul(ent, eff));
    const entropyLoss = ['cispo', 'dapo', 'vespo'].includes(lt) ? hm / N : hm / Math.max(sum(eff), 1);
    const coef = x.entropy_coef ?? p.entropy_coef;
    const last = x.last_world_entropy ?? Infinity;
    const apply = p.use_adaptive_entropy ? (last <= p.entropy_target ? coef : 0) : coef;
    loss -= apply * entropyLoss;
  }
  return loss;
}

/** Central differences of trlLoss w.r.t. each policy log-prob. */
function finiteDiff(x: Batch, p: P, frozen?: Frozen): Mat {
  return map(x.policy_token_logps, (v, b, t) => {
    const h = 1e-6 * Math.max(1, Math.abs(v));
    const at = (y: number) => trlLoss(x, map(x.policy_token_logps, (w, bb, tt) => (bb === b && tt === t ? y : w)), p, frozen);
    return (at(v + h) - at(v - h)) / (2 * h);
  });
}

/** Central differences of trlLoss w.r.t. each token entropy (the entropy bonus). */
function finiteDiffEntropy(x: Batch, p: P, frozen?: Frozen): Mat {
  return map(x.token_entropies, (v, b, t) => {
    const h = 1e-6 * Math.max(1, Math.abs(v));
    const at = (y: number) => trlLoss(x, x.policy_token_logps, p, frozen, map(x.token_entropies, (w, bb, tt) => (bb === b && tt === t ? y : w)));
    return (at(v + h) - at(v - h)) / (2 * h);
  });
}

/** The detached factors at the batch's own log-probs. */
function frozenOf(x: Batch, p: P): Frozen {
  const m = x.completion_mask;
  if (p.loss_type === 'cispo') {
    const epsHigh = p.epsilon_high ?? p.epsilon;
    const lr = map(x.policy_token_logps, (lp, b, t) => (m[b][t] ? lp - x.old_token_logps[b][t] : 0));
    const seq = rowSum(lr).map((s, b) => s / Math.max(rowSum(m)[b], 1));
    return { cispo: map(lr, (l, b) => Math.min(Math.exp(p.importance_sampling_level === 'token' ? l : seq[b]), epsHigh)) };
  }
  if (p.loss_type === 'vespo') {
    // φ read back from the transcription: its loss at lp is −Σ φ_b·A_b·Σ_t m·lp / N with nothing else varying by row.
    const lower = Math.log(1e-8);
    const isRatio = samplingRatio(x, p);
    const lr = map(x.policy_token_logps, (lp, b, t) => (m[b][t] ? lp - x.old_token_logps[b][t] : 0));
    return {
      phi: col1(rowSum(map(lr, (v, b, t) => clamp(v, -20, 20) * m[b][t])).map((s, b) => {
        const lw = clamp(s + (isRatio ? isRatio[b].reduce((a, r) => a + clamp(Math.log(r), lower, 20), 0) : 0), lower, 20);
        const pos = x.advantages[b] >= 0;
        const k = pos ? p.vespo_k_pos : p.vespo_k_neg;
        const lam = Math.max(pos ? p.vespo_lambda_pos : p.vespo_lambda_neg, 1e-4);
        const v = Math.exp(lam + k * lw - lam * Math.exp(lw));
        return Number.isFinite(v) ? v : 0;
      })),
    };
  }
  return {};
}

function hostBatch(x: Batch, p: P): HostBatch {
  const bound = resolveLoss('grpo', p as unknown as Record<string, unknown>);
  return parseBatch({ ...x }, 'grpo', bound.keys('grpo'));
}

function maxAbsDiff(a: ArrayLike<number>, b: ArrayLike<number>): number {
  expect(a.length).toBe(b.length);
  let e = 0;
  for (let i = 0; i < a.length; i++) e = Math.max(e, Math.abs(a[i] - b[i]));
  return e;
}

interface Variant {
  name: string;
  params: Partial<P>;
  /** Feed the sampler's log-probs; set the bonus's scalars; replace the advantages. */
  batch?: Partial<Batch> & { withSampling?: boolean };
  /** Also check float32 (one case per loss type keeps the file fast). */
  f32?: boolean;
}

const VARIANTS: Variant[] = [];
for (const lt of GRPO_LOSS_TYPES) {
  for (const level of ['token', 'sequence']) {
    if (lt === 'luspo' && level === 'token') continue; // refused (below)
    const base = { loss_type: lt, importance_sampling_level: level };
    VARIANTS.push({ name: `${lt} ${level}`, params: base, f32: true });
    if (lt !== 'luspo') VARIANTS.push({ name: `${lt} ${level} beta=0.04`, params: { ...base, beta: 0.04 } });
    if (lt === 'cispo') VARIANTS.push({ name: `${lt} ${level} epsilon_high=1.1`, params: { ...base, epsilon_high: 1.1 } });
    else if (lt === 'sapo') VARIANTS.push({ name: `${lt} ${level} temperatures 0.5/4`, params: { ...base, sapo_temperature_pos: 0.5, sapo_temperature_neg: 4 } });
    else if (lt === 'vespo') VARIANTS.push({ name: `${lt} ${level} k 0.5/6 lambda 1/8`, params: { ...base, vespo_k_pos: 0.5, vespo_k_neg: 6, vespo_lambda_pos: 1, vespo_lambda_neg: 8 } });
    else VARIANTS.push({ name: `${lt} ${level} delta=1.25 epsilon_high=0.1`, params: { ...base, delta: 1.25, epsilon_high: 0.1 } });
  }
}
VARIANTS.push({ name: 'dapo token top_entropy_quantile=0.4 beta=0.1', params: { top_entropy_quantile: 0.4, beta: 0.1 } });
VARIANTS.push({ name: 'dapo token distill_coef=0.3 (the teacher KL)', params: { distill_coef: 0.3 }, f32: true });
VARIANTS.push({ name: 'grpo sequence beta=0.04 distill_coef=0.2 (both KLs)', params: { loss_type: 'grpo', importance_sampling_level: 'sequence', beta: 0.04, distill_coef: 0.2 } });
VARIANTS.push({ name: 'cispo token distill_coef=0.5 top_entropy_quantile=0.4 (the KL is never entropy-masked)', params: { loss_type: 'cispo', distill_coef: 0.5, top_entropy_quantile: 0.4 } });
VARIANTS.push({ name: 'grpo sequence top_entropy_quantile=0.2', params: { loss_type: 'grpo', importance_sampling_level: 'sequence', top_entropy_quantile: 0.2 } });
// Row 1 (A < 0) has Σ log w ≈ 0.78: e^(1000·0.78) overflows, and TRL's nan_to_num counts that row's φ as 0
// (row 3 is given A > 0 here, so no other row's φ is astronomically large).
const OVERFLOW = { loss_type: 'vespo', vespo_k_neg: 1000, vespo_lambda_neg: 1e-4 };
const OVERFLOW_ADV = [1.2, -0.7, 0.4, 1.5, 0.9, -0.3];
VARIANTS.push({ name: 'vespo: k large enough that φ overflows to ∞ for a row (TRL counts it 0)', params: OVERFLOW, batch: { advantages: OVERFLOW_ADV } });

// The sampler–trainer correction: both bounds bind (token ratios e^±0.45 against [0.8, 1.25]; the
// rows' products 0.35…1.29 against [0.5, 1.2]; the test checks it).
const TOKEN_BOUNDS = { vllm_importance_sampling_clip_min: 0.8, vllm_importance_sampling_clip_max: 1.25 };
const SEQ_BOUNDS = { vllm_importance_sampling_clip_min: 0.5, vllm_importance_sampling_clip_max: 1.2 };
const CORRECTION_CASES: Variant[] = [];
for (const mode of ['token_truncate', 'token_mask', 'sequence_truncate', 'sequence_mask']) {
  const bounds = mode.startsWith('token') ? TOKEN_BOUNDS : SEQ_BOUNDS;
  const c = { vllm_importance_sampling_mode: mode, ...bounds };
  CORRECTION_CASES.push({ name: `${mode}: dapo token`, params: c, batch: { withSampling: true }, f32: true });
  CORRECTION_CASES.push({ name: `${mode}: grpo sequence beta=0.04 (the KL term is not corrected)`, params: { ...c, loss_type: 'grpo', importance_sampling_level: 'sequence', beta: 0.04 }, batch: { withSampling: true } });
  if (mode.startsWith('token')) CORRECTION_CASES.push({ name: `${mode}: vespo (the ratio enters φ)`, params: { ...c, loss_type: 'vespo' }, batch: { withSampling: true } });
  else CORRECTION_CASES.push({ name: `${mode}: luspo`, params: { ...c, loss_type: 'luspo', importance_sampling_level: 'sequence' }, batch: { withSampling: true } });
}
CORRECTION_CASES.push({ name: 'token_truncate without clip_min: sapo token', params: { loss_type: 'sapo', vllm_importance_sampling_mode: 'token_truncate', vllm_importance_sampling_clip_max: 1.25 }, batch: { withSampling: true } });
CORRECTION_CASES.push({ name: 'sequence_mask (defaults): cispo sequence', params: { loss_type: 'cispo', importance_sampling_level: 'sequence', vllm_importance_sampling_clip_max: 1.2 }, batch: { withSampling: true } });
CORRECTION_CASES.push({ name: 'correction off: the sampler log-probs only measured', params: { vllm_importance_sampling_correction: false, ...TOKEN_BOUNDS }, batch: { withSampling: true } });

// Off-policy sequence masking: advantages of both signs and 0. Without sampler log-probs the drift is
// measured from the old ones (δ = 0.001 drops row 5, keeps rows 1 and 3); with them from the
// sampler's (δ = 0.04 drops row 1, keeps 3 and 5); row 2 (A = 0) drifts most and is always kept.
const SIGNED = [1.2, -0.7, 0, -1.5, 0.9, -0.3];
const MASK_CASES: Variant[] = [
  { name: 'dapo token, drift from old', params: { off_policy_mask_threshold: 0.001 }, batch: { advantages: SIGNED } },
  { name: 'dapo token beta=0.04, drift from old (the KL term is never masked)', params: { off_policy_mask_threshold: 0.001, beta: 0.04 }, batch: { advantages: SIGNED }, f32: true },
  { name: 'grpo sequence, drift from the sampler', params: { off_policy_mask_threshold: 0.04, loss_type: 'grpo', importance_sampling_level: 'sequence', vllm_importance_sampling_correction: false }, batch: { advantages: SIGNED, withSampling: true } },
  { name: 'sapo token, drift from the sampler, with the correction', params: { off_policy_mask_threshold: 0.04, loss_type: 'sapo', vllm_importance_sampling_mode: 'token_truncate', ...TOKEN_BOUNDS }, batch: { advantages: SIGNED, withSampling: true } },
  { name: 'vespo, drift from old, beta=0.04', params: { off_policy_mask_threshold: 0.001, loss_type: 'vespo', beta: 0.04 }, batch: { advantages: SIGNED } },
  { name: 'luspo, drift from old', params: { off_policy_mask_threshold: 0.001, loss_type: 'luspo', importance_sampling_level: 'sequence' }, batch: { advantages: SIGNED } },
];

// The bias-corrected KL: k3 × the undetached ratio, at each level (for vespo the level only sets this ratio).
const BIAS_CASES: Variant[] = [
  { name: 'dapo token', params: { beta: 0.1, use_bias_correction_kl: true } },
  { name: 'grpo sequence', params: { beta: 0.1, use_bias_correction_kl: true, loss_type: 'grpo', importance_sampling_level: 'sequence' }, f32: true },
  { name: 'cispo token', params: { beta: 0.1, use_bias_correction_kl: true, loss_type: 'cispo' } },
  { name: 'vespo sequence', params: { beta: 0.1, use_bias_correction_kl: true, loss_type: 'vespo', importance_sampling_level: 'sequence' } },
  { name: 'sapo token with off-policy masking', params: { beta: 0.1, use_bias_correction_kl: true, loss_type: 'sapo', off_policy_mask_threshold: 0.001 }, batch: { advantages: SIGNED } },
  { name: 'dapo token, the teacher KL only (beta 0, distill_coef 0.3)', params: { distill_coef: 0.3, use_bias_correction_kl: true } },
  { name: 'grpo sequence, both KLs', params: { beta: 0.1, distill_coef: 0.3, use_bias_correction_kl: true, loss_type: 'grpo', importance_sampling_level: 'sequence' } },
];

// The entropy bonus, per loss type (its normaliser: N for dapo, cispo, vespo; the counted tokens else).
const ENTROPY_CASES: Variant[] = GRPO_LOSS_TYPES.map((lt) => ({
  name: `${lt}: entropy_coef=0.05`,
  params: { loss_type: lt, entropy_coef: 0.05, importance_sampling_level: lt === 'luspo' ? 'sequence' : 'token' },
}));
ENTROPY_CASES.push(
  { name: 'grpo with top_entropy_quantile=0.5 (the bonus on the same tokens)', params: { loss_type: 'grpo', entropy_coef: 0.05, top_entropy_quantile: 0.5 } },
  { name: 'dapo with num_items_in_batch', params: { entropy_coef: 0.05 }, batch: { num_items_in_batch: 40 } as Partial<Batch> },
  { name: 'adaptive, last entropy at the target: applied, coefficient from the batch', params: { use_adaptive_entropy: true, entropy_target: 0.5 }, batch: { last_world_entropy: 0.5, entropy_coef: 0.3 }, f32: true },
  { name: 'adaptive, last entropy above the target: not applied', params: { use_adaptive_entropy: true, entropy_coef: 0.3 }, batch: { last_world_entropy: 0.21 } },
  { name: 'adaptive, no measurement yet: not applied', params: { use_adaptive_entropy: true, entropy_coef: 0.3, loss_type: 'sapo' } },
);

/** Checks a case: the module's float64 reference and the ONNX graph against the transcription and its finite differences. */
async function checkCase(v: Variant): Promise<{ ref: LossRun; f64: LossRun; x: Batch; p: P }> {
  const p: P = { ...DEFAULTS, ...v.params };
  const x = batchOf(makeBatch(11), v.batch);
  const bound = resolveLoss('grpo', { max_completion_length: DEFAULTS.max_completion_length, ...v.params } as Record<string, unknown>);
  const batch = hostBatch(x, p);
  const want = trlLoss(x, x.policy_token_logps, p);
  const frozen = frozenOf(x, p);
  const fd = finiteDiff(x, p, frozen).flat();
  const bonus = p.entropy_coef !== 0 || p.use_adaptive_entropy;

  const ref = runLossReference(bound, batch, { grad: true });
  expect(Math.abs(ref.loss - want)).toBeLessThan(1e-12 * Math.max(1, Math.abs(want)));
  expect(maxAbsDiff(ref.grad.policy_token_logps, fd)).toBeLessThan(1e-7);
  expect(ref.perExample.reduce((a, b) => a + b, 0) / ref.perExample.length).toBeCloseTo(want, 12);

  const f64 = await runLossOnnx(bound, batch, { dtype: 'float64', grad: true });
  expect(Math.abs(f64.loss - want)).toBeLessThan(1e-12 * Math.max(1, Math.abs(want)));
  expect(maxAbsDiff(f64.grad.policy_token_logps, fd)).toBeLessThan(1e-7);
  expect(maxAbsDiff(f64.perExample, ref.perExample)).toBeLessThan(1e-12);
  expect(Object.keys(f64.metrics).sort()).toEqual(Object.keys(ref.metrics).sort());
  for (const k of Object.keys(ref.metrics)) expect(f64.metrics[k], k).toBeCloseTo(ref.metrics[k], 12);
  // Padding (junk log-probs) and the fully masked row get no gradient.
  expect(Array.from(f64.grad.policy_token_logps).filter((g, i) => x.completion_mask.flat()[i] === 0 && g !== 0)).toEqual([]);
  if (bonus) {
    const fdH = finiteDiffEntropy(x, p, frozen).flat();
    expect(maxAbsDiff(ref.grad.token_entropies, fdH)).toBeLessThan(1e-7);
    expect(maxAbsDiff(f64.grad.token_entropies, fdH)).toBeLessThan(1e-7);
  } else expect(f64.grad.token_entropies).toBeUndefined();

  if (v.f32) {
    const b32: HostBatch = Object.fromEntries(Object.entries(batch).map(([k, t]) => [k, { dims: t.dims, data: t.data.map(Math.fround) }]));
    const ref32 = runLossReference(bound, b32, { grad: true });
    const f32 = await runLossOnnx(bound, b32, { dtype: 'float32', grad: true });
    expect(Math.abs(f32.loss - ref32.loss)).toBeLessThan(1e-5 * Math.max(1, Math.abs(ref32.loss)));
    expect(maxAbsDiff(f32.grad.policy_token_logps, ref32.grad.policy_token_logps)).toBeLessThan(1e-5);
    if (bonus) expect(maxAbsDiff(f32.grad.token_entropies, ref32.grad.token_entropies)).toBeLessThan(1e-6);
    for (const k of Object.keys(ref32.metrics)) expect(Math.abs(f32.metrics[k] - ref32.metrics[k]), k).toBeLessThan(1e-5 * Math.max(1, Math.abs(ref32.metrics[k])));
  }
  return { ref, f64, x, p };
}

describe('grpo loss: float64 reference (TRL transcription), finite differences, ONNX', () => {
  for (const v of VARIANTS) it(v.name, async () => void (await checkCase(v)));

  it('the overflow case overflows: one row\'s φ is ∞ before TRL\'s nan_to_num, and that row then adds nothing', () => {
    const x = batchOf(makeBatch(11), { advantages: OVERFLOW_ADV });
    const p: P = { ...DEFAULTS, ...OVERFLOW } as P;
    const lw = x.policy_token_logps[1].reduce((a, v, t) => a + (v - x.old_token_logps[1][t]) * x.completion_mask[1][t], 0);
    expect(Math.exp(1e-4 + 1000 * lw - 1e-4 * Math.exp(lw))).toBe(Infinity);
    const bound = resolveLoss('grpo', OVERFLOW);
    const r = runLossReference(bound, hostBatch(x, p));
    expect(Math.abs(r.perExample[1])).toBe(0);
    expect(Number.isFinite(r.loss)).toBe(true);
  });
});

describe('grpo loss: the sampler–trainer correction (sampling_token_logps)', () => {
  for (const v of CORRECTION_CASES) {
    it(v.name, async () => {
      const { ref, p, x } = await checkCase(v);
      // TRL's mismatch metrics: |o − s| over the counted tokens.
      const diffs = x.old_token_logps.flatMap((row, b) => row.map((o, t) => Math.abs(o - x.sampling_token_logps![b][t])).filter((_, t) => x.completion_mask[b][t] === 1));
      expect(ref.metrics['sampling/sampling_logp_difference/max']).toBe(Math.max(...diffs));
      // prefzoo's KL estimate: k3 = r − 1 − log r with r = e^(o − s), the trainer over the sampler, averaged over the counted tokens.
      const k3 = x.old_token_logps.flatMap((row, b) => row.map((o, t) => { const r = Math.exp(o - x.sampling_token_logps![b][t]); return r - 1 - Math.log(r); }).filter((_, t) => x.completion_mask[b][t] === 1));
      expect(ref.metrics['sampling/sampling_kl']).toBeCloseTo(k3.reduce((a, v) => a + v, 0) / k3.length, 12);
      expect(ref.metrics['sampling/sampling_kl']).toBeGreaterThan(0);
      if (!p.vllm_importance_sampling_correction) {
        expect(ref.metrics['sampling/importance_sampling_ratio/mean']).toBeUndefined();
        expect(ref.loss).toBeCloseTo(trlLoss(batchOf(makeBatch(11)), x.policy_token_logps, p), 14);
        return;
      }
      // Both bounds bind: some raw ratio lies below clip_min and some above clip_max.
      const raw = samplingRatio(x, { ...p, vllm_importance_sampling_mode: p.vllm_importance_sampling_mode.replace('mask', 'truncate'), vllm_importance_sampling_clip_min: null, vllm_importance_sampling_clip_max: Infinity })!;
      const counted = raw.flatMap((row, b) => (row.length === 1 ? row : row.filter((_, t) => x.completion_mask[b][t] === 1)));
      if (p.vllm_importance_sampling_clip_min !== null) expect(counted.some((r) => r < p.vllm_importance_sampling_clip_min!)).toBe(true);
      expect(counted.some((r) => r > p.vllm_importance_sampling_clip_max)).toBe(true);
      if (p.vllm_importance_sampling_mode.endsWith('truncate')) {
        if (p.vllm_importance_sampling_clip_min !== null) expect(ref.metrics['sampling/importance_sampling_ratio/min']).toBe(p.vllm_importance_sampling_clip_min);
        expect(ref.metrics['sampling/importance_sampling_ratio/max']).toBe(p.vllm_importance_sampling_clip_max);
      } else expect(ref.metrics['sampling/importance_sampling_ratio/min']).toBe(0);
      // And the correction changed the loss.
      expect(Math.abs(ref.loss - trlLoss(batchOf(makeBatch(11)), x.policy_token_logps, { ...p, off_policy_mask_threshold: null }))).toBeGreaterThan(1e-6);
    });
  }
});

describe('grpo loss: the sampler–trainer KL estimate (sampling/sampling_kl) at the gaps of a float32 or q8 sampler', () => {
  it('float32 gives the float64 k3 to 1e-3 relative at |o − s| of 1e-6 … 0.3, and at only 1e-6 … 3e-4 (where e^d − 1 − d written out in float32 is off by a third)', async () => {
    const x0 = makeBatch(11);
    const m = x0.completion_mask;
    // Gaps spread over four decades, signs mixed, one large one (the series' other side).
    const gaps = [1e-6, -3e-6, 1e-5, -2e-5, 1e-4, -3e-4, 1e-3, -2e-3, 1e-2, -0.03, 0.3];
    let k = 0;
    const sampling = x0.old_token_logps.map((row, b) => row.map((o, t) => (m[b][t] ? o - gaps[k++ % gaps.length] : 7)));
    const p = { ...DEFAULTS } as P;
    const b32: HostBatch = Object.fromEntries(Object.entries(hostBatch({ ...batchOf(x0), sampling_token_logps: sampling }, p)).map(([key, t]) => [key, { dims: t.dims, data: t.data.map(Math.fround) }]));
    const o32 = b32.old_token_logps.data;
    const s32 = b32.sampling_token_logps.data;
    let want = 0;
    let n = 0;
    for (let i = 0; i < o32.length; i++) if (b32.completion_mask.data[i] === 1) { want += Math.expm1(o32[i] - s32[i]) - (o32[i] - s32[i]); n++; }
    want /= n;
    const got = (await runLossOnnx(resolveLoss('grpo', {}), b32, { dtype: 'float32' })).metrics['sampling/sampling_kl'];
    expect(Math.abs(got - want) / want).toBeLessThan(1e-3);
    // Only the small gaps (a q8 sampler's): the mean is ~1e-8, under float32's spacing near 1, and the series carries it alone.
    const tiny = [1e-6, -3e-6, 1e-5, -2e-5, 1e-4, -3e-4];
    const small = b32.sampling_token_logps.data.map((v, i) => (b32.completion_mask.data[i] === 1 ? Math.fround(o32[i] - tiny[i % tiny.length]) : v));
    let want2 = 0;
    for (let i = 0; i < o32.length; i++) if (b32.completion_mask.data[i] === 1) want2 += Math.expm1(o32[i] - small[i]) - (o32[i] - small[i]);
    want2 /= n;
    const got2 = (await runLossOnnx(resolveLoss('grpo', {}), { ...b32, sampling_token_logps: { dims: b32.sampling_token_logps.dims, data: small } }, { dtype: 'float32' })).metrics['sampling/sampling_kl'];
    expect(want2).toBeLessThan(1e-7);
    expect(Math.abs(got2 - want2) / want2).toBeLessThan(1e-3);
  });
});

describe('grpo loss: off-policy sequence masking (DeepSeek-V3.2)', () => {
  for (const v of MASK_CASES) {
    it(v.name, async () => {
      const { ref, p, x } = await checkCase(v);
      const src = x.sampling_token_logps ?? x.old_token_logps;
      const m = x.completion_mask;
      const drift = src.map((row, b) => row.reduce((a, s, t) => a + (s - x.policy_token_logps[b][t]) * m[b][t], 0) / Math.max(rowSum(m)[b], 1));
      const dropped = drift.map((d, b) => x.advantages[b] < 0 && d > p.off_policy_mask_threshold!);
      // The case exercises every branch: a negative row dropped, a negative row kept, a zero-advantage row drifting past δ kept.
      expect(dropped.some(Boolean)).toBe(true);
      expect(x.advantages.some((a, b) => a < 0 && !dropped[b])).toBe(true);
      expect(drift[2]).toBeGreaterThan(p.off_policy_mask_threshold!);
      const off = runLossReference(resolveLoss('grpo', { ...v.params, off_policy_mask_threshold: null } as Record<string, unknown>), hostBatch(x, p), { grad: true });
      dropped.forEach((d, b) => {
        // A dropped row keeps only its KL term (β·k3, which the unmasked run has as well); a kept row is unchanged.
        if (!d) expect(ref.perExample[b]).toBeCloseTo(off.perExample[b], 13);
        else if (p.beta === 0) expect(ref.perExample[b]).toBe(0);
        else expect(Math.abs(ref.perExample[b])).toBeGreaterThan(0);
      });
    });
  }
});

describe('grpo loss: bias-corrected KL (use_bias_correction_kl)', () => {
  for (const v of BIAS_CASES) {
    it(v.name, async () => {
      const { ref, p, x } = await checkCase(v);
      const plain = trlLoss(x, x.policy_token_logps, { ...p, use_bias_correction_kl: false });
      expect(Math.abs(ref.loss - plain)).toBeGreaterThan(1e-6);
    });
  }
});

describe('grpo loss: the entropy bonus and its adaptive coefficient', () => {
  for (const v of ENTROPY_CASES) {
    it(v.name, async () => {
      const { ref, p, x } = await checkCase(v);
      const applied = appliedEntropyCoef(x.entropy_coef ?? p.entropy_coef, x.last_world_entropy, p);
      const none = trlLoss(x, x.policy_token_logps, { ...p, entropy_coef: 0, use_adaptive_entropy: false });
      expect(ref.metrics.policy_loss).toBeCloseTo(none, 13);
      if (applied === 0) {
        expect(ref.loss).toBe(ref.metrics.policy_loss);
        expect(Array.from(ref.grad.token_entropies).every((g) => g === 0)).toBe(true);
      } else expect(ref.loss).toBeLessThan(none);
    });
  }

  it('the adaptive coefficient (Skywork-OR1, TRL): +δ up to the maximum at or below the target, −δ down to the minimum above it', () => {
    const s = { entropy_target: 0.2, entropy_coef_delta: 0.005, entropy_coef_min: 0, entropy_coef_max: 0.012 };
    const trace: number[] = [];
    let c = 0;
    for (const h of [0.5, 0.2, 0.1, 0.05, 0.19, 0.3, 0.25, 0.21, 0.22, 0.4]) trace.push((c = nextEntropyCoef(c, h, s)));
    // Float64 steps as Python's: 0 → 0.005 → 0.01 → 0.012 (capped) … → 0 (floored).
    expect(trace).toEqual([0, 0.005, 0.01, 0.012, 0.012, 0.007, 0.007 - 0.005, 0, 0, 0]);
    expect(nextEntropyCoef(0.3, 0.2, { ...s, entropy_coef_max: 1 })).toBe(0.3 + 0.005);
    expect(() => nextEntropyCoef(0, 0, { ...s, entropy_coef_min: 0.5 })).toThrow(/entropy_coef_min \(0\.5\) must be ≤ entropy_coef_max/);
    expect(appliedEntropyCoef(0.3, undefined, { use_adaptive_entropy: true, entropy_target: 0.2 })).toBe(0);
    expect(appliedEntropyCoef(0.3, 0.2, { use_adaptive_entropy: true, entropy_target: 0.2 })).toBe(0.3);
    expect(appliedEntropyCoef(0.3, undefined, { use_adaptive_entropy: false, entropy_target: 0.2 })).toBe(0.3);
  });
});

describe('grpo loss: identities and refusals', () => {
  it('on-policy (policy = old), token level: the loss is −Σ A·m / N and its gradient −A_b·m/N (the policy gradient); k3 KL is 0 at policy = reference', async () => {
    const x = batchOf(makeBatch(3));
    const same = { ...x, old_token_logps: x.policy_token_logps, ref_token_logps: x.policy_token_logps };
    const bound = resolveLoss('grpo', { beta: 0.5 });
    const run = await runLossOnnx(bound, parseBatch(same, 'grpo', bound.keys('grpo')), { dtype: 'float64', grad: true });
    const N = sum(x.completion_mask);
    const want = -x.completion_mask.reduce((a, row, b) => a + row.reduce((s, m) => s + m * x.advantages[b], 0), 0) / N;
    expect(run.loss).toBeCloseTo(want, 14);
    expect(run.metrics.kl).toBe(0);
    const g = x.completion_mask.flatMap((row, b) => row.map((m) => (-x.advantages[b] * m) / N));
    expect(maxAbsDiff(run.grad.policy_token_logps, g)).toBeLessThan(1e-14);
  });

  it('num_items_in_batch replaces the token count of dapo, cispo and vespo; bnpo ignores it', async () => {
    const x = batchOf(makeBatch(5));
    for (const lt of ['dapo', 'cispo', 'vespo', 'bnpo']) {
      const bound = resolveLoss('grpo', { loss_type: lt });
      const base = runLossReference(bound, parseBatch({ ...x }, 'grpo', bound.keys('grpo'))).loss;
      const batch = parseBatch({ ...x, num_items_in_batch: 4 * sum(x.completion_mask) }, 'grpo', bound.keys('grpo'));
      const scaled = runLossReference(bound, batch).loss;
      expect(scaled, lt).toBeCloseTo(lt === 'bnpo' ? base : base / 4, 14);
      if (lt === 'bnpo') expect((await runLossOnnx(bound, batch)).loss).toBeCloseTo(base, 14);
    }
  });

  it('bad batches and settings fail with one line naming the key or parameter', () => {
    const x = batchOf(makeBatch(1));
    const bound = resolveLoss('grpo', { beta: 0.1 });
    const { ref_token_logps: _r, ...noRef } = x;
    expect(() => parseBatch(noRef, 'grpo', bound.keys('grpo'))).toThrow(/missing key "ref_token_logps"/);
    const short = { ...x, old_token_logps: x.old_token_logps.map((row) => row.slice(1)) };
    expect(() => parseBatch(short, 'grpo', bound.keys('grpo'))).toThrow(/"old_token_logps" has rows of 4 tokens, expected 5/);
    expect(() => parseBatch({ ...x, completion_mask: map(x.completion_mask, () => 0.5) }, 'grpo', bound.keys('grpo'))).toThrow(/completion_mask.*0 or 1/);
    expect(() => resolveLoss('grpo', { loss_type: 'ppo' })).toThrow(/loss_type must be one of grpo, bnpo, dr_grpo, dapo, cispo, sapo, luspo, vespo/);
    expect(() => resolveLoss('grpo', { loss_type: 'cispo', delta: 2 })).toThrow(/delta applies to the clipped loss types/);
    expect(() => resolveLoss('grpo', { loss_type: 'sapo', delta: 2 })).toThrow(/delta applies to the clipped loss types \(grpo, bnpo, dr_grpo, dapo, luspo\), not sapo/);
    expect(() => resolveLoss('grpo', { loss_type: 'vespo', epsilon_high: 0.28 })).toThrow(/epsilon_high does not apply to loss_type=vespo/);
    const q = resolveLoss('grpo', { top_entropy_quantile: 0.5 });
    expect(q.keys('grpo').required).toContain('token_entropies');
    // LUSPO where TRL's unmasked mean would run over padding: refused.
    expect(() => resolveLoss('grpo', { loss_type: 'luspo' })).toThrow(/^loss grpo: loss_type=luspo needs importance_sampling_level=sequence/);
    const luspo = { loss_type: 'luspo', importance_sampling_level: 'sequence' };
    expect(() => resolveLoss('grpo', { ...luspo, beta: 0.1 })).toThrow(/luspo takes no per-token KL term/);
    expect(() => resolveLoss('grpo', { ...luspo, top_entropy_quantile: 0.5 })).toThrow(/luspo takes no per-token entropy mask/);
    expect(() => resolveLoss('grpo', { ...luspo, vllm_importance_sampling_mode: 'token_mask' })).toThrow(/luspo takes the sampler correction per sequence/);
    expect(() => resolveLoss('grpo', { ...luspo, vllm_importance_sampling_mode: 'token_mask', vllm_importance_sampling_correction: false })).not.toThrow();
    // VESPO takes the correction per token, once sampler log-probs come.
    const vespo = resolveLoss('grpo', { loss_type: 'vespo' });
    const withSampling = parseBatch(batchOf(makeBatch(1), { withSampling: true }), 'grpo', vespo.keys('grpo'));
    expect(() => runLossReference(vespo, withSampling)).toThrow(/vespo takes the sampler correction per token.*got sequence_mask/);
    expect(() => buildLossGraph(vespo, withSampling, 'float64', false)).toThrow(/vespo takes the sampler correction per token/);
    expect(() => runLossReference(vespo, parseBatch(x, 'grpo', vespo.keys('grpo')))).not.toThrow();
    expect(() => resolveLoss('grpo', { vllm_importance_sampling_clip_min: 0.5, vllm_importance_sampling_clip_max: 1 })).not.toThrow();
    expect(() => resolveLoss('grpo', { vllm_importance_sampling_clip_min: 1, vllm_importance_sampling_clip_max: 1 })).toThrow(/clip_min \(1\) must be less than vllm_importance_sampling_clip_max \(1\)/);
    expect(() => resolveLoss('grpo', { vllm_importance_sampling_clip_max: 0.9 })).toThrow(/vllm_importance_sampling_clip_max must be \[1, ∞\)/);
    expect(() => resolveLoss('grpo', { use_bias_correction_kl: true })).toThrow(/use_bias_correction_kl corrects the KL term, which needs beta > 0/);
    // TRL's deprecated vllm_importance_sampling_cap and the sampling_ names are aliases.
    const alias = resolveLoss('grpo', { vllm_importance_sampling_cap: 2, sampling_importance_sampling_mode: 'token_mask' });
    expect(alias.terms[0].params.vllm_importance_sampling_clip_max).toBe(2);
    expect(alias.terms[0].params.vllm_importance_sampling_mode).toBe('token_mask');
    // The bonus reads the entropies (and differentiates them).
    const bonus = resolveLoss('grpo', { entropy_coef: 0.01 });
    expect(bonus.keys('grpo').required).toContain('token_entropies');
    expect(bonus.grads('grpo')).toEqual(['policy_token_logps', 'token_entropies']);
    const { token_entropies: _h, ...noEnt } = x;
    expect(() => parseBatch(noEnt, 'grpo', bonus.keys('grpo'))).toThrow(/missing key "token_entropies"/);
    expect(() => parseBatch({ ...x, last_world_entropy: -1 }, 'grpo', resolveLoss('grpo', { use_adaptive_entropy: true }).keys('grpo'))).toThrow(/"last_world_entropy" must be a finite number ≥ 0/);
  });
});

describe('prefzoo grpo --help', () => {
  it('lists every new setting with its default and TRL name: the loss parameters, and the adaptive controller among GRPO settings', async () => {
    // GRPO declares its command beside the method; importing it registers the declaration.
    await import('../src/online/grpo/settings.ts');
    const { settingsHelp } = await import('../src/train/settings.ts');
    const loop = settingsHelp('grpo');
    for (const [k, v] of [['entropy_coef_delta', '0.005'], ['entropy_coef_min', '0'], ['entropy_coef_max', '1']]) expect(loop).toMatch(new RegExp(`${k}=${v} .*\\(TRL ${k}\\)`));
    const specs = resolveLoss('grpo').terms[0].loss.params;
    const want: Record<string, unknown> = {
      sapo_temperature_pos: 1, sapo_temperature_neg: 1.05, vespo_k_pos: 2, vespo_lambda_pos: 3, vespo_k_neg: 3, vespo_lambda_neg: 2,
      off_policy_mask_threshold: null, use_bias_correction_kl: false, vllm_importance_sampling_correction: true,
      vllm_importance_sampling_mode: 'sequence_mask', vllm_importance_sampling_clip_max: 3, vllm_importance_sampling_clip_min: null,
      entropy_coef: 0, use_adaptive_entropy: false, entropy_target: 0.2,
    };
    for (const [k, v] of Object.entries(want)) {
      const s = specs.find((q) => q.name === k);
      expect(s?.default, k).toBe(v);
      expect(s?.trl, k).toBe(k);
    }
  });
});

describe('prefzoo loss grpo', () => {
  it('prints {"loss","per_example","grad":{"policy_token_logps":[[…]]}}; the onnx and reference engines agree', async () => {
    const dir = mkdtempSync(join(tmpdir(), 'pz-grpo-loss-'));
    const file = join(dir, 'batch.json');
    const x = batchOf(makeBatch(9));
    writeFileSync(file, JSON.stringify(x));
    const args = ['loss', 'grpo', '--input', file, '--grad', '--param', 'loss_type=grpo', '--param', 'beta=0.04'];
    const [onnx, ref] = await Promise.all([prefzoo(...args), prefzoo(...args, '--engine', 'reference')]);
    expect(onnx.code, onnx.stderr).toBe(0);
    const a = JSON.parse(onnx.stdout);
    const b = JSON.parse(ref.stdout);
    expect(Object.keys(a)).toEqual(['loss', 'per_example', 'grad']);
    expect(Object.keys(a.grad)).toEqual(['policy_token_logps']);
    expect(a.grad.policy_token_logps).toHaveLength(6);
    expect(a.grad.policy_token_logps[0]).toHaveLength(5);
    expect(a.loss).toBeCloseTo(trlLoss(x, x.policy_token_logps, { ...DEFAULTS, loss_type: 'grpo', beta: 0.04 }), 12);
    expect(b.loss).toBeCloseTo(a.loss, 12);
    expect(maxAbsDiff(a.grad.policy_token_logps.flat(), b.grad.policy_token_logps.flat())).toBeLessThan(1e-12);
  });

  it('--param loss_type=vespo with the sampler log-probs and the entropy bonus: loss and gradient, grad.token_entropies included', async () => {
    const dir = mkdtempSync(join(tmpdir(), 'pz-grpo-vespo-'));
    const file = join(dir, 'batch.json');
    const x = batchOf(makeBatch(9), { withSampling: true });
    writeFileSync(file, JSON.stringify(x));
    const params = ['loss_type=vespo', 'vllm_importance_sampling_mode=token_truncate', 'entropy_coef=0.01'];
    const r = await prefzoo('loss', 'grpo', '--input', file, '--grad', '--metrics', ...params.flatMap((q) => ['--param', q]));
    expect(r.code, r.stderr).toBe(0);
    const out = JSON.parse(r.stdout);
    expect(Object.keys(out.grad)).toEqual(['policy_token_logps', 'token_entropies']);
    const p: P = { ...DEFAULTS, max_completion_length: 512, loss_type: 'vespo', vllm_importance_sampling_mode: 'token_truncate', entropy_coef: 0.01 };
    expect(out.loss).toBeCloseTo(trlLoss(x, x.policy_token_logps, p), 12);
    expect(maxAbsDiff(out.grad.token_entropies.flat(), finiteDiffEntropy(x, p).flat())).toBeLessThan(1e-7);
    expect(out.metrics['sampling/importance_sampling_ratio/max']).toBeLessThanOrEqual(3);
    expect(out.metrics['vespo/phi_seq_mean']).toBeGreaterThan(0);
  });
});
