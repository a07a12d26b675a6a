/**
 * The fused decoding graphs (decode.ts's `fused`: SkipSimplifiedLayerNormalization and RotaryEmbedding,
 * the CPU decoder's default) against the unfused ones, which are the standard-op graphs
 * online-decode.test.ts and decode-equivalence.test.ts hold to a full forward: over one cache whose
 * rows are at different fills (two prompts prefilled together, one left-padded, and a longer one
 * alone), the prefill's and every step's logits agree within float32 rounding, greedy decoding picks
 * the same tokens, and the sampling head draws the same tokens with the same log-probabilities; the
 * extend graph (a row's cache extended by several tokens in one run) too. For the llama family members
 * whose decode differs: llama, qwen2 (q/k/v biases), gemma (norm weights 1 + w) and phi3 (partial
 * rotary, sliding window). And a row's numbers are the same to the bit alone and among others (the
 * CPU graphs' float64 attention softmax): prefill in a left-padded group, steps over a cache whose
 * capacity the other rows set, and the extend graph.
 */
import { describe, expect, it } from 'vitest';
import { Decoder, type Pick, type Picked } from '../src/models/decoder.ts';
import { buildDecodeGraph } from '../src/models/decode.ts';
import type { ModelConfig } from '../src/models/config.ts';
import type { FloatTensor } from '../src/models/checkpoint.ts';
import { randomWeights, testConfig } from './helpers/model-fixtures.ts';

const ROWS = 3;
const STEPS = 30; // past the cache's first chunk of 32 slots for the long row (9 + 30)
/** Prompts of rows 0 and 1 prefilled together (row 1 left-padded), and row 2's, alone and longer. */
const PAIR = [[5, 9, 1, 4, 22], [0, 0, 0, 7, 3]];
const PAIR_MASK = [[1, 1, 1, 1, 1], [0, 0, 0, 1, 1]];
const LONG = [14, 15, 9, 26, 5, 35, 8, 9, 7];

interface Trace {
  /** Each run's logits (prefills, then each step), flattened. */
  logits: Float32Array[];
  tokens: number[][];
  logps: number[][];
}

const i64 = (xs: number[]) => BigInt64Array.from(xs, BigInt);
/** A sampling run's log-probabilities. */
const logpsOf = (p: Picked): number[] => {
  if (!p.tokens || !p.logps) throw new Error('expected a sampling pick');
  return Array.from(p.logps);
};
const argmax = (l: Float32Array, from: number, n: number) => {
  let best = 0;
  for (let v = 1; v < n; v++) if (l[from + v] > l[from + best]) best = v;
  return best;
};

/** Greedy decoding over the logits head, then sampled decoding (token and log-prob picked in the graph), of the three rows. */
async function trace(c: ModelConfig, w: Map<string, FloatTensor>, fused: boolean): Promise<Trace> {
  const dec = await Decoder.create(c, w, { fused });
  const V = c.vocab_size;
  const out: Trace = { logits: [], tokens: [], logps: [] };
  for (const mode of ['greedy', 'sample'] as const) {
    const cache = dec.newCache(ROWS, 16, 64);
    cache.addRows(ROWS);
    const uniform = (s: number) => Float64Array.from({ length: ROWS }, (_, r) => ((s * 0.6180339887 + r * 0.41421356) % 1));
    const pick = (s: number, n = ROWS): Pick | undefined => (mode === 'sample' ? { head: 'sample', limit: V, temperature: 0.7, uniform: uniform(s).subarray(0, n) } : undefined);
    const a = await dec.prefill(cache, 0, i64(PAIR.flat()), i64(PAIR_MASK.flat()), 2, pick(0, 2));
    const b = await dec.prefill(cache, 2, i64(LONG), i64(LONG.map(() => 1)), 1, pick(1, 1));
    let next: number[];
    if (mode === 'greedy') {
      out.logits.push(a.logits!.slice(), b.logits!.slice());
      next = [argmax(a.logits!, 0, V), argmax(a.logits!, V, V), argmax(b.logits!, 0, V)];
    } else {
      next = [...a.tokens!, ...b.tokens!].map(Number);
      out.logps.push([...logpsOf(a), ...logpsOf(b)]);
    }
    out.tokens.push(next);
    // Row 1's left padding is not kept: its two real positions fill its slots 0 and 1.
    expect(Array.from(cache.cols.subarray(0, ROWS))).toEqual([5, 2, 9]);
    for (let s = 0; s < STEPS; s++) {
      const r = await dec.step(i64(next), cache, pick(2 + s));
      if (mode === 'greedy') {
        out.logits.push(r.logits!.slice());
        next = Array.from({ length: ROWS }, (_, row) => argmax(r.logits!, row * V, V));
      } else {
        next = Array.from(r.tokens!, Number);
        out.logps.push(logpsOf(r));
      }
      out.tokens.push(next);
    }
    // The extend graph: row 1 takes four more tokens in one run.
    const e = await dec.extend(cache, 1, [3, 17, 4, 8]);
    if (mode === 'greedy') out.logits.push(e.logits!.slice());
  }
  await dec.release();
  return out;
}

/** Nodes of each kind in a graph. */
function ops(c: ModelConfig, fused: boolean): Map<string, number> {
  const g = buildDecodeGraph(c, { past: true, fused, head: 'sample' });
  const m = new Map<string, number>();
  for (const n of g.nodes) m.set(n.op, (m.get(n.op) ?? 0) + 1);
  return m;
}

describe('fused decoding graphs', () => {
  for (const arch of ['llama', 'qwen2', 'gemma', 'phi3'] as const) {
    it(`${arch}: fused = unfused (logits within float32 rounding, tokens, log-probs) over rows at different fills`, async () => {
      const c = testConfig(arch);
      const w = randomWeights(c, 7);
      // The fused graph does hold the fused ops (else this would compare a graph with itself).
      const [f, u] = [ops(c, true), ops(c, false)];
      const layers = c.num_hidden_layers as number;
      expect(f.get('SkipSimplifiedLayerNormalization')).toBe(2 * layers);
      expect(f.get('SimplifiedLayerNormalization')).toBe(1);
      expect(f.get('RotaryEmbedding')).toBe(2 * layers);
      expect(u.get('RotaryEmbedding')).toBeUndefined();
      const count = (m: Map<string, number>) => [...m.values()].reduce((s, n) => s + n, 0);
      expect(count(f)).toBeLessThan(count(u));

      const [fu, un] = await Promise.all([trace(c, w, true), trace(c, w, false)]);
      expect(fu.tokens).toEqual(un.tokens);
      // Rows kept apart: the rows' greedy continuations are not all the same.
      expect(new Set(un.tokens.slice(1, 6).map((t) => t.join())).size).toBeGreaterThan(1);
      let worst = 0;
      let scale = 0;
      for (let r = 0; r < un.logits.length; r++) {
        for (let i = 0; i < un.logits[r].length; i++) {
          worst = Math.max(worst, Math.abs(fu.logits[r][i] - un.logits[r][i]));
          scale = Math.max(scale, Math.abs(un.logits[r][i]));
        }
      }
      // float32 rounding of a two-layer network: a few units in the last place of the largest logit.
      expect(worst).toBeLessThan(64 * 2 ** -23 * scale);
      for (let s = 0; s < un.logps.length; s++) for (let r = 0; r < un.logps[s].length; r++) expect(Math.abs(fu.logps[s][r] - un.logps[s][r])).toBeLessThan(1e-5);
    });
  }
});

/**
 * Row 0's logits (prefill, each step, then an extend run) decoded alone in a cache of `capacity`
 * slots, or among `others` rows with longer prompts (row 0 left-padded in their prefill group).
 */
async function rowTrace(dec: Decoder, V: number, others: number, capacity: number): Promise<Float32Array[]> {
  const n = 1 + others;
  const S = others ? 9 : PAIR[0].length;
  const ids: number[] = [];
  const mask: number[] = [];
  for (let r = 0; r < n; r++) {
    const p = r === 0 ? PAIR[0] : LONG.map((t) => (t + 3 * r) % V);
    ids.push(...Array(S - p.length).fill(0), ...p);
    mask.push(...Array(S - p.length).fill(0), ...p.map(() => 1));
  }
  const cache = dec.newCache(n + 2, capacity, 64);
  cache.addRows(n);
  const out: Float32Array[] = [];
  out.push((await dec.prefill(cache, 0, i64(ids), i64(mask), n)).logits!.slice(0, V));
  for (let s = 0; s < 6; s++) {
    const next = Array.from({ length: n }, (_, r) => (7 * s + 5 * r + 1) % V);
    out.push((await dec.step(i64(next), cache)).logits!.slice(0, V));
  }
  out.push((await dec.extend(cache, 0, [3, 17, 4])).logits!.slice(0, V));
  return out;
}

describe('batch invariance', () => {
  for (const arch of ['llama', 'phi3'] as const) {
    it(`${arch}: a row's logits are the same to the bit alone and among 8 others (prefill left-padded, a cache of another capacity, extend), fused and unfused`, async () => {
      const c = testConfig(arch);
      const w = randomWeights(c, 11);
      for (const fused of [true, false]) {
        // Baked weights, as the server decodes (fed ones go through other products: see docs/performance.md).
        const dec = await Decoder.create(c, w, { fused, bake: true });
        const alone = await rowTrace(dec, c.vocab_size, 0, 13);
        const among = await rowTrace(dec, c.vocab_size, 8, 40);
        await dec.release();
        const bits = (x: Float32Array) => Buffer.from(x.buffer, x.byteOffset, x.byteLength).toString('hex');
        expect(among.map(bits)).toEqual(alone.map(bits));
      }
    });
  }
});

describe('past max_position_embeddings', () => {
  it('a cache with more slots than the rotary tables switches the decoder to the unfused graphs, which decode on past the last position', async () => {
    const c = testConfig('llama'); // max_position_embeddings 64
    const w = randomWeights(c, 5);
    const V = c.vocab_size;
    const run = async (fused: boolean) => {
      const dec = await Decoder.create(c, w, { fused });
      const short = dec.newCache(1, 16, 64);
      expect(dec.fused).toBe(fused);
      dec.recycle(short);
      const cache = dec.newCache(1, 16, 80);
      expect(dec.fused).toBe(false);
      cache.addRows(1);
      await dec.prefill(cache, 0, i64(LONG), i64(LONG.map(() => 1)), 1);
      let last = new Float32Array(0);
      for (let s = 0; s < 70 - LONG.length; s++) last = (await dec.step(i64([(s * 7 + 1) % V]), cache)).logits!.slice();
      expect(cache.cols[0]).toBe(70);
      await dec.release();
      return last;
    };
    const [a, b] = await Promise.all([run(true), run(false)]);
    expect(Array.from(a)).toEqual(Array.from(b));
  });
});
