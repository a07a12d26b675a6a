/**
 * The serving engine: requests become rows of generation sessions (src/models/generate.ts), no HTTP
 * here. Sampling settings are per session, so the engine keeps a small pool of sessions over the
 * one decoder, keyed by (temperature, top_p, top_k): requests with the same settings decode
 * together (continuous batching; the `n` choices of a request share one prefill), others in their
 * own session. Each choice draws from its own random stream, so what it draws does not depend on
 * what else is decoding.
 *
 * A choice's log-probabilities are the sampler's: each token's under the distribution it was drawn
 * from (temperature, top-k, top-p applied). At temperature 0 (greedy) they are the model's plain
 * log-softmax instead, since the sampler's distribution is then all on one token (read only with
 * `logprobs`: without it greedy rows batch as any and their log-probabilities stay 0). `top_logprobs`
 * reads the whole distribution at each step: the row's logits, then a one-token `generate()` drawing
 * from them without another run (such rows decode alone, a run each token).
 */
import type { Message, ToolSpec } from '../chat.ts';
import { UserError } from '../errors.ts';
import { maxPositions } from '../models/config.ts';
import { Decoder, GenerationSession, stopStringEnds, type GenerationRow, type StopReason } from '../models/generate.ts';
import { samplingDistribution, samplingOptions } from '../models/sampling.ts';
import type { SeededRandom } from '../random.ts';
import type { LoadedTokenizer } from '../tokenize/index.ts';
import { chatPromptIds } from '../tokenize/conversation.ts';
import { parseToolCalls, templateToolSupport, type ParsedTurn, type ToolCallFormat } from '../tokenize/tool-calls.ts';

/** Sampling settings of a request (those that pick the session it decodes in). */
export interface Sampling {
  temperature: number;
  topP: number;
  topK: number;
}

/** One of the most likely tokens at a step, with its log-probability. */
export interface TopToken {
  id: number;
  logprob: number;
}

/** One token as it is drawn (what streaming sends). */
export interface DrawnToken {
  id: number;
  /** Its log-probability (see the file's comment); -9999 where it lies outside top-k/top-p. */
  logprob: number;
  /** With `topLogprobs`: the most likely tokens at this step, most likely first. */
  top?: TopToken[];
}

export interface EngineRequest {
  promptIds: readonly number[];
  sampling: Sampling;
  /** Tokens per choice at most. */
  maxTokens: number;
  /** Texts that end a choice (not part of its text). */
  stop?: readonly string[];
  /** One random stream per choice (their number is `n`). */
  rngs: readonly SeededRandom[];
  /** Whether log-probabilities will be read (at temperature 0 they then need a run per token). */
  logprobs?: boolean;
  /** The most likely tokens to list at each step (0: none; needs a run per token). */
  topLogprobs?: number;
  /** Closes the request's rows (a client that went away). */
  signal?: AbortSignal;
  /**
   * Keep the (one) choice's row and its cache under this key once it ends: a later request with
   * the same key whose prompt starts with every id of that row feeds only the ids after them
   * (`row.extend`) instead of a prefill (GRPO --agent: a rollout's next call continues its
   * conversation). The row keeps drawing from the random stream it started with. `release(key)`
   * frees it.
   */
  keep?: string;
  /** Each choice's tokens as they are drawn. */
  onToken?: (choice: number, token: DrawnToken) => void;
}

export type FinishReason = 'stop' | 'length';

export interface ChoiceResult {
  /** The completion's ids as sampled, the stop id included when one ended it. */
  ids: number[];
  logprobs: number[];
  /** With `topLogprobs`: per token, the most likely tokens at that step. */
  top: TopToken[][] | null;
  /** The completion's text: without the stop id, cut before a stop string. */
  text: string;
  finish: FinishReason;
  stop: StopReason;
}

/** How JSON carries a log-probability of a token outside the sampler's top-k/top-p (vLLM's choice too). */
export const OUTSIDE = -9999;

/**
 * The runtime settings a served model's decoder adds to the run's: ONNX Runtime's intra-op threads
 * spin within a step but stop when it returns, so between steps the cores go to the HTTP work and
 * to clients on the same machine instead of to threads waiting for the next step (issue 43's
 * batch-1 comparison: 0.91× against 0.84×, medians of three alternating runs; docs/performance.md).
 */
export const SERVE_RUNTIME = { spinStop: true } as const;

/** How many sessions (distinct sampling settings) stay open at once; an idle one is closed past this. */
const POOL = 4;

export interface EngineOptions {
  /** Rows decoded together in one session at most (default 32). */
  maxBatch?: number;
  /** Prompts whose caches each session keeps for later requests starting with them (default 8; see `SessionOptions.prefixCache`). */
  prefixCache?: number;
}

interface Pooled {
  session: GenerationSession;
  rows: number;
  used: number;
}

/** Requests → rows of generation sessions over one decoder and its tokenizer. */
export class ServeEngine {
  private readonly pool = new Map<string, Pooled>();
  private clock = 0;
  /** Requests in `run` now, and when the engine last went from idle to busy (performance.now()). */
  private busy = 0;
  private busySince = 0;
  private busyMs = 0;
  private closed = false;
  /** Rows kept for a key's next request (`EngineRequest.keep`), with the session they live in. */
  private readonly kept = new Map<string, { row: GenerationRow; pooled: Pooled }>();
  /** Requests that continued a kept row (no prefill of their prompt). */
  continued = 0;
  /** Prompt tokens copied from kept prompts (`EngineOptions.prefixCache`) in sessions closed so far. */
  private hitsClosed = 0;
  readonly stopIds: number[];
  readonly format: ToolCallFormat | null;
  readonly maxBatch: number;
  private readonly prefixCache: number;

  constructor(
    private decoder: Decoder,
    readonly tok: LoadedTokenizer,
    o: EngineOptions = {},
  ) {
    this.stopIds = tok.stopIds.length ? tok.stopIds : tok.eosId !== null ? [tok.eosId] : [];
    this.format = templateToolSupport(tok.chatTemplate).format;
    this.maxBatch = o.maxBatch ?? 32;
    this.prefixCache = o.prefixCache ?? 8;
    if (!(Number.isInteger(this.maxBatch) && this.maxBatch >= 1)) throw new UserError(`serve: maxBatch must be a positive integer, got ${o.maxBatch}`);
  }

  /** The model's positions: a prompt plus its max_tokens must fit. */
  get maxPositions(): number {
    return maxPositions(this.decoder.config);
  }

  /** Rows open now, over every session (0 once every request has ended or was cancelled). */
  get rows(): number {
    let n = 0;
    for (const p of this.pool.values()) n += p.rows;
    return n;
  }

  /**
   * Serves another model from now on (GRPO's weights after an optimizer step): every session is
   * closed and the next request opens one over `decoder`. No request may be in flight.
   */
  async setModel(decoder: Decoder): Promise<void> {
    this.releaseAll();
    if (this.rows > 0) throw new Error(`serve: setModel() while ${this.rows} rows are generating`);
    await this.closeSessions();
    this.decoder = decoder;
  }

  /** Frees the row kept under `key` (see `EngineRequest.keep`). */
  release(key: string): void {
    const k = this.kept.get(key);
    if (!k) return;
    this.kept.delete(key);
    k.row.close();
    k.pooled.rows--;
  }

  private releaseAll(): void {
    for (const key of [...this.kept.keys()]) this.release(key);
  }

  /** Closes every session; requests after it are refused. */
  async close(): Promise<void> {
    this.releaseAll();
    this.closed = true;
    await this.closeSessions();
  }

  /** Prompt tokens requests copied from kept prompts instead of prefilling them, since the engine was made. */
  get prefixHits(): number {
    let n = this.hitsClosed;
    for (const p of this.pool.values()) n += p.session.prefixHits;
    return n;
  }

  private async closeSessions(): Promise<void> {
    const all = [...this.pool.values()];
    for (const p of all) this.hitsClosed += p.session.prefixHits;
    this.pool.clear();
    for (const p of all) await p.session.close();
  }

  private session(s: Sampling): Pooled {
    if (this.closed) throw new Error('serve: the engine is closed');
    const key = `${s.temperature}/${s.topP}/${s.topK}`;
    let p = this.pool.get(key);
    if (!p) {
      // Past the pool's size, the least recently used idle session goes.
      if (this.pool.size >= POOL) {
        const idle = [...this.pool.entries()].filter(([, q]) => q.rows === 0).sort((a, b) => a[1].used - b[1].used)[0];
        if (idle) {
          this.pool.delete(idle[0]);
          this.hitsClosed += idle[1].session.prefixHits;
          void idle[1].session.close();
        }
      }
      const tok = this.tok;
      const session = GenerationSession.open(this.decoder, {
        temperature: s.temperature,
        topP: s.topP,
        topK: s.topK,
        logprobs: true,
        stopIds: this.stopIds,
        decode: (ids) => tok.decode(ids, { skipSpecialTokens: false }),
        padId: tok.padId ?? tok.eosId ?? 0,
        vocabLimit: tok.vocabSize,
        maxBatch: this.maxBatch,
        prefixCache: this.prefixCache,
      });
      p = { session, rows: 0, used: 0 };
      this.pool.set(key, p);
    }
    p.used = ++this.clock;
    return p;
  }

  /** Decodes every choice of a request; rejects (its rows closed) when `signal` aborts. */
  async run(req: EngineRequest): Promise<ChoiceResult[]> {
    const sampling = samplingOptions({ temperature: req.sampling.temperature, topP: req.sampling.topP, topK: req.sampling.topK });
    const s = { temperature: sampling.temperature, topP: sampling.topP, topK: sampling.topK };
    if (req.promptIds.length + req.maxTokens > this.maxPositions) {
      throw new UserError(`a prompt of ${req.promptIds.length} tokens plus max_tokens ${req.maxTokens} passes the model's ${this.maxPositions} positions`);
    }
    req.signal?.throwIfAborted();
    const p = this.session(s);
    // A kept row this prompt continues: only the ids after it are fed. Otherwise it is let go.
    const k = req.keep !== undefined ? this.kept.get(req.keep) : undefined;
    let reused: GenerationRow | null = null;
    if (k && req.keep !== undefined) {
      this.kept.delete(req.keep);
      const held = k.row.ids;
      if (k.pooled === p && req.rngs.length === 1 && held.length <= req.promptIds.length && held.every((id, i) => req.promptIds[i] === id)) {
        k.row.extend(req.promptIds.slice(held.length));
        reused = k.row;
        this.continued++;
      } else {
        k.row.close();
        k.pooled.rows--;
      }
    }
    // Started in one turn of the event loop: the choices' identical prompts are prefilled once.
    const rows = reused ? [reused] : req.rngs.map((rng) => p.session.start(req.promptIds, rng, req.maxTokens));
    if (!reused) p.rows += rows.length;
    const keep = req.keep !== undefined && rows.length === 1 ? req.keep : undefined;
    const release = (row: GenerationRow, ok: boolean) => {
      if (ok && keep !== undefined && !req.signal?.aborted && !this.closed) {
        this.kept.set(keep, { row, pooled: p });
        return;
      }
      row.close();
      p.rows--;
    };
    const abort = () => {
      for (const r of rows) r.close();
    };
    req.signal?.addEventListener('abort', abort, { once: true });
    if (this.busy++ === 0) this.busySince = performance.now();
    try {
      return await Promise.all(
        rows.map((row, i) =>
          this.choice(row, i, req, s).then(
            (r) => (release(row, true), r),
            (e: unknown) => {
              release(row, false);
              throw e;
            },
          ),
        ),
      );
    } finally {
      req.signal?.removeEventListener('abort', abort);
      if (--this.busy === 0) this.busyMs += performance.now() - this.busySince;
    }
  }

  /**
   * Wall seconds during which at least one request was decoding, since the engine was made (what a
   * GRPO --agent round reports as decoding; the rest of the round is the agents' own code).
   */
  get busySeconds(): number {
    return (this.busyMs + (this.busy > 0 ? performance.now() - this.busySince : 0)) / 1000;
  }

  /** The distribution log-probabilities are reported under (the sampler's; the model's at temperature 0). */
  private reported(s: Sampling): { temperature: number; topP: number; topK: number } {
    return s.temperature === 0 ? { temperature: 1, topP: 1, topK: 0 } : s;
  }

  private async choice(row: GenerationRow, i: number, req: EngineRequest, s: Sampling): Promise<ChoiceResult> {
    const stop = req.stop ?? [];
    const top = req.topLogprobs ?? 0;
    const ids: number[] = [];
    const logprobs: number[] = [];
    const tops: TopToken[][] | null = top > 0 || (s.temperature === 0 && req.logprobs) ? [] : null;
    let reason: StopReason;
    if (tops) {
      // A run per token: the distribution at each step, then one token drawn from it.
      const dist = this.reported(s);
      for (;;) {
        const logits = await row.logits();
        const d = samplingDistribution(logits, dist);
        const seg = await row.generate({ maxNewTokens: 1 });
        const id = seg.ids[0];
        const k = d.ids.indexOf(id);
        const lp = k < 0 ? OUTSIDE : Math.log(d.probs[k]);
        const best = topOf(d, top);
        ids.push(id);
        logprobs.push(lp);
        tops.push(best);
        req.onToken?.(i, top > 0 ? { id, logprob: lp, top: best } : { id, logprob: lp });
        if (seg.stop === 'stop-id' || seg.stop === 'positions') {
          reason = seg.stop;
          break;
        }
        if (stop.length && stopStringEnds(ids, stop, (x) => this.tok.decode(x, { skipSpecialTokens: false }))) {
          reason = 'stop-string';
          break;
        }
        if (ids.length >= req.maxTokens) {
          reason = 'budget';
          break;
        }
      }
    } else {
      const seg = await row.generate({
        maxNewTokens: req.maxTokens,
        stopStrings: stop,
        onToken: (id, logp) => req.onToken?.(i, { id, logprob: finite(logp!) }),
      });
      ids.push(...seg.ids);
      for (const l of seg.logps!) logprobs.push(finite(l));
      reason = seg.stop;
    }
    return { ids, logprobs, top: top > 0 ? tops : null, text: this.completionText(ids, reason, stop), finish: reason === 'stop-id' || reason === 'stop-string' ? 'stop' : 'length', stop: reason };
  }

  /** The text of a completion's ids: without the stop id, cut before the first stop string. */
  completionText(ids: readonly number[], reason: StopReason, stop: readonly string[]): string {
    const text = this.tok.decode(reason === 'stop-id' ? ids.slice(0, -1) : ids, { skipSpecialTokens: false });
    return reason === 'stop-string' ? cutAtStop(text, stop) : text;
  }

  /** Reads tool calls out of a completion's text in the template's format. */
  parseTools(text: string): ParsedTurn {
    if (!this.format) return { content: text, toolCalls: [], errors: [] };
    return parseToolCalls(text, this.format);
  }

  /**
   * A chat's prompt ids (the template's render with the generation prompt and the tools), and the
   * text a forced tool call starts with (`tool_choice` required or a named function): fed after
   * the generation prompt as part of the prompt, so the model continues a call.
   */
  chatPrompt(messages: readonly Message[], tools: readonly ToolSpec[], force: 'required' | { name: string } | null): { promptIds: number[]; forced: string } {
    if (tools.length > 0) {
      const support = templateToolSupport(this.tok.chatTemplate);
      if (!support.tools || !this.format) throw new UserError(`the model's chat template does not render tools in a format calls can be read back from (Hermes <tool_call> or Llama 3 JSON); serve it with --chat-template FILE`);
    }
    const promptIds = chatPromptIds(this.tok, messages, tools.length ? { tools } : {});
    if (!force) return { promptIds, forced: '' };
    const forced = forcedCallText(this.format!, force);
    return { promptIds: [...promptIds, ...this.tok.encode(forced, { addSpecialTokens: false })], forced };
  }
}

/** The opening of a tool call in `format`: any function, or the named one. */
export function forcedCallText(format: ToolCallFormat, force: 'required' | { name: string }): string {
  const name = force === 'required' ? '' : `${JSON.stringify(force.name)}, "${format === 'hermes' ? 'arguments' : 'parameters'}": `;
  const open = force === 'required' ? '{"name": "' : `{"name": ${name}`;
  return format === 'hermes' ? `<tool_call>\n${open}` : open;
}

/** The text before the first of `stop` it holds. */
export function cutAtStop(text: string, stop: readonly string[]): string {
  let at = text.length;
  for (const s of stop) {
    const i = text.indexOf(s);
    if (i >= 0 && i < at) at = i;
  }
  return text.slice(0, at);
}

function finite(x: number): number {
  return Number.isFinite(x) ? x : OUTSIDE;
}

/** The `k` most likely of a distribution, most likely first (ties: the lower id). */
function topOf(d: { ids: number[]; probs: number[] }, k: number): TopToken[] {
  if (k <= 0) return [];
  const order = d.ids.map((_, j) => j).sort((a, b) => d.probs[b] - d.probs[a] || d.ids[a] - d.ids[b]);
  return order.slice(0, k).map((j) => ({ id: d.ids[j], logprob: Math.log(d.probs[j]) }));
}
