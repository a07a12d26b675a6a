/**
 * The preallocated cache (SlotCache) against the concatenating one: generateIds — prefill into a
 * cache of a chunk of slots, steps written in place, the cache grown past its first chunk, rows
 * leaving the batch as they stop — gives the tokens of a plain loop over Decoder.forward, which
 * returns past ++ new and drops finished rows by copying (and which online-decode.test.ts holds to
 * the full forward and the float64 reference).
 */
import { describe, expect, it } from 'vitest';
import { Decoder, generateIds, selectCacheRows, type KVCache } from '../src/models/generate.ts';
import type { ModelConfig } from '../src/models/config.ts';
import type { FloatTensor } from '../src/models/checkpoint.ts';
import { sampleRandom } from '../src/models/sampling.ts';
import { randomWeights, testConfig } from './helpers/model-fixtures.ts';

/** Greedy decoding of each prompt by Decoder.forward, rows leaving at a stop id or maxNew tokens. */
async function forwardLoop(c: ModelConfig, w: Map<string, FloatTensor>, prompts: number[][], maxNew: number, stop: number[]): Promise<number[][]> {
  const dec = await Decoder.create(c, w, {});
  const P0 = Math.max(...prompts.map((p) => p.length));
  let B = prompts.length;
  let ids = new BigInt64Array(B * P0).fill(2n);
  let mask = new BigInt64Array(B * P0);
  prompts.forEach((p, b) => p.forEach((t, i) => ((ids[b * P0 + P0 - p.length + i] = BigInt(t)), (mask[b * P0 + P0 - p.length + i] = 1n))));
  let cache: KVCache | null = null;
  let active = prompts.map((_, i) => i);
  const out = prompts.map((): number[] => []);
  let L = P0;
  const V = c.vocab_size;
  while (active.length) {
    const r = await dec.forward(ids, mask, B, cache);
    const keep: number[] = [];
    const next: bigint[] = [];
    active.forEach((row, b) => {
      const l = r.logits.subarray(b * V, b * V + V);
      let best = 0;
      for (let v = 1; v < V; v++) if (l[v] > l[best]) best = v;
      out[row].push(best);
      if (!stop.includes(best) && out[row].length < maxNew) {
        keep.push(b);
        next.push(BigInt(best));
      }
    });
    cache = keep.length < B ? selectCacheRows(r.cache, keep) : r.cache;
    const m = new BigInt64Array(keep.length * (L + 1));
    keep.forEach((b, i) => {
      m.set(mask.subarray(b * L, (b + 1) * L), i * (L + 1));
      m[i * (L + 1) + L] = 1n;
    });
    mask = m;
    L++;
    active = keep.map((b) => active[b]);
    B = keep.length;
    ids = BigInt64Array.from(next);
  }
  await dec.release();
  return out;
}

describe('preallocated KV cache', () => {
  const prompts = [[3, 9, 1, 4], [2, 7], [14, 15, 9, 26, 5, 35, 8, 9, 7], [11], [6, 6, 6, 6, 6, 6]];
  for (const [arch, maxNew] of [['llama', 45], ['mistral', 45], ['gpt2', 20]] as const) {
    it(`${arch}: generateIds (in place, grown, rows leaving) = the concatenating loop`, async () => {
      const c = testConfig(arch);
      const w = randomWeights(c, 3);
      // Stop ids chosen from the greedy run itself, so some rows stop early and others run to maxNew.
      const free = await forwardLoop(c, w, prompts, maxNew, []);
      const stop = [free[1][6], free[3][20]];
      const want = await forwardLoop(c, w, prompts, maxNew, stop);
      expect(new Set(want.map((x) => x.length)).size).toBeGreaterThan(1);
      const dec = await Decoder.create(c, w, {});
      const got = await generateIds([{ decoder: dec, weight: 1 }], prompts.map((p, i) => ({ promptIds: p, rng: sampleRandom(0, i, 0) })), { temperature: 0, maxNewTokens: maxNew, stopIds: stop, padId: 2 });
      await dec.release();
      expect(got.map((g) => g.ids)).toEqual(want);
      expect(got.map((g) => g.stopped)).toEqual(want.map((x) => stop.includes(x[x.length - 1])));
    });
  }

  it('a prefill a few rows at a time (prefillTokens) samples what one prefill of the batch does, the decoder reusing its last cache', async () => {
    const c = testConfig('llama');
    const w = randomWeights(c, 4);
    const reqs = () => prompts.map((p, i) => ({ promptIds: p, rng: sampleRandom(5, i, 0) }));
    const run = async (prefillTokens: number | undefined, o: { hostSampling?: boolean; temperature: number }) => {
      const dec = await Decoder.create(c, w, { prefillTokens });
      const out = [];
      // Twice: the second generation prefills into the first one's recycled cache buffers.
      for (let k = 0; k < 2; k++) out.push(await generateIds([{ decoder: dec, weight: 1 }], reqs(), { ...o, maxNewTokens: 40, stopIds: [], padId: 2 }));
      await dec.release();
      expect(out[1]).toEqual(out[0]);
      return out[0].map((g) => g.ids);
    };
    for (const o of [{ temperature: 1 }, { temperature: 1, hostSampling: true }, { temperature: 0 }]) {
      // 9-token prompts: 18 tokens a run is 2 rows at a time, 1 is a row at a time.
      const whole = await run(undefined, o);
      expect(await run(18, o)).toEqual(whole);
      expect(await run(1, o)).toEqual(whole);
    }
  });
});
