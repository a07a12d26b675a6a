/**
 * The preallocated cache (SlotCache) against no cache at all: generateIds — prefill into a cache of
 * a chunk of slots, steps written in place (one or two rows through the small-batch step graph), the cache
 * grown past its first chunk, rows leaving the batch as they stop — gives the tokens of greedy
 * decoding where every token's logits come from a prefill of the whole sequence so far (a row of a
 * session asking for its logits, no cache carried; online-decode.test.ts holds the prefill to the
 * full forward and the float64 reference).
 */
import { describe, expect, it } from 'vitest';
import { Decoder, GenerationSession, generateIds } from '../src/models/generate.ts';
import type { ModelConfig } from '../src/models/config.ts';
import type { FloatTensor } from '../src/models/checkpoint.ts';
import { sampleRandom } from '../src/models/sampling.ts';
import { SeededRandom } from '../src/random.ts';
import { randomWeights, testConfig } from './helpers/model-fixtures.ts';

/** Greedy decoding of each prompt to maxNew tokens, each token's logits from a prefill of all tokens so far. */
async function prefillLoop(c: ModelConfig, w: Map<string, FloatTensor>, prompts: number[][], maxNew: number): Promise<number[][]> {
  const dec = await Decoder.create(c, w, {});
  const s = GenerationSession.open(dec);
  const out: number[][] = [];
  for (const p of prompts) {
    const ids: number[] = [];
    while (ids.length < maxNew) {
      const row = s.start([...p, ...ids], new SeededRandom(0));
      const l = await row.logits();
      row.close();
      let best = 0;
      for (let v = 1; v < l.length; v++) if (l[v] > l[best]) best = v;
      ids.push(best);
    }
    out.push(ids);
  }
  await s.close();
  await dec.release();
  return out;
}

describe('preallocated KV cache', () => {
  const prompts = [[3, 9, 1, 4], [2, 7], [14, 15, 9, 26, 5, 35, 8, 9, 7], [11], [6, 6, 6, 6, 6, 6]];
  for (const [arch, maxNew] of [['llama', 45], ['mistral', 45], ['gpt2', 20]] as const) {
    it(`${arch}: generateIds (in place, grown, rows leaving, one row alone) = greedy over full prefills`, async () => {
      const c = testConfig(arch);
      const w = randomWeights(c, 3);
      // Stop ids chosen from the greedy run itself, so some rows stop early and others run to maxNew.
      const free = await prefillLoop(c, w, prompts, maxNew);
      const stop = [free[1][6], free[3][20]];
      // Greedy tokens do not depend on the stop ids: each row's are the free run's up to its first stop.
      const want = free.map((ids) => ids.slice(0, ids.findIndex((t) => stop.includes(t)) + 1 || ids.length));
      expect(new Set(want.map((x) => x.length)).size).toBeGreaterThan(1);
      const dec = await Decoder.create(c, w, {});
      const got = await generateIds([{ decoder: dec, weight: 1 }], prompts.map((p, i) => ({ promptIds: p, rng: sampleRandom(0, i, 0) })), { temperature: 0, maxNewTokens: maxNew, stopIds: stop, padId: 2 });
      // The longest prompt alone: the one-row step graph.
      const [solo] = await generateIds([{ decoder: dec, weight: 1 }], [{ promptIds: prompts[2], rng: sampleRandom(0, 2, 0) }], { temperature: 0, maxNewTokens: maxNew, stopIds: stop, padId: 2 });
      await dec.release();
      expect(got.map((g) => g.ids)).toEqual(want);
      expect(got.map((g) => g.stopped)).toEqual(want.map((x) => stop.includes(x[x.length - 1])));
      expect(solo.ids).toEqual(want[2]);
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
