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
import { parseBatch } from '../losses/core/batch.ts';
import { runLossOnnx, runLossReference } from '../losses/core/engine.ts';
import type { HostBatch } from '../losses/core/types.ts';
import { prefzoo } from './helpers/cli.ts';

type Mat = number[][];
interface Batch {
  policy_token_logps: Mat;
  old_token_logps: Mat;
  ref_token_logps: Mat;
  token_entropies: Mat;
  completion_mask: Mat;
  advantages: number[];
}

/** 6 completions of up to 5 tokens; row 2 is shorter, row 4 fully masked (a truncated completion); padding holds large junk. */
function makeBatch(seed: number): Batch {
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
  };
}

interface P {
  loss_type: string;
  importance_sampling_level: string;
  epsilon: number;
  epsilon_high: number | null;
  delta: number | null;
  beta: number;
  max_completion_length: number;
  top_entropy_quantile: number;
}
const DEFAULTS: P = { loss_type: 'dapo', importance_sampling_level: 'token', epsilon: 0.2, epsilon_high: null, delta: null, beta: 0, max_completion_length: 8, top_entropy_quantile: 1 };

const map = (x: Mat, f: (v: number, b: number, t: number) => number): Mat => x.map((row, b) => row.map((v, t) => f(v, b, t)));
const sum = (x: Mat) => x.flat().reduce((a, v) => a + v, 0);
const rowSum = (x: Mat) => x.map((row) => row.reduce((a, v) => a + v, 0));

/** torch.quantile (linear) of the counted entropies, then TRL's mask. */
function entropyMask(ent: Mat, mask: Mat, rho: number): Mat {
  const vals = ent.flat().filter((_, i) => mask.flat()[i] === 1).sort((a, b) => a - b);
  const pos = (1 - rho) * (vals.length - 1);
  const lo = Math.floor(pos);
  const thr = vals[lo] + (pos - lo) * (vals[Math.ceil(pos)] - vals[lo]);
  return map(ent, (e, b, t) => (e * mask[b][t] >= thr && mask[b][t] === 1 ? 1 : 0));
}

/**
 * TRL's `_compute_loss` from policy log-probs `lp` (whole-tensor steps); `frozenClamp` replaces
 * cispo's detached clamped weight by fixed values (the surrogate whose derivative autodiff gives).
 */
function trlLoss(x: Batch, lp: Mat, p: P, frozenClamp?: Mat): number {
  const m = x.completion_mask;
  const epsHigh = p.epsilon_high ?? p.epsilon;
  const logRatio = map(lp, (v, b, t) => (m[b][t] ? v - x.old_token_logps[b][t] : 0));
  const counts = rowSum(m);
  const logW: Mat = p.importance_sampling_level === 'token'
    ? logRatio
    : rowSum(map(logRatio, (v, b, t) => v * m[b][t])).map((s, b) => lp[b].map(() => s / Math.max(counts[b], 1)));
  const coef1 = map(logW, Math.exp);
  const A = x.advantages;
  let perToken: Mat;
  if (p.loss_type === 'cispo') {
    const clamped = frozenClamp ?? map(coef1, (c) => Math.min(c, epsHigh));
    perToken = map(lp, (v, b, t) => (m[b][t] ? -clamped[b][t] * A[b] * v : 0));
  } else {
    const coef2 = map(coef1, (c) => Math.min(Math.max(c, 1 - p.epsilon), 1 + epsHigh));
    const c1 = p.delta === null ? coef1 : map(coef1, (c) => Math.min(c, p.delta!));
    perToken = map(c1, (c, b, t) => -Math.min(c * A[b], coef2[b][t] * A[b]));
  }
  if (p.top_entropy_quantile < 1) {
    const em = entropyMask(x.token_entropies, m, p.top_entropy_quantile);
    perToken = map(perToken, (v, b, t) => v * em[b][t]);
  }
  if (p.beta > 0) {
    const kl = map(lp, (v, b, t) => (m[b][t] ? Math.exp(x.ref_token_logps[b][t] - v) - (x.ref_token_logps[b][t] - v) - 1 : 0));
    perToken = map(perToken, (v, b, t) => v + p.beta * kl[b][t]);
  }
  const masked = map(perToken, (v, b, t) => v * m[b][t]);
  const B = lp.length;
  switch (p.loss_type) {
    case 'grpo':
      return rowSum(masked).reduce((a, s, b) => a + s / Math.max(counts[b], 1), 0) / B;
    case 'bnpo':
      return sum(masked) / Math.max(sum(m), 1);
    case 'dr_grpo':
      return sum(masked) / (B * p.max_completion_length);
    default:
      return sum(masked) / Math.max(sum(m), 1);
  }
}

/** Central differences of trlLoss w.r.t. each policy log-prob. */
function finiteDiff(x: Batch, p: P, frozenClamp?: Mat): Mat {
  return map(x.policy_token_logps, (v, b, t) => {
    const h = 1e-6 * Math.max(1, Math.abs(v));
    const at = (y: number) => trlLoss(x, map(x.policy_token_logps, (w, bb, tt) => (bb === b && tt === t ? y : w)), p, frozenClamp);
    return (at(v + h) - at(v - h)) / (2 * h);
  });
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
}

const VARIANTS: Variant[] = [];
for (const lt of GRPO_LOSS_TYPES) {
  for (const level of ['token', 'sequence']) {
    const base = { loss_type: lt, importance_sampling_level: level };
    VARIANTS.push({ name: `${lt} ${level}`, params: base });
    VARIANTS.push({ name: `${lt} ${level} beta=0.04`, params: { ...base, beta: 0.04 } });
    if (lt === 'cispo') VARIANTS.push({ name: `${lt} ${level} epsilon_high=1.1`, params: { ...base, epsilon_high: 1.1 } });
    else VARIANTS.push({ name: `${lt} ${level} delta=1.25 epsilon_high=0.1`, params: { ...base, delta: 1.25, epsilon_high: 0.1 } });
  }
}
VARIANTS.push({ name: 'dapo token top_entropy_quantile=0.4 beta=0.1', params: { top_entropy_quantile: 0.4, beta: 0.1 } });
VARIANTS.push({ name: 'grpo sequence top_entropy_quantile=0.2', params: { loss_type: 'grpo', importance_sampling_level: 'sequence', top_entropy_quantile: 0.2 } });

describe('grpo loss: float64 reference (TRL transcription), finite differences, ONNX', () => {
  for (const v of VARIANTS) {
    it(v.name, async () => {
      const p: P = { ...DEFAULTS, ...v.params };
      const x = makeBatch(11);
      const bound = resolveLoss('grpo', p as unknown as Record<string, unknown>);
      const batch = hostBatch(x, p);
      const want = trlLoss(x, x.policy_token_logps, p);
      // cispo detaches its clamped weight: differentiate the surrogate with the weight frozen.
      let frozen: Mat | undefined;
      if (p.loss_type === 'cispo') {
        const epsHigh = p.epsilon_high ?? p.epsilon;
        const m = x.completion_mask;
        const lr = map(x.policy_token_logps, (lp, b, t) => (m[b][t] ? lp - x.old_token_logps[b][t] : 0));
        const seq = rowSum(lr).map((s, b) => s / Math.max(rowSum(m)[b], 1));
        frozen = map(lr, (l, b) => Math.min(Math.exp(p.importance_sampling_level === 'token' ? l : seq[b]), epsHigh));
      }
      const fd = finiteDiff(x, p, frozen).flat();

      const ref = runLossReference(bound, batch, { grad: true });
      expect(Math.abs(ref.loss - want)).toBeLessThan(1e-12 * Math.max(1, Math.abs(want)));
      expect(maxAbsDiff(ref.grad.policy_token_logps, fd)).toBeLessThan(1e-7);
      expect(ref.perExample.reduce((a, b) => a + b, 0) / ref.perExample.length).toBeCloseTo(want, 12);

      const f64 = await runLossOnnx(bound, batch, { dtype: 'float64', grad: true });
      expect(Math.abs(f64.loss - want)).toBeLessThan(1e-12 * Math.max(1, Math.abs(want)));
      expect(maxAbsDiff(f64.grad.policy_token_logps, fd)).toBeLessThan(1e-7);
      expect(maxAbsDiff(f64.perExample, ref.perExample)).toBeLessThan(1e-12);
      for (const k of Object.keys(ref.metrics)) expect(f64.metrics[k], k).toBeCloseTo(ref.metrics[k], 12);
      // Padding (junk log-probs) and the fully masked row get no gradient.
      expect(Array.from(f64.grad.policy_token_logps).filter((g, i) => x.completion_mask.flat()[i] === 0 && g !== 0)).toEqual([]);

      const b32: HostBatch = Object.fromEntries(Object.entries(batch).map(([k, t]) => [k, { dims: t.dims, data: t.data.map(Math.fround) }]));
      const ref32 = runLossReference(bound, b32, { grad: true });
      const f32 = await runLossOnnx(bound, b32, { dtype: 'float32', grad: true });
      expect(Math.abs(f32.loss - ref32.loss)).toBeLessThan(1e-5 * Math.max(1, Math.abs(ref32.loss)));
      expect(maxAbsDiff(f32.grad.policy_token_logps, ref32.grad.policy_token_logps)).toBeLessThan(1e-5);
    });
  }

  it('on-policy (policy = old), token level: the loss is −Σ A·m / N and its gradient −A_b·m/N (the policy gradient); k3 KL is 0 at policy = reference', async () => {
    const x = makeBatch(3);
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

  it('num_items_in_batch replaces the token count of dapo and cispo; bnpo ignores it', () => {
    const x = makeBatch(5);
    const dapo = resolveLoss('grpo');
    const base = runLossReference(dapo, parseBatch({ ...x }, 'grpo', dapo.keys('grpo'))).loss;
    const scaled = runLossReference(dapo, parseBatch({ ...x, num_items_in_batch: 4 * sum(x.completion_mask) }, 'grpo', dapo.keys('grpo'))).loss;
    expect(scaled).toBeCloseTo(base / 4, 14);
  });

  it('bad batches and settings fail with one line naming the key or parameter', () => {
    const x = makeBatch(1);
    const bound = resolveLoss('grpo', { beta: 0.1 });
    const { ref_token_logps: _r, ...noRef } = x;
    expect(() => parseBatch(noRef, 'grpo', bound.keys('grpo'))).toThrow(/missing key "ref_token_logps"/);
    const short = { ...x, old_token_logps: x.old_token_logps.map((row) => row.slice(1)) };
    expect(() => parseBatch(short, 'grpo', bound.keys('grpo'))).toThrow(/"old_token_logps" has rows of 4 tokens, expected 5/);
    expect(() => parseBatch({ ...x, completion_mask: map(x.completion_mask, () => 0.5) }, 'grpo', bound.keys('grpo'))).toThrow(/completion_mask.*0 or 1/);
    expect(() => resolveLoss('grpo', { loss_type: 'ppo' })).toThrow(/loss_type must be one of grpo, bnpo, dr_grpo, dapo, cispo/);
    expect(() => resolveLoss('grpo', { loss_type: 'cispo', delta: 2 })).toThrow(/delta applies to the clipped loss types/);
    const q = resolveLoss('grpo', { top_entropy_quantile: 0.5 });
    expect(q.keys('grpo').required).toContain('token_entropies');
  });
});

describe('prefzoo loss grpo', () => {
  it('prints {"loss","per_example","grad":{"policy_token_logps":[[…]]}}; the onnx and reference engines agree', async () => {
    const dir = mkdtempSync(join(tmpdir(), 'pz-grpo-loss-'));
    const file = join(dir, 'batch.json');
    const x = makeBatch(9);
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
});
