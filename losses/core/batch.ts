/**
 * Batch keys of each kind and the validation of a JSON batch (`prefzoo loss --input BATCH.json`).
 *
 * pairwise  [B]:    policy_chosen_logps, policy_rejected_logps, ref_chosen_logps, ref_rejected_logps,
 *                   chosen_tokens, rejected_tokens, chosen_probs, rejected_probs (SPPO win-rates),
 *                   chosen_scores, rejected_scores (reward-model scores, MPO's split),
 *                   chosen_wpo_logps, rejected_wpo_logps (WPO's sampling-aligned log-probs),
 *                   policy_rationale_logps, rationale_mask (the rationale term: summed log-prob of
 *                   each row's rationale, 1 where the row has one)
 * listwise  [B, K]: policy_logps, ref_logps, scores (labels ψ, higher is better), mask (1 = real entry),
 *                   win_probs (SPPO)
 * single    [B]:    policy_logps, ref_logps, rewards, values (DRO), labels (KTO: 1 desirable, 0 not),
 *                   kl (KTO, a number) or policy_kl_logps, ref_kl_logps [B'] (KTO's mismatched pairs)
 * nash_md   [B]:    policy_logps, ref_logps, probs (preference P(y ≻ y'))
 * grpo      [B, T]: policy_token_logps, old_token_logps, ref_token_logps, teacher_token_logps (per-token log-probs),
 *                   completion_mask (1 = a completion token counted), token_entropies (nats, for
 *                   top_entropy_quantile and the entropy bonus), sampling_token_logps (the sampler's
 *                   own log-probs of the tokens it drew: the sampler–trainer correction); [B]:
 *                   advantages; numbers: num_items_in_batch (DAPO's token count of the whole
 *                   accumulated batch), entropy_coef (the entropy bonus's coefficient this step),
 *                   last_world_entropy (the adaptive controller's last measured entropy)
 * reward_pairs [B]: chosen_rewards, rejected_rewards (a reward model's r(x, y_w), r(x, y_l))
 * distill [B, T, V]: student_logits, teacher_logits (logits over the vocabulary at each completion
 *                   position), or instead of teacher_logits [B, T, K]: teacher_topk_ids (the
 *                   teacher's K most likely token ids) and teacher_topk_logps (their log-probs at
 *                   temperature 1), with optionally [B, T] teacher_rest_logps (the log of its mass
 *                   outside those ids); [B, T]: completion_mask
 * every kind:       weight [B] (row weights of the batch mean)
 */
import { UserError } from '../../src/errors.ts';
import type { HostBatch, HostTensor, Kind, KeySet } from './types.ts';

export const PAIR_KEYS = [
  'policy_chosen_logps', 'policy_rejected_logps', 'ref_chosen_logps', 'ref_rejected_logps',
  'chosen_tokens', 'rejected_tokens', 'chosen_probs', 'rejected_probs', 'chosen_scores', 'rejected_scores',
  'chosen_wpo_logps', 'rejected_wpo_logps', 'policy_rationale_logps', 'rationale_mask', 'weight',
] as const;
export const LIST_KEYS = ['policy_logps', 'ref_logps', 'scores', 'mask', 'win_probs', 'weight'] as const;
export const SINGLE_KEYS = [
  'policy_logps', 'ref_logps', 'rewards', 'values', 'labels', 'kl', 'policy_kl_logps', 'ref_kl_logps', 'weight',
] as const;
export const NASH_KEYS = ['policy_logps', 'ref_logps', 'probs', 'weight'] as const;
export const GRPO_KEYS = [
  'policy_token_logps', 'old_token_logps', 'ref_token_logps', 'teacher_token_logps', 'advantages', 'completion_mask', 'token_entropies', 'num_items_in_batch',
  'sampling_token_logps', 'entropy_coef', 'last_world_entropy',
] as const;
export const REWARD_PAIR_KEYS = ['chosen_rewards', 'rejected_rewards', 'weight'] as const;
export const DISTILL_KEYS = ['student_logits', 'teacher_logits', 'teacher_topk_ids', 'teacher_topk_logps', 'teacher_rest_logps', 'completion_mask'] as const;
/** Distributions over the vocabulary ([B, T, V]) or over the teacher's top K ([B, T, K]), per completion position. */
export const DIST_KEYS: ReadonlySet<string> = new Set(['student_logits', 'teacher_logits', 'teacher_topk_ids', 'teacher_topk_logps']);
/** Keys holding token ids: integers, fed to a graph as int64. */
export const INDEX_KEYS: ReadonlySet<string> = new Set(['teacher_topk_ids']);
/** GRPO's per-token columns ([B, T]: one entry per completion position). */
export const TOKEN_KEYS: ReadonlySet<string> = new Set(['policy_token_logps', 'old_token_logps', 'ref_token_logps', 'teacher_token_logps', 'completion_mask', 'token_entropies', 'sampling_token_logps', 'teacher_rest_logps']);
/** Keys that are one number for the whole batch. */
const SCALAR_KEYS: ReadonlySet<string> = new Set(['kl', 'num_items_in_batch', 'entropy_coef', 'last_world_entropy']);

export const KEYS_OF: Record<Kind, readonly string[]> = {
  pairwise: PAIR_KEYS, listwise: LIST_KEYS, single: SINGLE_KEYS, nash_md: NASH_KEYS, grpo: GRPO_KEYS, reward_pairs: REWARD_PAIR_KEYS,
  distill: DISTILL_KEYS,
};

/** Rank of a key's tensor: 3 for [B, T, V] distributions, 2 for [B, K] list and [B, T] token columns, 0 for the batch scalars (`kl`, `num_items_in_batch`, …), else 1. */
export function keyRank(kind: Kind, key: string): number {
  if (DIST_KEYS.has(key)) return 3;
  if (kind === 'listwise' && key !== 'weight') return 2;
  if (TOKEN_KEYS.has(key)) return 2;
  if (SCALAR_KEYS.has(key)) return 0;
  return 1;
}

/** Keys whose first dim is not the batch size (KTO's mismatched pairs have their own length). */
const OWN_LENGTH = new Set(['policy_kl_logps', 'ref_kl_logps']);

type Domain = 'real' | 'positive' | 'prob' | 'binary' | 'nonneg' | 'nonpos' | 'index';
function domainOf(key: string): Domain {
  if (INDEX_KEYS.has(key)) return 'index';
  if (key === 'teacher_topk_logps' || key === 'teacher_rest_logps') return 'nonpos';
  if (key.endsWith('_tokens')) return 'positive';
  if (key.endsWith('_probs') || key === 'probs' || key === 'win_probs') return 'prob';
  if (key === 'mask' || key === 'labels' || key === 'rationale_mask' || key === 'completion_mask') return 'binary';
  if (key === 'weight' || key === 'token_entropies' || key === 'last_world_entropy') return 'nonneg';
  if (key === 'num_items_in_batch') return 'positive';
  return 'real';
}

const DOMAIN_TEXT: Record<Domain, string> = {
  real: 'a finite number',
  positive: 'a number > 0',
  prob: 'a number in [0, 1]',
  binary: '0 or 1 (or a boolean)',
  nonneg: 'a finite number ≥ 0',
  nonpos: 'a finite number ≤ 0 (a log-probability)',
  index: 'an integer ≥ 0 (a token id)',
};

function inDomain(d: Domain, v: number): boolean {
  if (!Number.isFinite(v)) return false;
  switch (d) {
    case 'positive': return v > 0;
    case 'prob': return v >= 0 && v <= 1;
    case 'binary': return v === 0 || v === 1;
    case 'nonneg': return v >= 0;
    case 'nonpos': return v <= 0;
    case 'index': return Number.isInteger(v) && v >= 0;
    default: return true;
  }
}

/** Picks the batch kind for a loss that accepts several (SPPO: pairs or lists) from the keys present. */
export function detectKind(kinds: readonly Kind[], json: Record<string, unknown>): Kind {
  if (kinds.length === 1) return kinds[0];
  if ('policy_chosen_logps' in json && kinds.includes('pairwise')) return 'pairwise';
  const pl = json.policy_logps;
  if (Array.isArray(pl) && Array.isArray(pl[0]) && kinds.includes('listwise')) return 'listwise';
  const flat = kinds.find((k) => k === 'single' || k === 'nash_md');
  return flat ?? kinds[0];
}

/**
 * Validates a parsed JSON batch against the keys a loss reads and converts it to float64 tensors.
 * Every mistake is one UserError naming the key (and the element) at fault.
 */
export function parseBatch(json: unknown, kind: Kind, keys: KeySet, source = 'batch'): HostBatch {
  if (json === null || typeof json !== 'object' || Array.isArray(json)) {
    throw new UserError(`${source}: expected a JSON object of batch columns`);
  }
  const obj = json as Record<string, unknown>;
  // Keys of other kinds are ignored (one file may serve several losses); unknown names are typos.
  const known = new Set(Object.values(KEYS_OF).flat());
  for (const k of Object.keys(obj)) {
    if (!known.has(k)) throw new UserError(`${source}: unknown key "${k}"; keys of a ${kind} batch: ${KEYS_OF[kind].join(', ')}`);
  }
  for (const k of keys.required) {
    if (!(k in obj)) throw new UserError(`${source}: missing key "${k}" (this loss needs ${keys.required.join(', ')})`);
  }
  if (keys.oneOf && !keys.oneOf.some((grp) => grp.every((k) => k in obj))) {
    throw new UserError(`${source}: missing keys: this loss needs ${keys.oneOf.map((grp) => grp.join(' + ')).join(', or ')}`);
  }
  const wanted = [...keys.required, ...keys.optional.filter((k) => k in obj)];
  const out: HostBatch = {};
  let B: number | undefined;
  let K: number | undefined;
  for (const key of wanted) {
    const t = toTensor(obj[key], key, keyRank(kind, key), source);
    if (t.dims.length >= 1 && !OWN_LENGTH.has(key)) {
      if (B === undefined) B = t.dims[0];
      else if (t.dims[0] !== B) throw new UserError(`${source}: key "${key}" has ${t.dims[0]} rows, expected ${B} like the other keys`);
    }
    if (t.dims.length >= 2) {
      const tokens = TOKEN_KEYS.has(key) || DIST_KEYS.has(key);
      if (K === undefined) K = t.dims[1];
      else if (t.dims[1] !== K) throw new UserError(`${source}: key "${key}" has ${tokens ? 'rows of' : 'lists of length'} ${t.dims[1]}${tokens ? ' tokens' : ''}, expected ${K} like the other keys`);
    }
    out[key] = t;
  }
  if (B === 0) throw new UserError(`${source}: the batch has no rows`);
  if (kind === 'distill') checkDistill(out, source);
  if (out.weight) {
    const s = out.weight.data.reduce((a, b) => a + b, 0);
    if (!(s > 0)) throw new UserError(`${source}: key "weight" must have a positive sum`);
  }
  return out;
}

function toTensor(v: unknown, key: string, rank: number, source: string): HostTensor {
  const d = domainOf(key);
  const num = (x: unknown, where: string): number => {
    const n = typeof x === 'boolean' && d === 'binary' ? (x ? 1 : 0) : x;
    if (typeof n !== 'number' || !inDomain(d, n)) {
      throw new UserError(`${source}: key "${key}"${where} must be ${DOMAIN_TEXT[d]}, got ${JSON.stringify(x)}`);
    }
    return n;
  };
  if (rank === 0) {
    const x = Array.isArray(v) && v.length === 1 ? v[0] : v;
    return { dims: [], data: Float64Array.of(num(x, '')) };
  }
  if (!Array.isArray(v)) {
    throw new UserError(`${source}: key "${key}" must be ${rank === 1 ? 'an array of numbers' : 'an array of arrays of numbers (one list per row)'}`);
  }
  if (rank === 3) return toTensor3(v, key, num, source);
  if (rank === 1) {
    if (v.some((x) => Array.isArray(x))) throw new UserError(`${source}: key "${key}" must be a flat array of numbers, one per row`);
    return { dims: [v.length], data: Float64Array.from(v, (x, i) => num(x, `[${i}]`)) };
  }
  const K = Array.isArray(v[0]) ? v[0].length : -1;
  const data = new Float64Array(v.length * Math.max(K, 0));
  v.forEach((row, i) => {
    if (!Array.isArray(row) || row.length !== K) {
      throw new UserError(`${source}: key "${key}" row ${i} must be an array of ${K} numbers (pad short lists and set "mask")`);
    }
    row.forEach((x, j) => (data[i * K + j] = num(x, `[${i}][${j}]`)));
  });
  if (K <= 0) throw new UserError(`${source}: key "${key}" must hold non-empty lists`);
  return { dims: [v.length, K], data };
}

/** A [B][T][W] array (W: the vocabulary, or the teacher's top K) as a tensor; `num` checks each element. */
function toTensor3(v: unknown, key: string, num: (x: unknown, where: string) => number, source: string): HostTensor {
  const shapeText = 'an array of rows, each an array of positions, each an array of numbers ([B][T][V])';
  if (!Array.isArray(v) || v.length === 0 || !Array.isArray(v[0]) || !Array.isArray(v[0][0])) throw new UserError(`${source}: key "${key}" must be ${shapeText}`);
  const T = (v[0] as unknown[]).length;
  const W = (v[0][0] as unknown[]).length;
  if (W === 0) throw new UserError(`${source}: key "${key}" must hold non-empty lists at each position`);
  const data = new Float64Array(v.length * T * W);
  v.forEach((row, i) => {
    if (!Array.isArray(row) || row.length !== T) throw new UserError(`${source}: key "${key}" row ${i} must be an array of ${T} positions (pad short completions and set "completion_mask")`);
    row.forEach((pos, t) => {
      if (!Array.isArray(pos) || pos.length !== W) throw new UserError(`${source}: key "${key}"[${i}][${t}] must be an array of ${W} numbers, as at [0][0]`);
      pos.forEach((x, j) => (data[(i * T + t) * W + j] = num(x, `[${i}][${t}][${j}]`)));
    });
  });
  return { dims: [v.length, T, W], data };
}

/**
 * How far the teacher's top-K probabilities at a counted position may sum past 1 (rounding, as of a
 * float16 cache) before the file is refused: they must be log-probabilities at temperature 1.
 */
export const TOPK_MASS_TOLERANCE = 1e-2;

/**
 * The checks of a distillation batch beyond each key's own: one teacher form; one vocabulary;
 * top-K ids inside it; and, at counted positions, K distinct ids whose probabilities sum to at most 1
 * (padding may hold anything: it never reaches the loss).
 */
function checkDistill(b: HostBatch, source: string): void {
  const ids = b.teacher_topk_ids;
  const logps = b.teacher_topk_logps;
  if (b.teacher_logits && (ids || logps)) {
    throw new UserError(`${source}: give the teacher as "teacher_logits" or as "teacher_topk_ids" + "teacher_topk_logps", not both`);
  }
  const [, T, V] = b.student_logits.dims;
  if (b.teacher_logits && b.teacher_logits.dims[2] !== V) {
    throw new UserError(`${source}: key "teacher_logits" has ${b.teacher_logits.dims[2]} logits per position, expected ${V} like "student_logits" (one vocabulary)`);
  }
  const rest = b.teacher_rest_logps;
  if (rest && !(ids && logps)) throw new UserError(`${source}: key "teacher_rest_logps" belongs to a top-K teacher: give "teacher_topk_ids" and "teacher_topk_logps" with it`);
  if (!ids || !logps) return;
  const K = ids.dims[2];
  if (logps.dims[2] !== K) throw new UserError(`${source}: key "teacher_topk_logps" has ${logps.dims[2]} entries per position, expected ${K} like "teacher_topk_ids"`);
  if (K > V) throw new UserError(`${source}: key "teacher_topk_ids" has ${K} ids per position, more than the ${V} logits of "student_logits"`);
  const mask = b.completion_mask.data;
  const at = (i: number) => `[${Math.floor(i / T)}][${i % T}]`;
  for (let i = 0; i < mask.length; i++) {
    const seen = new Set<number>();
    let mass = 0;
    for (let k = 0; k < K; k++) {
      const id = ids.data[i * K + k];
      if (id >= V) throw new UserError(`${source}: key "teacher_topk_ids"${at(i)}[${k}] is ${id}, outside the ${V} logits of "student_logits"`);
      if (mask[i] === 0) continue;
      if (seen.has(id)) throw new UserError(`${source}: key "teacher_topk_ids"${at(i)} lists id ${id} twice (the top K must be K distinct tokens)`);
      seen.add(id);
      mass += Math.exp(logps.data[i * K + k]);
    }
    if (rest && mask[i] !== 0) mass += Math.exp(rest.data[i]);
    if (mass > 1 + TOPK_MASS_TOLERANCE) {
      throw new UserError(`${source}: key "teacher_topk_logps"${rest ? ' (with "teacher_rest_logps")' : ''}${at(i)} gives probabilities summing to ${mass.toPrecision(4)}, more than 1: expected the teacher's log-probabilities at temperature 1`);
    }
  }
}

/** Float64 column of a batch key (throws a bug error when absent: keys were validated before). */
export function col(batch: HostBatch, key: string): Float64Array {
  const t = batch[key];
  if (!t) throw new Error(`batch key ${key} missing after validation`);
  return t.data;
}

/** Number of rows of a batch (B). */
export function rows(batch: HostBatch): number {
  for (const [k, t] of Object.entries(batch)) if (t.dims.length >= 1 && !OWN_LENGTH.has(k)) return t.dims[0];
  throw new Error('batch without row-indexed keys');
}
