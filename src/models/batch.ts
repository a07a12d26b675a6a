/**
 * Collation: tokenized examples → the tensors of one micro-batch.
 *
 * Every response becomes one sequence prompt ++ response, right-padded to a length rounded up to a
 * multiple of `padTo` (few distinct shapes for the runtime). Sequences are laid out response-major:
 * pairwise `[chosen_1..chosen_B, rejected_1..rejected_B]`, listwise `[y_1,1..y_1,K, y_2,1..]` (row-major
 * [B, K]), single `[y_1..y_B]` (followed by KTO's mismatched `[y'_1..y'_B]` when `kl` is on), so
 * per-sequence log-probs reshape straight into the loss's inputs.
 *
 * Shared prompts (`packed`, pairwise and listwise): the responses of one example share its prompt, so
 * they are laid out in one row, prompt ++ response_1 ++ response_2 ++ …, and the prompt is computed
 * once instead of once per response. A token attends to the prompt and to the earlier tokens of its
 * own response (`segment_ids`: 0 pad, 1 prompt, 2 + k response k), and its rotary or learned position
 * is the one it has in its own unpacked sequence (`position_ids`). Each counted token is predicted
 * from the position before it in its own sequence — the last prompt position for a response's first
 * token, which is why a position can be scored more than once — so the scored positions are listed
 * (`score_index` into the flattened rows, `score_target` the token) and `score_select [S, M]` sums
 * them into the S sequences of the layout above. Sequence log-probs, token counts and every loss
 * input are the same as unpacked; the work per step drops by the repeated prompts.
 */
import type { Kind } from '../../datasets/schema.ts';
import { toOrt, type Feeds } from '../runtime/session.ts';
import type { TokenizedExample } from '../../datasets/examples.ts';

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
  /** Pairwise and listwise: one row per example, its prompt shared by its responses (see above). */
  packed?: boolean;
  /**
   * LD-DPO (pairwise): response tokens past the shorter response's length count with this weight in
   * the log-prob sums (loss_mask / score_select hold the weights); `sequence_tokens [N]` then carries
   * the plain token counts.
   */
  ldAlpha?: number;
  /**
   * Pairwise: append one sequence per row for its rationale (src/train/rationale.ts), after the 2B
   * response sequences, and `rationale_mask [B]` (1 where the row has one).
   */
  rationale?: boolean;
}

export interface Collated {
  feeds: Feeds;
  /** Number of sequences (rows of input_ids unpacked; packed, sequences of the layout). */
  sequences: number;
  /** Padded row length. */
  length: number;
  /** Real tokens of the batch's sequences, prompt + response each (a shared prompt counts per response). */
  tokens: number;
  /** Tokens the model actually runs over (= tokens unless packed). */
  computed: number;
  /** List width (listwise). */
  k: number;
}

export function roundUp(n: number, m: number): number {
  return Math.ceil(n / m) * m;
}

/** Where response k of row i sits among the B·K sequences of the layout described above. */
export function sequenceIndex(kind: Kind, B: number, K: number, i: number, k: number): number {
  return kind === 'listwise' ? i * K + k : k * B + i;
}

/**
 * One sequence of a batch: its prompt, its response, LD-DPO's token weights (1 up to `front`, then
 * `tail`), and which response tokens count at all (`mask`, 0 on tool results and other turns that are
 * not the assistant's own; absent: all).
 */
interface Sequence {
  prompt: number[];
  response: number[];
  front: number;
  tail: number;
  mask?: number[];
}

/** The weight of response token j of a sequence in its log-prob sum (0: not scored). */
function tokenWeight(s: { front: number; tail: number; mask?: number[] }, j: number): number {
  if (s.mask && !s.mask[j]) return 0;
  return j < s.front ? 1 : s.tail;
}

/** Response tokens counted at full weight in both responses of a pair under LD-DPO: the shorter one's length. */
function ldWeights(rows: TokenizedExample[], i: number, o: CollateOptions): { front: number; tail: number } {
  if (o.ldAlpha === undefined || o.kind !== 'pairwise') return { front: Infinity, tail: 1 };
  const r = rows[i].responseIds;
  return { front: Math.min(r[0].length, r[1].length), tail: o.ldAlpha };
}

/** Sequences of a batch in the layout described above, then the rationale sequences (pairwise, `rationale`). */
function sequences(rows: TokenizedExample[], o: CollateOptions): Sequence[] {
  const full = { front: Infinity, tail: 1 };
  if (o.kind === 'pairwise') {
    const pairs = [0, 1].flatMap((k) => rows.map((r, i) => ({ prompt: r.promptIds, response: r.responseIds[k], mask: r.responseMasks?.[k], ...ldWeights(rows, i, o) })));
    if (!o.rationale) return pairs;
    // A row without a rationale gets a one-token placeholder that scores nothing (log-prob 0, masked out).
    return [...pairs, ...rows.map((r) => (r.rationale ? { prompt: r.rationale.promptIds, response: r.rationale.responseIds, ...full } : { prompt: r.promptIds.slice(0, 1), response: [], ...full }))];
  }
  if (o.kind === 'listwise') {
    const K = Math.max(...rows.map((r) => r.responseIds.length));
    // Missing list entries become prompt-only sequences whose loss mask is empty (log-prob 0, masked).
    return rows.flatMap((r) => Array.from({ length: K }, (_, k) => ({ prompt: r.promptIds, response: r.responseIds[k] ?? [], mask: r.responseMasks?.[k], ...full })));
  }
  const own = rows.map((r) => ({ prompt: r.promptIds, response: r.responseIds[0], mask: r.responseMasks?.[0], ...full }));
  if (!o.kl) return own;
  return [...own, ...rows.map((r) => {
    if (!r.klResponseIds) throw new Error('collate: kl rows need klResponseIds');
    return { prompt: r.promptIds, response: r.klResponseIds, ...full };
  })];
}

/** Kinds whose examples have several responses to one prompt, which a packed batch shares. */
export function canPack(kind: Kind, kl = false): boolean {
  return (kind === 'pairwise' || kind === 'listwise') && !kl;
}

/** Prompt tokens computed once and the responses that follow it, each with its place among the S sequences. */
interface PackGroup {
  prompt: number[];
  responses: { ids: number[]; seq: number; front: number; tail: number; mask?: number[] }[];
}

/** The model tensors of a packed batch (see the module comment) over the S sequences of `groups`. */
function packRows(groups: PackGroup[], S: number, o: CollateOptions): { feeds: Feeds; length: number; computed: number } {
  const G = groups.length;
  const maxLen = Math.max(2, ...groups.map((r) => r.prompt.length + r.responses.reduce((n, x) => n + x.ids.length, 0)));
  const L = roundUp(maxLen, o.padTo);
  const ids = new BigInt64Array(G * L).fill(BigInt(o.padId));
  const pos = new BigInt64Array(G * L);
  const seg = new BigInt64Array(G * L);
  const scoreIndex: number[] = [];
  const scoreTarget: number[] = [];
  const scoreSeq: number[] = [];
  const scoreWeight: number[] = [];
  let computed = 0;
  groups.forEach((r, i) => {
    const base = i * L;
    const P = r.prompt.length;
    r.prompt.forEach((id, t) => {
      ids[base + t] = BigInt(id);
      pos[base + t] = BigInt(t);
      seg[base + t] = 1n;
    });
    let at = P;
    r.responses.forEach((resp, k) => {
      resp.ids.forEach((id, j) => {
        ids[base + at + j] = BigInt(id);
        pos[base + at + j] = BigInt(P + j);
        seg[base + at + j] = BigInt(2 + k);
        // Predicted from the previous token of its own sequence; position 0 of a sequence has none.
        const from = j > 0 ? at + j - 1 : P - 1;
        // A masked token (a tool result, another turn) is not scored at all.
        if (from < 0 || (resp.mask && !resp.mask[j])) return;
        scoreIndex.push(base + from);
        scoreTarget.push(id);
        scoreSeq.push(resp.seq);
        scoreWeight.push(tokenWeight(resp, j));
      });
      at += resp.ids.length;
    });
    computed += at;
  });
  const M = scoreIndex.length;
  const F = o.dtype === 'float32' ? Float32Array : Float64Array;
  const select = new F(S * M);
  scoreSeq.forEach((s, m) => (select[s * M + m] = scoreWeight[m]));
  const feeds: Feeds = {
    input_ids: toOrt('int64', ids, [G, L]),
    position_ids: toOrt('int64', pos, [G, L]),
    segment_ids: toOrt('int64', seg, [G, L]),
    score_index: toOrt('int64', BigInt64Array.from(scoreIndex, BigInt), [M]),
    score_target: toOrt('int64', BigInt64Array.from(scoreTarget, BigInt), [M]),
    score_select: toOrt(o.dtype, select, [S, M]),
  };
  return { feeds, length: L, computed };
}

/** The packed groups of a batch: one per example (its responses), then one per rationale. */
function packGroups(rows: TokenizedExample[], K: number, o: CollateOptions): PackGroup[] {
  const B = rows.length;
  const groups: PackGroup[] = rows.map((r, i) => ({
    prompt: r.promptIds,
    responses: r.responseIds.map((ids, k) => ({ ids, seq: sequenceIndex(o.kind, B, K, i, k), mask: r.responseMasks?.[k], ...ldWeights(rows, i, o) })),
  }));
  if (o.rationale) {
    rows.forEach((r, i) => {
      if (r.rationale) groups.push({ prompt: r.rationale.promptIds, responses: [{ ids: r.rationale.responseIds, seq: K * B + i, front: Infinity, tail: 1 }] });
    });
  }
  return groups;
}

export function collate(rows: TokenizedExample[], o: CollateOptions): Collated {
  if (o.packed && !canPack(o.kind, o.kl)) throw new Error(`collate: ${o.kind}${o.kl ? ' (with KL pairs)' : ''} batches cannot share prompts`);
  if (o.rationale && o.kind !== 'pairwise') throw new Error('collate: rationales belong to pairwise batches');
  const seqs = sequences(rows, o);
  const N = seqs.length;
  const B = rows.length;
  const K = o.kind === 'listwise' ? Math.max(...rows.map((r) => r.responseIds.length)) : o.kind === 'pairwise' ? 2 : o.kl ? 2 : 1;
  const tokens = seqs.reduce((n, s) => n + s.prompt.length + s.response.length, 0);
  const packed = o.packed ? packRows(packGroups(rows, K, o), N, o) : null;
  const { feeds, length: T } = packed ?? padSequences(seqs, o);
  if (o.ldAlpha !== undefined) {
    // Token counts stay counts when LD-DPO weights the log-prob sums (length-normalised losses read them).
    const F = o.dtype === 'float32' ? Float32Array : Float64Array;
    const counted = (s: Sequence) => (s.mask ? s.mask.reduce((n, m, j) => n + (m && (j > 0 || s.prompt.length > 0) ? 1 : 0), 0) : Math.max(0, s.response.length - (s.prompt.length === 0 ? 1 : 0)));
    feeds.sequence_tokens = toOrt(o.dtype, F.from(seqs.map(counted)), [N]);
  }
  return { ...finish(rows, feeds, K, o), sequences: N, length: T, tokens, computed: packed?.computed ?? tokens, k: K };
}

/** The model tensors of an unpacked batch: one right-padded row per sequence. */
function padSequences(seqs: Sequence[], o: CollateOptions): { feeds: Feeds; length: number } {
  const N = seqs.length;
  const maxLen = Math.max(2, ...seqs.map((s) => s.prompt.length + s.response.length));
  const T = roundUp(maxLen, o.padTo);
  const ids = new BigInt64Array(N * T).fill(BigInt(o.padId));
  const attn = new BigInt64Array(N * T);
  const F = o.dtype === 'float32' ? Float32Array : Float64Array;
  const lossMask = new F(N * T);
  seqs.forEach((s, n) => {
    const base = n * T;
    const all = [...s.prompt, ...s.response];
    for (let t = 0; t < all.length; t++) {
      ids[base + t] = BigInt(all[t]);
      attn[base + t] = 1n;
    }
    for (let t = s.prompt.length; t < all.length; t++) lossMask[base + t] = tokenWeight(s, t - s.prompt.length);
  });
  const feeds: Feeds = {
    input_ids: toOrt('int64', ids, [N, T]),
    attention_mask: toOrt('int64', attn, [N, T]),
    loss_mask: toOrt(o.dtype, lossMask, [N, T]),
  };
  return { feeds, length: T };
}

/** The per-row and per-sequence inputs of the losses, the same in both layouts. */
function finish(rows: TokenizedExample[], feeds: Feeds, K: number, o: CollateOptions): { feeds: Feeds } {
  const B = rows.length;
  const F = o.dtype === 'float32' ? Float32Array : Float64Array;
  const N = B * K;
  const perRow = (f: (ex: TokenizedExample, i: number) => number) => toOrt(o.dtype, F.from(rows.map(f)), [B]);
  feeds.weight = perRow((r) => r.src.weight ?? 1);
  if (o.refLogps) {
    // ref_logps follows the sequence layout: [2B] response-major for pairs, [B, K] for lists, [B]
    // (rationale sequences have no reference).
    const ref = new F(B * K);
    rows.forEach((r, i) => {
      const v = o.refLogps!(r, i);
      for (let k = 0; k < K; k++) ref[sequenceIndex(o.kind, B, K, i, k)] = v[k] ?? 0;
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
    if (o.rationale) feeds.rationale_mask = perRow((r) => (r.rationale ? 1 : 0));
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
  return { feeds };
}

/**
 * The largest `input_ids` shape a batch of at most `size` of these rows collates to under `o`
 * (TrainProblem.longest, a scorer's chunking), without collating: `size` times the most rows one
 * example makes (sequences; packed, groups), by the longest row one example makes, rounded up to
 * `padTo`. A bound, not always a batch's shape: the two maxima may come from different examples.
 */
export function longestBatch(rows: readonly TokenizedExample[], size: number, o: Pick<CollateOptions, 'kind' | 'padTo' | 'kl' | 'packed' | 'rationale'>): { rows: number; len: number } {
  const full: CollateOptions = { ...o, padId: 0, dtype: 'float32' };
  let per = 1;
  let len = 2;
  for (const r of rows) {
    if (o.packed) {
      const groups = packGroups([r], o.kind === 'listwise' ? r.responseIds.length : 2, full);
      per = Math.max(per, groups.length);
      for (const x of groups) len = Math.max(len, x.prompt.length + x.responses.reduce((n, y) => n + y.ids.length, 0));
    } else {
      const seqs = sequences([r], full);
      per = Math.max(per, seqs.length);
      for (const x of seqs) len = Math.max(len, x.prompt.length + x.response.length);
    }
  }
  return { rows: Math.min(size, rows.length) * per, len: roundUp(len, o.padTo) };
}

/** A collated batch's size as the training graph's chunking reads it (TrainProblem.longest): rows and length of `input_ids`. */
export function batchShapeOf(c: Collated): { rows: number; len: number } {
  const [rows, len] = c.feeds.input_ids.dims;
  return { rows, len };
}
