/**
 * GRPO and its family on per-token log-probs — "DeepSeekMath: Pushing the Limits of Mathematical
 * Reasoning in Open Language Models" (2024) and its descendants, with the names and formulas of
 * TRL's GRPOConfig / `_compute_loss`.
 *
 * Batch [B, T] (one row per sampled completion, T completion positions): p = `policy_token_logps`
 * (the live policy), o = `old_token_logps` (the policy that sampled), r = `ref_token_logps`,
 * s = `sampling_token_logps` (what the sampler itself computed for the tokens it drew),
 * m = `completion_mask`, H = `token_entropies`; [B]: A = `advantages`. Per token
 *
 *   importance weight   w = exp(p − o)                                     (token level)
 *                       w = exp(Σ_t m(p − o) / max(Σ_t m, 1)), one per row (sequence level, GSPO)
 *   clipped (grpo, bnpo, dr_grpo, dapo, luspo):
 *                       ℓ = −min(w̃·A, clip(w, 1 − ε, 1 + ε_high)·A),  w̃ = min(w, δ) when `delta` is set
 *   cispo (MiniMax-M1): ℓ = −sg(min(w, ε_high))·A·p
 *   sapo (SAPO):        ℓ = −σ(τ(w − 1))·(4/τ)·A,  τ = τ_pos when A > 0, else τ_neg
 *   vespo (VESPO):      ℓ = −sg(φ)·A·p,  φ = e^λ·W^k·e^(−λW) with W the row's clamped product of
 *                       token ratios (and of the sampler correction's), k, λ by the sign of A
 *   × the off-policy sequence mask (DeepSeek-V3.2) when off_policy_mask_threshold δ is set: a row with
 *     A < 0 whose mean drift Σ m(s − sg(p))/Σ m (o when s is absent) exceeds δ drops out
 *   × the high-entropy mask when top_entropy_quantile ρ < 1 ("Beyond the 80/20 Rule", 2025)
 *   × the sampler–trainer correction sg(ρ): exp(o − s) per token or exp(Σ m(o − s)) per row,
 *     truncated to [C_min, C_max] or zeroed outside it (not for vespo, whose φ holds it)
 *   + β·(e^(r − p) − (r − p) − 1)·(w when use_bias_correction_kl)   (the k3 estimator of KL(π_θ ‖ π_ref))
 *   + λ·(e^(q − p) − (q − p) − 1)·(w when use_bias_correction_kl)   (the same estimator of KL(π_θ ‖ π_teacher),
 *     q = `teacher_token_logps`, λ = distill_coef: teacher-guided RL, DGPO)
 *
 * and the loss aggregates Σ_t m·ℓ by `loss_type`: grpo and sapo — per row over its own tokens, then
 * the mean of the rows; bnpo — over the batch's tokens; dr_grpo ("Understanding R1-Zero-Like
 * Training", 2025) — over B·max_completion_length; dapo ("DAPO", 2025), cispo and vespo — over
 * `num_items_in_batch`, the tokens of the whole accumulated batch (the batch's own tokens when not
 * given); luspo — each row's sequence term times its length, then the mean of the rows. With the
 * entropy bonus (entropy_coef, or use_adaptive_entropy) the loss then subtracts c·Σ H·m / D, D the
 * same token count for dapo, cispo and vespo, else the counted tokens of the micro-batch.
 *
 * `per_example[b]` is row b's share of the loss, scaled so that their mean is the loss (for bnpo,
 * dapo, cispo and vespo, B·Σ_t m·ℓ / N; the entropy bonus is shared evenly): rows are not
 * independent, so the loss takes no row weights.
 */
import type { Graph, Tensor } from '../src/onnx/graph.ts';
import { BadInputError, UserError } from '../src/errors.ts';
import { col, rows } from './core/batch.ts';
import { MASKED, sigmoid as sigmoidGraph } from './core/ops.ts';
import { sigmoid } from './core/math.ts';
import type { BatchTensors, EmitResult, HostBatch, LossModule, Params, RefResult } from './core/types.ts';

export const GRPO_LOSS_TYPES = ['grpo', 'bnpo', 'dr_grpo', 'dapo', 'cispo', 'sapo', 'luspo', 'vespo'] as const;
export type GrpoLossType = (typeof GRPO_LOSS_TYPES)[number];

/** TRL's vllm_importance_sampling_mode: where the sampler–trainer ratio is taken and what is done outside its bounds. */
export const SAMPLING_CORRECTION_MODES = ['token_truncate', 'token_mask', 'sequence_truncate', 'sequence_mask'] as const;
export type SamplingCorrectionMode = (typeof SAMPLING_CORRECTION_MODES)[number];

export interface GrpoParams extends Params {
  loss_type: GrpoLossType;
  importance_sampling_level: 'token' | 'sequence';
  epsilon: number;
  epsilon_high: number | null;
  delta: number | null;
  beta: number;
  /** λ of the per-token KL to a teacher (null: unset, 0 — `prefzoo grpo --teacher` sets its own default). */
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
  vllm_importance_sampling_mode: SamplingCorrectionMode;
  vllm_importance_sampling_clip_max: number;
  vllm_importance_sampling_clip_min: number | null;
  entropy_coef: number;
  use_adaptive_entropy: boolean;
  entropy_target: number;
}

const TOKEN_KEYS = ['policy_token_logps', 'old_token_logps', 'advantages', 'completion_mask'];
const CLIPPED: readonly GrpoLossType[] = ['grpo', 'bnpo', 'dr_grpo', 'dapo', 'luspo'];
/** Loss types normalised by the accumulated batch's token count N (their entropy bonus too). */
const OVER_N: readonly GrpoLossType[] = ['dapo', 'cispo', 'vespo'];
/** VESPO's lower clamp of log-weights, log 1e-8 (TRL's, from the paper's code). */
const VESPO_LOG_MIN = Math.log(1e-8);
const VESPO_LOG_MAX = 20;

/** The teacher KL's coefficient λ in force: distill_coef, 0 when unset. */
export function distillCoef(p: Pick<GrpoParams, 'distill_coef'>): number {
  return p.distill_coef ?? 0;
}

/** ε_high: the given value, else ε (as TRL). */
export function epsilonHigh(p: GrpoParams): number {
  return p.epsilon_high ?? p.epsilon;
}

/** Whether the loss carries the entropy bonus (TRL: a non-zero entropy_coef, or the adaptive controller on). */
export function entropyBonusOn(p: GrpoParams): boolean {
  return p.entropy_coef !== 0 || p.use_adaptive_entropy;
}

/** The adaptive-entropy controller's settings (Skywork-OR1): the target and the coefficient's step and bounds. */
export interface EntropyControl {
  entropy_target: number;
  entropy_coef_delta: number;
  entropy_coef_min: number;
  entropy_coef_max: number;
}

/**
 * The coefficient after one optimizer step of the adaptive controller (Skywork-OR1, arXiv 2505.22312;
 * TRL's update): raised by δ, up to the maximum, when the step's entropy was at or below the target,
 * else lowered by δ, down to the minimum. `entropy` is the step's mean per-token entropy over the
 * tokens the policy term counts (all the step's micro-batches together).
 */
export function nextEntropyCoef(coef: number, entropy: number, s: EntropyControl): number {
  if (s.entropy_coef_min > s.entropy_coef_max) {
    throw new BadInputError(`entropy_coef_min (${s.entropy_coef_min}) must be ≤ entropy_coef_max (${s.entropy_coef_max})`, { setting: 'entropy_coef_min' });
  }
  return entropy <= s.entropy_target ? Math.min(coef + s.entropy_coef_delta, s.entropy_coef_max) : Math.max(coef - s.entropy_coef_delta, s.entropy_coef_min);
}

/**
 * The coefficient the bonus applies this step: the given one, or under use_adaptive_entropy only once
 * the last step's entropy (undefined: not measured yet) is at or below the target, else 0.
 */
export function appliedEntropyCoef(coef: number, lastEntropy: number | undefined, p: Pick<GrpoParams, 'use_adaptive_entropy' | 'entropy_target'>): number {
  if (!p.use_adaptive_entropy) return coef;
  return lastEntropy !== undefined && lastEntropy <= p.entropy_target ? coef : 0;
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

/** SAPO's soft gate: ℓ = −σ(τ(w − 1))·(4/τ)·A and dℓ/d(log w) = −4A·σ(x)σ(−x)·w. */
function sapoTerm(w: number, a: number, p: GrpoParams): { value: number; slope: number } {
  const tau = a > 0 ? p.sapo_temperature_pos : p.sapo_temperature_neg;
  const x = tau * (w - 1);
  const s = sigmoid(x);
  return { value: (-s * 4 * a) / tau, slope: -4 * a * s * sigmoid(-x) * w };
}

/** The sampler–trainer ratio after the mode's truncation or masking. */
function correctRatio(r: number, p: GrpoParams): number {
  const lo = p.vllm_importance_sampling_clip_min;
  const hi = p.vllm_importance_sampling_clip_max;
  if (p.vllm_importance_sampling_mode.endsWith('truncate')) return Math.min(lo === null ? r : Math.max(r, lo), hi);
  return (lo !== null && r < lo) || r > hi ? 0 : r;
}

/** Whether the sampler correction applies to this batch: sampling log-probs given and the correction on. */
function correcting(p: GrpoParams, hasSampling: boolean): boolean {
  return hasSampling && p.vllm_importance_sampling_correction;
}

/** Checks a combination that depends on the batch (whether sampling log-probs come with it). */
function checkBatch(p: GrpoParams, hasSampling: boolean): void {
  if (correcting(p, hasSampling) && p.loss_type === 'vespo' && p.vllm_importance_sampling_mode.startsWith('sequence')) {
    throw new BadInputError(
      `loss grpo: loss_type=vespo takes the sampler correction per token (into its weight φ): with sampling_token_logps, vllm_importance_sampling_mode must be token_truncate or token_mask, got ${p.vllm_importance_sampling_mode}`,
      { setting: 'vllm_importance_sampling_mode' },
    );
  }
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

const TRL = (name: string) => ({ trl: name });

export const grpo: LossModule<GrpoParams> = {
  name: 'grpo',
  paper: 'DeepSeekMath: Pushing the Limits of Mathematical Reasoning in Open Language Models (GRPO); DAPO; Dr. GRPO; GSPO; CISPO; SAPO; LUSPO; VESPO',
  kind: 'grpo',
  kinds: ['grpo'],
  params: [
    { name: 'loss_type', type: 'enum', default: 'dapo', choices: GRPO_LOSS_TYPES, ...TRL('loss_type'), doc: 'policy term and aggregation: grpo (per sequence), bnpo (batch tokens), dr_grpo (B·max_completion_length), dapo (tokens of the accumulated batch), cispo (clipped IS weight × log-prob), sapo (soft gate, per sequence), luspo (sequence level × length), vespo (gamma weight × log-prob)' },
    { name: 'importance_sampling_level', type: 'enum', default: 'token', choices: ['token', 'sequence'], ...TRL('importance_sampling_level'), doc: 'importance ratio per token, or one per sequence from the mean log-ratio (GSPO; luspo needs it)' },
    { name: 'epsilon', type: 'number', default: 0.2, min: 0, ...TRL('epsilon'), doc: 'lower clipping ε: ratios below 1 − ε are clipped' },
    { name: 'epsilon_high', type: 'number', default: null, min: 0, ...TRL('epsilon_high'), doc: 'upper clipping ε_high (unset: ε; DAPO recommends 0.28); for cispo the cap of the IS weight (recommended 5)' },
    { name: 'delta', type: 'number', default: null, min: 1, minOpen: true, ...TRL('delta'), doc: 'two-sided clipping: the unclipped ratio is capped at δ (INTELLECT-2; use δ > 1 + ε_high)' },
    { name: 'beta', type: 'number', default: 0, min: 0, ...TRL('beta'), doc: 'weight β of the k3 estimate of KL(π_θ ‖ π_ref) per token (0: no reference model)' },
    { name: 'distill_coef', type: 'number', default: null, min: 0, doc: 'weight λ of the same k3 estimate of KL(π_θ ‖ π_teacher) per token, the teacher\'s log-probs of the sampled tokens in teacher_token_logps (teacher-guided RL, DGPO; unset: 0, and prefzoo grpo --teacher takes 0.1)' },
    { name: 'max_completion_length', type: 'integer', default: 512, min: 1, ...TRL('max_completion_length'), doc: "dr_grpo's constant normaliser (the longest completion sampled)" },
    { name: 'top_entropy_quantile', type: 'number', default: 1, min: 0, max: 1, ...TRL('top_entropy_quantile'), doc: 'ρ: only tokens whose entropy is in the top ρ of the batch count in the policy term (1: all; needs token_entropies)' },
    { name: 'sapo_temperature_pos', type: 'number', default: 1, min: 0, minOpen: true, ...TRL('sapo_temperature_pos'), doc: "sapo: temperature τ of the soft gate for tokens with advantage > 0" },
    { name: 'sapo_temperature_neg', type: 'number', default: 1.05, min: 0, minOpen: true, ...TRL('sapo_temperature_neg'), doc: 'sapo: temperature τ of the soft gate for tokens with advantage ≤ 0' },
    { name: 'vespo_k_pos', type: 'number', default: 2, min: 0, ...TRL('vespo_k_pos'), doc: 'vespo: power k of the gamma weight for advantage ≥ 0 (how hard low ratios are down-weighted)' },
    { name: 'vespo_lambda_pos', type: 'number', default: 3, min: 0, minOpen: true, ...TRL('vespo_lambda_pos'), doc: 'vespo: decay λ of the gamma weight for advantage ≥ 0 (how hard high ratios are down-weighted)' },
    { name: 'vespo_k_neg', type: 'number', default: 3, min: 0, ...TRL('vespo_k_neg'), doc: 'vespo: power k of the gamma weight for advantage < 0' },
    { name: 'vespo_lambda_neg', type: 'number', default: 2, min: 0, minOpen: true, ...TRL('vespo_lambda_neg'), doc: 'vespo: decay λ of the gamma weight for advantage < 0' },
    { name: 'off_policy_mask_threshold', type: 'number', default: null, min: 0, ...TRL('off_policy_mask_threshold'), doc: "DeepSeek-V3.2's off-policy sequence mask: a completion with advantage < 0 whose mean log-prob drift from the sampler exceeds this drops out of the policy term (unset: off)" },
    { name: 'use_bias_correction_kl', type: 'boolean', default: false, ...TRL('use_bias_correction_kl'), doc: 'multiply the k3 KL term by the importance ratio (DeepSeek-V3.2; needs beta > 0)' },
    { name: 'vllm_importance_sampling_correction', type: 'boolean', default: true, aliases: ['sampling_importance_sampling_correction'], ...TRL('vllm_importance_sampling_correction'), doc: "correct the sampler–trainer mismatch with the ratio exp(old − sampling log-probs) when sampling_token_logps come with the batch" },
    { name: 'vllm_importance_sampling_mode', type: 'enum', default: 'sequence_mask', choices: SAMPLING_CORRECTION_MODES, aliases: ['sampling_importance_sampling_mode'], ...TRL('vllm_importance_sampling_mode'), doc: 'the correction per token or per sequence; *_truncate clips the ratio to [clip_min, clip_max], *_mask zeroes it outside (prefzoo grpo with loss_type=vespo: token_truncate unless given, as vespo takes it per token into its weight)' },
    { name: 'vllm_importance_sampling_clip_max', type: 'number', default: 3, min: 1, aliases: ['vllm_importance_sampling_cap', 'sampling_importance_sampling_clip_max'], ...TRL('vllm_importance_sampling_clip_max'), doc: 'upper bound C_max of the sampler correction ratio' },
    { name: 'vllm_importance_sampling_clip_min', type: 'number', default: null, min: 0, max: 1, aliases: ['sampling_importance_sampling_clip_min'], ...TRL('vllm_importance_sampling_clip_min'), doc: 'lower bound C_min of the sampler correction ratio (unset: none)' },
    { name: 'entropy_coef', type: 'number', default: 0, ...TRL('entropy_coef'), doc: 'entropy bonus: the loss minus this × the mean per-token entropy (needs token_entropies); with use_adaptive_entropy the starting coefficient' },
    { name: 'use_adaptive_entropy', type: 'boolean', default: false, ...TRL('use_adaptive_entropy'), doc: "Skywork-OR1's controller: the coefficient applies only once the last step's entropy fell to entropy_target, and moves by entropy_coef_delta after every optimizer step" },
    { name: 'entropy_target', type: 'number', default: 0.2, min: 0, ...TRL('entropy_target'), doc: 'use_adaptive_entropy: the mean per-token entropy (nats) the controller holds the policy at' },
  ],
  rowwise: false,
  check(p) {
    const bad = (setting: string, msg: string) => new BadInputError(`loss grpo: ${msg}`, { setting });
    if (p.delta !== null && !CLIPPED.includes(p.loss_type)) throw bad('delta', `parameter delta applies to the clipped loss types (${CLIPPED.join(', ')}), not ${p.loss_type}`);
    if (p.epsilon_high !== null && (p.loss_type === 'sapo' || p.loss_type === 'vespo')) throw bad('epsilon_high', `parameter epsilon_high does not apply to loss_type=${p.loss_type} (it has no clipping)`);
    if (p.loss_type === 'luspo') {
      // TRL's luspo averages its [B, T] terms over every position, padding included, whenever a term varies by token.
      if (p.importance_sampling_level !== 'sequence') throw bad('importance_sampling_level', 'loss_type=luspo needs importance_sampling_level=sequence (at token level its mean would run over padding)');
      if (p.beta > 0) throw bad('beta', 'loss_type=luspo takes no per-token KL term (beta must be 0: its mean would run over padding)');
      if (distillCoef(p) > 0) throw bad('distill_coef', 'loss_type=luspo takes no per-token KL term (distill_coef must be 0: its mean would run over padding)');
      if (p.top_entropy_quantile < 1) throw bad('top_entropy_quantile', 'loss_type=luspo takes no per-token entropy mask (top_entropy_quantile must be 1: its mean would run over padding)');
      if (p.vllm_importance_sampling_correction && p.vllm_importance_sampling_mode.startsWith('token')) {
        throw bad('vllm_importance_sampling_mode', `loss_type=luspo takes the sampler correction per sequence (sequence_truncate or sequence_mask), not ${p.vllm_importance_sampling_mode} (its mean would run over padding)`);
      }
    }
    const lo = p.vllm_importance_sampling_clip_min;
    if (lo !== null && lo >= p.vllm_importance_sampling_clip_max) throw bad('vllm_importance_sampling_clip_min', `vllm_importance_sampling_clip_min (${lo}) must be less than vllm_importance_sampling_clip_max (${p.vllm_importance_sampling_clip_max})`);
    if (p.use_bias_correction_kl && p.beta === 0 && distillCoef(p) === 0) throw bad('use_bias_correction_kl', 'use_bias_correction_kl corrects the KL term, which needs beta > 0 (or distill_coef > 0: the teacher KL)');
  },
  keys(p) {
    const required = [...TOKEN_KEYS];
    const bonus = entropyBonusOn(p);
    if (p.beta > 0) required.push('ref_token_logps');
    if (distillCoef(p) > 0) required.push('teacher_token_logps');
    if (p.top_entropy_quantile < 1 || bonus) required.push('token_entropies');
    const optional = ['num_items_in_batch', 'sampling_token_logps'];
    if (!required.includes('token_entropies')) optional.push('token_entropies');
    if (bonus) optional.push('entropy_coef');
    if (p.use_adaptive_entropy) optional.push('last_world_entropy');
    return { required, optional };
  },
  grads: (p) => (entropyBonusOn(p) ? ['policy_token_logps', 'token_entropies'] : ['policy_token_logps']),
  ref(batch: HostBatch, p, coef): RefResult {
    const B = rows(batch);
    const T = batch.policy_token_logps.dims[1];
    const lp = col(batch, 'policy_token_logps');
    const old = col(batch, 'old_token_logps');
    const adv = col(batch, 'advantages');
    const m = col(batch, 'completion_mask');
    const ref = p.beta > 0 ? col(batch, 'ref_token_logps') : null;
    const teacher = distillCoef(p) > 0 ? col(batch, 'teacher_token_logps') : null;
    const ent = batch.token_entropies ? col(batch, 'token_entropies') : null;
    const samp = batch.sampling_token_logps ? col(batch, 'sampling_token_logps') : null;
    checkBatch(p, samp !== null);
    const emask = p.top_entropy_quantile < 1 ? highEntropyMask(ent!, m, p.top_entropy_quantile) : null;
    const seqLevel = p.importance_sampling_level === 'sequence';
    const lt = p.loss_type;
    let total = 0;
    for (let i = 0; i < m.length; i++) total += m[i];
    const N = batch.num_items_in_batch ? batch.num_items_in_batch.data[0] : total;
    // The sampler correction ρ (a constant of the batch): per token, or one per row spread over its positions.
    const corr = correcting(p, samp !== null);
    const seqCorr = p.vllm_importance_sampling_mode.startsWith('sequence');
    const rho = new Float64Array(B * T).fill(1);
    if (corr) {
      for (let b = 0; b < B; b++) {
        let rowDiff = 0;
        for (let t = 0; t < T; t++) {
          const i = b * T + t;
          const d = m[i] !== 0 ? old[i] - samp![i] : 0;
          rowDiff += d;
          if (!seqCorr) rho[i] = correctRatio(Math.exp(d), p);
        }
        if (seqCorr) rho.fill(correctRatio(Math.exp(rowDiff), p), b * T, (b + 1) * T);
      }
    }
    const per: number[] = [];
    const grad = new Float64Array(B * T);
    const flags = { low: 0, high: 0, region: 0 };
    let phiSum = 0;
    let klSum = 0;
    let teacherKlSum = 0;
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
      const cntC = Math.max(cnt, 1);
      const scale = lt === 'grpo' || lt === 'sapo' ? 1 / cntC
        : lt === 'dr_grpo' ? 1 / p.max_completion_length
        : lt === 'bnpo' ? B / Math.max(total, 1)
        : lt === 'luspo' ? 1
        : B / Math.max(N, 1);
      const a = adv[b];
      let keep = 1;
      if (p.off_policy_mask_threshold !== null) {
        const src = samp ?? old;
        let drift = 0;
        for (let t = 0; t < T; t++) if (m[at(t)] !== 0) drift += src[at(t)] - lp[at(t)];
        keep = a >= 0 || drift / cntC <= p.off_policy_mask_threshold ? 1 : 0;
      }
      // u_t: the constant factors of the policy term (off-policy mask, entropy mask, sampler correction).
      const u = (t: number) => keep * (emask ? emask[at(t)] : 1) * (lt === 'vespo' ? 1 : rho[at(t)]);
      let s = 0;
      const d = new Float64Array(T); // dS/dp_t
      const wSeq = Math.exp(lrSum / cntC);
      const wAt = (t: number) => (seqLevel ? wSeq : Math.exp(m[at(t)] !== 0 ? lp[at(t)] - old[at(t)] : 0));
      if (lt === 'vespo') {
        let logW = 0;
        for (let t = 0; t < T; t++) {
          const lr = m[at(t)] !== 0 ? lp[at(t)] - old[at(t)] : 0;
          logW += Math.min(Math.max(lr, -20), 20) * m[at(t)];
          if (corr) logW += Math.min(Math.max(Math.log(rho[at(t)]), VESPO_LOG_MIN), VESPO_LOG_MAX);
        }
        logW = Math.min(Math.max(logW, VESPO_LOG_MIN), VESPO_LOG_MAX);
        const k = a >= 0 ? p.vespo_k_pos : p.vespo_k_neg;
        const lam = Math.max(a >= 0 ? p.vespo_lambda_pos : p.vespo_lambda_neg, 1e-4);
        let phi = Math.exp(lam + k * logW - lam * Math.exp(logW));
        if (!Number.isFinite(phi)) phi = 0;
        phiSum += phi / B;
        for (let t = 0; t < T; t++) {
          if (m[at(t)] === 0) continue;
          s += u(t) * -phi * a * lp[at(t)];
          d[t] += u(t) * -phi * a;
        }
      } else if (lt === 'cispo') {
        for (let t = 0; t < T; t++) {
          if (m[at(t)] === 0) continue;
          const c = Math.min(wAt(t), epsilonHigh(p));
          s += u(t) * -c * a * lp[at(t)];
          d[t] += u(t) * -c * a;
        }
      } else {
        const termOf = lt === 'sapo' ? sapoTerm : clippedTerm;
        if (seqLevel) {
          const term = termOf(wSeq, a, p);
          let U = 0;
          for (let t = 0; t < T; t++) U += u(t) * m[at(t)];
          s += term.value * U;
          // d(log w)/dp_t = m_t / max(cnt, 1)
          for (let t = 0; t < T; t++) d[t] += (term.slope * U * m[at(t)]) / cntC;
        } else {
          for (let t = 0; t < T; t++) {
            if (m[at(t)] === 0) continue;
            const term = termOf(wAt(t), a, p);
            s += u(t) * term.value;
            d[t] += u(t) * term.slope;
          }
        }
      }
      if (CLIPPED.includes(lt) || lt === 'cispo') {
        if (seqLevel) {
          const f = clipFlags(wSeq, a, p);
          flags.low += f.low / B;
          flags.high += f.high / B;
          flags.region += f.region / B;
        } else {
          for (let t = 0; t < T; t++) {
            if (m[at(t)] === 0) continue;
            const f = clipFlags(wAt(t), a, p);
            flags.low += f.low / Math.max(total, 1);
            flags.high += f.high / Math.max(total, 1);
            flags.region += f.region / Math.max(total, 1);
          }
        }
      }
      // The k3 KL terms: to the reference (β) and to the teacher (λ), the same estimator.
      const klTerm = (target: Float64Array, c: number): number => {
        const bias = p.use_bias_correction_kl;
        let klRow = 0;
        let sum = 0;
        for (let t = 0; t < T; t++) {
          if (m[at(t)] === 0) continue;
          const x = target[at(t)] - lp[at(t)];
          const kl = Math.exp(x) - x - 1;
          const W = bias ? wAt(t) : 1;
          s += c * kl * W;
          d[t] += c * (1 - Math.exp(x)) * W;
          // The ratio is not detached: d(k3·w)/dp_t also carries k3·dw/dp_t.
          if (bias && !seqLevel) d[t] += c * kl * W;
          klRow += kl;
          sum += kl * W;
        }
        if (bias && seqLevel) for (let t = 0; t < T; t++) d[t] += (c * klRow * wSeq * m[at(t)]) / cntC;
        return sum;
      };
      if (ref) klSum += klTerm(ref, p.beta);
      if (teacher) teacherKlSum += klTerm(teacher, distillCoef(p));
      if (ent) for (let t = 0; t < T; t++) if (m[at(t)] !== 0) entSum += ent[at(t)];
      per.push(scale * s);
      for (let t = 0; t < T; t++) grad[at(t)] = coef[b] * scale * d[t];
    }
    const metrics: Record<string, number> = {};
    const out: Record<string, Float64Array> = { policy_token_logps: grad };
    if (entropyBonusOn(p)) {
      const em = emask ?? m;
      let sumH = 0;
      let emSum = 0;
      for (let i = 0; i < m.length; i++) {
        sumH += ent![i] * em[i];
        emSum += em[i];
      }
      const D = OVER_N.includes(lt) ? Math.max(N, 1) : Math.max(emSum, 1);
      const c0 = batch.entropy_coef ? batch.entropy_coef.data[0] : p.entropy_coef;
      const c = appliedEntropyCoef(c0, batch.last_world_entropy?.data[0], p);
      const bonus = (c * sumH) / D;
      metrics.policy_loss = per.reduce((acc, v, b) => acc + coef[b] * v, 0);
      for (let b = 0; b < B; b++) per[b] -= bonus;
      const w = coef.reduce((acc, v) => acc + v, 0);
      out.token_entropies = Float64Array.from(em, (e) => (-c * e * w) / D);
    }
    if (lt === 'cispo') metrics.cispo_clip_ratio = flags.high;
    else if (CLIPPED.includes(lt)) {
      metrics['clip_ratio/low_mean'] = flags.low;
      metrics['clip_ratio/high_mean'] = flags.high;
      metrics['clip_ratio/region_mean'] = flags.region;
    } else if (lt === 'vespo') metrics['vespo/phi_seq_mean'] = phiSum;
    if (ref) metrics.kl = klSum / Math.max(total, 1);
    if (teacher) metrics['distill/kl'] = teacherKlSum / Math.max(total, 1);
    if (ent) metrics.entropy = entSum / Math.max(total, 1);
    if (samp) Object.assign(metrics, samplingMetrics(old, samp, m, corr ? rho : null, seqCorr, B, T));
    return { perExample: per, grad: out, metrics };
  },
  emit(g: Graph, t: BatchTensors, p): EmitResult {
    return g.scope('grpo', () => {
      const lp = t.policy_token_logps;
      const m = t.completion_mask;
      const f = lp.dtype;
      const zero = g.constant(0, f);
      const one = g.constant(1, f);
      const lt = p.loss_type;
      const samp = t.sampling_token_logps;
      checkBatch(p, samp !== undefined);
      const a = g.unsqueeze(t.advantages, [1]); // [B, 1]
      const rowsB = g.cast(g.dim(t.advantages, 0), f); // [1]
      const B = g.squeeze(rowsB, [0]);
      const cnt = g.reduceSum(m, [1], true); // [B, 1]
      const cntC = g.max(cnt, one);
      const total = g.reduceSum(m, undefined, false);
      const counted = g.greater(m, 0.5);
      // Uncounted positions read 0, so whatever padding holds cannot overflow exp (∞·0 = NaN).
      const lr = g.where(counted, g.sub(lp, t.old_token_logps), zero);
      const seqLevel = p.importance_sampling_level === 'sequence';
      const logw = seqLevel ? g.div(g.reduceSum(g.mul(lr, m), [1], true), cntC) : lr; // [B, 1] or [B, T]
      const w = g.exp(logw);
      const epsH = epsilonHigh(p);
      const positive = g.greater(a, 0);
      const nonneg = g.greaterOrEqual(a, 0);
      const metrics: Record<string, Tensor> = {};

      // The sampler correction ρ, a constant: [B, T] per token, [B, 1] per sequence.
      const corr = correcting(p, samp !== undefined);
      const seqCorr = p.vllm_importance_sampling_mode.startsWith('sequence');
      let rho: Tensor | undefined;
      if (corr) {
        const diff = g.stopGradient(g.where(counted, g.sub(t.old_token_logps, samp!), zero));
        let r = g.exp(seqCorr ? g.reduceSum(diff, [1], true) : diff);
        const lo = p.vllm_importance_sampling_clip_min;
        const hi = p.vllm_importance_sampling_clip_max;
        if (p.vllm_importance_sampling_mode.endsWith('truncate')) {
          if (lo !== null) r = g.max(r, g.constant(lo, f));
          r = g.min(r, g.constant(hi, f));
        } else {
          let outside = g.greater(r, hi);
          if (lo !== null) outside = g.or(outside, g.less(r, lo));
          r = g.where(outside, zero, r);
        }
        rho = r;
      }

      let term: Tensor;
      let flagged: { low?: Tensor; high: Tensor } | undefined;
      let phi: Tensor | undefined;
      if (lt === 'cispo') {
        const c = g.stopGradient(g.where(g.greater(w, epsH), g.constant(epsH, f), w));
        term = g.neg(g.mul(g.mul(c, a), g.where(counted, lp, zero)));
        flagged = { high: g.and(g.greater(w, epsH), positive) };
      } else if (lt === 'sapo') {
        const tau = g.where(positive, g.constant(p.sapo_temperature_pos, f), g.constant(p.sapo_temperature_neg, f));
        const soft = g.div(g.mul(sigmoidGraph(g, g.mul(tau, g.sub(w, one))), 4), tau);
        term = g.neg(g.mul(soft, a));
      } else if (lt === 'vespo') {
        const clampTo = (x: Tensor, lo: number, hi: number) => g.min(g.max(x, g.constant(lo, f)), g.constant(hi, f));
        let logW = g.reduceSum(g.mul(clampTo(lr, -20, 20), m), [1], true);
        if (rho) logW = g.add(logW, g.reduceSum(clampTo(g.log(rho), VESPO_LOG_MIN, VESPO_LOG_MAX), [1], true));
        logW = clampTo(logW, VESPO_LOG_MIN, VESPO_LOG_MAX);
        const k = g.where(nonneg, g.constant(p.vespo_k_pos, f), g.constant(p.vespo_k_neg, f));
        const lam = g.where(nonneg, g.constant(Math.max(p.vespo_lambda_pos, 1e-4), f), g.constant(Math.max(p.vespo_lambda_neg, 1e-4), f));
        const raw = g.exp(g.sub(g.add(lam, g.mul(k, logW)), g.mul(lam, g.exp(logW))));
        // nan_to_num: an overflowed weight counts 0, as TRL's.
        const finiteMax = f === 'float32' ? 3.4028234663852886e38 : Number.MAX_VALUE;
        phi = g.stopGradient(g.where(g.lessOrEqual(raw, finiteMax), raw, zero)); // [B, 1]
        term = g.neg(g.mul(g.mul(phi, a), g.where(counted, lp, zero)));
        metrics['vespo/phi_seq_mean'] = g.reduceMean(phi, undefined, false);
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
      if (p.off_policy_mask_threshold !== null) {
        const src = samp ?? t.old_token_logps;
        const drift = g.div(g.reduceSum(g.where(counted, g.sub(src, g.stopGradient(lp)), zero), [1], true), cntC);
        term = g.mul(term, g.cast(g.or(nonneg, g.lessOrEqual(drift, p.off_policy_mask_threshold)), f));
      }
      const emask = p.top_entropy_quantile < 1 ? entropyMaskGraph(g, t.token_entropies, m, p.top_entropy_quantile) : undefined;
      if (emask) term = g.mul(term, emask);
      if (rho && lt !== 'vespo') term = g.mul(term, rho);
      // The k3 KL terms: to the reference (β) and to the teacher (λ), the same estimator.
      const klOf = (target: Tensor) => {
        const x = g.where(counted, g.sub(target, lp), zero);
        const kl = g.sub(g.sub(g.exp(x), x), one);
        return p.use_bias_correction_kl ? g.mul(kl, w) : kl;
      };
      const meanKl = (kl: Tensor) => g.div(g.reduceSum(g.mul(g.stopGradient(kl), m), undefined, false), g.max(total, one));
      if (p.beta > 0) {
        const kl = klOf(t.ref_token_logps);
        term = g.add(term, g.mul(kl, p.beta));
        metrics.kl = meanKl(kl);
      }
      if (distillCoef(p) > 0) {
        const kl = klOf(t.teacher_token_logps);
        term = g.add(term, g.mul(kl, distillCoef(p)));
        metrics['distill/kl'] = meanKl(kl);
      }
      const S = g.reduceSum(g.mul(term, m), [1], false); // [B]
      const N = g.max(t.num_items_in_batch ?? total, one);
      const scale = lt === 'grpo' || lt === 'sapo' ? g.div(one, g.squeeze(cntC, [1]))
        : lt === 'dr_grpo' ? g.constant(1 / p.max_completion_length, f)
        : lt === 'bnpo' ? g.div(B, g.max(total, one))
        : lt === 'luspo' ? one
        : g.div(B, N);
      let per = g.mul(S, scale);
      if (entropyBonusOn(p)) {
        if (!t.token_entropies) throw new UserError('loss grpo: the entropy bonus (entropy_coef, use_adaptive_entropy) needs token_entropies');
        const em = emask ?? m;
        const sumH = g.reduceSum(g.mul(t.token_entropies, em), undefined, false);
        const D = OVER_N.includes(lt) ? N : g.max(g.reduceSum(em, undefined, false), one);
        let c: Tensor = t.entropy_coef ?? g.constant(p.entropy_coef, f);
        if (p.use_adaptive_entropy) c = t.last_world_entropy ? g.where(g.lessOrEqual(t.last_world_entropy, p.entropy_target), c, zero) : zero;
        metrics.policy_loss = g.stopGradient(g.reduceMean(per, undefined, false));
        per = g.sub(per, g.mul(c, g.div(sumH, D)));
      }
      // Clip ratios as TRL logs them: token level over the counted tokens, sequence level over the rows.
      const share = (b: Tensor) => {
        const x = g.cast(b, f);
        return seqLevel ? g.reduceMean(x, undefined, false) : g.div(g.reduceSum(g.mul(x, m), undefined, false), g.max(total, one));
      };
      if (lt === 'cispo') metrics.cispo_clip_ratio = share(flagged!.high);
      else if (flagged) {
        metrics['clip_ratio/low_mean'] = share(flagged.low!);
        metrics['clip_ratio/high_mean'] = share(flagged.high);
        metrics['clip_ratio/region_mean'] = share(g.or(flagged.low!, flagged.high));
      }
      if (t.token_entropies) metrics.entropy = g.div(g.reduceSum(g.mul(g.stopGradient(t.token_entropies), m), undefined, false), g.max(total, one));
      if (samp) Object.assign(metrics, samplingMetricsGraph(g, t.old_token_logps, samp, m, rho, seqCorr));
      return { perExample: per, metrics };
    });
  },
};

/**
 * TRL's sampling metrics: |o − s| over the counted tokens (mean, max), and, when the correction
 * applies, its ratio after truncation or masking (min, mean, max over the counted tokens, or over
 * the rows per sequence). Empty sets read 0. Beside them prefzoo's `sampling/sampling_kl` (TRL logs
 * none): the k3 estimate of KL(sampler ‖ trainer) over the counted tokens, drawn from the sampler,
 * mean of e^(o − s) − 1 − (o − s) (Schulman's k3: unbiased, never negative).
 */
function samplingMetrics(old: Float64Array, samp: Float64Array, m: Float64Array, rho: Float64Array | null, seqCorr: boolean, B: number, T: number): Record<string, number> {
  const diffs: number[] = [];
  for (let i = 0; i < m.length; i++) if (m[i] !== 0) diffs.push(Math.abs(old[i] - samp[i]));
  const mean = (xs: number[]) => (xs.length ? xs.reduce((x, y) => x + y, 0) / xs.length : 0);
  const max = (xs: number[]) => (xs.length ? Math.max(...xs) : 0);
  const min = (xs: number[]) => (xs.length ? Math.min(...xs) : 0);
  let kl = 0;
  for (let i = 0; i < m.length; i++) if (m[i] !== 0) kl += Math.expm1(old[i] - samp[i]) - (old[i] - samp[i]);
  const out: Record<string, number> = {
    'sampling/sampling_logp_difference/mean': mean(diffs),
    'sampling/sampling_logp_difference/max': max(diffs),
    'sampling/sampling_kl': diffs.length ? kl / diffs.length : 0,
  };
  if (rho) {
    const rs: number[] = [];
    if (seqCorr) for (let b = 0; b < B; b++) rs.push(rho[b * T]);
    else for (let i = 0; i < m.length; i++) if (m[i] !== 0) rs.push(rho[i]);
    out['sampling/importance_sampling_ratio/min'] = min(rs);
    out['sampling/importance_sampling_ratio/mean'] = mean(rs);
    out['sampling/importance_sampling_ratio/max'] = max(rs);
  }
  return out;
}

/**
 * k3 = e^d − 1 − d per position (d = o − s; 0 where d is): in float32 e^d − 1 cancels to noise for the
 * gaps of a float32 or q8 sampler (|d| ~ 1e-7–1e-4), so under |d| < 0.1 the series d²/2 + d³/6 + d⁴/24
 * (its error d⁵/120 is under 2e-5 of the value there); in float64 e^d − 1 − d as it stands.
 */
function k3Graph(g: Graph, d: Tensor): Tensor {
  const f = d.dtype;
  const one = g.constant(1, f);
  const series = g.mul(g.mul(d, d), g.add(g.constant(0.5, f), g.mul(d, g.add(g.constant(1 / 6, f), g.mul(d, g.constant(1 / 24, f))))));
  const direct = g.sub(g.sub(g.exp(d), one), d);
  if (f === 'float64') return direct;
  return g.where(g.less(g.abs(d), g.constant(0.1, f)), series, direct);
}

function samplingMetricsGraph(g: Graph, old: Tensor, samp: Tensor, m: Tensor, rho: Tensor | undefined, seqCorr: boolean): Record<string, Tensor> {
  const f = m.dtype;
  const zero = g.constant(0, f);
  const counted = g.greater(m, 0.5);
  const total = g.reduceSum(m, undefined, false);
  const any = g.greater(total, 0.5);
  const n = g.max(total, g.constant(1, f));
  const absd = g.stopGradient(g.where(counted, g.abs(g.sub(old, samp)), zero));
  const out: Record<string, Tensor> = {
    'sampling/sampling_logp_difference/mean': g.div(g.reduceSum(absd, undefined, false), n),
    // |o − s| ≥ 0, so the padding's 0 never exceeds a counted token's value.
    'sampling/sampling_logp_difference/max': g.reduceMax(absd, undefined, false),
    'sampling/sampling_kl': g.div(g.reduceSum(k3Graph(g, g.stopGradient(g.where(counted, g.sub(old, samp), zero))), undefined, false), n),
  };
  if (rho) {
    if (seqCorr) {
      out['sampling/importance_sampling_ratio/min'] = g.reduceMin(rho, undefined, false);
      out['sampling/importance_sampling_ratio/mean'] = g.reduceMean(rho, undefined, false);
      out['sampling/importance_sampling_ratio/max'] = g.reduceMax(rho, undefined, false);
    } else {
      out['sampling/importance_sampling_ratio/min'] = g.where(any, g.reduceMin(g.where(counted, rho, -MASKED), undefined, false), zero);
      out['sampling/importance_sampling_ratio/mean'] = g.div(g.reduceSum(g.mul(rho, m), undefined, false), n);
      out['sampling/importance_sampling_ratio/max'] = g.reduceMax(g.where(counted, rho, zero), undefined, false);
    }
  }
  return out;
}

/**
 * The high-entropy mask in the graph: the counted entropies sorted (TopK, descending; uncounted
 * positions sink to the end as MASKED), the (1 − ρ)-quantile read between two order statistics.
 */
export function entropyMaskGraph(g: Graph, ent: Tensor, m: Tensor, rho: number): Tensor {
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
