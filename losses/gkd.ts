/**
 * GKD — "On-Policy Distillation of Language Models: Learning from Self-Generated Mistakes" (Agarwal
 * et al., 2024), eq. (1): the generalized Jensen–Shannon divergence between a teacher's and a
 * student's next-token distributions, as TRL's `GKDTrainer.generalized_jsd_loss` computes it.
 *
 * Batch (kind `distill`): z = `student_logits` [B, T, V], m = `completion_mask` [B, T], and the
 * teacher either dense, `teacher_logits` [B, T, V], or sparse, `teacher_topk_ids` and
 * `teacher_topk_logps` [B, T, K] (its K most likely tokens and their log-probs at temperature 1),
 * optionally with `teacher_rest_logps` [B, T]: the log of the teacher's mass outside those ids, as
 * the teacher computed it (a cache's float16 log-probs know 1 − Σ of them only to about 1e-3).
 * At each position, with T_τ the teacher's and S_τ the student's distribution at temperature τ,
 *
 *   β = 0:      ℓ = KL(T_τ ‖ S_τ)                              (forward KL)
 *   β = 1:      ℓ = KL(S_τ ‖ T_τ)                              (reverse KL)
 *   otherwise:  ℓ = β·KL(T_τ ‖ M) + (1 − β)·KL(S_τ ‖ M),  M = β·T_τ + (1 − β)·S_τ
 *
 * (β → 0 or 1 in the mixture form tends to 0, not to the KLs: the two ends are their own cases, as in
 * TRL). The loss is Σ_{b,t} m·ℓ / max(Σ m, 1): summed over the counted positions of the batch and
 * divided by their number (TRL's `batchmean` over unmasked tokens; a batch with none gives 0).
 *
 * Dense: T_τ = softmax(z_teacher/τ), S_τ = softmax(z/τ) over the V tokens.
 * Sparse: both over K + 1 outcomes, the K ids and a "rest" bucket: the teacher's K probabilities and
 * 1 − their sum (or e^teacher_rest_logps when given), the student's temperature-1 probabilities of the K ids and its mass outside them;
 * each rest mass floored at REST_FLOOR ε (the teacher's sum past 1 by rounding, the student's mass
 * underflowing); then each (K + 1)-outcome distribution raised to 1/τ and renormalised (at τ = 1,
 * the floor's renormalisation only). Where the ids cover the vocabulary (K = V) there is no rest: both
 * distributions are over the K ids, as the dense form. The gradient reaches every student logit: the
 * ids' own, the rest's through its mass.
 *
 * `per_example[b]` is row b's share, B·Σ_t m·ℓ / max(Σ m, 1), so their mean is the loss; rows share
 * the token count, so the loss takes no row weights.
 *
 * Metrics (monitoring, whatever β and τ): `distill/kl`, the mean per counted token of KL(S ‖ T), the
 * reverse KL to the teacher, and `distill/forward_kl`, of KL(T ‖ S), both at temperature 1 over the
 * outcomes the loss sees (the V tokens dense; the K ids and the rest sparse, each rest floored as
 * above: merging outcomes never raises a KL, so the sparse figures bound the full ones from below).
 */
import type { Graph, Tensor } from '../src/onnx/graph.ts';
import { BadInputError } from '../src/errors.ts';
import { rows } from './core/batch.ts';
import { MASKED, log1mexp as log1mexpGraph, logSumExpMasked } from './core/ops.ts';
import { log1mexp, logSumExp } from './core/math.ts';
import type { BatchTensors, EmitResult, HostBatch, LossModule, Params, RefResult } from './core/types.ts';

export interface GkdParams extends Params {
  beta: number;
  temperature: number;
}

/**
 * The least mass a rest bucket holds, before temperature (so ε^(1/τ) of it after: about 1e-3 at
 * τ = 2). Above float32's rounding of 1 − Σ of a top K (about 1e-7), so the graph in float32 and the
 * float64 reference floor the same positions.
 */
export const REST_FLOOR = 1e-6;
const LOG_REST_FLOOR = Math.log(REST_FLOOR);

/** Whether the batch gives the teacher as its top K (else as full logits); both is refused. */
function sparseTeacher(has: (key: string) => boolean): boolean {
  const sparse = has('teacher_topk_ids') || has('teacher_topk_logps');
  if (sparse && has('teacher_logits')) {
    throw new BadInputError('loss gkd: give the teacher as teacher_logits or as teacher_topk_ids + teacher_topk_logps, not both');
  }
  if (!sparse && has('teacher_rest_logps')) throw new BadInputError('loss gkd: teacher_rest_logps belongs to a top-K teacher (teacher_topk_ids + teacher_topk_logps)');
  return sparse;
}

/** The teacher's rest log-mass from its top-K log-probs: log(1 − Σ e^lp), the sum capped at 1 − ε (float64). */
function teacherRest(tl: ArrayLike<number>): number {
  return log1mexp(Math.min(logSumExp(Array.from(tl)), Math.log1p(-REST_FLOOR)));
}

// ---- float64 reference --------------------------------------------------------------------------

function logSoftmaxScaled(xs: ArrayLike<number>, scale: number): Float64Array {
  const u = Float64Array.from(xs, (x) => x * scale);
  const l = logSumExp(Array.from(u));
  return u.map((x) => x - l);
}

/**
 * One position's ℓ over N outcomes, from the teacher's and the student's log-probs, and dℓ/du for
 * u the student's scores (log S = log-softmax(u)): with e_j = S_j·∂ℓ/∂S_j, dℓ/du = e − S·Σ e.
 * ∂ℓ/∂S is −T/S (β = 0), log S − log T + 1 (β = 1), (1 − β)(log S − log M) (mixture).
 */
function gjsd(lt: Float64Array, ls: Float64Array, beta: number): { value: number; du: Float64Array } {
  const N = lt.length;
  const t = lt.map(Math.exp);
  const s = ls.map(Math.exp);
  const e = new Float64Array(N);
  let value = 0;
  if (beta === 0) {
    for (let j = 0; j < N; j++) {
      value += t[j] * (lt[j] - ls[j]);
      e[j] = -t[j];
    }
  } else if (beta === 1) {
    for (let j = 0; j < N; j++) {
      value += s[j] * (ls[j] - lt[j]);
      e[j] = s[j] * (ls[j] - lt[j] + 1);
    }
  } else {
    const lb = Math.log(beta);
    const l1b = Math.log(1 - beta);
    for (let j = 0; j < N; j++) {
      const a = lb + lt[j];
      const c = l1b + ls[j];
      const hi = Math.max(a, c);
      const lm = hi + Math.log1p(Math.exp(Math.min(a, c) - hi));
      value += beta * t[j] * (lt[j] - lm) + (1 - beta) * s[j] * (ls[j] - lm);
      e[j] = (1 - beta) * s[j] * (ls[j] - lm);
    }
  }
  let se = 0;
  for (let j = 0; j < N; j++) se += e[j];
  return { value, du: e.map((x, j) => x - s[j] * se) };
}

/** Σ e^(lp)·(lp − lq): KL(P ‖ Q) from log-probabilities. */
function klOf(lp: Float64Array, lq: Float64Array): number {
  let v = 0;
  for (let j = 0; j < lp.length; j++) v += Math.exp(lp[j]) * (lp[j] - lq[j]);
  return v;
}

/** The monitoring KLs at temperature 1 from the two log-mass vectors over the same outcomes: [KL(S ‖ T), KL(T ‖ S)]. */
function kls(teacher: Float64Array, student: Float64Array): [number, number] {
  const lt = logSoftmaxScaled(teacher, 1);
  const ls = logSoftmaxScaled(student, 1);
  return [klOf(ls, lt), klOf(lt, ls)];
}

/** Dense position: ℓ and dℓ/dz for the student's logits z (u = z/τ). */
function densePosition(z: Float64Array, zt: Float64Array, p: GkdParams): { value: number; dz: Float64Array; kl: [number, number] } {
  const r = gjsd(logSoftmaxScaled(zt, 1 / p.temperature), logSoftmaxScaled(z, 1 / p.temperature), p.beta);
  return { value: r.value, dz: r.du.map((x) => x / p.temperature), kl: kls(zt, z) };
}

/**
 * Sparse position: ℓ over the K ids and the rest, and dℓ/dz over the whole vocabulary. The student's
 * scores are u_k = log p(id_k)/τ and u_rest = h/τ, h = max(log p(rest), log ε), p = softmax(z):
 * d log p(id_k)/dz_v = [v = id_k] − p_v; dh/dz_v = [v ∉ ids]·p_v/p(rest) − p_v, or 0 when floored.
 */
function sparsePosition(z: Float64Array, ids: Float64Array, tl: Float64Array, rest: number | undefined, p: GkdParams): { value: number; dz: Float64Array; kl: [number, number] } {
  const V = z.length;
  const K = ids.length;
  const inTop = new Uint8Array(V);
  for (const id of ids) inTop[id] = 1;
  const lse = logSumExp(Array.from(z));
  const restZ: number[] = [];
  for (let v = 0; v < V; v++) if (!inTop[v]) restZ.push(z[v]);
  // No rest outcome when the ids cover the vocabulary; else its log-mass, floored.
  const hasRest = restZ.length > 0;
  const restLse = logSumExp(restZ);
  const floored = !(restLse - lse > LOG_REST_FLOOR);
  const N = hasRest ? K + 1 : K;
  const student = new Float64Array(N);
  for (let k = 0; k < K; k++) student[k] = z[ids[k]] - lse;
  const teacher = new Float64Array(N);
  teacher.set(tl);
  if (hasRest) {
    student[K] = floored ? LOG_REST_FLOOR : restLse - lse;
    // A given rest is floored as the student's is; one derived from the K log-probs is at least ε by its cap.
    teacher[K] = rest === undefined ? teacherRest(tl) : Math.max(rest, LOG_REST_FLOOR);
  }
  const r = gjsd(logSoftmaxScaled(teacher, 1 / p.temperature), logSoftmaxScaled(student, 1 / p.temperature), p.beta);
  const G = r.du.map((x) => x / p.temperature);
  const gRest = !hasRest || floored ? 0 : G[K];
  let total = gRest;
  for (let k = 0; k < K; k++) total += G[k];
  const dz = new Float64Array(V);
  for (let v = 0; v < V; v++) {
    const pv = Math.exp(z[v] - lse);
    dz[v] = -pv * total + (inTop[v] ? 0 : gRest * Math.exp(z[v] - restLse));
  }
  for (let k = 0; k < K; k++) dz[ids[k]] += G[k];
  return { value: r.value, dz, kl: kls(teacher, student) };
}

function reference(batch: HostBatch, p: GkdParams, coef: Float64Array): RefResult {
  const B = rows(batch);
  const [, T, V] = batch.student_logits.dims;
  const z = batch.student_logits.data;
  const m = batch.completion_mask.data;
  const sparse = sparseTeacher((k) => k in batch);
  const K = sparse ? batch.teacher_topk_ids.dims[2] : 0;
  let N = 0;
  for (const x of m) N += x;
  const norm = Math.max(N, 1);
  const per = new Array<number>(B).fill(0);
  const grad = new Float64Array(z.length);
  let reverse = 0;
  let forward = 0;
  for (let b = 0; b < B; b++) {
    for (let t = 0; t < T; t++) {
      const i = b * T + t;
      if (m[i] === 0) continue;
      const zi = z.subarray(i * V, (i + 1) * V);
      const r = sparse
        ? sparsePosition(zi, batch.teacher_topk_ids.data.subarray(i * K, (i + 1) * K), batch.teacher_topk_logps.data.subarray(i * K, (i + 1) * K), batch.teacher_rest_logps?.data[i], p)
        : densePosition(zi, batch.teacher_logits.data.subarray(i * V, (i + 1) * V), p);
      per[b] += (B * m[i] * r.value) / norm;
      reverse += (m[i] * r.kl[0]) / norm;
      forward += (m[i] * r.kl[1]) / norm;
      const scale = (coef[b] * B * m[i]) / norm;
      r.dz.forEach((d, v) => (grad[i * V + v] = scale * d));
    }
  }
  return { perExample: per, grad: { student_logits: grad }, metrics: { 'distill/kl': reverse, 'distill/forward_kl': forward } };
}

// ---- ONNX subgraph ------------------------------------------------------------------------------

/** log(eᵃ + eᵇ) with a stop-gradient max shift (exact gradients through both exponentials). */
function logAddExp(g: Graph, a: Tensor, b: Tensor): Tensor {
  const hi = g.stopGradient(g.max(a, b));
  return g.add(hi, g.log(g.add(g.exp(g.sub(a, hi)), g.exp(g.sub(b, hi)))));
}

/** Σ over the last axis of P·(log P − log Q), P = e^(lp): KL(P ‖ Q) per position [B, T]. */
function kl(g: Graph, lp: Tensor, lq: Tensor): Tensor {
  return g.reduceSum(g.mul(g.exp(lp), g.sub(lp, lq)), [2], false);
}

/** ℓ per position [B, T] from the teacher's and student's log-probs [B, T, N]. */
function gjsdGraph(g: Graph, lt: Tensor, ls: Tensor, beta: number): Tensor {
  if (beta === 0) return kl(g, lt, ls);
  if (beta === 1) return kl(g, ls, lt);
  const lm = logAddExp(g, g.add(lt, Math.log(beta)), g.add(ls, Math.log(1 - beta)));
  return g.add(g.mul(kl(g, lt, lm), beta), g.mul(kl(g, ls, lm), 1 - beta));
}

/**
 * The (K + 1)-outcome log-masses [B, T, K + 1] of the sparse form, before temperature. Where the ids
 * cover the vocabulary the rest reads MASKED for both: mass 0, no term, no gradient.
 */
function sparseOutcomes(g: Graph, t: BatchTensors): { teacher: Tensor; student: Tensor } {
  const z = t.student_logits;
  const f = z.dtype;
  const ids = t.teacher_topk_ids;
  const logp = g.logSoftmax(z, -1);
  const top = g.gatherElements(logp, ids, 2);
  // 1 outside the ids, 0 at them: the rest's mass is a masked log-sum-exp, exact however small.
  const outside = g.scatterElements(g.constantOfShape(g.shapeOf(z), 1, f), ids, g.constantOfShape(g.shapeOf(ids), 0, f), 2);
  const none = g.less(g.reduceMax(outside, [2], false), 0.5); // [B, T]
  const rest = g.where(none, MASKED, g.max(logSumExpMasked(g, logp, outside, 2), LOG_REST_FLOOR));
  const tl = g.stopGradient(t.teacher_topk_logps);
  const ones = g.constantOfShape(g.shapeOf(tl), 1, f);
  const given = t.teacher_rest_logps;
  const tRest = g.where(none, MASKED, given
    ? g.max(g.stopGradient(given), LOG_REST_FLOOR)
    : log1mexpGraph(g, g.min(logSumExpMasked(g, tl, ones, 2), Math.log1p(-REST_FLOOR))));
  return {
    teacher: g.concat([tl, g.unsqueeze(tRest, [2])], 2),
    student: g.concat([top, g.unsqueeze(rest, [2])], 2),
  };
}

function emit(g: Graph, t: BatchTensors, p: GkdParams): EmitResult {
  return g.scope('gkd', () => {
    const m = t.completion_mask;
    const f = m.dtype;
    const sparse = sparseTeacher((k) => t[k] !== undefined);
    const o = sparse ? sparseOutcomes(g, t) : { teacher: g.stopGradient(t.teacher_logits), student: t.student_logits };
    const inv = 1 / p.temperature;
    const lt = g.logSoftmax(inv === 1 ? o.teacher : g.mul(o.teacher, inv), -1);
    const ls = g.logSoftmax(inv === 1 ? o.student : g.mul(o.student, inv), -1);
    const per = gjsdGraph(g, lt, ls, p.beta); // [B, T]
    const norm = g.max(g.reduceSum(m, undefined, false), g.constant(1, f));
    const B = g.squeeze(g.cast(g.dim(m, 0), f), [0]);
    const rowSum = g.reduceSum(g.mul(per, m), [1], false); // [B]
    // The monitoring KLs at temperature 1 (the loss's own log-probs when τ = 1), no gradient.
    const mt = g.stopGradient(inv === 1 ? lt : g.logSoftmax(o.teacher, -1));
    const ms = g.stopGradient(inv === 1 ? ls : g.logSoftmax(o.student, -1));
    const perToken = (x: Tensor) => g.div(g.reduceSum(g.mul(x, m), undefined, false), norm);
    return {
      perExample: g.div(g.mul(rowSum, B), norm),
      metrics: { 'distill/kl': perToken(kl(g, ms, mt)), 'distill/forward_kl': perToken(kl(g, mt, ms)) },
    };
  });
}

export const gkd: LossModule<GkdParams> = {
  name: 'gkd',
  paper: 'On-Policy Distillation of Language Models: Learning from Self-Generated Mistakes (GKD): generalized JSD to a teacher, dense or top-K',
  kind: 'distill',
  kinds: ['distill'],
  params: [
    { name: 'beta', type: 'number', default: 0.5, min: 0, max: 1, trl: 'beta', doc: 'β of the generalized JSD: 0 the forward KL(teacher ‖ student), 1 the reverse KL(student ‖ teacher), between them the JSD through β·teacher + (1 − β)·student' },
    { name: 'temperature', type: 'number', default: 1, min: 0, minOpen: true, trl: 'temperature', doc: 'τ: both distributions at temperature τ (logits / τ; a top-K teacher\'s K + 1 outcomes raised to 1/τ and renormalised)' },
  ],
  rowwise: false,
  keys: () => ({
    required: ['student_logits', 'completion_mask'],
    optional: ['teacher_logits', 'teacher_topk_ids', 'teacher_topk_logps', 'teacher_rest_logps'],
    oneOf: [['teacher_logits'], ['teacher_topk_ids', 'teacher_topk_logps']],
  }),
  grads: () => ['student_logits'],
  ref: (batch, p, coef) => reference(batch, p, coef),
  emit: (g, t, p) => emit(g, t, p),
};
