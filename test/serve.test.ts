/**
 * `prefzoo serve` (src/serve/) against the clients it is for: the `openai` SDK (non-streaming and
 * streaming, `n`, seeds, logprobs, tools with the stream helpers assembling tool-call deltas) and
 * the AI SDK (`generateText` with a tool over two steps, `streamText`), over a tiny GPT-2.
 *
 * Tool calls need a model whose text is known: `scripted()` builds GPT-2 weights whose blocks add
 * nothing (their output projections are zero), so the next token is read off the residual stream
 * of position and token embeddings by an untied head. Each position of the assistant's first turn
 * (from the prompt's last position on) has a dimension of its own pointing at the next token of a
 * Hermes tool call and the end-of-turn id; beyond those positions the token embedding decides, a
 * chain from the generation prompt's last token through "It is 7." to the end-of-turn id. So the
 * first turn writes the call and, once the tool's result is in the prompt, the next writes the
 * answer; a parser or a stream that lost a character would fail the equalities below.
 *
 * Also: log-probabilities against a float64 log-softmax of logits from a prefill of their own; the
 * bad requests of issue 43 item 3, each with its status and error object, the server serving after;
 * a client that disconnects mid-stream frees its rows; rollout paths; `prefzoo serve --help`.
 */
import { spawnSync } from 'node:child_process';
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join, resolve } from 'node:path';
import OpenAI from 'openai';
import { generateText, stepCountIs, streamText, tool } from 'ai';
import { createOpenAICompatible } from '@ai-sdk/openai-compatible';
import { z } from 'zod';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { initModelFolder } from '../src/models/init.ts';
import { loadModel } from '../src/models/load.ts';
import { Decoder, GenerationSession } from '../src/models/generate.ts';
import { modelParameterShapes } from '../src/models/params.ts';
import type { FloatTensor } from '../src/models/checkpoint.ts';
import type { ModelConfig } from '../src/models/config.ts';
import { SeededRandom } from '../src/random.ts';
import { loadTokenizer, type LoadedTokenizer } from '../src/tokenize/index.ts';
import { chatPromptIds } from '../src/tokenize/conversation.ts';
import { ServeEngine } from '../src/serve/engine.ts';
import { startServer, type RolloutCall, type RunningServer } from '../src/serve/http.ts';
import { toMessages } from '../src/serve/openai.ts';

const ROOT = resolve(import.meta.dirname, '..');
const dir = mkdtempSync(join(tmpdir(), 'prefzoo-serve-'));
const MODEL = 'tiny-gpt2';
let tok: LoadedTokenizer;
let config: ModelConfig;
let random: Decoder;
let engine: ServeEngine;
let server: RunningServer;
let client: OpenAI;
const scriptedDecoders: Decoder[] = [];

const CALL = '<tool_call>\n{"name": "lookup", "arguments": {"key": "x"}}\n</tool_call>';
const ANSWER = 'It is 7.';
const TOOLS = [{ type: 'function' as const, function: { name: 'lookup', description: 'Looks a key up.', parameters: { type: 'object', properties: { key: { type: 'string' } }, required: ['key'] } } }];
const QUESTION = [{ role: 'user' as const, content: 'What is x?' }];

beforeAll(async () => {
  initModelFolder(join(dir, 'm'), 'gpt2', 'tiny', 5);
  tok = loadTokenizer(join(dir, 'm'));
  const m = loadModel(join(dir, 'm'));
  config = m.config;
  random = await Decoder.create(m.config, m.weights, { bake: true });
  engine = new ServeEngine(random, tok);
  server = await startServer({ engine, model: MODEL, port: 0, routes: { rollout: (id) => rollouts.get(id) ?? null } });
  client = new OpenAI({ baseURL: server.url, apiKey: 'unused' });
});
afterAll(async () => {
  await server.close();
  await engine.close();
  await random.release();
  for (const d of scriptedDecoders) await d.release();
  rmSync(dir, { recursive: true, force: true });
});

/** A GPT-2 whose first assistant turn after a prompt of `promptLength` ids is CALL, and whose later turns are ANSWER (see the file's comment). */
async function scripted(promptLength: number): Promise<Decoder> {
  const c: ModelConfig = { ...config, n_embd: 128, tie_word_embeddings: false } as ModelConfig;
  const D = 128;
  const weights = new Map<string, FloatTensor>();
  for (const [name, shape] of modelParameterShapes(c)) {
    const data = new Float32Array(shape.reduce((a, b) => a * b, 1));
    if (/ln_(1|2|f)\.weight$/.test(name)) data.fill(1);
    weights.set(name, { shape, data });
  }
  const end = tok.tokenToId('<|im_end|>')!;
  const wte = weights.get('transformer.wte.weight')!.data;
  const wpe = weights.get('transformer.wpe.weight')!.data;
  const head = weights.get('lm_head.weight')!.data;
  const call = [...tok.encode(CALL, { addSpecialTokens: false }), end];
  let dim = 0;
  // Position q (the last prompt position on) → the call's next token.
  call.forEach((next, k) => {
    const q = promptLength - 1 + k;
    wpe[q * D + dim] = 100;
    head[next * D + dim] = 10;
    dim++;
  });
  // Token → next token, from the generation prompt's last token through ANSWER to the end of the turn.
  const last = chatPromptIds(tok, QUESTION)[chatPromptIds(tok, QUESTION).length - 1];
  const chain = [last, ...tok.encode(ANSWER, { addSpecialTokens: false }), end];
  if (new Set(chain).size !== chain.length || dim + chain.length > D) throw new Error('scripted: the answer chain needs distinct tokens and room');
  for (let k = 0; k + 1 < chain.length; k++) {
    wte[chain[k] * D + dim] = 10;
    head[chain[k + 1] * D + dim] = 10;
    dim++;
  }
  const d = await Decoder.create(c, weights, { bake: true });
  scriptedDecoders.push(d);
  return d;
}

/** Log-softmax in float64. */
function logSoftmax(logits: Float32Array): Float64Array {
  let max = -Infinity;
  for (const x of logits) max = Math.max(max, x);
  let z = 0;
  for (const x of logits) z += Math.exp(x - max);
  return Float64Array.from(logits, (x) => x - max - Math.log(z));
}

const post = (path: string, body: unknown, headers: Record<string, string> = {}, base = server.url) =>
  fetch(`${base}${path}`, { method: 'POST', headers: { 'content-type': 'application/json', ...headers }, body: typeof body === 'string' ? body : JSON.stringify(body) });

/** A request that works: checks the server still serves. */
async function stillServing(base = server.url, headers: Record<string, string> = {}): Promise<void> {
  const r = await post('/chat/completions', { model: MODEL, messages: QUESTION, max_tokens: 2 }, headers, base);
  expect(r.status).toBe(200);
  expect(((await r.json()) as { choices: unknown[] }).choices).toHaveLength(1);
}

// eslint-disable-next-line @typescript-eslint/no-explicit-any
type Any = any;

describe('the openai SDK against prefzoo serve', () => {
  it('non-streaming: n choices, seeds, token ids, usage', async () => {
    const ask = (seed: number) => client.chat.completions.create({ model: MODEL, messages: QUESTION, max_tokens: 12, n: 3, seed, return_token_ids: true } as Any) as Promise<Any>;
    const [a, b, c] = await Promise.all([ask(7), ask(7), ask(8)]);
    expect(a.choices).toHaveLength(3);
    expect(a.prompt_token_ids).toEqual(chatPromptIds(tok, QUESTION));
    expect(a.choices.map((x: Any) => x.token_ids)).toEqual(b.choices.map((x: Any) => x.token_ids));
    expect(a.choices[0].token_ids).not.toEqual(a.choices[1].token_ids);
    expect(a.choices[0].token_ids).not.toEqual(c.choices[0].token_ids);
    for (const ch of a.choices) {
      const ended = tok.stopIds.includes(ch.token_ids.at(-1));
      expect(ch.message.content).toBe(tok.decode(ended ? ch.token_ids.slice(0, -1) : ch.token_ids, { skipSpecialTokens: false }));
      expect(ch.finish_reason).toBe(ended ? 'stop' : 'length');
    }
    expect(a.usage).toEqual({ prompt_tokens: a.prompt_token_ids.length, completion_tokens: a.choices.reduce((s: number, x: Any) => s + x.token_ids.length, 0), total_tokens: a.prompt_token_ids.length + a.choices.reduce((s: number, x: Any) => s + x.token_ids.length, 0) });
    const models = await client.models.list();
    expect(models.data.map((x) => x.id)).toEqual([MODEL]);
  });

  it('same seed, same request → same tokens, alone or among 8 concurrent others', async () => {
    const req = (seed: number, content = 'What is x?') => client.chat.completions.create({ model: MODEL, messages: [{ role: 'user', content }], max_tokens: 16, n: 2, seed, return_token_ids: true } as Any) as Promise<Any>;
    const alone = await req(99);
    const crowd = await Promise.all([req(1, 'another question'), req(2), req(99), req(3, 'a third one, longer than the others'), req(4), req(5), req(6, 'hello'), req(7), req(8)]);
    expect(crowd[2].choices.map((x: Any) => x.token_ids)).toEqual(alone.choices.map((x: Any) => x.token_ids));
    expect(engine.rows).toBe(0);
  });

  it('streaming gives the text, token ids and logprobs the same request gives whole; usage at the end', async () => {
    const body = { model: MODEL, messages: QUESTION, max_tokens: 20, seed: 5, logprobs: true, top_logprobs: 2, return_token_ids: true };
    const whole = (await client.chat.completions.create(body as Any)) as Any;
    const stream = (await client.chat.completions.create({ ...body, stream: true, stream_options: { include_usage: true } } as Any)) as Any;
    let text = '';
    const ids: number[] = [];
    const lps: number[] = [];
    let finish = null;
    let usage = null;
    for await (const chunk of stream) {
      if (chunk.usage) usage = chunk.usage;
      for (const ch of chunk.choices) {
        text += ch.delta.content ?? '';
        ids.push(...(ch.token_ids ?? []));
        for (const l of ch.logprobs?.content ?? []) lps.push(l.logprob);
        finish = ch.finish_reason ?? finish;
      }
    }
    expect(text).toBe(whole.choices[0].message.content);
    expect(ids).toEqual(whole.choices[0].token_ids);
    expect(lps).toEqual(whole.choices[0].logprobs.content.map((l: Any) => l.logprob));
    expect(finish).toBe(whole.choices[0].finish_reason);
    expect(usage).toEqual(whole.usage);
  });

  it("logprobs and top_logprobs = a float64 log-softmax of the model's logits from a prefill of their own", async () => {
    const r = (await client.chat.completions.create({ model: MODEL, messages: QUESTION, max_tokens: 4, seed: 3, logprobs: true, top_logprobs: 3, return_token_ids: true } as Any)) as Any;
    const ids: number[] = r.choices[0].token_ids;
    for (let k = 0; k < ids.length; k++) {
      const s = GenerationSession.open(random);
      const logits = await s.start([...r.prompt_token_ids, ...ids.slice(0, k)], new SeededRandom(0)).logits();
      await s.close();
      const ls = logSoftmax(logits.subarray(0, tok.vocabSize));
      const order = Array.from(ls.keys()).sort((a, b) => ls[b] - ls[a]);
      const entry = r.choices[0].logprobs.content[k];
      expect(entry.logprob).toBeCloseTo(ls[ids[k]], 4);
      expect(entry.token).toBe(tok.decode([ids[k]], { skipSpecialTokens: false }));
      expect(entry.top_logprobs.map((t: Any) => t.logprob)).toEqual(order.slice(0, 3).map((id) => expect.closeTo(ls[id], 4)));
      expect(entry.top_logprobs.map((t: Any) => t.token)).toEqual(order.slice(0, 3).map((id) => tok.decode([id], { skipSpecialTokens: false })));
    }
  });

  it('a tool call parsed from the text, whole and as streamed deltas the SDK assembles', async () => {
    await engine.setModel(await scripted(chatPromptIds(tok, QUESTION, { tools: TOOLS }).length));
    try {
      const body = { model: MODEL, messages: QUESTION, tools: TOOLS, max_tokens: 100, temperature: 0 };
      const whole = await client.chat.completions.create(body);
      const ch = whole.choices[0];
      expect(ch.finish_reason).toBe('tool_calls');
      expect(ch.message.content).toBeNull();
      expect(ch.message.tool_calls).toHaveLength(1);
      const call = ch.message.tool_calls![0] as Any;
      expect(call.type).toBe('function');
      expect(call.function).toEqual({ name: 'lookup', arguments: '{"key":"x"}' });
      const stream = client.chat.completions.stream(body);
      const chunks: Any[] = [];
      stream.on('chunk', (c) => chunks.push(c));
      const final = await stream.finalChatCompletion();
      expect(final.choices[0].finish_reason).toBe('tool_calls');
      expect((final.choices[0].message.tool_calls![0] as Any).function).toEqual(call.function);
      // OpenAI's delta layout: the call's id, type and name first, then its arguments.
      const deltas = chunks.flatMap((c) => c.choices.flatMap((x: Any) => x.delta.tool_calls ?? []));
      expect(deltas[0]).toMatchObject({ index: 0, type: 'function', function: { name: 'lookup', arguments: '' } });
      expect(deltas[1]).toEqual({ index: 0, function: { arguments: '{"key":"x"}' } });
      // tool_choice "none": the same text comes back as content.
      const none = await client.chat.completions.create({ ...body, tool_choice: 'none' });
      expect(none.choices[0].message.tool_calls ?? []).toEqual([]);
    } finally {
      await engine.setModel(random);
    }
  });
});

describe('the AI SDK against prefzoo serve', () => {
  /** A provider whose first request swaps in the scripted model for that request's prompt. */
  function provider() {
    let first = true;
    return createOpenAICompatible({
      name: 'prefzoo',
      baseURL: server.url,
      fetch: async (url, init) => {
        if (first) {
          first = false;
          const body = JSON.parse(String(init!.body));
          const ids = engine.chatPrompt(toMessages(body.messages), body.tools.map((t: Any) => ({ type: 'function', function: t.function })), null).promptIds;
          await engine.setModel(await scripted(ids.length));
        }
        return fetch(url, init);
      },
    });
  }
  const lookup = () => tool({ description: 'Looks a key up.', inputSchema: z.object({ key: z.string() }), execute: async ({ key }) => `the value of ${key} is 7` });

  it('generateText: a tool call, its result, the answer (stopWhen: stepCountIs(3))', async () => {
    try {
      const r = await generateText({ model: provider()(MODEL), prompt: 'What is x?', tools: { lookup: lookup() }, stopWhen: stepCountIs(3), temperature: 0 });
      expect(r.steps).toHaveLength(2);
      expect(r.steps[0].text).toBe('');
      expect(r.steps[0].toolCalls.map((c) => [c.toolName, c.input])).toEqual([['lookup', { key: 'x' }]]);
      expect(r.steps[0].toolResults.map((c) => c.output)).toEqual(['the value of x is 7']);
      expect(r.text).toBe(ANSWER);
      expect(r.finishReason).toBe('stop');
    } finally {
      await engine.setModel(random);
    }
  });

  it('streamText: the same conversation streamed', async () => {
    try {
      const r = streamText({ model: provider()(MODEL), prompt: 'What is x?', tools: { lookup: lookup() }, stopWhen: stepCountIs(3), temperature: 0 });
      let text = '';
      for await (const part of r.textStream) text += part;
      expect(text).toBe(ANSWER);
      const steps = await r.steps;
      expect(steps[0].toolCalls.map((c) => c.input)).toEqual([{ key: 'x' }]);
    } finally {
      await engine.setModel(random);
    }
  });
});

describe('bad requests: OpenAI error objects with their status, and the server serves on', () => {
  const expectError = async (r: Response, status: number, code: string | null, param: string | null = null) => {
    expect(r.status).toBe(status);
    const b = (await r.json()) as { error: Record<string, unknown> };
    expect(Object.keys(b.error).sort()).toEqual(['code', 'message', 'param', 'type']);
    expect(b.error.code).toBe(code);
    expect(b.error.param).toBe(param);
    expect(typeof b.error.message).toBe('string');
    return b.error;
  };

  it('malformed JSON, unknown model, max_tokens past the positions, unsupported parameters, unknown route', async () => {
    await expectError(await post('/chat/completions', '{"model": '), 400, 'invalid_json');
    await stillServing();
    const e = await expectError(await post('/chat/completions', { model: 'gpt-9', messages: QUESTION }), 404, 'model_not_found', 'model');
    expect(e.type).toBe('not_found_error');
    await expectError(await post('/chat/completions', { model: MODEL, messages: QUESTION, max_tokens: 600 }), 400, 'context_length_exceeded', 'max_tokens');
    await expectError(await post('/completions', { model: MODEL, prompt: 'hi', max_tokens: 600 }), 400, 'context_length_exceeded', 'max_tokens');
    await expectError(await post('/chat/completions', { model: MODEL, messages: QUESTION, logit_bias: { '5': 10 } }), 400, 'unsupported_parameter', 'logit_bias');
    await expectError(await post('/chat/completions', { model: MODEL, messages: QUESTION, response_format: { type: 'json_schema', json_schema: {} } }), 400, 'unsupported_parameter', 'response_format');
    await expectError(await post('/chat/completions', { model: MODEL, messages: QUESTION, frobnicate: 1 }), 400, 'unsupported_parameter', 'frobnicate');
    await expectError(await post('/chat/completions', { model: MODEL, messages: QUESTION, n: 99 }), 400, null, 'n');
    await expectError(await post('/chat/completions', { model: MODEL, messages: [] }), 400, null, 'messages');
    await expectError(await post('/nowhere', {}), 404, 'unknown_url');
    await stillServing();
    // The openai SDK surfaces them as its typed errors.
    await expect(client.chat.completions.create({ model: 'gpt-9', messages: QUESTION })).rejects.toBeInstanceOf(OpenAI.NotFoundError);
  });

  it('a body over the limit (413), a missing key (401), a full queue (429), after shutdown (503)', async () => {
    // A rollout whose record() waits for a gate holds its request in flight (and its decoding slot) until opened.
    let reached = () => {};
    let open = () => {};
    const hold = () => {
      const r = new Promise<void>((res) => (reached = res));
      const g = new Promise<void>((res) => (open = res));
      return { reached: r, gate: g };
    };
    let h = hold();
    const limited = await startServer({
      engine,
      model: MODEL,
      port: 0,
      apiKey: 'sekret',
      limits: { maxBodyBytes: 2000, maxConcurrency: 1, maxQueue: 1 },
      routes: { rollout: () => ({ rng: new SeededRandom(1), sampling: { temperature: 1, top_p: 1, top_k: 0 }, record: async () => (reached(), await h.gate) }) },
    });
    const held = `${limited.url.replace(/\/v1$/, '')}/rollouts/held/v1`;
    const auth = { authorization: 'Bearer sekret' };
    const small = { model: MODEL, messages: QUESTION, max_tokens: 3 };
    try {
      await expectError(await post('/chat/completions', small, {}, limited.url), 401, 'invalid_api_key');
      await expectError(await post('/chat/completions', small, { authorization: 'Bearer wrong' }, limited.url), 401, 'invalid_api_key');
      expect((await fetch(`${limited.url}/models`)).status).toBe(401);
      await expectError(await post('/chat/completions', { model: MODEL, messages: [{ role: 'user', content: 'x'.repeat(5000) }] }, auth, limited.url), 413, 'request_too_large');
      await stillServing(limited.url, auth);
      // One decoding (held), one waiting: the third is turned away.
      const first = post('/chat/completions', small, auth, held);
      await h.reached;
      const second = post('/chat/completions', small, auth, limited.url);
      await new Promise((r) => setTimeout(r, 200));
      await expectError(await post('/chat/completions', small, auth, limited.url), 429, null);
      open();
      expect((await Promise.all([first, second])).map((r) => r.status)).toEqual([200, 200]);
      await stillServing(limited.url, auth);
      // Shutdown: the request in flight finishes, a new one gets 503.
      h = hold();
      const inFlight = post('/chat/completions', small, auth, held);
      await h.reached;
      const closing = limited.close();
      await expectError(await post('/chat/completions', small, auth, limited.url), 503, null);
      open();
      expect((await inFlight).status).toBe(200);
      await closing;
    } finally {
      open();
      await limited.close().catch(() => {});
    }
    await stillServing();
  });

  it('a client that disconnects mid-stream frees its rows', async () => {
    const ac = new AbortController();
    const r = await fetch(`${server.url}/chat/completions`, { method: 'POST', headers: { 'content-type': 'application/json' }, body: JSON.stringify({ model: MODEL, messages: QUESTION, max_tokens: 400, n: 2, seed: 3, stream: true }), signal: ac.signal });
    // Seeded: an unseeded row of this random model could draw its stop id within the first chunks and
    // end before the abort (a flaky 1 instead of 2 below); seed 3's rows do not.
    const reader = r.body!.getReader();
    await reader.read();
    await reader.read();
    expect(engine.rows).toBe(2);
    ac.abort();
    for (let k = 0; k < 100 && engine.rows > 0; k++) await new Promise((res) => setTimeout(res, 20));
    expect(engine.rows).toBe(0);
    await stillServing();
  });

  it('a non-loopback host without an API key is refused', async () => {
    await expect(startServer({ engine, model: MODEL, host: '0.0.0.0', port: 0 })).rejects.toThrow(/--api-key/);
  });
});

const rollouts = new Map<string, { rng: SeededRandom; sampling: { temperature: number; top_p: number; top_k: number }; maxTokens?: number; record: (c: RolloutCall) => void }>();

describe('rollout paths', () => {
  it("draw from the rollout's stream and settings whatever the request says, and record every call", async () => {
    const calls: RolloutCall[] = [];
    rollouts.set('r1', { rng: new SeededRandom(11), sampling: { temperature: 1, top_p: 1, top_k: 0 }, maxTokens: 5, record: (c) => calls.push(c) });
    const rc = new OpenAI({ baseURL: `${server.url.replace(/\/v1$/, '')}/rollouts/r1/v1`, apiKey: 'unused' });
    const a = (await rc.chat.completions.create({ model: MODEL, messages: QUESTION, max_tokens: 50, temperature: 0, seed: 1, return_token_ids: true } as Any)) as Any;
    const b = (await rc.chat.completions.create({ model: MODEL, messages: QUESTION, max_tokens: 50, temperature: 0, seed: 1, return_token_ids: true } as Any)) as Any;
    // One generator continuing across the calls, the run's temperature (not 0) and its maxTokens.
    const rng = new SeededRandom(11);
    const engineOwn = await engine.run({ promptIds: a.prompt_token_ids, sampling: { temperature: 1, topP: 1, topK: 0 }, maxTokens: 5, rngs: [rng] });
    const engineNext = await engine.run({ promptIds: a.prompt_token_ids, sampling: { temperature: 1, topP: 1, topK: 0 }, maxTokens: 5, rngs: [rng] });
    expect(a.choices[0].token_ids).toEqual(engineOwn[0].ids);
    expect(b.choices[0].token_ids).toEqual(engineNext[0].ids);
    expect(calls.map((c) => c.completionIds)).toEqual([a.choices[0].token_ids, b.choices[0].token_ids]);
    expect(calls[0].promptIds).toEqual(a.prompt_token_ids);
    expect(calls[0].logps).toEqual(engineOwn[0].logprobs);
    expect(calls[0].messages).toEqual(QUESTION);
    expect(calls[0].text).toBe(a.choices[0].message.content);
    const unknown = await post('/chat/completions', { model: MODEL, messages: QUESTION }, {}, `${server.url.replace(/\/v1$/, '')}/rollouts/nope/v1`);
    expect(unknown.status).toBe(404);
    const twice = await post('/chat/completions', { model: MODEL, messages: QUESTION, n: 2 }, {}, `${server.url.replace(/\/v1$/, '')}/rollouts/r1/v1`);
    expect(twice.status).toBe(400);
  });
});

describe('the library', () => {
  it('serve() loads a model folder, listens, answers, and closes', async () => {
    const { serve } = await import('../src/index.ts');
    const s = await serve({ model: join(dir, 'm'), port: 0, servedModelName: 'lib' });
    try {
      const r = await post('/completions', { model: 'lib', prompt: 'hello', max_tokens: 3, seed: 1 }, {}, s.url);
      expect(r.status).toBe(200);
      expect(((await r.json()) as Any).choices[0].finish_reason).toMatch(/stop|length/);
    } finally {
      await s.close();
    }
    await expect(fetch(`${s.url}/models`)).rejects.toThrow();
  });
});

describe('prefzoo serve (the command)', () => {
  it('--help lists the flags; another host without --api-key is refused in one line', () => {
    const bin = join(ROOT, 'bin', 'prefzoo.mjs');
    const help = spawnSync(process.execPath, [bin, 'serve', '--help'], { encoding: 'utf8' });
    expect(help.status).toBe(0);
    for (const f of ['--model', '--adapter', '--device', '--host', '--port', '--api-key', '--served-model-name', '--max-concurrency', '--max-queue', '--quiet']) expect(help.stdout).toContain(f);
    const r = spawnSync(process.execPath, [bin, 'serve', '--model', join(dir, 'm'), '--host', '0.0.0.0'], { encoding: 'utf8', env: { ...process.env, PREFZOO_API_KEY: '' } });
    expect(r.status).not.toBe(0);
    expect(r.stderr.trim().split('\n')).toHaveLength(1);
    expect(r.stderr).toMatch(/--api-key/);
  });
});
