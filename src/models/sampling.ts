/**
 * Next-token sampling from one row of logits: temperature, top-k, top-p (nucleus), and the geometric
 * mixture of several models' logits, softmax(Σ_i w_i·logits_i) (Nash-MD's opponent policy with
 * weights 1−m and m). Plain TypeScript on the host: a row is one vocabulary vector.
 */
import { UserError } from '../errors.ts';
import { SeededRandom } from '../random.ts';

export interface SamplingOptions {
  /** Divides the logits; 0 means greedy (argmax). Default 1. */
  temperature?: number;
  /** Keep only the k most likely tokens; 0 keeps all. Default 0. */
  topK?: number;
  /** Keep the smallest set of most likely tokens whose probability reaches p; 1 keeps all. Default 1. */
  topP?: number;
}

/** Checks sampling options and fills defaults; bad values name the flag. */
export function samplingOptions(o: SamplingOptions = {}): Required<SamplingOptions> {
  const temperature = o.temperature ?? 1;
  const topK = o.topK ?? 0;
  const topP = o.topP ?? 1;
  if (!(Number.isFinite(temperature) && temperature >= 0)) throw new UserError(`--temperature must be a number ≥ 0, got ${o.temperature}`);
  if (!(Number.isInteger(topK) && topK >= 0)) throw new UserError(`--top-k must be an integer ≥ 0, got ${o.topK}`);
  if (!(topP > 0 && topP <= 1)) throw new UserError(`--top-p must be in (0, 1], got ${o.topP}`);
  return { temperature, topK, topP };
}

/** Σ_i w_i · rows_i, row by row (the logits of a geometric mixture, before temperature). */
export function mixLogits(parts: { logits: Float32Array; weight: number }[]): Float32Array {
  if (parts.length === 1 && parts[0].weight === 1) return parts[0].logits;
  const out = new Float32Array(parts[0].logits.length);
  for (const { logits, weight } of parts) {
    if (weight === 0) continue;
    for (let i = 0; i < out.length; i++) out[i] += weight * logits[i];
  }
  return out;
}

function argmax(x: ArrayLike<number>): number {
  let best = 0;
  for (let i = 1; i < x.length; i++) if (x[i] > x[best]) best = i;
  return best;
}

/**
 * The distribution sampling draws from: candidate token ids and their probabilities (summing to 1),
 * after temperature, top-k and top-p. Exposed so tests can compare frequencies with it.
 */
export function samplingDistribution(logits: ArrayLike<number>, o: Required<SamplingOptions>): { ids: number[]; probs: number[] } {
  const V = logits.length;
  if (o.temperature === 0) return { ids: [argmax(logits)], probs: [1] };
  let ids: number[];
  if (o.topK > 0 && o.topK < V) {
    // k largest by insertion into a short sorted list: O(V·k) with k small, no full sort.
    ids = [];
    for (let i = 0; i < V; i++) {
      if (ids.length === o.topK && logits[i] <= logits[ids[ids.length - 1]]) continue;
      let j = ids.length < o.topK ? ids.length : ids.length - 1;
      if (ids.length < o.topK) ids.push(i);
      while (j > 0 && logits[ids[j - 1]] < logits[i]) {
        ids[j] = ids[j - 1];
        j--;
      }
      ids[j] = i;
    }
  } else {
    ids = Array.from({ length: V }, (_, i) => i);
    if (o.topP < 1) ids.sort((a, b) => logits[b] - logits[a]);
  }
  let max = -Infinity;
  for (const i of ids) max = Math.max(max, logits[i]);
  let probs = ids.map((i) => Math.exp((logits[i] - max) / o.temperature));
  let z = probs.reduce((a, b) => a + b, 0);
  probs = probs.map((p) => p / z);
  if (o.topP < 1) {
    // ids are sorted by probability here (top-k keeps them sorted): keep the shortest prefix reaching p.
    let acc = 0;
    let n = 0;
    while (n < ids.length && acc < o.topP) acc += probs[n++];
    ids = ids.slice(0, n);
    z = acc;
    probs = probs.slice(0, n).map((p) => p / z);
  }
  return { ids, probs };
}

// exp(x) for x ≤ 0 as 2^(k/64)·e^r, |r| ≤ ln2/128: Cody–Waite reduction (ln 2 split as fdlibm does, so
// k·HI is exact), a 64-entry table of 2^(j/64), 2^-i by halving, and e^r to r⁶/720 (the next term is
// below 3e-20). Within 4e-16 (2 ulp) of Math.exp, about 2.5× faster: sampling a 32,000-token row is
// mostly its exps.
const EXP_SHIFT = 6755399441055744; // 1.5·2^52: adding and subtracting it rounds to an integer
const EXP_INV = 64 / Math.LN2;
const EXP_HI = 6.9314718036912381649e-1 / 64;
const EXP_LO = 1.90821492927058770002e-10 / 64;
const EXP_TABLE = Float64Array.from({ length: 64 }, (_, j) => Math.pow(2, j / 64));
const EXP_POW2 = new Float64Array(1100).map((_, i) => 2 ** -i);

/** e^x for x ≤ 0 (the shifted logits of a row); 0 below e^-745, where float64 underflows. */
export function expNonPositive(x: number): number {
  if (!(x >= -745)) return x !== x ? NaN : 0;
  const kd = x * EXP_INV + EXP_SHIFT - EXP_SHIFT;
  const r = x - kd * EXP_HI - kd * EXP_LO;
  const k = kd | 0;
  const p = 1 + r * (1 + r * (0.5 + r * (1 / 6 + r * (1 / 24 + r * (1 / 120 + r * (1 / 720))))));
  return EXP_POW2[-(k >> 6)] * EXP_TABLE[k & 63] * p;
}

/** Scratch for the unnormalised probabilities of one row (sampling is synchronous: one row at a time). */
let weights = new Float64Array(0);

/** Draws one token id from a row of logits. */
export function sampleToken(logits: ArrayLike<number>, o: Required<SamplingOptions>, rng: SeededRandom): number {
  if (o.temperature === 0) return argmax(logits);
  if (o.topK === 0 && o.topP === 1) {
    // The common case without a candidate list: one pass for the max, one for the weights and their
    // sum, one to draw. Each weight is one exp, kept for the draw (the exp is most of the cost); the
    // weights are those of Math.exp to 4e-16, so a draw changes only if u lands that close to a boundary.
    const V = logits.length;
    if (weights.length < V) weights = new Float64Array(V);
    const e = weights;
    let max = -Infinity;
    for (let i = 0; i < V; i++) if (logits[i] > max) max = logits[i];
    let z = 0;
    const t = o.temperature;
    for (let i = 0; i < V; i++) {
      const w = expNonPositive((logits[i] - max) / t);
      e[i] = w;
      z += w;
    }
    let u = rng.next() * z;
    for (let i = 0; i < V; i++) {
      u -= e[i];
      if (u < 0) return i;
    }
    return V - 1;
  }
  const { ids, probs } = samplingDistribution(logits, o);
  let u = rng.next();
  for (let k = 0; k < ids.length; k++) {
    u -= probs[k];
    if (u < 0) return ids[k];
  }
  return ids[ids.length - 1];
}

function mix32(x: number): number {
  x ^= x >>> 16;
  x = Math.imul(x, 0x7feb352d);
  x ^= x >>> 15;
  x = Math.imul(x, 0x846ca68b);
  return (x ^ (x >>> 16)) >>> 0;
}

/**
 * The random stream of one sample: a function of (seed, prompt index, sample index) only, so the
 * batch size or order never changes what a sample draws. Each of the four state words hashes all three.
 */
export function sampleRandom(seed: number, prompt: number, sample: number): SeededRandom {
  const words = [0, 1, 2, 3].map((i) => mix32(mix32(mix32(seed ^ Math.imul(i + 1, 0x9e3779b9)) ^ prompt) ^ Math.imul(sample, 0x85ebca6b)));
  return new SeededRandom(words);
}
