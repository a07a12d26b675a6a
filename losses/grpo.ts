/**
 * GRPO and its family on per-token log-probs — "DeepSeekMath: Pushing the Limits of Mathematical
 * Reasoning in Open Language Models" (2024) and its descendants, with the names and formulas of
 * TRL's GRPOConfig / `_compute_loss`.
 *
 * Batch [B, T] (one row per sampled completion, T completion positions): p = `policy_token_logps`
 * (the live policy), o = `old_token_logps` (the policy that sampled), r = `ref_token_logps`,
 * m = `completion_mask`; [B]: A = `advantages`. Per token
 *
 *   importance weight   w = exp(p − o)                                     (token level)
 *                       w = exp(Σ_t m(p − o) / max(Σ_t m, 1)), one per row (sequence level, GSPO)
 *   clipped (grpo, bnpo, dr_grpo, dapo):
 *                       ℓ = −min(w̃·A, clip(w, 1 − ε, 1 + ε_high)·A),  w̃ = min(w, δ) when `delta` is set
 *   cispo (MiniMax-M1): ℓ = −sg(min(w, ε_high))·A·p
 *   × the high-entropy mask when top_entropy_quantile ρ < 1 ("Beyond the 80/20 Rule", 2025): a token
 *     counts only when its entropy (`token_entropies`) is ≥ the (1 − ρ)-quantile of the batch's
 *   + β·(e^(r − p) − (r − p) − 1)   (the k3 estimator of KL(π_θ ‖ π_ref), Schulman's note)
 *
 * and the loss aggregates Σ_t m·ℓ by `loss_type`: grpo — per row over its own tokens, then the mean
 * of the rows; bnpo — over the batch's tokens; dr_grpo ("Understanding R1-Zero-Like Training",
 * 2025) — over B·max_completion_length; dapo ("DAPO", 2025) and cispo — over `num_items_in_batch`,
 * the tokens of the whole accumulated batch (the batch's own tokens when not given).
 *
 * `per_example[b]` is row b's share of the loss, scaled so that their mean is the loss (for bnpo,
 * dapo and cispo, B·Σ_t m·ℓ / N): rows are not independent, so the loss takes no row weights.
 */
import type { Graph, Tensor } from '../src/onnx/graph.ts';
import { UserError } from '../src/errors.ts';
import { col, rows } from './core/batch.ts';
import { MASKED } from './core/ops.ts';
import type { BatchTensors, EmitResult, HostBatch, LossModule, Params, RefResult } from './core/types.ts';

export const GRPO_LOSS_TYPES = ['grpo', 'bnpo', 'dr_grpo', 'dapo', 'cispo'] as const;
export type GrpoLossType = (typeof GRPO_LOSS_TYPES)[number];

export interface GrpoParams extends Params {
  loss_type: GrpoLossType;
  importance_sampling_level: 'token' | 'sequence';
  epsilon: number;
  epsilon_high: number | null;
  delta: number | null;
  beta: number;
  max_completion_length: number;
  top_entropy_quantile: number;
}

const TOKEN_KEYS = ['policy_token_logps', 'old_token_logps', 'advantages', 'completion_mask'];

/** ε_high: the given value, else ε (as TRL). */
export function epsilonHigh(p: GrpoParams): number {
  return p.epsilon_high ?? p.epsilon;
}

/** The q-quantile of values, linear between order statistics (torch.quantile's default). */
function quantileOf(values: number[], q: number): number {
  const s = [...values].sort((a, b) => a - b);
  const pos = q * (s.length - 1);
  const lo = Math.floor(pos);
  const hi = Math.min(lo + 1, s.length - 1);
  return s[lo] + (pos - lo) * (s[hi] - s[lo]);
}

/**
 * The high-entropy token mask of top_entropy_quantile ρ (float64): 1 where the token is counted and
 * its entropy is ≥ the (1 − ρ)-quantile of the counted tokens' entropies (TRL's get_high_entropy_mask).
 */
export function highEntropyMask(entropies: ArrayLike<number>, mask: ArrayLike<number>, rho: number): Float64Array {
  const counted: number[] = [];
  for (let i = 0; i < mask.length; i++) if (mask[i] > 0.5) counted.push(entropies[i]);
  const out = new Float64Array(mask.length);
  if (counted.length === 0) return out;
  const thr = quantileOf(counted, 1 - rho);
  for (let i = 0; i < mask.length; i++) out[i] = mask[i] > 0.5 && entropies[i] * mask[i] >= thr ? 1 : 0;
  return out;
}

/** One token's policy term ℓ and its slope dℓ/d(log w) (clipped family) given w, A. */
function clippedTerm(w: number, a: number, p: GrpoParams): { value: number; slope: number } {
  const lo = 1 - p.epsilon;
  const hi = 1 + epsilonHigh(p);
  const c1 = p.delta !== null && w > p.delta ? p.delta : w;
  const dc1 = p.delta !== null && w > p.delta ? 0 : w;
  const c2 = w < lo ? lo : w > hi ? hi : w;
  const dc2 = w < lo || w > hi ? 0 : w;
  const l1 = c1 * a;
  const l2 = c2 * a;
  return l1 <= l2 ? { value: -l1, slope: -dc1 * a } : { value: -l2, slope: -dc2 * a };
}

interface ClipFlags {
  low: number;
  high: number;
  region: number;
}

function clipFlags(w: number, a: number, p: GrpoParams): ClipFlags {
  if (p.loss_type === 'cispo') {
    const c = w > epsilonHigh(p) && a > 0 ? 1 : 0;
    return { low: 0, high: c, region: c };
  }
  const c1 = p.delta !== null && w > p.delta ? p.delta : w;
  const low = c1 < 1 - p.epsilon && a < 0 ? 1 : 0;
  const high = c1 > 1 + epsilonHigh(p) && a > 0 ? 1 : 0;
  return { low, high, region: low || high ? 1 : 0 };
}

export const grpo: LossModule<GrpoParams> = {
  name: 'grpo',
  paper: 'DeepSeekMath: Pushing the Limits of Mathematical Reasoning in Open Language Models (GRPO); DAPO; Dr. GRPO; GSPO; CISPO',
  kind: 'grpo',
  kinds: ['grpo'],
  params: [
    { name: 'loss_type', type: 'enum', default: 'dapo', choices: GRPO_LOSS_TYPES, doc: 'how per-token terms are aggregated: grpo (per sequence), bnpo (batch tokens), dr_grpo (B·max_completion_length), dapo (tokens of the accumulated batch), cispo (clipped IS weight × log-prob)' },
    { name: 'importance_sampling_level', type: 'enum', default: 'token', choices: ['token', 'sequence'], doc: 'importance ratio per token, or one per sequence from the mean log-ratio (GSPO)' },
    { name: 'epsilon', type: 'number', default: 0.2, min: 0, doc: 'lower clipping ε: ratios below 1 − ε are clipped' },
    { name: 'epsilon_high', type: 'number', default: null, min: 0, doc: 'upper clipping ε_high (unset: ε; DAPO recommends 0.28); for cispo the cap of the IS weight (recommended 5)' },
    { name: 'delta', type: 'number', default: null, min: 1, minOpen: true, doc: 'two-sided clipping: the unclipped ratio is capped at δ (INTELLECT-2; use δ > 1 + ε_high)' },
    { name: 'beta', type: 'number', default: 0, min: 0, doc: 'weight β of the k3 estimate of KL(π_θ ‖ π_ref) per token (0: no reference model)' },
    { name: 'max_completion_length', type: 'integer', default: 512, min: 1, doc: "dr_grpo's constant normaliser (the longest completion sampled)" },
    { name: 'top_entropy_quantile', type: 'number', default: 1, min: 0, max: 1, doc: 'ρ: only tokens whose entropy is in the top ρ of the batch count in the policy term (1: all; needs token_entropies)' },
  ],
  rowwise: false,
  check(p) {
    if (p.delta !== null && p.loss_type === 'cispo') throw new UserError('loss grpo: parameter delta applies to the clipped loss types, not cispo');
  },
  keys(p) {
    const required = [...TOKEN_KEYS];
    if (p.beta > 0) required.push('ref_token_logps');
    if (p.top_entropy_quantile < 1) required.push('token_entropies');
    const optional = ['num_items_in_batch'];
    if (p.top_entropy_quantile >= 1) optional.push('token_entropies');
    return { required, optional };
  },
  grads: () => ['policy_token_logps'],
  ref(batch: HostBatch, p, coef): RefResult {
    const B = rows(batch);
    const T = batch.policy_token_logps.dims[1];
    const lp = col(batch, 'policy_token_logps');
    const old = col(batch, 'old_token_logps');
    const adv = col(batch, 'advantages');
    const m = col(batch, 'completion_mask');
    const ref = p.beta > 0 ? col(batch, 'ref_token_logps') : null;
    const ent = batch.token_entropies ? col(batch, 'token_entropies') : null;
    const emask = p.top_entropy_quantile < 1 ? highEntropyMask(ent!, m, p.top_entropy_quantile) : null;
    const seqLevel = p.importance_sampling_level === 'sequence';
    let total = 0;
    for (let i = 0; i < m.length; i++) total += m[i];
    const N = batch.num_items_in_batch ? batch.num_items_in_batch.data[0] : total;
    const per: number[] = [];
    const grad = new Float64Array(B * T);
    const flags = { low: 0, high: 0, region: 0 };
    let klSum = 0;
    let entSum = 0;
    for (let b = 0; b < B; b++) {
      const at = (t: number) => b * T + t;
      let cnt = 0;
      let lrSum = 0;
      for (let t = 0; t < T; t++) {
        if (m[at(t)] === 0) continue;
        cnt += 1;
        lrSum += lp[at(t)] - old[at(t)];
      }
      const scale = p.loss_type === 'grpo' ? 1 / Math.max(cnt, 1)
        : p.loss_type === 'dr_grpo' ? 1 / p.max_completion_length
        : B / Math.max(N, 1);
      const a = adv[b];
      const e = (t: number) => (emask ? emask[at(t)] : 1);
      let s = 0;
      const d = new Float64Array(T); // dS/dp_t
      if (seqLevel) {
        const w = Math.exp(lrSum / Math.max(cnt, 1));
        let em = 0;
        for (let t = 0; t < T; t++) em += e(t) * m[at(t)];
        if (p.loss_type === 'cispo') {
          const c = Math.min(w, epsilonHigh(p));
          for (let t = 0; t < T; t++) {
            if (m[at(t)] === 0) continue;
            s += -c * a * lp[at(t)] * e(t);
            d[t] += -c * a * e(t);
          }
        } else {
          const term = clippedTerm(w, a, p);
          s += term.value * em;
          // d(log w)/dp_t = m_t / max(cnt, 1)
          for (let t = 0; t < T; t++) d[t] += term.slope * em * (m[at(t)] / Math.max(cnt, 1));
        }
        const f = clipFlags(w, a, p);
        flags.low += f.low / B;
        flags.high += f.high / B;
        flags.region += f.region / B;
      } else {
        for (let t = 0; t < T; t++) {
          const mt = m[at(t)];
          if (mt === 0) continue;
          const w = Math.exp(lp[at(t)] - old[at(t)]);
          if (p.loss_type === 'cispo') {
            const c = Math.min(w, epsilonHigh(p));
            s += -c * a * lp[at(t)] * e(t) * mt;
            d[t] += -c * a * e(t) * mt;
          } else {
            const term = clippedTerm(w, a, p);
            s += term.value * e(t) * mt;
            d[t] += term.slope * e(t) * mt;
          }
          const f = clipFlags(w, a, p);
          flags.low += (f.low * mt) / Math.max(total, 1);
          flags.high += (f.high * mt) / Math.max(total, 1);
          flags.region += (f.region * mt) / Math.max(total, 1);
        }
      }
      if (ref) {
        for (let t = 0; t < T; t++) {
          if (m[at(t)] === 0) continue;
          const x = ref[at(t)] - lp[at(t)];
          const kl = Math.exp(x) - x - 1;
          s += p.beta * kl * m[at(t)];
          d[t] += p.beta * (1 - Math.exp(x)) * m[at(t)];
          klSum += kl * m[at(t)];
        }
      }
      if (ent) for (let t = 0; t < T; t++) if (m[at(t)] !== 0) entSum += ent[at(t)];
      per.push(scale * s);
      for (let t = 0; t < T; t++) grad[at(t)] = coef[b] * scale * d[t];
    }
    const metrics: Record<string, number> = {};
    if (p.loss_type === 'cispo') metrics.cispo_clip_ratio = flags.high;
    else {
      metrics['clip_ratio/low_mean'] = flags.low;
      metrics['clip_ratio/high_mean'] = flags.high;
      metrics['clip_ratio/region_mean'] = flags.region;
    }
    if (ref) metrics.kl = klSum / Math.max(total, 1);
    if (ent) metrics.entropy = entSum / Math.max(total, 1);
    return { perExample: per, grad: { policy_token_logps: grad }, metrics };
  },
  emit(g: Graph, t: BatchTensors, p): EmitResult {
    return g.scope('grpo', () => {
      const lp = t.policy_token_logps;
      const m = t.completion_mask;
      const f = lp.dtype;
      const one = g.constant(1, f);
      const a = g.unsqueeze(t.advantages, [1]); // [B, 1]
      const rowsB = g.cast(g.dim(t.advantages, 0), f); // [1]
      const B = g.squeeze(rowsB, [0]);
      const cnt = g.reduceSum(m, [1], true); // [B, 1]
      const total = g.reduceSum(m, undefined, false);
      const counted = g.greater(m, 0.5);
      // Uncounted positions read 0, so whatever padding holds cannot overflow exp (∞·0 = NaN).
      const lr = g.where(counted, g.sub(lp, t.old_token_logps), g.constant(0, f));
      const seqLevel = p.importance_sampling_level === 'sequence';
      const logw = seqLevel ? g.div(g.reduceSum(g.mul(lr, m), [1], true), g.max(cnt, one)) : lr; // [B, 1] or [B, T]
      const w = g.exp(logw);
      const epsH = epsilonHigh(p);
      let term: Tensor;
      let flagged: { low?: Tensor; high: Tensor };
      const positive = g.greater(a, 0);
      if (p.loss_type === 'cispo') {
        const c = g.stopGradient(g.where(g.greater(w, epsH), g.constant(epsH, f), w));
        term = g.neg(g.mul(g.mul(c, a), g.where(counted, lp, g.constant(0, f))));
        flagged = { high: g.and(g.greater(w, epsH), positive) };
      } else {
        const c1 = p.delta !== null ? g.where(g.greater(w, p.delta), g.constant(p.delta, f), w) : w;
        const lo = 1 - p.epsilon;
        const hi = 1 + epsH;
        const c2 = g.where(g.less(w, lo), g.constant(lo, f), g.where(g.greater(w, hi), g.constant(hi, f), w));
        const l1 = g.mul(c1, a);
        const l2 = g.mul(c2, a);
        term = g.neg(g.where(g.lessOrEqual(l1, l2), l1, l2));
        flagged = { low: g.and(g.less(c1, lo), g.less(a, 0)), high: g.and(g.greater(c1, hi), positive) };
      }
      if (p.top_entropy_quantile < 1) term = g.mul(term, entropyMaskGraph(g, t.token_entropies, m, p.top_entropy_quantile));
      const metrics: Record<string, Tensor> = {};
      if (p.beta > 0) {
        const x = g.where(counted, g.sub(t.ref_token_logps, lp), g.constant(0, f));
        const kl = g.sub(g.sub(g.exp(x), x), one);
        term = g.add(term, g.mul(kl, p.beta));
        metrics.kl = g.div(g.reduceSum(g.mul(g.stopGradient(kl), m), undefined, false), g.max(total, one));
      }
      const S = g.reduceSum(g.mul(term, m), [1], false); // [B]
      const scale = p.loss_type === 'grpo' ? g.div(one, g.max(g.squeeze(cnt, [1]), one))
        : p.loss_type === 'dr_grpo' ? g.constant(1 / p.max_completion_length, f)
        : g.div(B, g.max(t.num_items_in_batch ?? total, one));
      const per = g.mul(S, scale);
      // Clip ratios as TRL logs them: token level over the counted tokens, sequence level over the rows.
      const share = (b: Tensor) => {
        const x = g.cast(b, f);
        return seqLevel ? g.reduceMean(x, undefined, false) : g.div(g.reduceSum(g.mul(x, m), undefined, false), g.max(total, one));
      };
      if (p.loss_type === 'cispo') metrics.cispo_clip_ratio = share(flagged.high);
      else {
        metrics['clip_ratio/low_mean'] = share(flagged.low!);
        metrics['clip_ratio/high_mean'] = share(flagged.high);
        metrics['clip_ratio/region_mean'] = share(g.or(flagged.low!, flagged.high));
      }
      if (t.token_entropies) metrics.entropy = g.div(g.reduceSum(g.mul(g.stopGradient(t.token_entropies), m), undefined, false), g.max(total, one));
      return { perExample: per, metrics };
    });
  },
};

/**
 * The high-entropy mask in the graph: the counted entropies sorted (TopK, descending; uncounted
 * positions sink to the end as MASKED), the (1 − ρ)-quantile read between two order statistics.
 */
function entropyMaskGraph(g: Graph, ent: Tensor, m: Tensor, rho: number): Tensor {
  return g.scope('entropy_mask', () => {
    const f = ent.dtype;
    const e = g.stopGradient(ent);
    const counted = g.greater(m, 0.5);
    const flat = g.reshape(g.where(counted, e, MASKED), [-1]);
    const [desc] = g.op('TopK', [flat, g.shapeOf(flat)], { axis: { kind: 'int', value: -1 }, largest: { kind: 'int', value: 1 }, sorted: { kind: 'int', value: 1 } }, [
      { dtype: f, shape: ['n'] },
      { dtype: 'int64', shape: ['n'] },
    ]);
    const n = g.max(g.reduceSum(m, undefined, false), g.constant(1, f));
    const last = g.sub(n, 1);
    const pos = g.mul(last, 1 - rho); // ascending position
    const lo = g.floor(pos);
    const hi = g.min(g.add(lo, 1), last);
    // Ascending index i is descending index (n − 1) − i.
    const pick = (i: Tensor) => g.gather(desc, g.cast(g.sub(last, i), 'int64'), 0);
    const vlo = pick(lo);
    const thr = g.add(vlo, g.mul(g.sub(pos, lo), g.sub(pick(hi), vlo)));
    return g.cast(g.and(g.greaterOrEqual(g.mul(e, m), thr), counted), f);
  });
}
