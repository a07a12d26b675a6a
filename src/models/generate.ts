/**
 * Generation: one loop over rows that decode together, on the CPU or WebGPU (a backend each, see
 * backend.ts). A `GenerationSession` is opened over a model (or a geometric mixture of models, as
 * Nash-MD samples) with the sampling options; `start` gives a row for a prompt, and each
 * `row.generate()` asks for one segment: tokens until a stop id, a stop string or the segment's
 * budget. The session's one loop decodes every row that asks together, at most `maxBatch` at a
 * time; a row that is not asking (its caller busy, e.g. running a tool) leaves the batch and its
 * cache is parked. `row.extend(ids)` appends tokens the model did not sample (a tool's answer), fed
 * in one run into the row's cache when it next generates; `row.fork(rng)` continues the same tokens
 * with another random stream from a copy of the cache.
 *
 * What the loop saves: identical prompts asked together are prefilled once and copied (a GRPO
 * group's completions, SPPO's samples, Nash-MD's pairs), and when a row finishes, a waiting one
 * takes its place in the batch at once, prefilled at its own length (no padding to the longest).
 * `sharePrompts: false, continuous: false` turn both off: batches of `maxBatch` rows, left-padded,
 * one after the other (the generation before sessions, kept for comparison).
 *
 * Each row draws from its own random stream, one number a token, so which rows decode together
 * never changes what a row draws. `generateIds` is the whole-batch function over a session.
 */
import { maxPositions } from './config.ts';
import { UserError } from '../errors.ts';
import type { SeededRandom } from '../random.ts';
import type { LoadedTokenizer } from '../tokenize/index.ts';
import { mixLogits, sampleToken, samplingDistribution, samplingOptions, type SamplingOptions } from './sampling.ts';
import { Decoder } from './decoder.ts';
import { CpuBackend } from './generate-cpu.ts';
import { DeviceBackend } from './generate-device.ts';
import type { DecodeBackend, PickSpec, RunOut } from './backend.ts';

// The session runs over decoders: callers make them (Decoder.create) from here.
export { Decoder } from './decoder.ts';

/** One decoder of a mixture and its weight w_i in softmax(Σ w_i·logits_i). */
export interface MixturePart {
  decoder: Decoder;
  weight: number;
}

export interface SessionOptions extends SamplingOptions {
  /** Ids that end a segment (kept as its last token). */
  stopIds?: readonly number[];
  /** Texts that end a segment once the segment's decoded text contains one (needs `decode`). */
  stopStrings?: readonly string[];
  /** The text of token ids (for `stopStrings`). */
  decode?: (ids: readonly number[]) => string;
  /** Rows decoded together at most (default 32). */
  maxBatch?: number;
  /** Id fed under the mask where prompts are left-padded (`continuous: false`). Default 0. */
  padId?: number;
  /**
   * Only ids below this are drawn: embeddings are often padded past the tokenizer's vocabulary, and
   * those rows (never trained) must not be sampled. Default: the model's vocab_size.
   */
  vocabLimit?: number;
  /** Sample on the host from the logits even where the graph could pick the tokens (for measuring). */
  hostSampling?: boolean;
  /**
   * Return each sampled token's log-probability under the distribution it was drawn from (after
   * temperature, top-k and top-p; 0 for greedy). Where the graph draws (CPU, one model, no
   * top-k/top-p) it returns them with the token; otherwise they are computed on the host.
   */
  logprobs?: boolean;
  /** Identical prompts starting together are prefilled once (default true). */
  sharePrompts?: boolean;
  /** A finished row's slot takes the next waiting row at once, prompts prefilled at their own length (default true). */
  continuous?: boolean;
  /** Slots (prompt + new tokens) a row is expected to need at most: what a batch cache reserves. */
  slots?: number;
  /**
   * Prompts whose caches are kept for later rows (0: none, the default): a new row whose prompt
   * starts with at least `PREFIX_MIN` tokens of a kept one copies that part of its cache and feeds
   * only the rest in one run, where a server's requests share a system prompt and tools. The most
   * recently used are kept. Backends that cannot cut a cache (the device) ignore it.
   */
  prefixCache?: number;
}

/** The fewest tokens of a kept prompt a new row must start with to copy them (`SessionOptions.prefixCache`). */
export const PREFIX_MIN = 16;

/** Why a segment ended. */
export type StopReason = 'stop-id' | 'stop-string' | 'budget' | 'positions';

/** What one `generate()` decoded. */
export interface Segment {
  /** Sampled ids, ending with the stop id when `stop` is 'stop-id'. */
  ids: number[];
  stop: StopReason;
  /** With `logprobs`: each sampled id's log-probability under the distribution it was drawn from. */
  logps?: Float32Array;
}

/** What one `generate()` asks for besides the session's options. */
export interface SegmentOptions {
  /** Tokens at most (default: the row's budget from `start`). */
  maxNewTokens?: number;
  /** Texts that end this segment, in place of the session's `stopStrings` (needs the session's `decode`). */
  stopStrings?: readonly string[];
  /**
   * Called with each token as it is drawn (and its log-probability with the session's `logprobs`, as
   * the segment's `logps` will hold it), before the segment resolves; a throw ends the segment with that error.
   */
  onToken?: (id: number, logp: number | undefined) => void;
}

/** A sequence being generated (see `GenerationSession.start`). */
export interface GenerationRow {
  /** Every token of the row: the prompt, the sampled segments and the extensions, in order. */
  readonly ids: readonly number[];
  readonly promptLength: number;
  /** Decodes the next segment, at most `maxNewTokens` tokens (default: the row's budget from `start`). */
  generate(o?: SegmentOptions): Promise<Segment>;
  /**
   * The next token's logits (the mixture's Σ w_i·logits_i, before temperature, `[V]`), after one run
   * over what the row has not fed yet; a `generate()` after it draws from them without another run.
   */
  logits(): Promise<Float32Array>;
  /** Appends tokens the model did not sample; the next `generate()` feeds them in one run. */
  extend(ids: readonly number[]): void;
  /** A new row with the same tokens and a copy of this row's cache, drawing from `rng`. */
  fork(rng: SeededRandom, maxNewTokens?: number): GenerationRow;
  /** Frees the row's cache; the row cannot be used after. */
  close(): void;
}

let timer: ((label: string, ms: number) => void) | null = null;
/** Milliseconds reported since the iteration began (the rest of it is reported as bookkeeping). */
let timed = 0;

/**
 * Reports how long each piece of a generation iteration takes (scripts/bench/decode-profile.ts):
 * 'prefill' (new rows' prefill and rows' extend runs), 'forward' (the batch's step), 'sample' (the
 * draws and stop checks), 'bookkeeping' (the rest: rows leaving and joining, the turn callers get
 * between iterations). null stops.
 */
export function setGenerateTimer(t: ((label: string, ms: number) => void) | null): void {
  timer = t === null ? null : (label, ms) => ((timed += ms), t(label, ms));
  report = t;
}
let report: ((label: string, ms: number) => void) | null = null;

interface Want {
  kind: 'generate' | 'logits';
  budget: number;
  stopStrings?: readonly string[];
  onToken?: (id: number, logp: number | undefined) => void;
  seg: number[];
  logps: number[];
  order: number;
  resolve: (s: Segment) => void;
  resolveLogits: (l: Float32Array) => void;
  reject: (e: unknown) => void;
}

class Row implements GenerationRow {
  /** How many of `seq` are in the row's cache. */
  cached = 0;
  /** Where its cache is: none yet, in the batch, parked outside it. */
  where: 'none' | 'batch' | 'parked' = 'none';
  want: Want | null = null;
  closed = false;
  /** The row whose cache this one copies at the next iteration (a fork). */
  forkOf: Row | null = null;
  /** Logits of the next token, fetched by `logits()` (per part, `[V]`). */
  ready: Float32Array[] | null = null;

  constructor(
    private readonly session: GenerationSession,
    readonly id: number,
    readonly seq: number[],
    readonly promptLength: number,
    readonly rng: SeededRandom,
    readonly budget: number,
  ) {}

  get ids(): readonly number[] {
    return this.seq;
  }

  private keyOf: string | null = null;

  /** The row's tokens as a key (prompts shared by several rows). */
  get key(): string {
    this.keyOf ??= this.seq.join(',');
    return this.keyOf;
  }

  get pending(): number {
    return this.seq.length - this.cached;
  }

  private check(what: string): void {
    if (this.closed || this.session.closed) throw new Error(`generation: ${what} on a closed ${this.closed ? 'row' : 'session'}`);
    if (this.want) throw new Error(`generation: ${what} while the row is generating`);
  }

  generate(o: SegmentOptions = {}): Promise<Segment> {
    this.check('generate()');
    const budget = o.maxNewTokens ?? this.budget;
    if (!(Number.isInteger(budget) && budget >= 1)) throw new UserError(`max_new_tokens must be a positive integer, got ${budget}`);
    if (o.stopStrings?.length && !this.session.decodes) throw new Error('generation: stopStrings need the session\'s decode function');
    return new Promise<Segment>((resolve, reject) => {
      this.want = { kind: 'generate', budget, stopStrings: o.stopStrings, onToken: o.onToken, seg: [], logps: [], order: this.session.ticket(), resolve, resolveLogits: () => {}, reject };
      this.session.wake();
    });
  }

  logits(): Promise<Float32Array> {
    this.check('logits()');
    return new Promise<Float32Array>((resolveLogits, reject) => {
      this.want = { kind: 'logits', budget: 0, seg: [], logps: [], order: this.session.ticket(), resolve: () => {}, resolveLogits, reject };
      this.session.wake();
    });
  }

  extend(ids: readonly number[]): void {
    this.check('extend()');
    if (this.seq.length + ids.length > this.session.maxPositions) {
      throw new UserError(`generation: ${this.seq.length} tokens plus ${ids.length} exceed the model's ${this.session.maxPositions} positions`);
    }
    this.seq.push(...ids);
    if (ids.length) {
      this.ready = null;
      this.keyOf = null;
    }
  }

  fork(rng: SeededRandom, maxNewTokens = this.budget): GenerationRow {
    this.check('fork()');
    const child = this.session.newRow(this.seq.slice(), this.promptLength, rng, maxNewTokens);
    child.ready = this.ready;
    if (this.where !== 'none' || this.forkOf) {
      child.forkOf = this;
      child.cached = this.cached;
    }
    return child;
  }

  close(): void {
    if (this.closed) return;
    this.closed = true;
    this.want?.reject(new Error('generation: the row was closed while generating'));
    this.want = null;
    this.session.wake();
  }
}

/**
 * The one generation loop over a model or a mixture (see the file's comment). Open it, `start`
 * rows, `generate` them (concurrently: rows asking together decode together), `close` it.
 */
export class GenerationSession {
  private readonly rows = new Map<number, Row>();
  /**
   * Prompts prefilled while more rows with the same tokens wait for a slot: a parked copy of the
   * cache (under an id of no row) and each part's logits for the first token, so a waiting row
   * starts from a copy instead of a prefill.
   */
  private readonly prompts = new Map<string, { id: number; logits: Float32Array[] }>();
  /** Kept prompts (`SessionOptions.prefixCache`): a parked copy of each one's cache, under an id of no row. */
  private readonly prefixes: { id: number; ids: number[]; used: number }[] = [];
  private prefixClock = 0;
  /** Prompt tokens new rows copied from kept prompts instead of feeding them (`SessionOptions.prefixCache`). */
  prefixHits = 0;
  private nextId = 0;
  private tickets = 0;
  private pump: Promise<void> | null = null;
  private again = false;
  private failed: unknown = null;
  /** @internal After `close()`. */
  closed = false;
  private readonly backend: DecodeBackend;
  private readonly sampling: Required<SamplingOptions>;
  private readonly stop: Set<number>;
  private readonly limit: number;
  private readonly maxBatch: number;
  private readonly vocab: number;
  readonly maxPositions: number;

  private constructor(
    private readonly parts: MixturePart[],
    private readonly o: SessionOptions,
  ) {
    if (parts.length === 0) throw new Error('generation: no decoder');
    this.sampling = samplingOptions(o);
    const config = parts[0].decoder.config;
    this.maxPositions = maxPositions(config);
    this.stop = new Set(o.stopIds ?? []);
    this.vocab = parts[0].decoder.vocabSize;
    this.limit = Math.min(o.vocabLimit ?? config.vocab_size, config.vocab_size);
    this.maxBatch = o.maxBatch ?? 32;
    if (!(Number.isInteger(this.maxBatch) && this.maxBatch >= 1)) throw new UserError(`batch size for generation must be a positive integer, got ${o.maxBatch}`);
    if (o.stopStrings?.length && !o.decode) throw new Error('generation: stopStrings need a decode function');
    const decoders = parts.map((p) => p.decoder);
    const slots = Math.min(o.slots ?? 256, this.maxPositions);
    const padId = o.padId ?? 0;
    if (decoders.every((d) => d.device)) this.backend = new DeviceBackend(parts.map((p) => ({ decoder: p.decoder, weight: p.weight })), { padId });
    else if (decoders.some((d) => d.device)) throw new Error('generation: a mixture of decoders on different devices');
    else this.backend = new CpuBackend(decoders, { maxBatch: this.maxBatch, slots, padId });
  }

  /** Whether stop strings can be checked (the session was given `decode`). */
  get decodes(): boolean {
    return !!this.o.decode;
  }

  /** A session over one decoder (weight 1) or a mixture of them. */
  static open(parts: Decoder | MixturePart[], o: SessionOptions = {}): GenerationSession {
    return new GenerationSession(parts instanceof Decoder ? [{ decoder: parts, weight: 1 }] : parts, o);
  }

  /** A new row for `promptIds`, drawing from `rng`; `maxNewTokens` is its segments' default budget. */
  start(promptIds: readonly number[], rng: SeededRandom, maxNewTokens = 256): GenerationRow {
    if (promptIds.length >= this.maxPositions) throw new UserError(`a prompt of ${promptIds.length} tokens fills the model's ${this.maxPositions} positions`);
    return this.newRow(promptIds.slice(), promptIds.length, rng, maxNewTokens);
  }

  /** @internal */
  newRow(seq: number[], promptLength: number, rng: SeededRandom, budget: number): Row {
    if (this.failed) throw this.failed;
    if (this.closed) throw new Error('generation: start() on a closed session');
    const r = new Row(this, this.nextId++, seq, promptLength, rng, budget);
    this.rows.set(r.id, r);
    return r;
  }

  /** @internal */
  ticket(): number {
    return this.tickets++;
  }

  /** @internal Runs the loop (again) after a row asked for something. */
  wake(): void {
    if (this.pump) {
      this.again = true;
      return;
    }
    this.pump = this.run();
  }

  private async run(): Promise<void> {
    try {
      // Rows asked for in the same turn of the event loop start together.
      await new Promise((r) => setImmediate(r));
      if (this.failed) throw this.failed;
      do {
        this.again = false;
        for (;;) {
          timed = 0;
          const t0 = report ? performance.now() : 0;
          const more = await this.iterate();
          // Let callers react to what finished (close it, extend and ask again) before the next step.
          if (more) await new Promise((r) => setImmediate(r));
          report?.('bookkeeping', performance.now() - t0 - timed);
          if (!more) break;
        }
      } while (this.again);
    } catch (e) {
      this.failed = e;
      for (const r of this.rows.values()) {
        r.want?.reject(e);
        r.want = null;
      }
    }
    // In the same turn as the last look at `again`: a row asking after this starts a new pump.
    this.pump = null;
  }

  /** Frees every row's cache; rows still generating are rejected. */
  async close(): Promise<void> {
    this.closed = true;
    while (this.pump) await this.pump;
    for (const r of this.rows.values()) {
      r.want?.reject(new Error('generation: the session was closed'));
      r.want = null;
    }
    this.rows.clear();
    await this.backend.close();
  }

  private pickSpec(): PickSpec | null {
    if (this.o.hostSampling) return null;
    const s = this.sampling;
    if (this.parts.length === 1 && this.parts[0].weight !== 1) return null;
    const logprobs = this.o.logprobs ?? false;
    const spec: PickSpec | null = s.temperature === 0 ? { head: 'greedy', limit: this.limit } : s.topK === 0 && s.topP === 1 ? { head: 'sample', limit: this.limit, temperature: s.temperature, logprobs } : null;
    return spec && this.backend.canPick(spec) ? spec : null;
  }

  /** One pass: forks copied, closed rows freed, then one token for every row asking (within maxBatch). Returns whether rows still ask. */
  private async iterate(): Promise<boolean> {
    const b = this.backend;
    for (const r of this.rows.values()) {
      if (!r.forkOf) continue;
      const src = r.forkOf;
      r.forkOf = null;
      if (src.where === 'none') r.cached = 0;
      else {
        await b.copy(src.id, r.id);
        r.where = 'parked';
      }
    }
    for (const r of [...this.rows.values()]) {
      if (!r.closed || [...this.rows.values()].some((c) => c.forkOf === r)) continue;
      if (r.where === 'parked') b.free(r.id);
      if (r.where !== 'batch') this.rows.delete(r.id);
    }
    if (this.prompts.size > 0) {
      const waiting = new Set([...this.rows.values()].filter((r) => r.where === 'none' && !r.closed).map((r) => r.key));
      for (const [key, p] of this.prompts) {
        if (waiting.has(key)) continue;
        b.free(p.id);
        this.prompts.delete(key);
      }
    }
    if (this.prefixes.length > 0) await this.fromPrefixes();
    const wanting = [...this.rows.values()].filter((r) => r.want).sort((x, y) => x.want!.order - y.want!.order);
    // Rows in the batch go on only if they ask for one token's step.
    const steps = (r: Row) => r.want?.kind === 'generate' && !r.ready && r.pending === 1;
    const leaving = b.batchRows().filter((id) => !steps(this.rows.get(id)!));
    await b.leave(leaving, (id) => !this.rows.get(id)!.closed);
    for (const id of leaving) {
      const r = this.rows.get(id)!;
      if (r.closed) this.rows.delete(id);
      else r.where = 'parked';
    }
    if (wanting.length === 0) return false;
    const pick = this.pickSpec();
    const continuous = this.o.continuous ?? true;
    let free = this.maxBatch - b.batchRows().length;
    // Answers to sample: each row with the run that fed it and its index there.
    const answers: { row: Row; out: RunOut; i: number }[] = [];
    const ready: Row[] = [];
    const copies: [number, Row][] = [];
    const uniform = (rows: Row[]) => (pick?.head === 'sample' ? Float64Array.from(rows, (r) => r.rng.next()) : null);

    // Parked rows asking for a step join the batch first.
    const joining: Row[] = [];
    for (const r of wanting) {
      if (r.where === 'batch') continue;
      if (r.ready && r.pending === 0) ready.push(r);
      else if (r.where === 'parked' && steps(r) && free > 0) {
        joining.push(r);
        free--;
      }
    }
    await b.join(joining.map((r) => r.id), this.room(joining));
    for (const r of joining) r.where = 'batch';

    let t0 = timer ? performance.now() : 0;
    const batch = b.batchRows().map((id) => this.rows.get(id)!);
    if (batch.length > 0) {
      const out = await b.step(batch.map((r) => r.seq[r.cached]), pick, uniform(batch));
      batch.forEach((r, i) => {
        r.cached++;
        answers.push({ row: r, out, i });
      });
      if (timer) timer('forward', performance.now() - t0);
    }

    t0 = timer ? performance.now() : 0;
    // Parked rows with several tokens to feed (extended, or asking for logits). Rows asking for
    // logits: one run each. Rows joining the batch: those with as many tokens cached and as many to
    // feed in one run where the backend can (`extendRows`: 16 served requests starting with one kept
    // prompt are one run, not 16), each row's numbers those of its own run.
    const groups = new Map<string, Row[]>();
    for (const r of wanting) {
      if (r.where !== 'parked' || r.pending === 0 || steps(r)) continue;
      if (r.want!.kind === 'logits') {
        const out = await b.extend(r.id, r.seq.slice(r.cached), null, null);
        r.cached = r.seq.length;
        answers.push({ row: r, out, i: 0 });
        continue;
      }
      if (free === 0) continue;
      free--;
      const key = b.extendRows ? `${r.cached}:${r.seq.length}` : `row ${r.id}`;
      const group = groups.get(key);
      if (group) group.push(r);
      else groups.set(key, [r]);
    }
    for (const rows of groups.values()) {
      const tokens = rows.map((r) => r.seq.slice(r.cached));
      const u = pick ? uniform(rows) : null;
      const out = rows.length > 1 ? await b.extendRows!(rows.map((r) => r.id), tokens, pick, u) : await b.extend(rows[0].id, tokens[0], pick, u);
      rows.forEach((r, i) => {
        r.cached = r.seq.length;
        answers.push({ row: r, out, i });
      });
      await b.join(rows.map((r) => r.id), this.room(rows));
      for (const r of rows) r.where = 'batch';
    }
    // New rows: identical prompts prefilled once (the others copy the cache), at their own length,
    // or (not continuous) a batch left-padded to its longest when no row is decoding.
    let fresh = wanting.filter((r) => r.where === 'none');
    if (this.prompts.size > 0) {
      // Rows whose prompt was prefilled for others: a copy of its cache, the first token drawn from its logits.
      fresh = fresh.filter((r) => {
        const p = this.prompts.get(r.key);
        if (!p || free === 0 || r.want!.kind !== 'generate') return true;
        free--;
        copies.push([p.id, r]);
        return false;
      });
      for (const [id, r] of copies) {
        // Straight into the batch: the row draws its first token from the prompt's logits now and
        // steps with the batch from the next iteration.
        await b.clone(id, r.id);
        r.where = 'batch';
        r.cached = r.seq.length;
        r.ready = this.prompts.get(r.key)!.logits;
        ready.push(r);
      }
    }
    const admit = continuous || b.batchRows().length === 0 ? fresh : [];
    if (admit.length > 0) await this.prefill(admit, pick, uniform, answers, free, fresh);
    if (timer && admit.length > 0) timer('prefill', performance.now() - t0);

    t0 = timer ? performance.now() : 0;
    this.take(answers, ready);
    timer?.('sample', performance.now() - t0);
    return [...this.rows.values()].some((r) => r.want);
  }

  /** The slots `rows` may need at most (their tokens and what is left of their segment's budget): a batch made for them reserves it, so it does not grow as they decode. */
  private room(rows: readonly Row[]): number | undefined {
    if (rows.length === 0) return undefined;
    return Math.max(...rows.map((r) => r.seq.length + Math.max(1, (r.want?.budget ?? 1) - (r.want?.seg.length ?? 0))));
  }

  /**
   * New rows that start with a kept prompt (at least PREFIX_MIN tokens of it) get a parked copy of
   * that part of its cache: the rest of their prompt is fed by an extend run (or, one token left,
   * as the batch's step). Rows whose prompt other new rows share are left to be prefilled once.
   */
  private async fromPrefixes(): Promise<void> {
    const fresh = [...this.rows.values()].filter((r) => r.where === 'none' && r.want && !r.closed && !r.ready && !r.forkOf);
    const count = new Map<string, number>();
    for (const r of fresh) count.set(r.key, (count.get(r.key) ?? 0) + 1);
    for (const r of fresh) {
      if (count.get(r.key)! > 1 || this.prompts.has(r.key)) continue;
      let best: (typeof this.prefixes)[number] | null = null;
      let len = 0;
      for (const p of this.prefixes) {
        const n = Math.min(p.ids.length, r.seq.length - 1);
        let i = 0;
        while (i < n && p.ids[i] === r.seq[i]) i++;
        if (i > len) [best, len] = [p, i];
      }
      if (!best || len < PREFIX_MIN) continue;
      best.used = ++this.prefixClock;
      await this.backend.copy(best.id, r.id, len, this.room([r]));
      r.cached = len;
      r.where = 'parked';
      this.prefixHits += len;
    }
  }

  /** Keeps a copy of a just-prefilled row's cache as a prompt later rows may start with. */
  private async keepPrefix(r: Row): Promise<void> {
    const limit = this.o.prefixCache ?? 0;
    if (limit <= 0 || !this.backend.copiesPrefix || r.seq.length < PREFIX_MIN) return;
    // Already kept (or a longer prompt starting with it is): nothing new to keep.
    if (this.prefixes.some((p) => p.ids.length >= r.seq.length && r.seq.every((id, i) => p.ids[i] === id))) return;
    const id = this.nextId++;
    await this.backend.copy(r.id, id);
    this.prefixes.push({ id, ids: r.seq.slice(), used: ++this.prefixClock });
    if (this.prefixes.length > limit) {
      const old = this.prefixes.reduce((a, p) => (p.used < a.used ? p : a));
      this.backend.free(old.id);
      this.prefixes.splice(this.prefixes.indexOf(old), 1);
    }
  }

  private async prefill(fresh: Row[], pick: PickSpec | null, uniform: (rows: Row[]) => Float64Array | null, answers: { row: Row; out: RunOut; i: number }[], free: number, waiting: Row[]): Promise<void> {
    const b = this.backend;
    const share = this.o.sharePrompts ?? true;
    const continuous = this.o.continuous ?? true;
    // Prompts more rows wait for than are admitted now: their cache is kept for them.
    const count = new Map<string, number>();
    if (share) for (const r of waiting) count.set(r.key, (count.get(r.key) ?? 0) + 1);
    // Groups of rows with the same tokens: the first is prefilled, the rest copy it.
    const byTokens = new Map<string, Row[]>();
    const admitted: Row[] = [];
    for (const r of fresh) {
      if (free === 0) break;
      const key = share ? r.key : String(r.id);
      const g = byTokens.get(key);
      if (g) g.push(r);
      else byTokens.set(key, [r]);
      admitted.push(r);
      free--;
    }
    const heads = [...byTokens.values()].map((g) => g[0]);
    // A prompt shared by several rows gives the logits (each row draws its own token from them);
    // the others are picked in the graph where it can.
    const runs: { rows: Row[]; pad: boolean; pick: PickSpec | null }[] = [];
    const add = (rows: Row[], pad: boolean, p: PickSpec | null) => rows.length && runs.push({ rows, pad, pick: p });
    // Rows whose first token is drawn on the host: a prompt several rows share, or a row asking for logits.
    const group = (r: Row) => byTokens.get(share ? r.key : String(r.id))!;
    const kept = (r: Row) => share && (count.get(r.key) ?? 0) > group(r).length;
    const shared = (r: Row) => group(r).length > 1 || kept(r) || group(r).some((x) => x.want!.kind === 'logits');
    if (!continuous || b.padPrefill) {
      add(heads.filter((r) => !shared(r)), true, pick);
      add(heads.filter(shared), true, null);
    } else {
      const byLength = new Map<number, Row[]>();
      for (const r of heads) {
        const k = r.seq.length === 0 ? -1 : r.seq.length;
        byLength.set(k, [...(byLength.get(k) ?? []), r]);
      }
      for (const [len, rows] of byLength) {
        add(rows.filter((r) => !shared(r)), len === -1, pick);
        add(rows.filter(shared), len === -1, null);
      }
    }
    const budget = (r: Row) => r.seq.length + (r.want!.budget || 1) - 1;
    for (const run of runs) {
      const room = Math.max(...admitted.map(budget));
      const out = await b.prefill({ rows: run.rows.map((r) => r.id), prompts: run.rows.map((r) => r.seq), pad: run.pad, room }, run.pick, run.pick ? uniform(run.rows) : null);
      run.rows.forEach((r, i) => {
        r.cached = r.seq.length;
        r.where = 'batch';
        answers.push({ row: r, out, i });
      });
      // Only rows prefilled at their own length are kept (the device backend's cache keeps a left-padded row's padding).
      if (!run.pad) for (const r of run.rows) await this.keepPrefix(r);
      for (const r of run.rows) {
        if (kept(r) && !this.prompts.has(r.key)) {
          const id = this.nextId++;
          await b.copy(r.id, id);
          const i = run.rows.indexOf(r);
          this.prompts.set(r.key, { id, logits: out.logits!.map((l) => l.slice(i * this.vocab, i * this.vocab + this.limit)) });
        }
        for (const d of group(r).slice(1)) {
          await b.clone(r.id, d.id);
          d.cached = d.seq.length;
          d.where = 'batch';
          answers.push({ row: d, out, i: run.rows.indexOf(r) });
        }
      }
    }
  }

  /** Draws each answered row's token (or hands over its logits) and ends the rows that stop. */
  private take(answers: { row: Row; out: RunOut; i: number }[], ready: Row[]): void {
    const V = this.vocab;
    const lim = this.limit;
    const rowLogits = (a: { out: RunOut; i: number }) => a.out.logits!.map((l) => l.subarray(a.i * V, a.i * V + lim));
    const all = [...answers, ...ready.map((row) => ({ row, out: null as RunOut | null, i: 0 }))];
    for (const a of all) {
      const r = a.row;
      // A row closed by an earlier row's onToken (a request cancelled as its tokens streamed) takes nothing.
      if (!r.want) continue;
      const w = r.want;
      const logits = a.out ? (a.out.tokens ? null : rowLogits(a as { out: RunOut; i: number })) : r.ready!;
      r.ready = null;
      if (w.kind === 'logits') {
        const own = logits!.map((l) => l.slice());
        r.ready = own;
        r.want = null;
        w.resolveLogits(own.length === 1 && this.parts[0].weight === 1 ? own[0] : mixLogits(own.map((l, k) => ({ logits: l, weight: this.parts[k].weight }))).slice());
        continue;
      }
      let tok: number;
      if (!logits) {
        tok = Number(a.out!.tokens![a.i]);
        // The graph's log-probability of its draw; a greedy pick's is 0, as logProb's.
        if (this.o.logprobs) {
          const lp = (a.out as { logps?: ArrayLike<number> }).logps;
          if (!lp && this.sampling.temperature !== 0) throw new Error('generation: a backend drew tokens without their log-probabilities');
          w.logps.push(lp ? lp[a.i] : 0);
        }
      } else {
        const mixed = mixLogits(logits.map((l, k) => ({ logits: l, weight: this.parts[k].weight })));
        tok = sampleToken(mixed, this.sampling, r.rng);
        if (this.o.logprobs) w.logps.push(logProb(mixed, tok, this.sampling));
      }
      r.seq.push(tok);
      w.seg.push(tok);
      if (w.onToken) {
        try {
          w.onToken(tok, this.o.logprobs ? Math.fround(w.logps[w.logps.length - 1]) : undefined);
        } catch (e) {
          r.want = null;
          w.reject(e);
          continue;
        }
        if (r.want !== w) continue;
      }
      const stops = w.stopStrings ?? this.o.stopStrings;
      const reason: StopReason | null = this.stop.has(tok)
        ? 'stop-id'
        : stops?.length && stopStringEnds(w.seg, stops, this.o.decode!)
          ? 'stop-string'
          : w.seg.length >= w.budget
            ? 'budget'
            : r.seq.length >= this.maxPositions
              ? 'positions'
              : null;
      if (reason) {
        r.want = null;
        w.resolve(this.o.logprobs ? { ids: w.seg, stop: reason, logps: Float32Array.from(w.logps) } : { ids: w.seg, stop: reason });
      }
    }
  }
}

/**
 * Whether the text of `seg` holds one of `stops`, asked after each token: one that is not in the text
 * before the last token ends in what the last token changed, at the text's end, so only a tail is
 * decoded — the last n tokens, n doubled from 4 until their text is longer than the last token's own
 * by the longest stop string and 8 characters (room for a partial character or a stripped leading
 * space where the tail starts). Each token's check decodes a few tokens, not the whole segment.
 */
export function stopStringEnds(seg: readonly number[], stops: readonly string[], decode: (ids: readonly number[]) => string): boolean {
  let longest = 0;
  for (const s of stops) longest = Math.max(longest, s.length);
  const need = decode(seg.slice(-1)).length + longest + 8;
  for (let n = Math.min(4, seg.length); ; n = Math.min(2 * n, seg.length)) {
    const text = decode(seg.slice(seg.length - n));
    if (text.length >= need || n === seg.length) return stops.some((s) => text.includes(s));
  }
}

/** log p(tok) under the distribution `sampleToken` draws from (temperature, top-k, top-p); 0 for greedy. */
export function logProb(logits: ArrayLike<number>, tok: number, o: Required<SamplingOptions>): number {
  if (o.temperature === 0) return 0;
  if (o.topK === 0 && o.topP === 1) {
    let max = -Infinity;
    for (let i = 0; i < logits.length; i++) if (logits[i] > max) max = logits[i];
    let z = 0;
    for (let i = 0; i < logits.length; i++) z += Math.exp((logits[i] - max) / o.temperature);
    return (logits[tok] - max) / o.temperature - Math.log(z);
  }
  const { ids, probs } = samplingDistribution(logits, o);
  const k = ids.indexOf(tok);
  return k < 0 ? -Infinity : Math.log(probs[k]);
}

export interface GenerateRequest {
  promptIds: number[];
  /** This row's random stream (see `sampleRandom`). */
  rng: SeededRandom;
}

export interface GenerateOptions extends SamplingOptions {
  maxNewTokens: number;
  /** Ids that end a response (kept as its last token). */
  stopIds: readonly number[];
  /** Id fed under the mask for left padding. */
  padId: number;
  /** Rows per forward pass (default 32). */
  batchSize?: number;
  /** Sample on the host from the logits even where the graph could pick the tokens (for measuring). */
  hostSampling?: boolean;
  /**
   * Only ids below this are drawn: embeddings are often padded past the tokenizer's vocabulary, and
   * those rows (never trained) must not be sampled. Default: the model's vocab_size.
   */
  vocabLimit?: number;
  /** See `SessionOptions`: shared prompts prefilled once, continuous batching (both default true). */
  sharePrompts?: boolean;
  continuous?: boolean;
  /** Each id's log-probability under the distribution it was drawn from (see `SessionOptions.logprobs`). */
  logprobs?: boolean;
}

export interface Generated {
  /** Sampled ids, ending with the stop id when `stopped`. */
  ids: number[];
  /** True when a stop id ended the response (false: max_new_tokens reached). */
  stopped: boolean;
  /** With `logprobs`: each id's log-probability under the distribution it was drawn from. */
  logps?: Float32Array;
}

/**
 * Samples a response per request from softmax(Σ_i w_i·logits_i / temperature) (one part with
 * weight 1 is plain sampling), with top-k/top-p, until a stop id or `maxNewTokens`: one session,
 * every request a row, closed when it ends.
 */
export async function generateIds(parts: MixturePart[], reqs: GenerateRequest[], o: GenerateOptions): Promise<Generated[]> {
  if (parts.length === 0) throw new Error('generateIds: no decoder');
  samplingOptions(o);
  if (!(Number.isInteger(o.maxNewTokens) && o.maxNewTokens >= 1)) throw new UserError(`--max-new-tokens must be a positive integer, got ${o.maxNewTokens}`);
  const maxPos = maxPositions(parts[0].decoder.config);
  const P = Math.max(1, ...reqs.map((r) => r.promptIds.length));
  if (P + o.maxNewTokens > maxPos) throw new UserError(`a prompt of ${P} tokens plus max_new_tokens ${o.maxNewTokens} exceeds the model's ${maxPos} positions`);
  const session = GenerationSession.open(parts, { ...o, maxBatch: o.batchSize ?? 32, slots: P + o.maxNewTokens - 1 });
  // Similar prompt lengths start together (less padding where batches are padded); each row's
  // stream makes the order irrelevant to what it draws.
  const order = reqs.map((_, i) => i).sort((a, b) => reqs[a].promptIds.length - reqs[b].promptIds.length);
  const out: Generated[] = new Array(reqs.length);
  try {
    await Promise.all(
      order.map(async (i) => {
        const row = session.start(reqs[i].promptIds, reqs[i].rng, o.maxNewTokens);
        const seg = await row.generate();
        row.close();
        out[i] = { ids: seg.ids, stopped: seg.stop === 'stop-id' };
        if (seg.logps) out[i].logps = seg.logps;
      }),
    );
  } finally {
    await session.close();
  }
  return out;
}

/** The text of a sampled response: its ids without the final stop token. */
export function responseText(tok: LoadedTokenizer, ids: readonly number[], stopped: boolean): string {
  return tok.decode(stopped ? ids.slice(0, -1) : ids, { skipSpecialTokens: false });
}
