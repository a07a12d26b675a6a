/**
 * Evaluation metrics on implicit rewards r̂(y) = β·(logp(y) − ref(y)), all in float64 on plain
 * arrays: pairwise accuracy and margins, listwise NDCG / Kendall τ / top-1, single-trajectory ROC-AUC.
 */

export interface PairwiseMetrics {
  /** Share of pairs with r̂(chosen) − r̂(rejected) > tol; ties count as wrong (losses/metrics.ts, TRL's rule). */
  accuracy: number;
  /** Pairs whose |margin| ≤ tol: counted as wrong in `accuracy` (all of them when policy = reference). */
  ties: number;
  margin: number;
  chosen_reward: number;
  rejected_reward: number;
  count: number;
}

export function mean(xs: ArrayLike<number>): number {
  let s = 0;
  for (let i = 0; i < xs.length; i++) s += xs[i];
  return xs.length ? s / xs.length : NaN;
}

/** `tol[i]`: the tie tolerance of pair i (default 0: exact equality is a tie). */
export function pairwiseMetrics(chosenRewards: ArrayLike<number>, rejectedRewards: ArrayLike<number>, tol?: ArrayLike<number>): PairwiseMetrics {
  const n = chosenRewards.length;
  if (rejectedRewards.length !== n) throw new Error('pairwiseMetrics: chosen and rejected lengths differ');
  let correct = 0;
  let ties = 0;
  let margin = 0;
  for (let i = 0; i < n; i++) {
    const m = chosenRewards[i] - rejectedRewards[i];
    const t = tol ? tol[i] : 0;
    if (m > t) correct++;
    else if (m >= -t) ties++;
    margin += m;
  }
  return {
    accuracy: n ? correct / n : NaN,
    ties,
    margin: n ? margin / n : NaN,
    chosen_reward: mean(chosenRewards),
    rejected_reward: mean(rejectedRewards),
    count: n,
  };
}

/**
 * NDCG of one list: gains 2^label − 1, discount log2(1 + rank), ranking by predicted score
 * (descending, ties broken by original index so the result is deterministic).
 */
export function ndcg(scores: number[], labels: number[], k = scores.length): number {
  const order = scores.map((s, i) => [s, i] as const).sort((a, b) => b[0] - a[0] || a[1] - b[1]).map((p) => p[1]);
  const ideal = [...labels].sort((a, b) => b - a);
  let dcg = 0;
  let idcg = 0;
  for (let r = 0; r < Math.min(k, labels.length); r++) {
    const disc = Math.log2(2 + r);
    dcg += (2 ** labels[order[r]] - 1) / disc;
    idcg += (2 ** ideal[r] - 1) / disc;
  }
  return idcg > 0 ? dcg / idcg : 1;
}

/** Kendall τ-b between two score vectors (handles ties in either). */
export function kendallTau(a: number[], b: number[]): number {
  let concordant = 0;
  let discordant = 0;
  let tiesA = 0;
  let tiesB = 0;
  for (let i = 0; i < a.length; i++) {
    for (let j = i + 1; j < a.length; j++) {
      const da = Math.sign(a[i] - a[j]);
      const db = Math.sign(b[i] - b[j]);
      if (da === 0 && db === 0) continue;
      if (da === 0) tiesA++;
      else if (db === 0) tiesB++;
      else if (da === db) concordant++;
      else discordant++;
    }
  }
  const denom = Math.sqrt((concordant + discordant + tiesA) * (concordant + discordant + tiesB));
  return denom > 0 ? (concordant - discordant) / denom : 0;
}

export interface ListwiseMetrics {
  ndcg: number;
  kendall_tau: number;
  /** Share of lists whose highest implicit reward is (one of) the best-labelled responses. */
  top1_accuracy: number;
  count: number;
}

export function listwiseMetrics(rewards: number[][], labels: number[][]): ListwiseMetrics {
  let nd = 0;
  let tau = 0;
  let top = 0;
  for (let i = 0; i < rewards.length; i++) {
    const r = rewards[i];
    const l = labels[i];
    nd += ndcg(r, l);
    tau += kendallTau(r, l);
    let best = 0;
    for (let j = 1; j < r.length; j++) if (r[j] > r[best]) best = j;
    const ties = r.filter((v) => v === r[best]).length;
    if (ties === 1 && l[best] === Math.max(...l)) top++;
  }
  const n = rewards.length;
  return { ndcg: nd / n, kendall_tau: tau / n, top1_accuracy: top / n, count: n };
}

/**
 * ROC-AUC of scores against binary labels: the probability that a random positive scores above a
 * random negative, ties counting one half (Mann–Whitney U with average ranks).
 */
export function rocAuc(scores: ArrayLike<number>, labels: ArrayLike<boolean>): number {
  const idx = Array.from({ length: scores.length }, (_, i) => i).sort((a, b) => scores[a] - scores[b]);
  const ranks = new Float64Array(scores.length);
  for (let i = 0; i < idx.length; ) {
    let j = i;
    while (j + 1 < idx.length && scores[idx[j + 1]] === scores[idx[i]]) j++;
    const avg = (i + j) / 2 + 1;
    for (let k = i; k <= j; k++) ranks[idx[k]] = avg;
    i = j + 1;
  }
  let pos = 0;
  let rankSum = 0;
  for (let i = 0; i < labels.length; i++) {
    if (labels[i]) {
      pos++;
      rankSum += ranks[i];
    }
  }
  const neg = labels.length - pos;
  if (pos === 0 || neg === 0) return NaN;
  return (rankSum - (pos * (pos + 1)) / 2) / (pos * neg);
}

/** Groups row indices by a key (the `source` column), keeping first-seen order. */
export function groupBy(keys: ArrayLike<string | null>): Map<string, number[]> {
  const m = new Map<string, number[]>();
  for (let i = 0; i < keys.length; i++) {
    const k = keys[i] ?? '(none)';
    let a = m.get(k);
    if (!a) m.set(k, (a = []));
    a.push(i);
  }
  return m;
}
