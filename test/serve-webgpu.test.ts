/**
 * `prefzoo serve --device webgpu` against the same server on the CPU, through the `openai` SDK: the
 * library's `serve({ runtime: { ep: 'webgpu' } })` builds what the command builds (the model folder
 * read by readExportSource, a baked Decoder on the device), so the device decoder's paths in
 * src/serve are the ones exercised: greedy rows picked on the device, greedy rows with logprobs
 * and top_logprobs reading the logits each step, seeded samples whose log-probabilities the device
 * computes, the `n` choices of a request sharing one prefill, streaming; and, on an engine over a
 * device decoder, a rollout's kept row continued by its next call (`keep`), requests joining one
 * device batch while one reads logits and one is cancelled (its row gathered out), and `setModel`.
 *
 * SwiftShader's logits differ from the CPU's in their last bits (within about 3e-4 on this model,
 * see `folder`; test/webgpu-generate.test.ts), so log-probabilities are compared to 1e-3 (as
 * test/webgpu.test.ts compares losses) and the tokens exactly; a seeded draw could in principle
 * differ when its uniform lands within about 1e-6 of a boundary (a few dozen draws here). Runs under SwiftShader in CI; without an adapter the tests are skipped
 * (failed with PREFZOO_REQUIRE_WEBGPU=1). The model is the tiny preset, a few tokens per request.
 */
import { existsSync, mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import OpenAI from 'openai';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { serve, type RunningServer } from '../src/index.ts';
import { initModelFolder, initWeights } from '../src/models/init.ts';
import { saveCheckpoint } from '../src/models/checkpoint.ts';
import { loadModel } from '../src/models/load.ts';
import { Decoder } from '../src/models/generate.ts';
import { deviceTraffic, resetDeviceTraffic } from '../src/models/generate-device.ts';
import type { RuntimeOptions } from '../src/runtime/session.ts';
import { SeededRandom } from '../src/random.ts';
import { loadTokenizer } from '../src/tokenize/index.ts';
import { chatPromptIds } from '../src/tokenize/conversation.ts';
import { ServeEngine, type EngineRequest } from '../src/serve/engine.ts';
import { webgpuMissing, webgpuRequired } from './helpers/webgpu.ts';

// eslint-disable-next-line @typescript-eslint/no-explicit-any
type Any = any;

const reason = await webgpuMissing('test/serve-webgpu.test.ts');
const GPU: RuntimeOptions = { ep: 'webgpu' };
const CPU: RuntimeOptions = { ep: 'cpu' };
const dir = mkdtempSync(join(tmpdir(), 'prefzoo-serve-webgpu-'));
const MODEL = 'tiny';
const QUESTION = [{ role: 'user' as const, content: 'What is x?' }];
const servers: RunningServer[] = [];
let gpu: OpenAI;
let cpu: OpenAI;

afterAll(async () => {
  for (const s of servers) await s.close();
  rmSync(dir, { recursive: true, force: true });
});

/** The same request to both servers. */
async function both(body: Record<string, unknown>): Promise<[Any, Any]> {
  const ask = (c: OpenAI) => c.chat.completions.create({ model: MODEL, messages: QUESTION, return_token_ids: true, ...body } as Any) as Promise<Any>;
  return [await ask(gpu), await ask(cpu)];
}

/**
 * The tiny llama of `seed` (one folder per seed, written once), its weights drawn with std 0.1, not
 * init-model's 0.02, whose near-uniform logits make greedy repeat one token. Larger weights move
 * SwiftShader's logits further from the CPU's (0.3: 5e-3): at 0.1 they stay within about 3e-4.
 */
function folder(seed: number): string {
  const f = join(dir, `m${seed}`);
  if (!existsSync(f)) {
    const { config } = initModelFolder(f, 'llama', 'tiny', seed);
    saveCheckpoint(f, initWeights(config, seed, 0.1), { config });
  }
  return f;
}

const lps = (choice: Any): number[] => choice.logprobs.content.map((l: Any) => l.logprob);

function expectClose(got: number[], want: number[], what: string) {
  expect(got, what).toHaveLength(want.length);
  for (let i = 0; i < want.length; i++) expect(Math.abs(got[i] - want[i]), `${what} [${i}]: ${got[i]} vs ${want[i]}`).toBeLessThan(1e-3);
}

describe.skipIf(reason !== null && !webgpuRequired)('prefzoo serve --device webgpu (the openai SDK, against the CPU server)', () => {
  beforeAll(async () => {
    if (reason !== null) return;
    const start = (runtime: RuntimeOptions) => serve({ model: folder(8), runtime, port: 0, servedModelName: MODEL });
    servers.push(await start(GPU), await start(CPU));
    gpu = new OpenAI({ baseURL: servers[0].url, apiKey: 'unused' });
    cpu = new OpenAI({ baseURL: servers[1].url, apiKey: 'unused' });
  });

  it('finds an adapter', () => {
    expect(reason).toBeNull();
  });

  it("greedy: the CPU's token ids, and logprobs and top_logprobs (the logits read each step) within 1e-3 of the CPU's", async () => {
    const [g, c] = await both({ temperature: 0, max_tokens: 5, seed: 1, logprobs: true, top_logprobs: 3 });
    expect(g.prompt_token_ids).toEqual(c.prompt_token_ids);
    expect(g.choices[0].token_ids).toHaveLength(5);
    expect(g.choices[0].token_ids).toEqual(c.choices[0].token_ids);
    expect(g.choices[0].message.content).toBe(c.choices[0].message.content);
    expectClose(lps(g.choices[0]), lps(c.choices[0]), 'logprob');
    for (let k = 0; k < 5; k++) {
      const [tg, tc] = [g.choices[0].logprobs.content[k].top_logprobs, c.choices[0].logprobs.content[k].top_logprobs];
      expect(tg.map((t: Any) => t.token)).toEqual(tc.map((t: Any) => t.token));
      expectClose(tg.map((t: Any) => t.logprob), tc.map((t: Any) => t.logprob), `top_logprobs at ${k}`);
    }
    // The model's distribution, not a one-hot: the greedy token's log-probability is below 0.
    expect(lps(g.choices[0]).some((l) => l < -1e-3)).toBe(true);
  });

  it('greedy, streamed (the pick on the device): the chunks assemble to the CPU\'s text and token ids', async () => {
    const body = { temperature: 0, max_tokens: 6, seed: 2 };
    const [, c] = await both(body);
    resetDeviceTraffic();
    const stream = (await gpu.chat.completions.create({ model: MODEL, messages: QUESTION, return_token_ids: true, stream: true, ...body } as Any)) as Any;
    let text = '';
    const ids: number[] = [];
    let finish = null;
    for await (const chunk of stream) {
      for (const ch of chunk.choices) {
        text += ch.delta.content ?? '';
        ids.push(...(ch.token_ids ?? []));
        finish = ch.finish_reason ?? finish;
      }
    }
    expect(ids).toEqual(c.choices[0].token_ids);
    expect(text).toBe(c.choices[0].message.content);
    expect(finish).toBe(c.choices[0].finish_reason);
    // Decoded on the device: a run per token, and only the picked ids (int64) came back.
    const t = deviceTraffic();
    expect(t.steps).toBe(ids.length);
    expect(t.downloadBytes).toBe(8 * ids.length);
  });

  it("seeded samples, n = 2 sharing a prefill: the CPU's token ids, the sampler's log-probabilities within 1e-3", async () => {
    const [g, c] = await both({ temperature: 0.8, max_tokens: 5, n: 2, seed: 7, logprobs: true });
    expect(g.choices.map((x: Any) => x.token_ids)).toEqual(c.choices.map((x: Any) => x.token_ids));
    expect(g.choices[0].token_ids).not.toEqual(g.choices[1].token_ids);
    for (let i = 0; i < 2; i++) expectClose(lps(g.choices[i]), lps(c.choices[i]), `choice ${i}`);
  });
});

describe.skipIf(reason !== null && !webgpuRequired)('the serving engine over a device decoder', () => {
  /** The model of `seed` decoding on `runtime`, as serve() builds it. */
  async function decoder(seed: number, runtime: RuntimeOptions): Promise<Decoder> {
    const m = loadModel(folder(seed));
    return Decoder.create(m.config, m.weights, { runtime, bake: true });
  }

  it("a rollout's kept row continued by its next call (keep) draws the CPU's tokens, and release frees it", async () => {
    const tok = loadTokenizer(folder(8));
    const first = chatPromptIds(tok, QUESTION);
    const sampling = { temperature: 1, topP: 1, topK: 0 };
    const run = async (runtime: RuntimeOptions) => {
      const dec = await decoder(8, runtime);
      const engine = new ServeEngine(dec, tok);
      const rng = new SeededRandom(21);
      const req = (promptIds: number[]): EngineRequest => ({ promptIds, sampling, maxTokens: 4, rngs: [rng], keep: 'r', logprobs: true });
      const a = (await engine.run(req(first)))[0];
      const b = (await engine.run(req([...first, ...a.ids, ...tok.encode(' and', { addSpecialTokens: false })])))[0];
      const state = { continued: engine.continued, rows: engine.rows };
      engine.release('r');
      const after = engine.rows;
      await engine.close();
      await dec.release();
      return { a, b, state, after };
    };
    const [g, c] = [await run(GPU), await run(CPU)];
    expect(g.state).toEqual({ continued: 1, rows: 1 });
    expect(g.after).toBe(0);
    expect([g.a.ids, g.b.ids]).toEqual([c.a.ids, c.b.ids]);
    expectClose([...g.a.logprobs, ...g.b.logprobs], [...c.a.logprobs, ...c.b.logprobs], 'logprobs');
  });

  it("concurrent requests in one device batch, one reading logits, one cancelled midway: the others draw the CPU's tokens, no row left open", async () => {
    const tok = loadTokenizer(folder(8));
    const prompt = (content: string) => chatPromptIds(tok, [{ role: 'user', content }]);
    const sampling = { temperature: 0.7, topP: 1, topK: 0 };
    const run = async (runtime: RuntimeOptions) => {
      const dec = await decoder(8, runtime);
      const engine = new ServeEngine(dec, tok, { maxBatch: 4 });
      const ac = new AbortController();
      let drawn = 0;
      const req = (content: string, seed: number, o: Partial<EngineRequest> = {}): EngineRequest => ({ promptIds: prompt(content), sampling, maxTokens: 6, rngs: [new SeededRandom(seed)], logprobs: true, ...o });
      const cancelled = engine.run(req('a question that is cancelled', 3, { signal: ac.signal, onToken: () => ++drawn === 2 && ac.abort() }));
      const [a, b, c] = await Promise.all([
        engine.run(req('What is x?', 1)),
        engine.run(req('and y, longer than the first?', 2, { topLogprobs: 2 })),
        cancelled.then(
          () => 'finished',
          (e: Error) => e.message,
        ),
      ]);
      const rows = engine.rows;
      await engine.close();
      await dec.release();
      return { ids: [a[0].ids, b[0].ids], logprobs: [...a[0].logprobs, ...b[0].logprobs], top: b[0].top!.flat().map((t) => t.id), cancelled: c, drawn, rows };
    };
    const [g, c] = [await run(GPU), await run(CPU)];
    expect(g.cancelled).toMatch(/row was closed/);
    expect(c.cancelled).toBe(g.cancelled);
    expect(g.drawn).toBe(2);
    expect(g.rows).toBe(0);
    expect(g.ids).toEqual(c.ids);
    expect(Math.min(...g.ids.map((x) => x.length))).toBeGreaterThan(2);
    expect(g.top).toEqual(c.top);
    expectClose(g.logprobs, c.logprobs, 'logprobs');
  });

  it("setModel to another device decoder: the next requests draw that model's tokens", async () => {
    const tok = loadTokenizer(folder(8));
    const promptIds = chatPromptIds(tok, QUESTION);
    const req = (): EngineRequest => ({ promptIds, sampling: { temperature: 0, topP: 1, topK: 0 }, maxTokens: 4, rngs: [new SeededRandom(1)] });
    const [a, b] = [await decoder(8, GPU), await decoder(2, GPU)];
    const engine = new ServeEngine(a, tok);
    const before = (await engine.run(req()))[0].ids;
    await engine.setModel(b);
    const after = (await engine.run(req()))[0].ids;
    await engine.close();
    for (const d of [a, b]) await d.release();
    const want = async (seed: number) => {
      const d = await decoder(seed, CPU);
      const e = new ServeEngine(d, tok);
      const ids = (await e.run(req()))[0].ids;
      await e.close();
      await d.release();
      return ids;
    };
    expect(before).toEqual(await want(8));
    expect(after).toEqual(await want(2));
    expect(after).not.toEqual(before);
  });
});
