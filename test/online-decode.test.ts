/**
 * Generation: the KV-cache decode graphs against a full recomputation (the training forward) and the
 * independent float64 reference; seeded sampling; the sampling distribution (temperature, top-k,
 * top-p) against a float64 computation; mixture sampling against the exact distribution of
 * softmax((1−m)·logits_A + m·logits_B) on a tiny vocabulary.
 */
import { describe, expect, it } from 'vitest';
import { Decoder, generateIds } from '../src/models/generate.ts';
import { mixLogits, sampleRandom, samplingDistribution, samplingOptions, sampleToken } from '../src/models/sampling.ts';
import { SeededRandom } from '../src/random.ts';
import type { ModelConfig } from '../src/models/config.ts';
import type { FloatTensor } from '../src/models/checkpoint.ts';
import { pad, randomWeights, runModel, testConfig } from './helpers/model-fixtures.ts';
import { referenceLogits } from './helpers/reference-forward.ts';

/**
 * Decodes `rows` token by token after left-padded prompts and returns each step's logits per row:
 * the generation's own path (the prefill into a `SlotCache`, then one step graph run per token,
 * keys/values written into the cache in place; the cache starts at a chunk of slots and grows).
 */
async function cachedLogits(c: ModelConfig, w: Map<string, FloatTensor>, rows: number[][], promptLens: number[], steps: number): Promise<Float32Array[][]> {
  const dec = await Decoder.create(c, w, {});
  const B = rows.length;
  const P0 = Math.max(...promptLens);
  const ids = new BigInt64Array(B * P0).fill(5n);
  const mask = new BigInt64Array(B * P0);
  rows.forEach((r, b) => {
    for (let t = 0; t < promptLens[b]; t++) {
      ids[b * P0 + P0 - promptLens[b] + t] = BigInt(r[t]);
      mask[b * P0 + P0 - promptLens[b] + t] = 1n;
    }
  });
  const cache = dec.newCache(B, P0 + 1, P0 + steps);
  cache.addRows(B);
  let out = await dec.prefill(cache, 0, ids, mask, B);
  const V = c.vocab_size;
  const got: Float32Array[][] = [];
  for (let s = 0; ; s++) {
    got.push(rows.map((_, b) => out.logits!.slice(b * V, (b + 1) * V)));
    if (s === steps) break;
    out = await dec.step(BigInt64Array.from(rows.map((r, b) => BigInt(r[promptLens[b] + s]))), cache);
  }
  await dec.release();
  return got;
}

describe('KV-cache decoding', () => {
  for (const arch of ['llama', 'qwen2', 'qwen3', 'mistral', 'gemma', 'phi3', 'gpt2'] as const) {
    it(`${arch}: prefill + steps equal the full forward (1e-5) and the float64 reference (1e-4)`, async () => {
      const c = testConfig(arch, { extra: arch === 'qwen2' ? { attention_bias: true } : {} });
      const w = randomWeights(c, 11);
      const rows = [
        [3, 9, 1, 4, 1, 5, 9, 2, 6],
        [2, 7, 1, 8, 2, 8, 1, 8, 2],
        [14, 15, 9, 26, 5, 35, 8, 9, 7],
      ];
      const promptLens = [2, 5, 3];
      const steps = 4;
      const batched = await cachedLogits(c, w, rows, promptLens, steps);
      // The middle row alone too: a batch of one or two rows steps through its own graph (`stepSmall`, x·Wᵀ products).
      const alone = await cachedLogits(c, w, [rows[1]], [promptLens[1]], steps);
      const full = await runModel(c, w, pad(rows.map((r) => ({ ids: r, loss: r.map(() => 1) })), 9, ['right', 'right', 'right']));
      const V = c.vocab_size;
      let maxFull = 0;
      let maxRef = 0;
      for (const [got, which] of [[batched, [0, 1, 2]], [alone, [1]]] as const) {
        which.forEach((b, i) => {
          const ref = referenceLogits(c, w, rows[b]);
          for (let s = 0; s <= steps; s++) {
            const t = promptLens[b] + s - 1; // position whose logits predict the next token
            for (let v = 0; v < V; v++) {
              maxFull = Math.max(maxFull, Math.abs(got[s][i][v] - full.logits[(b * 9 + t) * V + v]));
              maxRef = Math.max(maxRef, Math.abs(got[s][i][v] - ref[t][v]) / Math.max(1, Math.abs(ref[t][v])));
            }
          }
        });
      }
      expect(maxFull).toBeLessThan(1e-5);
      expect(maxRef).toBeLessThan(1e-4);
    });
  }
});

describe('sampling distribution', () => {
  const logits = [0.3, 2.0, -1.0, 1.2, 2.5, 0.0];
  const softmax = (xs: number[], T: number) => {
    const m = Math.max(...xs);
    const e = xs.map((x) => Math.exp((x - m) / T));
    const z = e.reduce((a, b) => a + b, 0);
    return e.map((x) => x / z);
  };

  it('temperature 0 is argmax; temperature T divides the logits', () => {
    expect(samplingDistribution(logits, samplingOptions({ temperature: 0 }))).toEqual({ ids: [4], probs: [1] });
    const d = samplingDistribution(logits, samplingOptions({ temperature: 0.7 }));
    const want = softmax(logits, 0.7);
    d.ids.forEach((id, k) => expect(d.probs[k]).toBeCloseTo(want[id], 12));
  });

  it('top-k keeps the k largest, renormalised', () => {
    const d = samplingDistribution(logits, samplingOptions({ topK: 3 }));
    expect(d.ids).toEqual([4, 1, 3]);
    const want = softmax([2.5, 2.0, 1.2], 1);
    d.probs.forEach((p, k) => expect(p).toBeCloseTo(want[k], 12));
  });

  it('top-p keeps the shortest most-likely prefix reaching p', () => {
    const full = softmax(logits, 1);
    const sorted = full.map((p, i) => [p, i]).sort((a, b) => b[0] - a[0]);
    const p = sorted[0][0] + sorted[1][0] * 0.5; // needs exactly two tokens
    const d = samplingDistribution(logits, samplingOptions({ topP: p }));
    expect(d.ids).toEqual([sorted[0][1], sorted[1][1]]);
    const z = sorted[0][0] + sorted[1][0];
    expect(d.probs[0]).toBeCloseTo(sorted[0][0] / z, 12);
  });

  it('draws follow the distribution (chi-square, top-k 4 at temperature 1.3)', () => {
    const o = samplingOptions({ topK: 4, temperature: 1.3 });
    const d = samplingDistribution(logits, o);
    const rng = new SeededRandom(5);
    const counts = new Map<number, number>();
    const N = 20000;
    for (let i = 0; i < N; i++) {
      const t = sampleToken(Float32Array.from(logits), o, rng);
      counts.set(t, (counts.get(t) ?? 0) + 1);
    }
    expect([...counts.keys()].every((t) => d.ids.includes(t))).toBe(true);
    const chi = d.ids.reduce((s, id, k) => s + ((counts.get(id) ?? 0) - N * d.probs[k]) ** 2 / (N * d.probs[k]), 0);
    expect(chi).toBeLessThan(16.3); // df 3, p = 0.001
  });

  it('rejects bad options with the flag name', () => {
    expect(() => samplingOptions({ topP: 0 })).toThrow(/--top-p/);
    expect(() => samplingOptions({ topK: 1.5 })).toThrow(/--top-k/);
    expect(() => samplingOptions({ temperature: -1 })).toThrow(/--temperature/);
  });
});

describe('seeded generation', () => {
  const c = testConfig('llama');
  const w = randomWeights(c, 3);
  const prompts = [[1, 2, 3], [4, 5], [6, 7, 8, 9], [10], [11, 12]];
  const run = async (dec: Decoder, seed: number, batchSize: number, extra: object = {}) =>
    generateIds(
      [{ decoder: dec, weight: 1 }],
      prompts.flatMap((p, i) => [0, 1].map((k) => ({ promptIds: p, rng: sampleRandom(seed, i, k) }))),
      { maxNewTokens: 6, stopIds: [0, 1, 2], padId: 0, batchSize, temperature: 1.5, ...extra },
    );

  it('the same seed gives the same samples, whatever the batch size; another seed differs', async () => {
    const dec = await Decoder.create(c, w, { bake: true });
    const a = await run(dec, 42, 32);
    const b = await run(dec, 42, 3);
    const d = await run(dec, 43, 32);
    expect(b).toEqual(a);
    expect(d).not.toEqual(a);
    // Stop ids end a sample and are kept; otherwise max_new_tokens does.
    for (const s of a) {
      if (s.stopped) expect([0, 1, 2]).toContain(s.ids[s.ids.length - 1]);
      else expect(s.ids.length).toBe(6);
      expect(s.ids.slice(0, -1).some((t) => t <= 2)).toBe(false);
    }
    expect(await run(dec, 42, 4, { topK: 5, topP: 0.9 })).toEqual(await run(dec, 42, 10, { topK: 5, topP: 0.9 }));
    await dec.release();
  });

  it('graph-input weights and baked weights decode the same', async () => {
    const baked = await Decoder.create(c, w, { bake: true });
    const inputs = await Decoder.create(c, w, {});
    expect(await run(inputs, 7, 32)).toEqual(await run(baked, 7, 32));
    await Promise.all([baked.release(), inputs.release()]);
  });
});

describe('mixture sampling', () => {
  it('two tokens from softmax((1−m)·logits_A + m·logits_B) match the exact joint distribution (chi-square)', async () => {
    const c = testConfig('llama', { extra: { vocab_size: 5 } });
    const wa = randomWeights(c, 21);
    const wb = randomWeights(c, 22);
    const m = 0.35;
    const prompt = [1, 3, 2];
    // Exact joint p(t1, t2) from the float64 reference forward of both models.
    const mix = (ids: number[]) => {
      const la = referenceLogits(c, wa, ids).at(-1)!;
      const lb = referenceLogits(c, wb, ids).at(-1)!;
      const x = Array.from(la, (v, i) => (1 - m) * v + m * lb[i]);
      const mx = Math.max(...x);
      const e = x.map((v) => Math.exp(v - mx));
      const z = e.reduce((s, v) => s + v, 0);
      return e.map((v) => v / z);
    };
    const V = c.vocab_size;
    const p1 = mix(prompt);
    const joint = p1.flatMap((p, t1) => mix([...prompt, t1]).map((q) => p * q));
    const A = await Decoder.create(c, wa, { bake: true });
    const B = await Decoder.create(c, wb, { bake: true });
    const N = 12000;
    const out = await generateIds(
      [
        { decoder: A, weight: 1 - m },
        { decoder: B, weight: m },
      ],
      Array.from({ length: N }, (_, i) => ({ promptIds: prompt, rng: sampleRandom(9, 0, i) })),
      { maxNewTokens: 2, stopIds: [], padId: 0, batchSize: 4000 },
    );
    const counts = new Array(V * V).fill(0);
    for (const s of out) counts[s.ids[0] * V + s.ids[1]]++;
    const chi = joint.reduce((s, p, k) => s + (counts[k] - N * p) ** 2 / (N * p), 0);
    expect(chi).toBeLessThan(52.6); // df 24, p = 0.001
    // Weight 0 on B is plain sampling from A: the same draws give the same ids.
    const reqs = () => Array.from({ length: 50 }, (_, i) => ({ promptIds: prompt, rng: sampleRandom(3, 0, i) }));
    const o = { maxNewTokens: 3, stopIds: [], padId: 0 };
    expect(await generateIds([{ decoder: A, weight: 1 }, { decoder: B, weight: 0 }], reqs(), o)).toEqual(await generateIds([{ decoder: A, weight: 1 }], reqs(), o));
    await Promise.all([A.release(), B.release()]);
  });

  it('mixLogits is the weighted sum', () => {
    const a = Float32Array.from([1, 2, 3]);
    const b = Float32Array.from([-1, 0, 5]);
    expect(Array.from(mixLogits([{ logits: a, weight: 0.25 }, { logits: b, weight: 0.75 }]))).toEqual([-0.5, 0.5, 4.5]);
  });
});
