/**
 * The serving engine (src/serve/engine.ts) and what it adds to the generation session: per-segment
 * stop strings and the `onToken` callback give what the session-wide stop strings and the resolved
 * segment give; a seeded request draws the same ids alone and among 8 concurrent others; aborting a
 * request frees its rows; top_logprobs and the chosen tokens' log-probabilities equal a float64
 * log-softmax of logits from a prefill of the same ids in a session of their own.
 */
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { initModelFolder } from '../src/models/init.ts';
import { loadModel } from '../src/models/load.ts';
import { Decoder, GenerationSession, PREFIX_MIN, type Segment } from '../src/models/generate.ts';
import { sampleRandom } from '../src/models/sampling.ts';
import { SeededRandom } from '../src/random.ts';
import { loadTokenizer, type LoadedTokenizer } from '../src/tokenize/index.ts';
import { cutAtStop, ServeEngine } from '../src/serve/engine.ts';

const dir = mkdtempSync(join(tmpdir(), 'prefzoo-serve-engine-'));
let tok: LoadedTokenizer;
let dec: Decoder;

beforeAll(async () => {
  initModelFolder(join(dir, 'm'), 'llama', 'tiny', 5);
  tok = loadTokenizer(join(dir, 'm'));
  const m = loadModel(join(dir, 'm'));
  dec = await Decoder.create(m.config, m.weights, { bake: true });
});
afterAll(async () => {
  await dec.release();
  rmSync(dir, { recursive: true, force: true });
});

const prompt = () => tok.encode('hello there, how are you', { addSpecialTokens: false });

/** Log-softmax in float64 of logits divided by t. */
function logSoftmax(logits: Float32Array, t = 1): Float64Array {
  let max = -Infinity;
  for (const x of logits) max = Math.max(max, x / t);
  let z = 0;
  for (const x of logits) z += Math.exp(x / t - max);
  return Float64Array.from(logits, (x) => x / t - max - Math.log(z));
}

describe('generation session additions', () => {
  it("per-segment stop strings and onToken give what the session's stop strings and the segment give", async () => {
    const decode = (ids: readonly number[]) => tok.decode(ids, { skipSpecialTokens: false });
    const ids = prompt();
    // A stop string the free run reaches: the text of tokens 3..4 of a run without stops.
    const free = GenerationSession.open(dec, { temperature: 1, logprobs: true, vocabLimit: tok.vocabSize });
    const whole = await free.start(ids, new SeededRandom(3)).generate({ maxNewTokens: 24 });
    await free.close();
    const stop = decode(whole.ids.slice(3, 5));
    const a = GenerationSession.open(dec, { temperature: 1, logprobs: true, vocabLimit: tok.vocabSize, stopStrings: [stop], decode });
    const want = await a.start(ids, new SeededRandom(3)).generate({ maxNewTokens: 24 });
    await a.close();
    const b = GenerationSession.open(dec, { temperature: 1, logprobs: true, vocabLimit: tok.vocabSize, decode });
    const seen: [number, number | undefined][] = [];
    const got: Segment = await b.start(ids, new SeededRandom(3)).generate({ maxNewTokens: 24, stopStrings: [stop], onToken: (id, lp) => seen.push([id, lp]) });
    await b.close();
    expect(want.stop).toBe('stop-string');
    expect(got.ids).toEqual(want.ids);
    expect(got.stop).toBe('stop-string');
    expect(seen.map((x) => x[0])).toEqual(got.ids);
    expect(seen.map((x) => x[1])).toEqual(Array.from(got.logps!));
    expect(got.ids.length).toBeLessThan(whole.ids.length);
  });
});

describe('kept prompts (prefixCache)', () => {
  const rnd = new SeededRandom(4);
  const base = Array.from({ length: 40 }, () => 3 + Math.floor(rnd.next() * 100));
  const p = (...tail: number[]) => [...base, ...tail];

  it("a row starting with a kept prompt copies that part of its cache and feeds the rest: its logits are a whole prefill's to the bit, its draws the same", async () => {
    const plain = GenerationSession.open(dec, { temperature: 1, logprobs: true });
    const want = await plain.start(p(5, 6, 7), new SeededRandom(1)).logits();
    const wantSeg = await plain.start(p(5, 6, 7), new SeededRandom(2)).generate({ maxNewTokens: 8 });
    await plain.close();
    const s = GenerationSession.open(dec, { temperature: 1, logprobs: true, prefixCache: 2 });
    await s.start(p(9), new SeededRandom(1)).generate({ maxNewTokens: 2 });
    expect(s.prefixHits).toBe(0);
    const got = await s.start(p(5, 6, 7), new SeededRandom(1)).logits();
    expect(s.prefixHits).toBe(40);
    expect(Buffer.from(got.buffer, got.byteOffset, got.byteLength).equals(Buffer.from(want.buffer, want.byteOffset, want.byteLength))).toBe(true);
    const seg = await s.start(p(5, 6, 7), new SeededRandom(2)).generate({ maxNewTokens: 8 });
    expect(s.prefixHits).toBe(80);
    expect(seg.ids).toEqual(wantSeg.ids);
    expect(seg.logps![0]).toBe(wantSeg.logps![0]);
    for (let i = 0; i < seg.ids.length; i++) expect(seg.logps![i]).toBeCloseTo(wantSeg.logps![i], 5);
    await s.close();
  });

  it('the most recently used are kept; a match shorter than PREFIX_MIN copies nothing; rows sharing a prompt are prefilled once', async () => {
    const s = GenerationSession.open(dec, { temperature: 1, prefixCache: 2 });
    const other = (k: number) => Array.from({ length: 30 }, (_, i) => 3 + ((k * 37 + i * 11) % 100));
    for (const k of [1, 2, 3]) await s.start(other(k), new SeededRandom(k)).generate({ maxNewTokens: 2 });
    // other(1) was pushed out by other(3); other(2) and other(3) are kept.
    await s.start([...other(1), 4], new SeededRandom(0)).generate({ maxNewTokens: 2 });
    expect(s.prefixHits).toBe(0);
    await s.start([...other(3), 4], new SeededRandom(0)).generate({ maxNewTokens: 2 });
    expect(s.prefixHits).toBe(30);
    // Fewer than PREFIX_MIN tokens in common: a prefill.
    await s.start([...other(2).slice(0, PREFIX_MIN - 1), 1, 1, 1], new SeededRandom(0)).generate({ maxNewTokens: 2 });
    expect(s.prefixHits).toBe(30);
    // Two rows of one new prompt asked together: one prefill, copied, no kept prompt used.
    const twin = [...other(3), 8, 8];
    await Promise.all([0, 1].map((k) => s.start(twin, new SeededRandom(k)).generate({ maxNewTokens: 2 })));
    expect(s.prefixHits).toBe(30);
    await s.close();
  });

  it.each([
    ['drawn in the graph', {}],
    ['drawn on the host from the logits (top-k)', { topK: 8 }],
  ])('rows starting with one kept prompt and feeding as many tokens are extended in one run, each drawing to the bit what it draws alone (%s)', async (_, extra) => {
    const tails = [[5, 6, 7], [8, 9, 10], [11, 12, 13], [14, 15, 16]];
    const keep = async (s: GenerationSession) => s.start(p(9), new SeededRandom(1)).generate({ maxNewTokens: 2 });
    const alone: Segment[] = [];
    for (const [k, tail] of tails.entries()) {
      const s = GenerationSession.open(dec, { temperature: 1, logprobs: true, prefixCache: 2, ...extra });
      await keep(s);
      alone.push(await s.start(p(...tail), new SeededRandom(10 + k)).generate({ maxNewTokens: 6 }));
      await s.close();
    }
    const s = GenerationSession.open(dec, { temperature: 1, logprobs: true, prefixCache: 2, ...extra });
    await keep(s);
    const batches: number[] = [];
    const extendRows = dec.extendRows.bind(dec);
    dec.extendRows = (caches, ids, pick) => (batches.push(caches.length), extendRows(caches, ids, pick));
    try {
      const together = await Promise.all(tails.map((tail, k) => s.start(p(...tail), new SeededRandom(10 + k)).generate({ maxNewTokens: 6 })));
      expect(s.prefixHits).toBe(40 * tails.length);
      expect(batches).toEqual([tails.length]);
      together.forEach((seg, k) => {
        expect(seg.ids).toEqual(alone[k].ids);
        expect(Array.from(seg.logps!)).toEqual(Array.from(alone[k].logps!));
      });
      // The rows drew from their own streams: not all the same.
      expect(new Set(together.map((seg) => seg.ids.join())).size).toBeGreaterThan(1);
    } finally {
      dec.extendRows = extendRows;
      await s.close();
    }
  });

  it('the engine keeps prompts by default: requests sharing a prefix draw what an engine without kept prompts draws', async () => {
    const sampling = { temperature: 1, topP: 1, topK: 0 };
    const serve = async (prefixCache: number) => {
      const engine = new ServeEngine(dec, tok, { prefixCache });
      const out = [];
      for (const tail of [[5], [6, 7], [8, 9, 10]]) out.push((await engine.run({ promptIds: p(...tail), sampling, maxTokens: 10, rngs: [sampleRandom(3, 0, tail.length)] }))[0]);
      const hits = engine.prefixHits;
      await engine.close();
      return { out, hits };
    };
    const on = await serve(8);
    const off = await serve(0);
    expect(on.hits).toBe(80);
    expect(off.hits).toBe(0);
    expect(on.out.map((c) => c.ids)).toEqual(off.out.map((c) => c.ids));
    on.out.forEach((c, k) => c.logprobs.forEach((l, i) => expect(l).toBeCloseTo(off.out[k].logprobs[i], 5)));
  });
});

describe('the serving engine', () => {
  it('a seeded request draws the same ids alone and among 8 concurrent others', async () => {
    const engine = new ServeEngine(dec, tok);
    const req = (seed: number, other = false) => ({
      promptIds: other ? tok.encode(`other prompt number ${seed}`, { addSpecialTokens: false }) : prompt(),
      sampling: { temperature: 1, topP: 1, topK: 0 },
      maxTokens: 20,
      rngs: [0, 1].map((i) => sampleRandom(seed, 0, i)),
    });
    const alone = await engine.run(req(42));
    const crowd = await Promise.all([...Array.from({ length: 4 }, (_, k) => engine.run(req(k, true))), engine.run(req(42)), ...Array.from({ length: 4 }, (_, k) => engine.run(req(10 + k)))]);
    expect(crowd[4].map((c) => c.ids)).toEqual(alone.map((c) => c.ids));
    expect(crowd[4].map((c) => c.logprobs)).toEqual(alone.map((c) => c.logprobs));
    // The two choices drew from different streams; another seed draws otherwise.
    expect(alone[0].ids).not.toEqual(alone[1].ids);
    expect(crowd[5][0].ids).not.toEqual(alone[0].ids);
    expect(engine.rows).toBe(0);
    await engine.close();
  });

  it('an aborted request closes its rows; the engine serves on', async () => {
    const engine = new ServeEngine(dec, tok);
    const ac = new AbortController();
    let drawn = 0;
    const running = engine.run({
      promptIds: prompt(),
      sampling: { temperature: 1, topP: 1, topK: 0 },
      maxTokens: 400,
      rngs: [new SeededRandom(1), new SeededRandom(2)],
      signal: ac.signal,
      onToken: () => {
        if (++drawn === 5) {
          expect(engine.rows).toBe(2);
          ac.abort();
        }
      },
    });
    await expect(running).rejects.toThrow();
    expect(engine.rows).toBe(0);
    expect(drawn).toBeLessThan(20);
    const after = await engine.run({ promptIds: prompt(), sampling: { temperature: 1, topP: 1, topK: 0 }, maxTokens: 3, rngs: [new SeededRandom(1)] });
    expect(after[0].ids).toHaveLength(3);
    await engine.close();
  });

  for (const temperature of [1, 0.7, 0]) {
    it(`top_logprobs and the chosen tokens' log-probs = a float64 log-softmax of independent logits (temperature ${temperature})`, async () => {
      const engine = new ServeEngine(dec, tok);
      const streamed: number[] = [];
      const [c] = await engine.run({ promptIds: prompt(), sampling: { temperature, topP: 1, topK: 0 }, maxTokens: 6, rngs: [new SeededRandom(9)], logprobs: true, topLogprobs: 3, onToken: (_, t) => streamed.push(t.id) });
      await engine.close();
      expect(streamed).toEqual(c.ids);
      const t = temperature === 0 ? 1 : temperature;
      for (let k = 0; k < c.ids.length; k++) {
        const s = GenerationSession.open(dec);
        const logits = await s.start([...prompt(), ...c.ids.slice(0, k)], new SeededRandom(0)).logits();
        await s.close();
        const ls = logSoftmax(logits.subarray(0, tok.vocabSize), t);
        const order = Array.from(ls.keys()).sort((a, b) => ls[b] - ls[a]);
        expect(c.top![k].map((x) => x.id)).toEqual(order.slice(0, 3));
        c.top![k].forEach((x) => expect(x.logprob).toBeCloseTo(ls[x.id], 4));
        expect(c.logprobs[k]).toBeCloseTo(ls[c.ids[k]], 4);
        if (temperature === 0) expect(c.ids[k]).toBe(order[0]);
      }
    });
  }

  it('the text stops before a stop string', () => {
    expect(cutAtStop('abc STOP def END', ['END', 'STOP'])).toBe('abc ');
    expect(cutAtStop('abc', ['x'])).toBe('abc');
  });

  it('a kept row continued by the next call (keep) feeds only the new ids, and draws what a fresh prefill of the whole prompt draws', async () => {
    const sampling = { temperature: 1, topP: 1, topK: 0 };
    const first = prompt();
    const run = async (keep: boolean) => {
      const engine = new ServeEngine(dec, tok);
      // One stream across both calls, as a rollout's.
      const rng = new SeededRandom(21);
      const a = await engine.run({ promptIds: first, sampling, maxTokens: 6, rngs: [rng], ...(keep ? { keep: 'r' } : {}) });
      const next = [...first, ...a[0].ids, ...tok.encode(' and then', { addSpecialTokens: false })];
      const b = await engine.run({ promptIds: next, sampling, maxTokens: 6, rngs: [rng], ...(keep ? { keep: 'r' } : {}) });
      const rows = engine.rows;
      const continued = engine.continued;
      engine.release('r');
      const after = engine.rows;
      await engine.close();
      return { a: a[0], b: b[0], rows, continued, after };
    };
    const kept = await run(true);
    const fresh = await run(false);
    expect(kept.continued).toBe(1);
    expect(fresh.continued).toBe(0);
    expect(kept.rows).toBe(1);
    expect(kept.after).toBe(0);
    expect(kept.a.ids).toEqual(fresh.a.ids);
    expect(kept.b.ids).toEqual(fresh.b.ids);
    for (let i = 0; i < kept.b.logprobs.length; i++) expect(kept.b.logprobs[i]).toBeCloseTo(fresh.b.logprobs[i], 4);
  });
});
