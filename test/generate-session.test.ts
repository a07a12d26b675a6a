/**
 * The generation session (src/models/generate.ts): a row extended by tokens it did not sample gets,
 * from one extend run into its cache, the next-token logits a full prefill of all its tokens gives;
 * forked rows draw what independent rows with the same streams draw; a row that pauses between
 * segments leaves its slot to a waiting row and continues, after its extension, as a fresh row over
 * the same tokens would; stop strings, log-probabilities, shared prompts and continuous batching
 * change no token.
 *
 * Tolerance of the logits (1e-5): the extend run and the prefill compute the same float32 sums over
 * at most 40 positions and a hidden size of 32 in different orders (the cache scored apart from the
 * new tokens, unfilled slots masked), so they agree to a few float32 ulps of logits of size ~1;
 * test/online-decode.test.ts holds the prefill itself to a float64 reference.
 */
import { describe, expect, it } from 'vitest';
import { Decoder, GenerationSession, generateIds, stopStringEnds, type Segment } from '../src/models/generate.ts';
import { sampleRandom } from '../src/models/sampling.ts';
import { SeededRandom } from '../src/random.ts';
import type { Arch } from '../src/models/config.ts';
import { randomWeights, testConfig } from './helpers/model-fixtures.ts';

const maxDiff = (a: Float32Array, b: Float32Array) => a.reduce((m, x, i) => Math.max(m, Math.abs(x - b[i])), 0);
const clone = (r: SeededRandom) => new SeededRandom(r.state);

/** The logits after `ids`, from a prefill of all of them in a session of its own. */
async function prefillLogits(dec: Decoder, ids: readonly number[]): Promise<Float32Array> {
  const s = GenerationSession.open(dec);
  const l = await s.start(ids, new SeededRandom(0)).logits();
  await s.close();
  return l;
}

describe('generation session', () => {
  for (const arch of ['llama', 'gpt2', 'mistral', 'qwen3'] as Arch[]) {
    it(`${arch}: extend(ids) then the next token's logits = a full prefill of the concatenation`, async () => {
      const c = testConfig(arch);
      const dec = await Decoder.create(c, randomWeights(c, 7), {});
      const s = GenerationSession.open(dec, { temperature: 0.8 });
      const row = s.start([3, 9, 1, 4, 7], new SeededRandom(1));
      // Another row decodes in the same batch, so the extended row is parked and rejoins.
      const other = s.start([5, 6], new SeededRandom(2));
      const [seg] = await Promise.all([row.generate({ maxNewTokens: 6 }), other.generate({ maxNewTokens: 9 })]);
      expect(seg.ids).toHaveLength(6);
      for (const ext of [[11, 12, 13, 14, 15, 16, 17], [20], [8, 9, 10]]) {
        row.extend(ext);
        const got = await row.logits();
        const want = await prefillLogits(dec, row.ids);
        expect(maxDiff(got, want), `${arch} +${ext.length}`).toBeLessThan(1e-5);
      }
      // The logits fetched are the ones the next draw uses: no run is repeated, the token is theirs.
      const next = await row.generate({ maxNewTokens: 3 });
      expect(next.ids).toHaveLength(3);
      row.close();
      other.close();
      await s.close();
      await dec.release();
    });
  }

  it('forked rows draw what independent rows with the same streams draw (forks before and after the prefill)', async () => {
    const c = testConfig('llama');
    const dec = await Decoder.create(c, randomWeights(c, 3), {});
    const o = { temperature: 1.1, stopIds: [0] };
    const s = GenerationSession.open(dec, o);
    const parent = s.start([4, 8, 15, 16, 23], sampleRandom(5, 0, 0), 10);
    // Before any prefill: the forks share the parent's (one prefill for the group).
    const early = [1, 2, 3].map((k) => parent.fork(sampleRandom(5, 0, k)));
    const first = await Promise.all([parent, ...early].map((r) => r.generate()));
    // After a segment: forks copy the parent's cache, its unfed last token included.
    const streams = [7, 8].map((k) => sampleRandom(9, 0, k));
    const late = streams.map((r) => parent.fork(clone(r), 8));
    const second = await Promise.all(late.map((r) => r.generate()));
    await s.close();

    const solo = GenerationSession.open(dec, { ...o, sharePrompts: false });
    const alone = await Promise.all([0, 1, 2, 3].map((k) => solo.start([4, 8, 15, 16, 23], sampleRandom(5, 0, k), 10).generate()));
    expect(first).toEqual(alone);
    expect(new Set(first.map((x) => x.ids.join())).size).toBeGreaterThan(1);
    const prefix = [4, 8, 15, 16, 23, ...first[0].ids];
    const again = await Promise.all(streams.map((r) => solo.start(prefix, r, 8).generate()));
    expect(second).toEqual(again);
    await solo.close();
    await dec.release();
  });

  it('a row paused between segments leaves its slot to a waiting row, then continues after its extension as a fresh row would', async () => {
    const c = testConfig('qwen3');
    const dec = await Decoder.create(c, randomWeights(c, 4), {});
    const o = { temperature: 0.9 };
    const s = GenerationSession.open(dec, { ...o, maxBatch: 2 });
    const order: string[] = [];
    const track = (name: string, p: Promise<Segment>) => p.then((x) => (order.push(name), x));
    const a = s.start([1, 2, 3], sampleRandom(1, 0, 0));
    const paused = s.start([7, 7, 9, 3], sampleRandom(1, 1, 0));
    const waiting = s.start([12, 5], sampleRandom(1, 2, 0));
    const long = track('a', a.generate({ maxNewTokens: 40 }));
    const seg1 = await track('paused', paused.generate({ maxNewTokens: 3 }));
    const rng = clone((paused as unknown as { rng: SeededRandom }).rng);
    // While the paused row's caller is busy, the waiting row takes its slot and finishes.
    const w = await track('waiting', waiting.generate({ maxNewTokens: 5 }));
    expect(order).toEqual(['paused', 'waiting']);
    paused.extend([30, 31, 32, 33]);
    const seg2 = await track('paused', paused.generate({ maxNewTokens: 6 }));
    const segA = await long;
    expect(order).toEqual(['paused', 'waiting', 'paused', 'a']);
    expect(paused.ids).toEqual([7, 7, 9, 3, ...seg1.ids, 30, 31, 32, 33, ...seg2.ids]);
    await s.close();

    const ref = GenerationSession.open(dec, o);
    const fresh = await ref.start([7, 7, 9, 3, ...seg1.ids, 30, 31, 32, 33], rng).generate({ maxNewTokens: 6 });
    expect(seg2).toEqual(fresh);
    // The other rows drew what they draw alone.
    expect(await ref.start([1, 2, 3], sampleRandom(1, 0, 0)).generate({ maxNewTokens: 40 })).toEqual(segA);
    expect(await ref.start([12, 5], sampleRandom(1, 2, 0)).generate({ maxNewTokens: 5 })).toEqual(w);
    await ref.close();
    await dec.release();
  });

  it('a row closed while it generates is rejected, the others go on; a closed session refuses new rows', async () => {
    const c = testConfig('llama');
    const dec = await Decoder.create(c, randomWeights(c, 5), {});
    const s = GenerationSession.open(dec, { temperature: 1 });
    const a = s.start([1, 2, 3], sampleRandom(3, 0, 0));
    const b = s.start([4, 5], sampleRandom(3, 1, 0));
    const pa = a.generate({ maxNewTokens: 20 });
    const pb = b.generate({ maxNewTokens: 20 });
    b.close();
    await expect(pb).rejects.toThrow(/closed while generating/);
    const ref = GenerationSession.open(dec, { temperature: 1 });
    expect(await pa).toEqual(await ref.start([1, 2, 3], sampleRandom(3, 0, 0)).generate({ maxNewTokens: 20 }));
    await ref.close();
    await s.close();
    expect(() => s.start([1], sampleRandom(3, 2, 0))).toThrow(/closed session/);
    expect(() => a.generate()).toThrow(/closed session/);
    await dec.release();
  });

  it('stop strings end a segment; log-probabilities are those of the distribution drawn from; the tokens do not change', async () => {
    const c = testConfig('gpt2');
    const dec = await Decoder.create(c, randomWeights(c, 2), {});
    const decode = (ids: readonly number[]) => ids.map((t) => String.fromCharCode(97 + (t % 26))).join('');
    const o = { temperature: 0.7 };
    const reqs = () => [[3, 1, 4], [1, 5, 9, 2], [6]].map((p, i) => ({ promptIds: p, rng: sampleRandom(2, i, 0) }));
    const plain = await generateIds([{ decoder: dec, weight: 1 }], reqs(), { ...o, maxNewTokens: 12, stopIds: [], padId: 0 });
    const withLogps = await generateIds([{ decoder: dec, weight: 1 }], reqs(), { ...o, maxNewTokens: 12, stopIds: [], padId: 0, logprobs: true });
    expect(withLogps.map((x) => x.ids)).toEqual(plain.map((x) => x.ids));
    // The graph's draw returns the log-probabilities the host computes from the logits (float64 both,
    // summed in another order): equal once rounded to float32, or one float32 step apart where the
    // two float64 values straddle a rounding boundary.
    const onHost = await generateIds([{ decoder: dec, weight: 1 }], reqs(), { ...o, maxNewTokens: 12, stopIds: [], padId: 0, logprobs: true, hostSampling: true });
    expect(onHost.map((x) => x.ids)).toEqual(plain.map((x) => x.ids));
    for (let i = 0; i < 3; i++) {
      for (let t = 0; t < 12; t++) {
        const [g, h] = [withLogps[i].logps![t], onHost[i].logps![t]];
        expect(Math.abs(g - h), `row ${i} token ${t}: ${g} vs ${h}`).toBeLessThanOrEqual(Math.abs(h) * 2 ** -23);
      }
    }
    for (let i = 0; i < 3; i++) {
      const prompt = reqs()[i].promptIds;
      for (let t = 0; t < 12; t += 5) {
        const l = await prefillLogits(dec, [...prompt, ...plain[i].ids.slice(0, t)]);
        const m = Math.max(...l);
        const z = l.reduce((a, x) => a + Math.exp((x - m) / 0.7), 0);
        expect(withLogps[i].logps![t]).toBeCloseTo((l[plain[i].ids[t]] - m) / 0.7 - Math.log(z), 4);
      }
    }
    // A stop string drawn from the first row's text: the segment ends on the token that completes it.
    const text = decode(plain[0].ids);
    const stop = text.slice(4, 6);
    const s = GenerationSession.open(dec, { ...o, stopStrings: [stop], decode });
    const seg = await s.start([3, 1, 4], sampleRandom(2, 0, 0)).generate({ maxNewTokens: 12 });
    await s.close();
    const end = text.indexOf(stop) + stop.length;
    expect(seg).toEqual({ ids: plain[0].ids.slice(0, end), stop: 'stop-string' });
    await dec.release();
  });

  it('stop strings are found from the text of the last tokens: the token a whole-segment search first finds one at, decoding a few tokens a check', () => {
    const rng = new SeededRandom([5, 6, 7, 8]);
    // Pieces of 0 to 12 characters (an empty one, as a partial UTF-8 byte decodes), the leading space
    // of the whole text stripped as SentencePiece's decoder does: the tail's text is not always the
    // whole text's tail.
    const pieces = ['', '', '', '', 'a', 'b', 'ab', ' a', 'ba', 'abc', '          ', 'xyzxyzxyzxyz', ' ', 'c', 'bca', 'cxyzxyzxyzxyz'];
    let decoded = 0;
    const decode = (ids: readonly number[]) => ((decoded += ids.length), ids.map((t) => pieces[t]).join('').replace(/^ /, ''));
    let found = 0;
    for (let trial = 0; trial < 200; trial++) {
      const stops = trial % 2 ? ['abca', 'c b'] : ['bab'];
      const seg = Array.from({ length: 60 }, () => Math.floor(rng.next() * pieces.length));
      const whole = seg.findIndex((_, k) => stops.some((x) => decode(seg.slice(0, k + 1)).includes(x)));
      const tail = seg.findIndex((_, k) => stopStringEnds(seg.slice(0, k + 1), stops, decode));
      expect(tail, `trial ${trial}`).toBe(whole);
      if (whole >= 0) found++;
    }
    expect(found).toBeGreaterThan(100);
    // A few tokens decoded per check, not the segment so far: over 400 tokens and no stop, a
    // whole-segment check decodes 80,200 ids in all.
    const long = Array.from({ length: 400 }, () => Math.floor(rng.next() * pieces.length));
    decoded = 0;
    for (let k = 0; k < long.length; k++) expect(stopStringEnds(long.slice(0, k + 1), ['qq'], decode)).toBe(false);
    expect(decoded).toBeLessThan(40 * 400);
  });

  it('shared prompts and continuous batching give the tokens of left-padded batches, more requests than rows', async () => {
    const c = testConfig('mistral');
    const dec = await Decoder.create(c, randomWeights(c, 6), {});
    const prompts = [[3, 9, 1], [2, 7], [3, 9, 1], [14, 15, 9, 26, 5], [2, 7], [11], [3, 9, 1]];
    const reqs = () => prompts.map((p, i) => ({ promptIds: p, rng: sampleRandom(4, i, 0) }));
    for (const temperature of [0, 1]) {
      const o = { temperature, maxNewTokens: 9, stopIds: [5], padId: 0, batchSize: 3 };
      const old = await generateIds([{ decoder: dec, weight: 1 }], reqs(), { ...o, sharePrompts: false, continuous: false });
      const now = await generateIds([{ decoder: dec, weight: 1 }], reqs(), o);
      expect(now).toEqual(old);
      expect(new Set(now.map((x) => x.ids.length)).size).toBeGreaterThan(1);
    }
    await dec.release();
  });
});
