/**
 * Batched sampling with a key/value cache. A `Decoder` holds the prefill and step sessions of one
 * model; `generateIds` left-pads a batch of prompts, prefills once, then feeds one token per step,
 * drawing each row's token from the (mixture of the) decoders' logits with that row's own random
 * stream. The cache is preallocated (`SlotCache`: fixed shapes, grown a chunk of slots at a time) and
 * each step writes only its new keys/values into it; the step graph attends over unfilled slots
 * masked out, and the logits and new keys/values land in buffers allocated once. Finished rows leave
 * the batch (the rows after them move up in place), so a long answer in the batch does not make the
 * short ones pay.
 */
import { type ModelConfig, maxPositions } from './config.ts';
import type { FloatTensor } from './checkpoint.ts';
import type { LoraConfig } from './lora.ts';
import { modelParameterShapes } from './params.ts';
import { Session, toOrt, type Feeds, type OrtTensor, type RuntimeOptions } from '../runtime/session.ts';
import { UserError } from '../errors.ts';
import type { SeededRandom } from '../random.ts';
import type { LoadedTokenizer } from '../tokenize/index.ts';
import { buildDecodeGraph, cacheShape, pastName, presentName, type DecodeHead } from './decode.ts';
import { mixLogits, sampleToken, samplingOptions, type SamplingOptions } from './sampling.ts';
import { DeviceDecode, generateBatchOnDevice } from './generate-device.ts';

/** The cache of a batch: `[B, KV, L, hd]` per layer and kind, as fed back under the past names. */
export interface KVCache {
  rows: number;
  length: number;
  tensors: Feeds;
}

export interface DecoderOptions {
  runtime?: RuntimeOptions;
  /**
   * Bake the weights into the graphs (fastest for a fixed model). Without it they are graph inputs
   * and `setWeights` swaps them without new sessions (a policy that is being trained).
   */
  bake?: boolean;
  lora?: LoraConfig | null;
  /**
   * Prompt tokens per prefill run (default 256): a batch's prompts are prefilled a few rows at a
   * time, so the prefill's activations (kept by ONNX Runtime's arena for the session's life) are
   * those of this many tokens, not of the whole batch.
   */
  prefillTokens?: number;
}

/**
 * What a step returns for each row: `greedy` the argmax, `sample` a draw with each row's `uniform`
 * number, both among the ids below `limit`, picked inside the graph (see `DecodeHead`); no pick,
 * the logits.
 */
export type Pick = { head: 'greedy'; limit: number } | { head: 'sample'; limit: number; temperature: number; uniform: Float64Array };

export class Decoder {
  private params: Feeds = {};
  /** Prefill and step sessions by head, built on first use (a decoder that only samples never builds the logits graphs). */
  private readonly sessions = new Map<string, Promise<Session>>();
  /** The cache buffers of the last generation, for the next one (see `recycle`). */
  private spare: Float32Array[] = [];
  /** On WebGPU: the sessions and weights of generation on the device (generate-device.ts). */
  readonly device: DeviceDecode | null;

  private constructor(
    readonly config: ModelConfig,
    private readonly shapes: Map<string, number[]>,
    readonly baked: boolean,
    private readonly build: { weights?: Map<string, FloatTensor>; lora?: LoraConfig | null; runtime?: RuntimeOptions; prefillTokens: number },
  ) {
    this.device = build.runtime?.ep === 'webgpu' ? new DeviceDecode(config, shapes, { ...build, runtime: build.runtime }) : null;
  }

  static async create(config: ModelConfig, weights: Map<string, FloatTensor>, o: DecoderOptions = {}): Promise<Decoder> {
    const bake = o.bake ?? false;
    // Without ONNX Runtime's memory pattern unless asked for: the planned block of every intermediate
    // of a run comes on top of the arena (measured: ~75 MB less peak RSS at batch 32, no slower).
    const runtime: RuntimeOptions = { memPattern: false, ...o.runtime };
    const d = new Decoder(config, modelParameterShapes(config, { lora: o.lora }), bake, { weights: bake ? weights : undefined, lora: o.lora, runtime, prefillTokens: o.prefillTokens ?? 256 });
    if (!bake) d.setWeights((name) => weights.get(name)?.data);
    return d;
  }

  private session(past: boolean, head: DecodeHead): Promise<Session> {
    const key = `${past ? 'step' : 'prefill'}/${head}`;
    let s = this.sessions.get(key);
    if (!s) {
      const weightFirst = (this.build.runtime?.ep ?? 'cpu') === 'cpu';
      s = Session.fromGraph(buildDecodeGraph(this.config, { past, weights: this.build.weights, lora: this.build.lora, head, weightFirst }), this.build.runtime);
      this.sessions.set(key, s);
    }
    return s;
  }

  /** Whether the graph can pick tokens (its float64 sampling runs on the CPU only). */
  get picksTokens(): boolean {
    return (this.build.runtime?.ep ?? 'cpu') === 'cpu';
  }

  /** Feeds these parameter values from now on (graph-input decoders only); arrays are not copied. */
  setWeights(get: (name: string) => Float32Array | undefined): void {
    if (this.baked) throw new Error('setWeights: this decoder has its weights baked in');
    for (const [name, shape] of this.shapes) {
      const data = get(name);
      if (!data) throw new Error(`decoder: no values for parameter ${name}`);
      this.params[name] = toOrt('float32', data, shape);
    }
  }

  /**
   * Feeds these tensors from now on (graph-input decoders only): host tensors, or on WebGPU GPU
   * buffers (e.g. the training session's parameters), which the device generation feeds without a
   * copy. They are not copied: the caller keeps them alive while the decoder uses them.
   */
  setWeightTensors(get: (name: string) => OrtTensor | undefined): void {
    if (this.baked) throw new Error('setWeightTensors: this decoder has its weights baked in');
    for (const name of this.shapes.keys()) {
      const t = get(name);
      if (!t) throw new Error(`decoder: no tensor for parameter ${name}`);
      this.params[name] = t;
    }
  }

  /** The parameter feeds (host or device tensors; none when baked). */
  get weightFeeds(): Feeds {
    return this.params;
  }

  get vocabSize(): number {
    return this.config.vocab_size;
  }

  /**
   * Runs S new tokens per row (S = 1 with a cache). `ids` [B, S]; `mask` [B, L] covers the cache and the new tokens.
   * Returns the logits of each row's last new token `[B, V]` and the extended cache (a new one:
   * `cache` is not changed).
   */
  async forward(ids: BigInt64Array, mask: BigInt64Array, rows: number, cache: KVCache | null): Promise<{ logits: Float32Array; cache: KVCache }> {
    const S = ids.length / rows;
    const L = mask.length / rows;
    if (cache && S !== 1) throw new Error(`decoder: a step with a cache feeds one token per row, got ${S}`);
    const feeds: Feeds = { ...this.params, input_ids: toOrt('int64', ids, [rows, S]), attention_mask: toOrt('int64', mask, [rows, L]) };
    if (cache) Object.assign(feeds, cache.tensors);
    const out = await (await this.session(cache !== null, 'logits')).run(feeds);
    const { layers, kvHeads: KV, headDim: hd } = cacheShape(this.config);
    const tensors: Feeds = {};
    for (let i = 0; i < layers; i++) {
      for (const kv of ['key', 'value'] as const) {
        const cur = out[presentName(i, kv)].data as Float32Array;
        if (!cache) {
          tensors[pastName(i, kv)] = toOrt('float32', cur, [rows, KV, S, hd]);
          continue;
        }
        // past ++ new along the positions, row and head by row and head.
        const past = cache.tensors[pastName(i, kv)].data as Float32Array;
        const P = cache.length;
        const full = new Float32Array(rows * KV * (P + S) * hd);
        for (let r = 0; r < rows * KV; r++) {
          full.set(past.subarray(r * P * hd, (r + 1) * P * hd), r * (P + S) * hd);
          full.set(cur.subarray(r * S * hd, (r + 1) * S * hd), (r * (P + S) + P) * hd);
        }
        tensors[pastName(i, kv)] = toOrt('float32', full, [rows, KV, P + S, hd]);
      }
    }
    return { logits: out.logits.data as Float32Array, cache: { rows, length: L, tensors } };
  }

  /**
   * Prefills `ids` [B, S] under `mask` [B, S] into a new cache with room for `capacity` positions
   * (grown as needed, in place up to `maxCapacity`); returns each row's pick for its last token (the
   * logits `[B, V]` without one) and the cache.
   */
  async prefill(ids: BigInt64Array, mask: BigInt64Array, rows: number, capacity: number, pick?: Pick, maxCapacity = capacity): Promise<Picked & { cache: SlotCache }> {
    const S = ids.length / rows;
    const V = this.vocabSize;
    const session = await this.session(false, headOf(pick));
    const cache = new SlotCache(cacheShape(this.config), rows, Math.max(capacity, S), V, maxCapacity, this.spare);
    this.spare = [];
    const tokens = new BigInt64Array(pick ? rows : 0);
    const logits = new Float32Array(pick ? 0 : rows * V);
    const chunk = Math.max(1, Math.floor(this.build.prefillTokens / S));
    for (let r0 = 0; r0 < rows; r0 += chunk) {
      const n = Math.min(chunk, rows - r0);
      const feeds: Feeds = { ...this.params, input_ids: toOrt('int64', ids.subarray(r0 * S, (r0 + n) * S), [n, S]), attention_mask: toOrt('int64', mask.subarray(r0 * S, (r0 + n) * S), [n, S]) };
      if (pick) Object.assign(feeds, pickFeeds(pick, n, r0));
      const out = await session.run(feeds);
      cache.writePrompt((name) => out[name].data as Float32Array, S, r0, n);
      if (pick) tokens.set(out.token.data as BigInt64Array, r0);
      else logits.set(out.logits.data as Float32Array, r0 * V);
    }
    cache.setPrompt(mask, S);
    return pick ? { tokens, cache } : { logits, cache };
  }

  /**
   * One token per row `ids` [B] into `cache` (B = cache.rows): its keys and values are written into
   * the cache's next slot. Returns each row's pick (the logits `[B, V]` without one), in the cache's
   * buffers (valid until its next step).
   */
  async step(ids: BigInt64Array, cache: SlotCache, pick?: Pick): Promise<Picked> {
    cache.reserve(1);
    const feeds: Feeds = { ...this.params, input_ids: toOrt('int64', ids, [cache.rows, 1]), attention_mask: cache.stepMask() };
    Object.assign(feeds, cache.pastFeeds());
    if (pick) Object.assign(feeds, pickFeeds(pick, cache.rows));
    await (await this.session(true, headOf(pick))).run(feeds, cache.outputs(pick !== undefined));
    cache.writeStep((name) => cache.newSlot(name));
    return pick ? { tokens: cache.tokens() } : { logits: cache.logits() };
  }

  /**
   * Keeps a finished generation's cache buffers for the next prefill (the online loops generate
   * batch after batch of the same shape): the cache is not allocated again while the last one waits
   * for the garbage collector, which held two at once.
   */
  recycle(cache: SlotCache): void {
    this.spare = cache.release();
  }

  /** Ends ONNX Runtime's profiling of the sessions built so far (`runtime.profilePrefix`), writing the traces. */
  async endProfiling(): Promise<void> {
    for (const s of this.sessions.values()) (await s).endProfiling();
  }

  async release(): Promise<void> {
    const all = await Promise.allSettled(this.sessions.values());
    this.sessions.clear();
    for (const r of all) if (r.status === 'fulfilled') await r.value.release();
    await this.device?.release();
  }
}

/** A step's result: the picked tokens `[B]`, or the logits `[B, V]`. */
export type Picked = { tokens: BigInt64Array; logits?: undefined } | { logits: Float32Array; tokens?: undefined };

function headOf(pick: Pick | undefined): DecodeHead {
  return !pick ? 'logits' : pick.head === 'sample' && pick.temperature === 1 ? 'sample-t1' : pick.head;
}

/** The pick's feeds for `rows` rows from row `first`. */
function pickFeeds(pick: Pick, rows: number, first = 0): Feeds {
  const feeds: Feeds = { vocab_limit: toOrt('int64', BigInt64Array.of(BigInt(pick.limit)), [1]) };
  if (pick.head === 'sample') {
    if (pick.temperature !== 1) feeds.temperature = toOrt('float64', Float64Array.of(pick.temperature), []);
    feeds.uniform = toOrt('float64', pick.uniform.subarray(first, first + rows), [rows, 1]);
  }
  return feeds;
}

/** Keeps cache rows `keep` (in that order). */
export function selectCacheRows(cache: KVCache, keep: number[]): KVCache {
  const tensors: Feeds = {};
  for (const [name, t] of Object.entries(cache.tensors)) {
    const [B, KV, L, hd] = t.dims as number[];
    const row = KV * L * hd;
    const src = t.data as Float32Array;
    const dst = new Float32Array(keep.length * row);
    keep.forEach((r, i) => dst.set(src.subarray(r * row, (r + 1) * row), i * row));
    if (B !== cache.rows) throw new Error('cache rows disagree');
    tensors[name] = toOrt('float32', dst, [keep.length, KV, L, hd]) as OrtTensor;
  }
  return { rows: keep.length, length: cache.length, tensors };
}

/** Cache slots are added this many at a time: fixed shapes between, and attention over at most this many unfilled slots. */
const SLOT_CHUNK = 32;

/**
 * A batch's key/value cache in place: per layer and kind one `[B, KV, capacity, hd]` buffer, of
 * which the first `length` positions are written; `mask` `[B, capacity]` marks the real ones (left
 * padding and unwritten slots are 0). A step feeds the whole buffer with its mask and writes its own
 * keys/values into slot `length`; when the slots run out the buffers grow by a chunk. Each buffer is
 * allocated once with room for `maxCapacity` slots (pages the generation never reaches are never
 * touched, so never resident) and grows within it, rows moved apart in place: the cache is never
 * held twice. The step's outputs (logits, new keys/values) go to buffers allocated with it.
 */
export class SlotCache {
  length = 0;
  private buffers = new Map<string, Float32Array>();
  private mask: BigInt64Array;
  private fresh = new Map<string, Float32Array>();
  private logitsBuf: Float32Array | null = null;
  private tokenBuf: BigInt64Array;
  private maxCapacity: number;

  constructor(
    private readonly geom: { layers: number; kvHeads: number; headDim: number },
    public rows: number,
    public capacity: number,
    private readonly vocab: number,
    maxCapacity = capacity,
    /** Buffers to use again (a finished cache's, see `release`), where long enough. */
    reuse: Float32Array[] = [],
  ) {
    const { layers, kvHeads: KV, headDim: hd } = geom;
    this.maxCapacity = Math.max(capacity, maxCapacity);
    const size = rows * KV * this.maxCapacity * hd;
    // Reused buffers hold an earlier cache's values; unwritten slots are masked, as after growing.
    const spare = reuse.filter((b) => b.length >= size);
    for (let i = 0; i < layers; i++) {
      for (const kv of ['key', 'value'] as const) {
        this.buffers.set(pastName(i, kv), spare.pop() ?? new Float32Array(size));
        this.fresh.set(presentName(i, kv), new Float32Array(rows * KV * hd));
      }
    }
    this.mask = new BigInt64Array(rows * capacity);
    this.tokenBuf = new BigInt64Array(rows);
  }

  /** Writes the prompt's `n` positions of rows `first`…`first + count − 1` (`src(presentName)`: `[count, KV, n, hd]`) into slots 0…n−1. */
  writePrompt(src: (name: string) => Float32Array, n: number, first: number, count: number): void {
    const { layers, kvHeads: KV, headDim: hd } = this.geom;
    const cap = this.capacity;
    for (let i = 0; i < layers; i++) {
      for (const kv of ['key', 'value'] as const) {
        const from = src(presentName(i, kv));
        const to = this.buffers.get(pastName(i, kv))!;
        for (let r = 0; r < count * KV; r++) to.set(from.subarray(r * n * hd, (r + 1) * n * hd), (first * KV + r) * cap * hd);
      }
    }
  }

  /** Once every row's prompt is written: its mask (`[B, n]`); the next step writes slot n. */
  setPrompt(mask: BigInt64Array, n: number): void {
    for (let b = 0; b < this.rows; b++) this.mask.set(mask.subarray(b * n, (b + 1) * n), b * this.capacity);
    this.length = n;
  }

  /** Makes room for `n` more positions (growing every buffer by whole chunks). */
  reserve(n: number): void {
    if (this.length + n <= this.capacity) return;
    let cap = Math.ceil((this.length + n) / SLOT_CHUNK) * SLOT_CHUNK;
    if (cap > this.maxCapacity && this.length + n <= this.maxCapacity) cap = this.maxCapacity;
    const { kvHeads: KV, headDim: hd } = this.geom;
    if (cap > this.maxCapacity) {
      // Past the room allocated: new buffers (a caller that did not say how long it would run).
      for (const [name, old] of this.buffers) {
        const grown = new Float32Array(this.rows * KV * cap * hd);
        for (let r = 0; r < this.rows * KV; r++) grown.set(old.subarray(r * this.capacity * hd, (r * this.capacity + this.length) * hd), r * cap * hd);
        this.buffers.set(name, grown);
      }
      this.maxCapacity = cap;
    } else {
      // Rows move apart in place, the last first (each moves to a higher offset, over rows already moved).
      for (const buf of this.buffers.values()) {
        for (let r = this.rows * KV - 1; r > 0; r--) buf.copyWithin(r * cap * hd, r * this.capacity * hd, (r * this.capacity + this.length) * hd);
      }
    }
    const mask = new BigInt64Array(this.rows * cap);
    for (let b = 0; b < this.rows; b++) mask.set(this.mask.subarray(b * this.capacity, b * this.capacity + this.length), b * cap);
    this.mask = mask;
    this.capacity = cap;
  }

  /** Writes a step's new position (`src(presentName)`: `[B, KV, 1, hd]`) into the next slot. */
  writeStep(src: (name: string) => Float32Array): void {
    const { layers, kvHeads: KV, headDim: hd } = this.geom;
    this.reserve(1);
    const cap = this.capacity;
    for (let i = 0; i < layers; i++) {
      for (const kv of ['key', 'value'] as const) {
        const from = src(presentName(i, kv));
        const to = this.buffers.get(pastName(i, kv))!;
        for (let r = 0; r < this.rows * KV; r++) {
          const o = (r * cap + this.length) * hd;
          for (let d = 0; d < hd; d++) to[o + d] = from[r * hd + d];
        }
      }
    }
    for (let b = 0; b < this.rows; b++) this.mask[b * cap + this.length] = 1n;
    this.length += 1;
  }

  /** The attention mask of a one-token step: the cache's slots, then the new token. */
  stepMask(): OrtTensor {
    const cap = this.capacity;
    const m = new BigInt64Array(this.rows * (cap + 1));
    for (let b = 0; b < this.rows; b++) {
      m.set(this.mask.subarray(b * cap, (b + 1) * cap), b * (cap + 1));
      m[b * (cap + 1) + cap] = 1n;
    }
    return toOrt('int64', m, [this.rows, cap + 1]) as OrtTensor;
  }

  /** The cache buffers as the step's past inputs (the first `rows` rows, not copied). */
  pastFeeds(): Feeds {
    const { kvHeads: KV, headDim: hd } = this.geom;
    const feeds: Feeds = {};
    const n = this.rows * KV * this.capacity * hd;
    for (const [name, buf] of this.buffers) feeds[name] = toOrt('float32', buf.length === n ? buf : buf.subarray(0, n), [this.rows, KV, this.capacity, hd]);
    return feeds;
  }

  /** Preallocated outputs of a step: logits `[B, V]` (or the picked `token` `[B]`) and each layer's new keys/values `[B, KV, 1, hd]`. */
  outputs(picked: boolean): Record<string, OrtTensor> {
    const { kvHeads: KV, headDim: hd } = this.geom;
    const out: Record<string, OrtTensor> = picked
      ? { token: toOrt('int64', this.tokens(), [this.rows]) as OrtTensor }
      : { logits: toOrt('float32', this.logits(), [this.rows, this.vocab]) as OrtTensor };
    for (const [name, buf] of this.fresh) out[name] = toOrt('float32', buf.subarray(0, this.rows * KV * hd), [this.rows, KV, 1, hd]) as OrtTensor;
    return out;
  }

  newSlot(name: string): Float32Array {
    return this.fresh.get(name)!;
  }

  logits(): Float32Array {
    this.logitsBuf ??= new Float32Array(this.rows * this.vocab);
    return this.logitsBuf.subarray(0, this.rows * this.vocab);
  }

  tokens(): BigInt64Array {
    return this.tokenBuf.subarray(0, this.rows);
  }

  /** Hands the cache buffers over (for a later cache); this cache is unusable after. */
  release(): Float32Array[] {
    const out = [...this.buffers.values()];
    this.buffers.clear();
    return out;
  }

  /** Keeps rows `keep` (ascending), moving them up in place. */
  keepRows(keep: number[]): void {
    const { kvHeads: KV, headDim: hd } = this.geom;
    const row = KV * this.capacity * hd;
    keep.forEach((b, i) => {
      if (b === i) return;
      for (const buf of this.buffers.values()) buf.copyWithin(i * row, b * row, (b + 1) * row);
      this.mask.copyWithin(i * this.capacity, b * this.capacity, (b + 1) * this.capacity);
    });
    this.rows = keep.length;
  }
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
}

export interface Generated {
  /** Sampled ids, ending with the stop id when `stopped`. */
  ids: number[];
  /** True when a stop id ended the response (false: max_new_tokens reached). */
  stopped: boolean;
}

let timer: ((label: string, ms: number) => void) | null = null;

/** Reports how long each piece of a generation step takes (scripts/bench/decode-profile.ts); null stops. */
export function setGenerateTimer(t: ((label: string, ms: number) => void) | null): void {
  timer = t;
}

/** One decoder of a mixture and its weight w_i in softmax(Σ w_i·logits_i). */
export interface MixturePart {
  decoder: Decoder;
  weight: number;
}

/**
 * Samples a response per request from softmax(Σ_i w_i·logits_i / temperature) (one part with
 * weight 1 is plain sampling), with top-k/top-p, until a stop id or `maxNewTokens`.
 */
export async function generateIds(parts: MixturePart[], reqs: GenerateRequest[], o: GenerateOptions): Promise<Generated[]> {
  if (parts.length === 0) throw new Error('generateIds: no decoder');
  const sampling = samplingOptions(o);
  if (!(Number.isInteger(o.maxNewTokens) && o.maxNewTokens >= 1)) throw new UserError(`--max-new-tokens must be a positive integer, got ${o.maxNewTokens}`);
  const config = parts[0].decoder.config;
  const maxPos = maxPositions(config);
  const stop = new Set(o.stopIds);
  const limit = Math.min(o.vocabLimit ?? config.vocab_size, config.vocab_size);
  const out: Generated[] = new Array(reqs.length);
  const inGraph = !o.hostSampling && parts.length === 1 && parts[0].weight === 1 && parts[0].decoder.picksTokens && (sampling.temperature === 0 || (sampling.topK === 0 && sampling.topP === 1));
  // Similar prompt lengths share a batch (less padding); each row's stream makes the order irrelevant.
  const order = reqs.map((_, i) => i).sort((a, b) => reqs[a].promptIds.length - reqs[b].promptIds.length);
  const batchSize = o.batchSize ?? 32;
  for (let s = 0; s < order.length; s += batchSize) {
    const rowsIdx = order.slice(s, s + batchSize);
    const P0 = Math.max(1, ...rowsIdx.map((i) => reqs[i].promptIds.length));
    if (P0 + o.maxNewTokens > maxPos) {
      throw new UserError(`a prompt of ${P0} tokens plus max_new_tokens ${o.maxNewTokens} exceeds the model's ${maxPos} positions`);
    }
    if (parts.every((p) => p.decoder.device)) {
      await generateBatchOnDevice(parts, reqs, rowsIdx, o, sampling, out, timer);
      continue;
    }
    let B = rowsIdx.length;
    const prompt = new BigInt64Array(B * P0).fill(BigInt(o.padId));
    const mask = new BigInt64Array(B * P0);
    rowsIdx.forEach((r, b) => {
      const p = reqs[r].promptIds;
      for (let t = 0; t < p.length; t++) {
        prompt[b * P0 + P0 - p.length + t] = BigInt(p[t]);
        mask[b * P0 + P0 - p.length + t] = 1n;
      }
    });
    // The prompt and a chunk of slots to start with; the cache grows a chunk at a time as rows go on.
    const capacity = Math.max(P0, Math.min(Math.ceil((P0 + 1) / SLOT_CHUNK) * SLOT_CHUNK, P0 + o.maxNewTokens - 1));
    const caches: SlotCache[] = [];
    let active = rowsIdx.slice();
    const got = new Map<number, number[]>(rowsIdx.map((r) => [r, []]));
    const V = parts[0].decoder.vocabSize;
    // One model without top-k/top-p: the graph picks the tokens (each row's uniform drawn here, from
    // its own stream, as sampleToken would draw it), and the logits never reach JavaScript.
    const uniform = new Float64Array(B);
    const pick: Pick | undefined = !inGraph ? undefined : sampling.temperature === 0 ? { head: 'greedy', limit } : { head: 'sample', limit, temperature: sampling.temperature, uniform };
    let ids = prompt;
    for (let step = 0; active.length > 0; step++) {
      let t0 = timer ? performance.now() : 0;
      if (pick?.head === 'sample') active.forEach((r, b) => (uniform[b] = reqs[r].rng.next()));
      const results: Picked[] = [];
      for (let k = 0; k < parts.length; k++) {
        if (step === 0) {
          const r = await parts[k].decoder.prefill(prompt, mask, B, capacity, pick, P0 + o.maxNewTokens - 1);
          caches.push(r.cache);
          results.push(r);
        } else {
          results.push(await parts[k].decoder.step(ids, caches[k], pick));
        }
      }
      if (timer) {
        timer(step === 0 ? 'prefill' : 'forward', performance.now() - t0);
        t0 = performance.now();
      }
      const tokens = results[0].tokens;
      const { keep, next } = takeTokens(active, got, stop, o.maxNewTokens, out, (b, r) =>
        tokens ? Number(tokens[b]) : sampleToken(mixLogits(results.map((res, k) => ({ logits: res.logits!.subarray(b * V, b * V + limit), weight: parts[k].weight }))), sampling, reqs[r].rng),
      );
      if (timer) {
        timer('sample', performance.now() - t0);
        t0 = performance.now();
      }
      if (keep.length === 0) {
        caches.forEach((c, k) => parts[k].decoder.recycle(c));
        break;
      }
      if (keep.length < B) for (const c of caches) c.keepRows(keep);
      active = keep.map((b) => active[b]);
      B = keep.length;
      ids = BigInt64Array.from(next, BigInt);
      timer?.('bookkeeping', performance.now() - t0);
    }
  }
  return out;
}

/**
 * Appends to each active row (request `active[b]`) its token `tokenAt(b, r)`; a row that drew a stop
 * id (kept as its last token) or reached `maxNewTokens` is finished into `out`. Returns the batch
 * positions that go on and their tokens, the next step's input.
 */
export function takeTokens(
  active: readonly number[],
  got: Map<number, number[]>,
  stop: ReadonlySet<number>,
  maxNewTokens: number,
  out: Generated[],
  tokenAt: (b: number, r: number) => number,
): { keep: number[]; next: number[] } {
  const keep: number[] = [];
  const next: number[] = [];
  active.forEach((r, b) => {
    const tok = tokenAt(b, r);
    const seq = got.get(r)!;
    seq.push(tok);
    if (stop.has(tok)) out[r] = { ids: seq, stopped: true };
    else if (seq.length >= maxNewTokens) out[r] = { ids: seq, stopped: false };
    else {
      keep.push(b);
      next.push(tok);
    }
  });
  return { keep, next };
}

/** The text of a sampled response: its ids without the final stop token. */
export function responseText(tok: LoadedTokenizer, ids: readonly number[], stopped: boolean): string {
  return tok.decode(stopped ? ids.slice(0, -1) : ids, { skipSpecialTokens: false });
}
