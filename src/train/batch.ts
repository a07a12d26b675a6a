/**
 * Collation: tokenized examples → the tensors of one micro-batch.
 *
 * Every response becomes one sequence prompt ++ response, right-padded to a length rounded up to a
 * multiple of `padTo` (few distinct shapes for the runtime). Sequences are laid out response-major:
 * pairwise `[chosen_1..chosen_B, rejected_1..rejected_B]`, listwise `[y_1,1..y_1,K, y_2,1..]` (row-major
 * [B, K]), single `[y_1..y_B]` (followed by KTO's mismatched `[y'_1..y'_B]` when `kl` is on), so
 * per-sequence log-probs reshape straight into the loss's inputs.
 */
import type { Kind } from '../../datasets/schema.ts';
import { toOrt, type Feeds } from '../runtime/session.ts';
import type { TokenizedExample } from './data.ts';

export interface CollateOptions {
  kind: Kind;
  padTo: number;
  padId: number;
  /** Float type of masks and per-row values. */
  dtype: 'float32' | 'float64';
  /** Cached reference log-probs per example (same layout as the responses), when the loss needs them. */
  refLogps?: (ex: TokenizedExample, index: number) => number[];
  /** Attach DRO's value position (last prompt token) per row. */
  valueIndex?: boolean;
  /** Single-trajectory: add each row's mismatched sequence (prompt_i, klResponseIds_i) for KTO's KL estimate. */
  kl?: boolean;
}

export interface Collated {
  feeds: Feeds;
  /** Number of sequences (rows of input_ids). */
  sequences: number;
  /** Padded sequence length. */
  length: number;
  /** Real (non-pad) tokens in the batch. */
  tokens: number;
  /** List width (listwise). */
  k: number;
}

export function roundUp(n: number, m: number): number {
  return Math.ceil(n / m) * m;
}

/** Sequences of a batch in the layout described above, with each sequence's prompt length. */
function sequences(kind: Kind, rows: TokenizedExample[], kl = false): { prompt: number[]; response: number[] }[] {
  if (kind === 'pairwise') {
    return [0, 1].flatMap((k) => rows.map((r) => ({ prompt: r.promptIds, response: r.responseIds[k] })));
  }
  if (kind === 'listwise') {
    const K = Math.max(...rows.map((r) => r.responseIds.length));
    // Missing list entries become prompt-only sequences whose loss mask is empty (log-prob 0, masked).
    return rows.flatMap((r) => Array.from({ length: K }, (_, k) => ({ prompt: r.promptIds, response: r.responseIds[k] ?? [] })));
  }
  const own = rows.map((r) => ({ prompt: r.promptIds, response: r.responseIds[0] }));
  if (!kl) return own;
  return [...own, ...rows.map((r) => {
    if (!r.klResponseIds) throw new Error('collate: kl rows need klResponseIds');
    return { prompt: r.promptIds, response: r.klResponseIds };
  })];
}

export function collate(rows: TokenizedExample[], o: CollateOptions): Collated {
  const seqs = sequences(o.kind, rows, o.kl);
  const N = seqs.length;
  const maxLen = Math.max(2, ...seqs.map((s) => s.prompt.length + s.response.length));
  const T = roundUp(maxLen, o.padTo);
  const ids = new BigInt64Array(N * T).fill(BigInt(o.padId));
  const attn = new BigInt64Array(N * T);
  const F = o.dtype === 'float32' ? Float32Array : Float64Array;
  const lossMask = new F(N * T);
  let tokens = 0;
  seqs.forEach((s, n) => {
    const base = n * T;
    const all = [...s.prompt, ...s.response];
    for (let t = 0; t < all.length; t++) {
      ids[base + t] = BigInt(all[t]);
      attn[base + t] = 1n;
    }
    for (let t = s.prompt.length; t < all.length; t++) lossMask[base + t] = 1;
    tokens += all.length;
  });
  const feeds: Feeds = {
    input_ids: toOrt('int64', ids, [N, T]),
    attention_mask: toOrt('int64', attn, [N, T]),
    loss_mask: toOrt(o.dtype, lossMask, [N, T]),
  };
  const B = rows.length;
  const K = o.kind === 'listwise' ? N / B : o.kind === 'pairwise' ? 2 : o.kl ? 2 : 1;
  const perRow = (f: (ex: TokenizedExample, i: number) => number) => toOrt(o.dtype, F.from(rows.map(f)), [B]);
  feeds.weight = perRow((r) => r.src.weight ?? 1);
  if (o.refLogps) {
    // ref_logps follows the sequence layout: [2B] response-major for pairs, [B, K] for lists, [B].
    const ref = new F(N);
    rows.forEach((r, i) => {
      const v = o.refLogps!(r, i);
      if (o.kind === 'pairwise') {
        ref[i] = v[0];
        ref[B + i] = v[1];
      } else if (o.kind === 'listwise') {
        for (let k = 0; k < K; k++) ref[i * K + k] = v[k] ?? 0;
      } else {
        ref[i] = v[0];
        if (o.kl) ref[B + i] = v[1];
      }
    });
    feeds.ref_logps = toOrt(o.dtype, ref, [N]);
  }
  if (o.kind === 'pairwise') {
    if (rows.every((r) => r.src.responseScores)) {
      feeds.chosen_scores = perRow((r) => r.src.responseScores![0]);
      feeds.rejected_scores = perRow((r) => r.src.responseScores![1]);
    }
    if (rows.every((r) => r.src.winProbs)) {
      feeds.chosen_probs = perRow((r) => r.src.winProbs![0]);
      feeds.rejected_probs = perRow((r) => r.src.winProbs![1]);
    }
  } else if (o.kind === 'listwise') {
    const scores = new F(N);
    const mask = new F(N);
    const win = new F(N);
    rows.forEach((r, i) => {
      for (let k = 0; k < r.responseIds.length; k++) {
        scores[i * K + k] = r.src.scores?.[k] ?? 0;
        mask[i * K + k] = 1;
        win[i * K + k] = r.src.winProbs?.[k] ?? 0.5;
      }
    });
    feeds.scores = toOrt(o.dtype, scores, [B, K]);
    feeds.mask = toOrt(o.dtype, mask, [B, K]);
    if (rows.every((r) => r.src.winProbs)) feeds.win_probs = toOrt(o.dtype, win, [B, K]);
  } else {
    if (rows.every((r) => r.src.reward !== undefined)) feeds.rewards = perRow((r) => r.src.reward!);
    else if (rows.every((r) => r.src.label !== undefined)) feeds.rewards = perRow((r) => (r.src.label ? 1 : 0));
    if (rows.every((r) => r.src.label !== undefined)) feeds.labels = perRow((r) => (r.src.label ? 1 : 0));
    if (o.valueIndex) {
      feeds.value_index = toOrt('int64', BigInt64Array.from(rows.map((r) => BigInt(Math.max(0, r.promptIds.length - 1)))), [B]);
    }
  }
  return { feeds, sequences: N, length: T, tokens, k: K };
}
