/**
 * The HTTP side of `prefzoo serve` (node:http only): routes, server-sent events, the body limit, the
 * API key, and a bounded number of requests decoding at once with a bounded queue behind them (429
 * past it). Requests become engine requests (engine.ts) and results become OpenAI's shapes
 * (openai.ts); every failure is OpenAI's error object with its status, never a crash.
 *
 * Routes: GET /health, GET /v1/models, POST /v1/chat/completions, POST /v1/completions; with a
 * `rollout` resolver, the same /v1 routes under /rollouts/{id}/ too, where tokens come from the
 * rollout's random stream and sampling settings and every call is recorded (docs/serve.md).
 */
import { randomBytes, randomInt } from 'node:crypto';
import { createServer, type IncomingMessage, type ServerResponse } from 'node:http';
import type { AddressInfo } from 'node:net';
import type { Message, ToolCall, ToolSpec } from '../chat.ts';
import { UserError } from '../errors.ts';
import { sampleRandom } from '../models/sampling.ts';
import type { SeededRandom } from '../random.ts';
import type { ChoiceResult, ServeEngine } from './engine.ts';
import {
  ApiError,
  chatLogprobs,
  chatPlan,
  completionLogprobs,
  completionPlan,
  errorBody,
  openaiToolCalls,
  TextStream,
  usage,
  type ChatPlan,
  type CompletionPlan,
  type PlanBase,
  type RequestLimits,
} from './openai.ts';

export interface ServerLimits extends RequestLimits {
  /** Request bodies larger than this are answered 413. */
  maxBodyBytes: number;
  /** Requests decoding at once; more wait in the queue. */
  maxConcurrency: number;
  /** Requests waiting at most; past it, 429. */
  maxQueue: number;
}

export const DEFAULT_LIMITS: ServerLimits = { maxBodyBytes: 4 << 20, maxConcurrency: 64, maxQueue: 256, maxN: 16, maxTopLogprobs: 20 };

/** The sampling settings of a rollout (they override a request's). */
export interface RolloutSampling {
  temperature: number;
  top_p: number;
  top_k: number;
}

/** One call made on a rollout's path, as `record` receives it before the response is sent. */
export interface RolloutCall {
  promptIds: number[];
  /** The completion's ids as sampled (the stop id included when one ended it). */
  completionIds: number[];
  /** The sampler's log-probability of each completion id. */
  logps: number[];
  finishReason: 'stop' | 'length' | 'tool_calls';
  text: string;
  toolCalls: ToolCall[];
  /** The request's messages (chat) or the prompt as one user message (completions). */
  messages: Message[];
  tools: ToolSpec[];
}

/** What a rollout id stands for (see `ServerOptions.rollout`). */
export interface Rollout {
  /** The rollout's one random stream, continued across its calls. */
  rng: SeededRandom;
  sampling: RolloutSampling;
  /** Tokens per call at most (a request asking more gets this many). */
  maxTokens?: number;
  /**
   * A chat's prompt ids in place of the template's fresh render, or null for that render (GRPO's
   * --agent: a conversation continued from the ids the rollout sampled; not with a forced tool call).
   */
  prompt?(messages: readonly Message[], tools: readonly ToolSpec[]): number[] | null;
  /** Keep each call's row under this key, so a next call that continues it feeds only its new ids (`EngineRequest.keep`). */
  keep?: string;
  record(call: RolloutCall): void | Promise<void>;
}

export interface ServerOptions {
  engine: ServeEngine;
  /** The served model's name (`model` of requests, `GET /v1/models`). */
  model: string;
  /** Default 127.0.0.1; any other needs `apiKey`. */
  host?: string;
  /** Default 8080; 0 picks a free port. */
  port?: number;
  /** Checked on every request (`Authorization: Bearer KEY`); 401 otherwise. */
  apiKey?: string;
  limits?: Partial<ServerLimits>;
  /**
   * Milliseconds an idle keep-alive connection is held before the server closes it (default: Node's
   * 5,000); 0 never closes one, leaving it to the client. A server whose clients live in its own
   * process wants 0: when that process's event loop is blocked past the timeout, the client sends
   * its next request on a pooled connection just as the server's overdue timer closes it (ECONNRESET).
   */
  keepAliveTimeout?: number;
  routes?: {
    /** Serves /rollouts/{id}/v1/…: the rollout an id stands for, or null (404). */
    rollout?: (id: string) => Rollout | null;
  };
}

export interface RunningServer {
  /** The base URL, `http://HOST:PORT/v1`. */
  url: string;
  /** Stops: new requests get 503, those in flight finish (`cancel`: are cancelled), then the socket closes. */
  close(o?: { cancel?: boolean }): Promise<void>;
}

const LOOPBACK = new Set(['127.0.0.1', '::1', 'localhost']);

/** Whether `host` is this machine only (no API key needed). */
export function isLoopback(host: string): boolean {
  return LOOPBACK.has(host) || /^127\.\d+\.\d+\.\d+$/.test(host);
}

/** Starts serving; resolves once listening. */
export async function startServer(o: ServerOptions): Promise<RunningServer> {
  const host = o.host ?? '127.0.0.1';
  if (!isLoopback(host) && !o.apiKey) throw new UserError(`serve: --host ${host} reaches beyond this machine; give --api-key KEY (checked on every request)`);
  const limits: ServerLimits = { ...DEFAULT_LIMITS, ...o.limits };
  for (const [k, v] of Object.entries(limits)) {
    if (!(Number.isInteger(v) && v >= (k === 'maxQueue' ? 0 : 1))) throw new UserError(`serve: limit ${k} must be a ${k === 'maxQueue' ? 'non-negative' : 'positive'} integer, got ${v}`);
  }
  if (o.keepAliveTimeout !== undefined && !(Number.isInteger(o.keepAliveTimeout) && o.keepAliveTimeout >= 0)) throw new UserError(`serve: keepAliveTimeout must be a non-negative integer of milliseconds, got ${o.keepAliveTimeout}`);
  const s = new Server(o, limits);
  const url = await s.listen(host, o.port ?? 8080);
  return { url, close: (c) => s.close(c?.cancel ?? false) };
}

class Server {
  private readonly http = createServer((req, res) => void this.handle(req, res));
  private closing = false;
  private active = 0;
  private readonly queue: { go: (granted: boolean) => void }[] = [];
  private readonly running = new Set<AbortController>();
  private idle: (() => void) | null = null;
  private readonly created = Math.floor(Date.now() / 1000);

  constructor(
    private readonly o: ServerOptions,
    private readonly limits: ServerLimits,
  ) {
    if (o.keepAliveTimeout !== undefined) this.http.keepAliveTimeout = o.keepAliveTimeout;
  }

  listen(host: string, port: number): Promise<string> {
    return new Promise((resolve, reject) => {
      this.http.once('error', (e: NodeJS.ErrnoException) => reject(e.code === 'EADDRINUSE' ? new UserError(`serve: port ${port} on ${host} is in use; pick another with --port`) : e));
      this.http.listen(port, host, () => {
        const a = this.http.address() as AddressInfo;
        const h = a.family === 'IPv6' ? `[${a.address}]` : a.address;
        resolve(`http://${h}:${a.port}/v1`);
      });
    });
  }

  async close(cancel: boolean): Promise<void> {
    this.closing = true;
    if (cancel) for (const ac of this.running) ac.abort();
    // The queue drains into 503s; requests in flight finish.
    for (const q of this.queue.splice(0)) q.go(false);
    if (this.active > 0) await new Promise<void>((r) => (this.idle = r));
    await new Promise<void>((r) => {
      this.http.close(() => r());
      this.http.closeAllConnections();
    });
  }

  /** Waits for a decoding slot; 429 when the queue is full. Returns the release. */
  private async admit(signal: AbortSignal): Promise<() => void> {
    if (this.active < this.limits.maxConcurrency) this.active++;
    else {
      if (this.queue.length >= this.limits.maxQueue) throw new ApiError(429, `the server is busy: ${this.active} requests decoding and ${this.queue.length} waiting (the most it holds); retry later`);
      // A freed slot is handed over as it is (`active` unchanged), so no newcomer takes it first.
      const granted = await new Promise<boolean>((resolve) => {
        const entry = { go: resolve };
        this.queue.push(entry);
        signal.addEventListener('abort', () => {
          const k = this.queue.indexOf(entry);
          if (k >= 0) this.queue.splice(k, 1);
          resolve(false);
        }, { once: true });
      });
      if (!granted) throw this.closing ? new ApiError(503, 'the server is shutting down') : new ApiError(499, 'the client went away');
    }
    let done = false;
    return () => {
      if (done) return;
      done = true;
      const next = this.queue.shift();
      if (next) next.go(true);
      else {
        this.active--;
        if (this.active === 0 && this.idle) this.idle();
      }
    };
  }

  private async handle(req: IncomingMessage, res: ServerResponse): Promise<void> {
    const ac = new AbortController();
    res.on('close', () => {
      if (!res.writableFinished) ac.abort();
    });
    try {
      if (this.closing) throw new ApiError(503, 'the server is shutting down');
      if (this.o.apiKey && req.headers.authorization !== `Bearer ${this.o.apiKey}`) throw new ApiError(401, 'invalid or missing API key (Authorization: Bearer KEY)', 'authentication_error', null, 'invalid_api_key');
      const path = (req.url ?? '/').split('?')[0];
      if (path === '/health' && req.method === 'GET') return json(res, 200, { status: 'ok' });
      let rollout: Rollout | null = null;
      let route = path;
      const m = /^\/rollouts\/([^/]+)(\/v1\/.*)$/.exec(path);
      if (m && this.o.routes?.rollout) {
        rollout = this.o.routes.rollout(decodeURIComponent(m[1]));
        if (!rollout) throw new ApiError(404, `no rollout "${decodeURIComponent(m[1])}"`, 'not_found_error', null, 'rollout_not_found');
        route = m[2];
      }
      if (route === '/v1/models' && req.method === 'GET') {
        return json(res, 200, { object: 'list', data: [{ id: this.o.model, object: 'model', created: this.created, owned_by: 'prefzoo', max_model_len: this.o.engine.maxPositions }] });
      }
      const kind = route === '/v1/chat/completions' ? 'chat' : route === '/v1/completions' ? 'completion' : null;
      if (!kind) throw new ApiError(404, `no route ${req.method} ${path}`, 'not_found_error', null, 'unknown_url');
      if (req.method !== 'POST') throw new ApiError(405, `${route} takes POST`, 'invalid_request_error', null, 'method_not_allowed');
      const body = await readJson(req, this.limits.maxBodyBytes);
      const plan = kind === 'chat' ? chatPlan(body, this.limits) : completionPlan(body, this.limits);
      if (plan.model !== this.o.model) throw new ApiError(404, `the model "${plan.model}" does not exist; this server serves "${this.o.model}"`, 'not_found_error', 'model', 'model_not_found');
      if (rollout && plan.n !== 1) throw new ApiError(400, '"n" must be 1 on a rollout\'s path', 'invalid_request_error', 'n');
      const release = await this.admit(ac.signal);
      this.running.add(ac);
      try {
        if (kind === 'chat') await this.chat(plan as ChatPlan, rollout, res, ac.signal);
        else await this.completion(plan as CompletionPlan, rollout, res, ac.signal);
      } finally {
        this.running.delete(ac);
        release();
      }
    } catch (e) {
      if (ac.signal.aborted && !this.closing) return; // the client went away
      const err = e instanceof ApiError ? e : e instanceof UserError ? new ApiError(400, e.message) : ac.signal.aborted ? new ApiError(503, 'cancelled: the server is shutting down') : new ApiError(500, `internal error: ${(e as Error)?.message ?? e}`);
      if (!res.headersSent) json(res, err.status, errorBody(err), err.status === 413 ? { connection: 'close' } : {});
      else if (!res.writableEnded) {
        res.write(`data: ${JSON.stringify(errorBody(err))}\n\n`);
        res.end();
      }
    }
  }

  /** The engine request's common part: token budget, random streams, sampling (a rollout's overriding). */
  private common(plan: PlanBase, promptIds: number[], rollout: Rollout | null, param: string) {
    const engine = this.o.engine;
    const left = engine.maxPositions - promptIds.length;
    if (left < 1) throw new ApiError(400, `the prompt is ${promptIds.length} tokens; the model has ${engine.maxPositions} positions`, 'invalid_request_error', param, 'context_length_exceeded');
    if (plan.maxTokens !== null && plan.maxTokens > left) {
      throw new ApiError(400, `max_tokens ${plan.maxTokens} plus the prompt's ${promptIds.length} tokens pass the model's ${engine.maxPositions} positions (at most ${left} here)`, 'invalid_request_error', 'max_tokens', 'context_length_exceeded');
    }
    let maxTokens = plan.maxTokens ?? left;
    if (rollout) {
      if (rollout.maxTokens !== undefined) maxTokens = Math.min(maxTokens, rollout.maxTokens);
      const r = rollout.sampling;
      return { maxTokens, rngs: [rollout.rng], sampling: { temperature: r.temperature, topP: r.top_p, topK: r.top_k }, ...(rollout.keep !== undefined ? { keep: rollout.keep } : {}) };
    }
    const seed = plan.seed ?? randomInt(2 ** 32);
    return { maxTokens, rngs: Array.from({ length: plan.n }, (_, i) => choiceRandom(seed, i)), sampling: plan.sampling };
  }

  private async chat(plan: ChatPlan, rollout: Rollout | null, res: ServerResponse, signal: AbortSignal): Promise<void> {
    const engine = this.o.engine;
    const tools = plan.toolChoice === 'none' ? [] : plan.tools;
    const force = plan.toolChoice === 'required' ? 'required' : typeof plan.toolChoice === 'object' ? plan.toolChoice : null;
    const continued = !force && rollout?.prompt ? rollout.prompt(plan.messages, tools) : null;
    const { promptIds, forced } = continued ? { promptIds: continued, forced: '' } : engine.chatPrompt(plan.messages, tools, force);
    const c = this.common(plan, promptIds, rollout, 'messages');
    const id = `chatcmpl-${randomBytes(12).toString('hex')}`;
    const created = Math.floor(Date.now() / 1000);
    const head = { id, object: 'chat.completion.chunk', created, model: this.o.model };
    const tokenText = (t: number) => engine.tok.decode([t], { skipSpecialTokens: false });
    const decode = (ids: readonly number[]) => engine.tok.decode(ids, { skipSpecialTokens: false });
    const callId = () => `call_${randomBytes(12).toString('hex')}`;
    const streams = plan.stream ? Array.from({ length: c.rngs.length }, () => new TextStream({ decode, stopIds: new Set(engine.stopIds), stop: plan.stop, tools: tools.length ? engine.format : null, forced })) : [];
    if (plan.stream) {
      sse(res);
      for (let i = 0; i < streams.length; i++) {
        const first: Record<string, unknown> = { index: i, delta: { role: 'assistant', content: '' }, logprobs: null, finish_reason: null };
        const chunk: Record<string, unknown> = { ...head, choices: [first] };
        if (plan.returnTokenIds && i === 0) chunk.prompt_token_ids = promptIds;
        send(res, chunk);
      }
    }
    const results = await engine.run({
      promptIds,
      ...c,
      stop: plan.stop,
      logprobs: plan.logprobs,
      topLogprobs: plan.topLogprobs,
      signal,
      onToken: plan.stream
        ? (i, t) => {
            const content = streams[i].push(t.id);
            const choice: Record<string, unknown> = { index: i, delta: content ? { content } : {}, logprobs: plan.logprobs ? { content: chatLogprobs(tokenText, [t.id], [t.logprob], t.top ? [t.top] : null), refusal: null } : null, finish_reason: null };
            if (plan.returnTokenIds) choice.token_ids = [t.id];
            if (content || plan.logprobs || plan.returnTokenIds) send(res, { ...head, choices: [choice] });
          }
        : undefined,
    });
    // Each choice read back: its text (a forced call's opening first) and its tool calls.
    const answers = results.map((r) => {
      const text = forced + r.text;
      const parsed = tools.length ? engine.parseTools(text) : null;
      const calls = parsed && parsed.toolCalls.length ? openaiToolCalls(parsed.toolCalls, callId) : [];
      const finish = calls.length && r.finish === 'stop' ? ('tool_calls' as const) : r.finish;
      return { r, text, parsed, calls, finish, content: calls.length ? parsed!.content : text };
    });
    if (rollout) {
      const a = answers[0];
      await rollout.record({ promptIds, completionIds: a.r.ids, logps: a.r.logprobs, finishReason: a.finish, text: a.content, toolCalls: a.parsed?.toolCalls ?? [], messages: plan.messages, tools });
    }
    const completionTokens = results.reduce((s, r) => s + r.ids.length, 0);
    if (plan.stream) {
      answers.forEach((a, i) => {
        const tail = a.calls.length ? restOf(a.content, a.text, streams[i].sent) : streams[i].flush();
        if (tail) send(res, { ...head, choices: [{ index: i, delta: { content: tail }, logprobs: null, finish_reason: null }] });
        a.calls.forEach((call, k) => {
          send(res, { ...head, choices: [{ index: i, delta: { tool_calls: [{ index: k, id: call.id, type: 'function', function: { name: call.function.name, arguments: '' } }] }, logprobs: null, finish_reason: null }] });
          send(res, { ...head, choices: [{ index: i, delta: { tool_calls: [{ index: k, function: { arguments: call.function.arguments } }] }, logprobs: null, finish_reason: null }] });
        });
        send(res, { ...head, choices: [{ index: i, delta: {}, logprobs: null, finish_reason: a.finish }] });
      });
      if (plan.includeUsage) send(res, { ...head, choices: [], usage: usage(promptIds.length, completionTokens) });
      res.end('data: [DONE]\n\n');
      return;
    }
    const out: Record<string, unknown> = {
      id,
      object: 'chat.completion',
      created,
      model: this.o.model,
      choices: answers.map((a, i) => {
        const message: Record<string, unknown> = { role: 'assistant', content: a.calls.length && a.content === '' ? null : a.content, refusal: null };
        if (a.calls.length) message.tool_calls = a.calls;
        const choice: Record<string, unknown> = { index: i, message, logprobs: plan.logprobs ? { content: chatLogprobs(tokenText, a.r.ids, a.r.logprobs, a.r.top), refusal: null } : null, finish_reason: a.finish };
        if (plan.returnTokenIds) choice.token_ids = a.r.ids;
        return choice;
      }),
      usage: usage(promptIds.length, completionTokens),
    };
    if (plan.returnTokenIds) out.prompt_token_ids = promptIds;
    json(res, 200, out);
  }

  private async completion(plan: CompletionPlan, rollout: Rollout | null, res: ServerResponse, signal: AbortSignal): Promise<void> {
    const engine = this.o.engine;
    const tok = engine.tok;
    let promptIds: number[];
    if (typeof plan.prompt === 'string') promptIds = tok.encode(plan.prompt, { addSpecialTokens: true });
    else {
      const badId = plan.prompt.find((t) => t >= tok.vocabSize);
      if (badId !== undefined) throw new ApiError(400, `"prompt" holds token id ${badId}; the vocabulary has ${tok.vocabSize}`, 'invalid_request_error', 'prompt');
      promptIds = plan.prompt;
    }
    if (promptIds.length === 0) throw new ApiError(400, '"prompt" is empty', 'invalid_request_error', 'prompt');
    const c = this.common(plan, promptIds, rollout, 'prompt');
    const id = `cmpl-${randomBytes(12).toString('hex')}`;
    const created = Math.floor(Date.now() / 1000);
    const head = { id, object: 'text_completion', created, model: this.o.model };
    const tokenText = (t: number) => tok.decode([t], { skipSpecialTokens: false });
    const decode = (ids: readonly number[]) => tok.decode(ids, { skipSpecialTokens: false });
    const streams = plan.stream ? Array.from({ length: c.rngs.length }, () => new TextStream({ decode, stopIds: new Set(engine.stopIds), stop: plan.stop, tools: null })) : [];
    const offsets = streams.map(() => 0);
    if (plan.stream) sse(res);
    const results: ChoiceResult[] = await engine.run({
      promptIds,
      ...c,
      stop: plan.stop,
      logprobs: plan.logprobs,
      topLogprobs: plan.topLogprobs,
      signal,
      onToken: plan.stream
        ? (i, t) => {
            const text = streams[i].push(t.id);
            const choice: Record<string, unknown> = { index: i, text, logprobs: plan.logprobs ? completionLogprobs(tokenText, [t.id], [t.logprob], t.top ? [t.top] : null, offsets[i]) : null, finish_reason: null };
            offsets[i] += tokenText(t.id).length;
            if (plan.returnTokenIds) choice.token_ids = [t.id];
            if (text || plan.logprobs || plan.returnTokenIds) send(res, { ...head, choices: [choice] });
          }
        : undefined,
    });
    if (rollout) {
      const r = results[0];
      const prompt = typeof plan.prompt === 'string' ? plan.prompt : decode(plan.prompt);
      await rollout.record({ promptIds, completionIds: r.ids, logps: r.logprobs, finishReason: r.finish, text: r.text, toolCalls: [], messages: [{ role: 'user', content: prompt }], tools: [] });
    }
    const completionTokens = results.reduce((s, r) => s + r.ids.length, 0);
    if (plan.stream) {
      results.forEach((r, i) => {
        const tail = streams[i].flush();
        send(res, { ...head, choices: [{ index: i, text: tail, logprobs: null, finish_reason: r.finish }] });
      });
      if (plan.includeUsage) send(res, { ...head, choices: [], usage: usage(promptIds.length, completionTokens) });
      res.end('data: [DONE]\n\n');
      return;
    }
    const out: Record<string, unknown> = {
      ...head,
      choices: results.map((r, i) => {
        const choice: Record<string, unknown> = { index: i, text: r.text, logprobs: plan.logprobs ? completionLogprobs(tokenText, r.ids, r.logprobs, r.top, 0) : null, finish_reason: r.finish };
        if (plan.returnTokenIds) choice.token_ids = r.ids;
        return choice;
      }),
      usage: usage(promptIds.length, completionTokens),
    };
    if (plan.returnTokenIds) out.prompt_token_ids = promptIds;
    json(res, 200, out);
  }
}

/**
 * The random stream of choice `i` of a request with `seed`: `sampleRandom(seed, 0, i)`, the stream
 * `prefzoo generate --seed SEED` gives sample i of its first prompt.
 */
export function choiceRandom(seed: number, i: number): SeededRandom {
  return sampleRandom(seed, 0, i);
}

/** The content still to send after a streamed prefix of `sent` characters of `text`. */
function restOf(content: string, text: string, sent: number): string {
  const prefix = text.slice(0, sent).trimStart();
  return content.startsWith(prefix) ? content.slice(prefix.length) : '';
}

function json(res: ServerResponse, status: number, body: unknown, headers: Record<string, string> = {}): void {
  const data = JSON.stringify(body);
  res.writeHead(status, { 'content-type': 'application/json', 'content-length': Buffer.byteLength(data), ...headers });
  res.end(data);
}

function sse(res: ServerResponse): void {
  res.writeHead(200, { 'content-type': 'text/event-stream', 'cache-control': 'no-cache', connection: 'keep-alive' });
  res.flushHeaders();
}

function send(res: ServerResponse, chunk: unknown): void {
  if (!res.writableEnded) res.write(`data: ${JSON.stringify(chunk)}\n\n`);
}

/** The body as JSON: 413 past `limit` bytes, 400 when it is not JSON. */
async function readJson(req: IncomingMessage, limit: number): Promise<unknown> {
  const declared = Number(req.headers['content-length']);
  if (Number.isFinite(declared) && declared > limit) throw new ApiError(413, `the request body is ${declared} bytes; the limit is ${limit}`, 'invalid_request_error', null, 'request_too_large');
  const parts: Buffer[] = [];
  let size = 0;
  for await (const chunk of req) {
    size += (chunk as Buffer).length;
    if (size > limit) throw new ApiError(413, `the request body passes the limit of ${limit} bytes`, 'invalid_request_error', null, 'request_too_large');
    parts.push(chunk as Buffer);
  }
  const text = Buffer.concat(parts).toString('utf8');
  try {
    return JSON.parse(text);
  } catch (e) {
    throw new ApiError(400, `the request body is not JSON: ${(e as Error).message}`, 'invalid_request_error', null, 'invalid_json');
  }
}
