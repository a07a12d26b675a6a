/**
 * A model's decoding sessions and its key/value cache on the host. A `Decoder` holds the prefill,
 * step and extend sessions of one model (built on first use, per head); `SlotCache` is a batch's
 * cache in place: preallocated, grown a chunk of slots at a time, each row with its own number of
 * filled slots, so rows of different lengths (and rows that joined late) share one step. The
 * generation loop (generate.ts) drives them through the CPU backend (generate-cpu.ts); on WebGPU the
 * same decoder holds its device side (generate-device.ts).
 */
import type { ModelConfig } from './config.ts';
import type { FloatTensor } from './checkpoint.ts';
import type { LoraConfig } from './lora.ts';
import { modelParameterShapes } from './params.ts';
import { defaultCpuThreads, optimizedNodeCount, Session, toOrt, type Feeds, type OrtTensor, type RuntimeOptions } from '../runtime/session.ts';
import type { Graph } from '../onnx/graph.ts';
import { serializeModelInto } from '../onnx/proto.ts';
import { buildDecodeGraph, cacheShape, pastName, presentName, type DecodeHead } from './decode.ts';
import { DeviceDecode } from './generate-device.ts';
import { allocQuantized, quantizeInto, quantizeProducts, type ProductQuant, type QuantizedWeight } from './quantize.ts';

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
  /**
   * Products over block-quantized weights (MatMulNBits, see quantize.ts): the decoder is fed as
   * without `bake` (`setWeights` each update), and quantizes the linear weights of the values fed
   * when a graph is next needed, baking them into new sessions (the CPU provider prepacks them);
   * embeddings, norms and biases stay float32 and fed. CPU only.
   */
  quant?: ProductQuant | null;
  /**
   * The host graphs with ONNX Runtime's fused decoding ops (decode.ts's `fused`; CPU provider only,
   * the default there). The WebGPU backend keeps its unfused graphs (docs/performance.md, "Fused
   * decoding"), so true is refused there. A cache made for more slots than the model's
   * `max_position_embeddings` (the fused graphs' rotary tables end there) switches the decoder to
   * the unfused graphs, which extrapolate the angles.
   */
  fused?: boolean;
  /**
   * With `quant`: parameters whose values `setWeights` never changes (a LoRA run's frozen base). Their
   * quantized blocks are made once, and while every weight baked into the sessions is one of them, a
   * weight update keeps the sessions and only feeds the new values (the adapters' A and B, fed float32).
   */
  frozen?: ReadonlySet<string>;
}

/**
 * What a run returns for each row: `greedy` the argmax, `sample` a draw with each row's `uniform`
 * number, both among the ids below `limit`, picked inside the graph (see `DecodeHead`); no pick,
 * the logits.
 */
export type Pick = { head: 'greedy'; limit: number } | { head: 'sample'; limit: number; temperature: number; uniform: Float64Array };

/**
 * A run's result: the picked tokens `[B]` (with `sample`, each one's log-probability under the
 * distribution it was drawn from, `logps` `[B]`), or the logits `[B, V]`.
 */
export type Picked = { tokens: BigInt64Array; logps?: Float64Array; logits?: undefined } | { logits: Float32Array; tokens?: undefined };

/**
 * `stepSmall`: the step graph of a batch of one or two rows (see `step`): its products as x·Wᵀ, and
 * with `quant` (whose step graph is that already) a session of one intra-op thread.
 */
type GraphKind = 'prefill' | 'step' | 'stepSmall' | 'extend';

/**
 * The largest model whose quantized one- or two-row step runs on one intra-op thread by default: measured
 * at `small` (56M parameters, 26 MB of q4 blocks; docs/performance.md, "Against llama.cpp at the same
 * precision", session 20). A wider model's products are long enough to share between threads (not
 * measured at 0.5B: it keeps every core).
 */
const ONE_THREAD_PARAMS = 100e6;

export class Decoder {
  private params: Feeds = {};
  /** Prefill, step and extend sessions by head, built on first use (a decoder that only samples never builds the logits graphs). */
  private readonly sessions = new Map<string, Promise<Session>>();
  /** The cache buffers of the last generation, for the next one (see `recycle`). */
  private spare: Float32Array[] = [];
  /** The extend run's new keys/values outputs, written in place run after run (see `extend`). */
  private readonly extendOut = new Map<string, Float32Array>();
  /** The stacked pasts of `extendRows`, kept from run to run. */
  private readonly extendPast = new Map<string, Float32Array>();
  /** On WebGPU: the sessions and weights of generation on the device (generate-device.ts). */
  readonly device: DeviceDecode | null;
  /** With `quant`: the values last fed, each weight's quantized buffers (kept for the next update), those made from the current values, and the parameters no graph reads as floats. */
  private readonly floats = new Map<string, Float32Array>();
  private readonly blocks = new Map<string, QuantizedWeight>();
  private readonly current = new Set<string>();
  private readonly unfed = new Set<string>();
  /** Milliseconds spent quantizing weights so far (with `quant`). */
  quantizeMs = 0;
  /** Milliseconds spent building graphs and creating their sessions so far (quantizing not included). */
  sessionMs = 0;
  /** Sessions created so far (with `quant` and unfrozen weights, each update's next run makes new ones). */
  sessionsBuilt = 0;
  /**
   * With `quant`: the last model's bytes, written over by the next one's (the graphs are rebuilt after
   * every update, and fresh memory is slow to touch; a model's size of memory held for it, none when
   * no update rebuilds), and the session creation under way: one at a time, so that no model's bytes
   * are written over while ONNX Runtime reads them.
   */
  private modelBytes: Uint8Array | null = null;
  private creating: Promise<unknown> = Promise.resolve();

  private constructor(
    readonly config: ModelConfig,
    private readonly shapes: Map<string, number[]>,
    readonly baked: boolean,
    private readonly build: { weights?: Map<string, FloatTensor>; lora?: LoraConfig | null; runtime?: RuntimeOptions; prefillTokens: number; quant?: ProductQuant | null; fused: boolean; frozen?: ReadonlySet<string> },
  ) {
    if (build.quant && (build.runtime?.ep ?? 'cpu') !== 'cpu') throw new Error(`decoder: q${build.quant.bits} products run on the CPU provider only, not ${build.runtime!.ep}`);
    this.device = build.runtime?.ep === 'webgpu' ? new DeviceDecode(config, shapes, { ...build, runtime: build.runtime }) : null;
  }

  static async create(config: ModelConfig, weights: Map<string, FloatTensor>, o: DecoderOptions = {}): Promise<Decoder> {
    const bake = o.bake ?? false;
    // Without ONNX Runtime's memory pattern unless asked for: the planned block of every intermediate
    // of a run comes on top of the arena (measured: ~75 MB less peak RSS at batch 32, no slower).
    const runtime: RuntimeOptions = { memPattern: false, ...o.runtime };
    if (bake && o.quant) throw new Error('decoder: quant feeds its weights; it cannot also bake them');
    const cpu = (runtime.ep ?? 'cpu') === 'cpu';
    if (o.fused && !cpu) throw new Error(`decoder: the fused decoding graphs run on the CPU provider only, not ${runtime.ep}`);
    const fused = o.fused ?? cpu;
    const d = new Decoder(config, modelParameterShapes(config, { lora: o.lora }), bake, { weights: bake ? weights : undefined, lora: o.lora, runtime, prefillTokens: o.prefillTokens ?? 256, quant: o.quant, fused, frozen: o.frozen });
    if (!bake) d.setWeights((name) => weights.get(name)?.data);
    return d;
  }

  /** The graph of a session (see `session`). */
  private graph(kind: GraphKind, head: DecodeHead): Graph {
    const quant = this.build.quant;
    const weightFirst = !quant && kind !== 'stepSmall' && (this.build.runtime?.ep ?? 'cpu') === 'cpu';
    // A row's numbers must not depend on the rows decoding beside it. ONNX Runtime's float32 Softmax
    // sums a row in SIMD lanes by column (MLAS: one accumulator of 4, 8 or 16 lanes, each adding its
    // columns in order), so only where a row's columns sit matters. A step's past is a row's own
    // slots from 0 (SlotCache keeps no holes) then masked ones, and its new token sits at column
    // `capacity`, a multiple of STEP_ALIGN (`Decoder.step`): the same lanes whatever the capacity, the
    // extra masked slots adding (near) zeros. The prefill (a left-padded group shifts a row's columns)
    // and the extend run (its new tokens after the capacity, a cut copy's or the row's own) take
    // the softmax in float64 on the CPU instead (docs/performance.md, "Fused decoding").
    const rowInvariant = (this.build.runtime?.ep ?? 'cpu') === 'cpu' && (kind === 'prefill' || kind === 'extend');
    // A step's attention products one query row each on the CPU (MLAS reads the cache in place; see
    // layers.ts's `stepAttentionByRow`). An extend returns only its new keys/values (the cache is the caller's).
    const cpu = (this.build.runtime?.ep ?? 'cpu') === 'cpu';
    const rowProducts = cpu && (kind === 'step' || kind === 'stepSmall');
    const g = buildDecodeGraph(this.config, { past: kind !== 'prefill', concatPast: kind === 'extend', presentNew: kind === 'extend', weights: this.build.weights, lora: this.build.lora, head, weightFirst, fused: this.build.fused, rowInvariant, rowProducts });
    if (quant) {
      quantizeProducts(g, quant, (name, transposed) => this.quantized(name, transposed));
      const inputs = new Set(g.inputs.map((i) => i.name));
      for (const name of this.shapes.keys()) if (!inputs.has(name)) this.unfed.add(name);
      for (const name of this.unfed) delete this.params[name];
    }
    return g;
  }

  private session(kind: GraphKind, head: DecodeHead): Promise<Session> {
    const key = `${kind}/${head}`;
    let s = this.sessions.get(key);
    if (!s) {
      const t0 = performance.now();
      const q0 = this.quantizeMs;
      const g = this.graph(kind, head);
      if (this.build.quant) {
        s = this.creating.then(async () => {
          const bytes = serializeModelInto(g, this.modelBytes);
          // Kept for the next rebuild only where an update makes one: every baked weight frozen
          // (LoRA's base), none comes, and the buffer (the model's size) would only hold memory.
          const frozen = this.build.frozen;
          const rebuilds = !frozen || [...this.current].some((name) => !frozen.has(name));
          this.modelBytes = rebuilds ? new Uint8Array(bytes.buffer) : null;
          return Session.create(bytes, this.runtimeOf(kind));
        });
        this.creating = s.catch(() => undefined);
      } else s = Session.fromGraph(g, this.build.runtime);
      this.sessionsBuilt++;
      const started = t0 + (this.quantizeMs - q0);
      void s.then(() => (this.sessionMs += performance.now() - started), () => undefined);
      this.sessions.set(key, s);
    }
    return s;
  }

  /**
   * A session's runtime: with `quant`, a one- or two-row step of a model of at most
   * `ONE_THREAD_PARAMS` parameters on one intra-op thread unless the runtime names a count (see `step`).
   */
  private runtimeOf(kind: GraphKind): RuntimeOptions | undefined {
    const runtime = this.build.runtime;
    return this.build.quant && kind === 'stepSmall' ? { ...runtime, threads: runtime?.threads ?? 1 } : runtime;
  }

  /** Whether a quantized one- or two-row step gets its own one-thread session: a model of at most `ONE_THREAD_PARAMS` (asked every step: counted once). */
  private get smallQuant(): boolean {
    return (this.smallModel ??= [...this.shapes.values()].reduce((n, shape) => n + shape.reduce((a, b) => a * b, 1), 0) <= ONE_THREAD_PARAMS);
  }
  private smallModel: boolean | undefined;

  /** Intra-op threads of the step session a cache of `maxRows` rows runs (CPU; null on a device). */
  stepThreads(maxRows: number): number | null {
    if (this.device) return null;
    return this.runtimeOf(this.stepKind(maxRows))?.threads ?? defaultCpuThreads();
  }

  /** The step graph a cache made for `maxRows` rows runs (see `step`: one or two rows fed as x·Wᵀ). */
  private stepKind(maxRows: number): GraphKind {
    // A larger quantized model's small step is the batch's graph and runtime: one session, not a second
    // holding its own copy of the baked blocks.
    return maxRows <= 2 && !this.baked && (!this.build.quant || this.smallQuant) ? 'stepSmall' : 'step';
  }

  /**
   * From now on the unfused graphs: the fused ones' rotary tables end at max_position_embeddings (a
   * later position is an error of the run). Sessions built so far go.
   */
  private unfuse(): void {
    this.build.fused = false;
    const old = [...this.sessions.values()];
    this.sessions.clear();
    for (const s of old) void s.then((x) => x.release(), () => undefined);
  }

  /** Whether the host graphs use the fused decoding ops (`DecoderOptions.fused`). */
  get fused(): boolean {
    return this.build.fused;
  }

  /**
   * Nodes of the step graph a cache of `maxRows` rows runs with `pick`'s head: as built (`graph`) and
   * as ONNX Runtime runs it after its own optimisations (`runtime`, one kernel call each on the CPU;
   * null where not saved). The WebGPU backend runs the same step graph, its head the logits.
   */
  async stepNodes(maxRows: number, head: DecodeHead): Promise<{ graph: number; runtime: number | null }> {
    const g = this.graph(this.stepKind(maxRows), this.device ? 'logits' : head);
    const graph = g.nodes.length;
    return { graph, runtime: await optimizedNodeCount(g, this.build.runtime) };
  }

  /** Whether the graph can pick tokens (its float64 sampling runs on the CPU only). */
  get picksTokens(): boolean {
    return (this.build.runtime?.ep ?? 'cpu') === 'cpu';
  }

  /** Prompt tokens per prefill run. */
  get prefillTokens(): number {
    return this.build.prefillTokens;
  }

  /**
   * Feeds these parameter values from now on (graph-input decoders only); arrays are not copied.
   * With `quant` the sessions go when a weight baked into them may have changed (one not `frozen`):
   * the next run quantizes these values into new ones. When every baked weight is frozen (LoRA's
   * base: the adapters are fed), the sessions stay and the new values are only new feeds.
   */
  setWeights(get: (name: string) => Float32Array | undefined): void {
    if (this.baked) throw new Error('setWeights: this decoder has its weights baked in');
    for (const [name, shape] of this.shapes) {
      const data = get(name);
      if (!data) throw new Error(`decoder: no values for parameter ${name}`);
      this.floats.set(name, data);
      if (!this.unfed.has(name)) this.params[name] = toOrt('float32', data, shape);
    }
    if (this.build.quant) {
      const frozen = this.build.frozen;
      const stale = frozen ? [...this.current].filter((name) => !frozen.has(name)) : [...this.current];
      if (stale.length === 0) return;
      for (const name of stale) this.current.delete(name);
      const old = [...this.sessions.values()];
      this.sessions.clear();
      for (const s of old) void s.then((x) => x.release(), () => undefined);
    }
  }

  /** The quantized blocks of parameter `name` (of its transpose), from the values last fed; made once per `setWeights`. */
  private quantized(name: string, transposed: boolean): QuantizedWeight | null {
    const quant = this.build.quant!;
    const shape = this.shapes.get(name);
    const data = this.floats.get(name);
    if (!shape || !data || shape.length !== 2 || name.includes('lora_')) return null;
    if (this.current.has(name)) return this.blocks.get(name)!;
    const t0 = performance.now();
    const [N, K] = transposed ? [shape[1], shape[0]] : [shape[0], shape[1]];
    let q = this.blocks.get(name);
    if (!q) this.blocks.set(name, (q = allocQuantized(N, K, quant.bits, quant.block)));
    quantizeInto(data, q, transposed);
    this.current.add(name);
    this.quantizeMs += performance.now() - t0;
    return q;
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

  /** A new cache for up to `maxRows` rows, with room for `capacity` slots to start and `maxCapacity` reserved. */
  newCache(maxRows: number, capacity: number, maxCapacity = capacity): SlotCache {
    const positions = (this.config as { max_position_embeddings?: number }).max_position_embeddings;
    if (this.build.fused && positions !== undefined && Math.max(capacity, maxCapacity) > positions) this.unfuse();
    const c = new SlotCache(cacheShape(this.config), maxRows, capacity, this.vocabSize, maxCapacity, this.spare);
    this.spare = [];
    return c;
  }

  /**
   * Prefills `n` prompts `ids` [n, S] under `mask` [n, S] into rows `first`…`first + n − 1` of
   * `cache` (slots 0…S−1), a few rows a run (`prefillTokens`); returns each row's pick for its last
   * token (the logits `[n, V]` without one). `pick.uniform` holds the n rows' numbers.
   */
  async prefill(cache: SlotCache, first: number, ids: BigInt64Array, mask: BigInt64Array, n: number, pick?: Pick): Promise<Picked> {
    const S = ids.length / n;
    const V = this.vocabSize;
    const session = await this.session('prefill', headOf(pick));
    const tokens = new BigInt64Array(pick ? n : 0);
    const logps = new Float64Array(pick?.head === 'sample' ? n : 0);
    const logits = new Float32Array(pick ? 0 : n * V);
    const chunk = Math.max(1, Math.floor(this.build.prefillTokens / S));
    for (let r0 = 0; r0 < n; r0 += chunk) {
      const k = Math.min(chunk, n - r0);
      const feeds: Feeds = { ...this.params, input_ids: toOrt('int64', ids.subarray(r0 * S, (r0 + k) * S), [k, S]), attention_mask: toOrt('int64', mask.subarray(r0 * S, (r0 + k) * S), [k, S]) };
      if (pick) Object.assign(feeds, pickFeeds(pick, k, r0));
      const out = await session.run(feeds);
      cache.writePrompt((name) => out[name].data as Float32Array, S, first + r0, k, mask.subarray(r0 * S, (r0 + k) * S));
      if (pick) tokens.set(out.token.data as BigInt64Array, r0);
      else logits.set(out.logits.data as Float32Array, r0 * V);
      if (pick?.head === 'sample') logps.set(out.logprob.data as Float64Array, r0);
    }
    return pick ? (pick.head === 'sample' ? { tokens, logps } : { tokens }) : { logits };
  }

  /**
   * One token per row `ids` [B] into `cache` (B = cache.rows): its keys and values are written into
   * each row's next slot. Returns each row's pick (the logits `[B, V]` without one), in the cache's
   * buffers (valid until its next step).
   */
  async step(ids: BigInt64Array, cache: SlotCache, pick?: Pick): Promise<Picked> {
    // The new token at a column that is a multiple of STEP_ALIGN (see `graph`'s float32 softmax).
    cache.reserve(alignUp(Math.max(cache.length + 1, cache.capacity)));
    const feeds: Feeds = { ...this.params, input_ids: toOrt('int64', ids, [cache.rows, 1]), attention_mask: cache.stepMask() };
    Object.assign(feeds, cache.pastFeeds());
    if (pick) Object.assign(feeds, pickFeeds(pick, cache.rows));
    // One or two rows: the products as x·Wᵀ. MLAS runs a single row as a vector-matrix product
    // reading W in place (its M = 1 kernel), where the weight-first form's transposed x would make it
    // pad the one column to a panel of 16 and multiply all of them; at two rows packing W costs less
    // than the padding still (docs/performance.md: 1.09× a step; at four, even). Baked weights are
    // x·Wᵀ in every step graph already (prepacked), and a second session would copy them again.
    // Quantized products (MatMulNBits) are x·Wᵀ in every graph too; their one- and two-row step of a
    // small model runs on one intra-op thread unless the runtime names a count (`ONE_THREAD_PARAMS`):
    // `small`'s q4 row is 57 products of 20–40 µs and ~375 smaller kernels, too short to gain from a
    // second thread, and where another process held the second core, waiting for it made the step
    // slower and uneven (docs/performance.md, "Against llama.cpp at the same precision", session 20).
    // Only a cache made for at most two rows takes it: a larger batch that shrinks to two rows at its
    // tail keeps its own graph, as a second session for those last steps would raise the run's peak
    // memory (measured +10 MB on a rollout: its arena and plan, beside the batch's) for a few steps.
    await (await this.session(this.stepKind(cache.maxRows), headOf(pick))).run(feeds, cache.outputs(pick?.head));
    cache.writeStep((name) => cache.newSlot(name));
    return pick ? (pick.head === 'sample' ? { tokens: cache.tokens(), logps: cache.logps() } : { tokens: cache.tokens() }) : { logits: cache.logits() };
  }

  /**
   * Extends row `row` of `cache` by `ids` in one run (the extend graph: the row's cache and the new
   * tokens, any number of them); returns the pick for the last new token (its logits `[1, V]`
   * without one). `pick.uniform[0]` is the row's number.
   */
  async extend(cache: SlotCache, row: number, ids: readonly number[], pick?: Pick): Promise<Picked> {
    const feeds: Feeds = { input_ids: toOrt('int64', BigInt64Array.from(ids, BigInt), [1, ids.length]), attention_mask: cache.rowMask(row, ids.length), ...cache.rowPast(row) };
    return this.runExtend(feeds, 1, ids.length, pick, (_, src) => cache.writeTail(row, src, ids.length));
  }

  /**
   * Extends one-row caches of one capacity, `caches[b]` by `ids[b]` (all of one length), in one run of
   * the extend graph: their pasts are stacked into `[n, KV, capacity, hd]` (one copy), so each row's
   * numbers are those of its own `extend` (the same columns, and products whose rows do not depend on
   * the batch: test/serve-engine.test.ts). `pick.uniform[b]` is row b's number.
   */
  async extendRows(caches: readonly SlotCache[], ids: readonly (readonly number[])[], pick?: Pick): Promise<Picked> {
    const n = caches.length;
    const S = ids[0].length;
    const cap = caches[0].capacity;
    if (caches.some((c) => c.capacity !== cap || c.rows !== 1) || ids.some((x) => x.length !== S)) throw new Error('decoder: extendRows takes one-row caches of one capacity and token lists of one length');
    const { layers, kvHeads: KV, headDim: hd } = cacheShape(this.config);
    const rowSize = KV * cap * hd;
    const feeds: Feeds = { input_ids: toOrt('int64', BigInt64Array.from(ids.flat(), BigInt), [n, S]) };
    const mask = new BigInt64Array(n * (cap + S));
    caches.forEach((c, b) => mask.set(c.rowMask(0, S).data as BigInt64Array, b * (cap + S)));
    feeds.attention_mask = toOrt('int64', mask, [n, cap + S]);
    const pasts = caches.map((c) => c.rowPast(0));
    for (let i = 0; i < layers; i++) {
      for (const kv of ['key', 'value'] as const) {
        const name = pastName(i, kv);
        let buf = this.extendPast.get(name);
        if (!buf || buf.length < n * rowSize) this.extendPast.set(name, (buf = new Float32Array(n * rowSize)));
        pasts.forEach((past, b) => buf!.set(past[name].data as Float32Array, b * rowSize));
        feeds[name] = toOrt('float32', buf.subarray(0, n * rowSize), [n, KV, cap, hd]);
      }
    }
    return this.runExtend(feeds, n, S, pick, (b, src) => caches[b].writeTail(0, src, S));
  }

  /**
   * Runs the extend graph on `feeds` (`n` rows of `S` new tokens, their pasts and mask) and hands each
   * row's new keys/values to `write(b, src)` (`src(presentName)`: `[1, KV, S, hd]`).
   */
  private async runExtend(feeds: Feeds, n: number, S: number, pick: Pick | undefined, write: (b: number, src: (name: string) => Float32Array) => void): Promise<Picked> {
    Object.assign(feeds, this.params);
    if (pick) Object.assign(feeds, pickFeeds(pick, n));
    // Attention runs over past ++ new (a whole prefill's numbers), but the graph returns only the S
    // new keys/values (`[n, KV, S, hd]`), which ONNX Runtime writes into buffers kept from run to run:
    // returning past ++ new (5 MB on small for a served request's prompt) cost a third of the run
    // (docs/performance.md, "The step's attention one query row a product").
    const { layers, kvHeads: KV, headDim: hd } = cacheShape(this.config);
    const size = KV * S * hd;
    const fetches: Record<string, OrtTensor | null> = pick ? (pick.head === 'sample' ? { token: null, logprob: null } : { token: null }) : { logits: null };
    for (let i = 0; i < layers; i++) {
      for (const kv of ['key', 'value'] as const) {
        const name = presentName(i, kv);
        let buf = this.extendOut.get(name);
        if (!buf || buf.length < n * size) this.extendOut.set(name, (buf = new Float32Array(n * size)));
        fetches[name] = toOrt('float32', buf.subarray(0, n * size), [n, KV, S, hd]) as OrtTensor;
      }
    }
    const out = await (await this.session('extend', headOf(pick))).run(feeds, fetches);
    for (let b = 0; b < n; b++) write(b, (name) => this.extendOut.get(name)!.subarray(b * size, (b + 1) * size));
    if (!pick) return { logits: out.logits.data as Float32Array };
    return pick.head === 'sample' ? { tokens: out.token.data as BigInt64Array, logps: out.logprob.data as Float64Array } : { tokens: out.token.data as BigInt64Array };
  }

  /**
   * Keeps a finished generation's cache buffers for the next cache (the online loops generate batch
   * after batch of the same shape): the cache is not allocated again while the last one waits for
   * the garbage collector, which held two at once.
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
    this.extendOut.clear();
    this.extendPast.clear();
    for (const r of all) if (r.status === 'fulfilled') await r.value.release();
    await this.device?.release();
  }
}

export function headOf(pick: Pick | undefined): DecodeHead {
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

/** Cache slots are added this many at a time: fixed shapes between, and attention over at most this many unfilled slots. */
export const SLOT_CHUNK = 32;

/**
 * A stepped cache's capacity is a multiple of this: the widest SIMD accumulator of MLAS's softmax sum
 * (AVX-512: 16 lanes; AVX2 8, NEON/SSE/WebAssembly 4), so a step's new token lands in lane 0 whatever
 * the capacity (see `Decoder.graph`). SLOT_CHUNK is a multiple of it.
 */
export const STEP_ALIGN = 16;

/** `n` rounded up to a multiple of STEP_ALIGN. */
export const alignUp = (n: number) => Math.ceil(n / STEP_ALIGN) * STEP_ALIGN;

/**
 * A batch's key/value cache in place: per layer and kind one `[B, KV, capacity, hd]` buffer; row b
 * has its first `cols[b]` slots written (a left-padded prompt's padding is not kept), and `mask`
 * `[B, capacity]` marks the real ones (unwritten slots are 0), so rows of different lengths share the buffer and a step. A
 * step feeds the whole buffer with its mask and writes each row's new keys/values into that row's
 * next slot; when the slots run out the buffers grow by a chunk. Each buffer is allocated once with
 * room for `maxRows` rows of `maxCapacity` slots (pages the generation never reaches are never
 * touched, so never resident) and grows within it, rows moved apart in place: the cache is never
 * held twice. The step's outputs (logits, new keys/values) go to buffers allocated with it.
 */
export class SlotCache {
  /** Rows in use (the first `rows` of the buffers). */
  rows = 0;
  /** Filled slots per row. */
  cols: Int32Array;
  private buffers = new Map<string, Float32Array>();
  private mask: BigInt64Array;
  private fresh = new Map<string, Float32Array>();
  private logitsBuf: Float32Array | null = null;
  private tokenBuf: BigInt64Array;
  private logpBuf: Float64Array;
  private maxCapacity: number;

  constructor(
    private readonly geom: { layers: number; kvHeads: number; headDim: number },
    readonly maxRows: number,
    public capacity: number,
    private readonly vocab: number,
    maxCapacity = capacity,
    /** Buffers to use again (a finished cache's, see `release`), where long enough. */
    reuse: Float32Array[] = [],
  ) {
    const { layers, kvHeads: KV, headDim: hd } = geom;
    // Reserved to a multiple of STEP_ALIGN, so a step's alignment never reallocates.
    this.maxCapacity = alignUp(Math.max(capacity, maxCapacity));
    const size = maxRows * KV * this.maxCapacity * hd;
    // Reused buffers hold an earlier cache's values; unwritten slots are masked, as after growing.
    const spare = reuse.filter((b) => b.length >= size);
    for (let i = 0; i < layers; i++) {
      for (const kv of ['key', 'value'] as const) {
        this.buffers.set(pastName(i, kv), spare.pop() ?? new Float32Array(size));
        this.fresh.set(presentName(i, kv), new Float32Array(maxRows * KV * hd));
      }
    }
    this.mask = new BigInt64Array(maxRows * capacity);
    this.cols = new Int32Array(maxRows);
    this.tokenBuf = new BigInt64Array(maxRows);
    this.logpBuf = new Float64Array(maxRows);
  }

  /** The most slots any row has filled. */
  get length(): number {
    let m = 0;
    for (let b = 0; b < this.rows; b++) m = Math.max(m, this.cols[b]);
    return m;
  }

  /** Appends `n` empty rows; returns the first one's index. */
  addRows(n: number): number {
    const first = this.rows;
    if (first + n > this.maxRows) throw new Error(`cache: ${first + n} rows exceed its ${this.maxRows}`);
    this.rows += n;
    for (let b = first; b < this.rows; b++) {
      this.cols[b] = 0;
      this.mask.fill(0n, b * this.capacity, (b + 1) * this.capacity);
    }
    return first;
  }

  /**
   * Writes the real positions of a prompt of `n` (`src(presentName)`: `[count, KV, n, hd]`, `mask`
   * `[count, n]`) of rows `first`…`first + count − 1` into their slots 0, 1, …: a left-padded row's
   * padding is dropped, so a row's slots are the same however its prefill group was padded (a
   * step's float32 softmax then sums its columns in the same lanes; see `Decoder.graph`). The
   * positions its keys were rotated by are the mask's counts, not slots, so nothing else changes.
   */
  writePrompt(src: (name: string) => Float32Array, n: number, first: number, count: number, mask: BigInt64Array): void {
    this.reserve(n);
    const { layers, kvHeads: KV, headDim: hd } = this.geom;
    const cap = this.capacity;
    // Each row's real positions, as runs [from, to) of the prompt.
    const runs: [number, number][][] = [];
    for (let b = 0; b < count; b++) {
      const row: [number, number][] = [];
      for (let t = 0; t < n; t++) {
        if (mask[b * n + t] === 0n) continue;
        const last = row[row.length - 1];
        if (last && last[1] === t) last[1]++;
        else row.push([t, t + 1]);
      }
      runs.push(row);
    }
    for (let i = 0; i < layers; i++) {
      for (const kv of ['key', 'value'] as const) {
        const from = src(presentName(i, kv));
        const to = this.buffers.get(pastName(i, kv))!;
        for (let b = 0; b < count; b++) {
          for (let h = 0; h < KV; h++) {
            const r = b * KV + h;
            let slot = 0;
            for (const [t0, t1] of runs[b]) {
              to.set(from.subarray((r * n + t0) * hd, (r * n + t1) * hd), ((first * KV + r) * cap + slot) * hd);
              slot += t1 - t0;
            }
          }
        }
      }
    }
    for (let b = 0; b < count; b++) {
      const len = runs[b].reduce((s, [t0, t1]) => s + t1 - t0, 0);
      this.mask.fill(0n, (first + b) * cap, (first + b + 1) * cap);
      this.mask.fill(1n, (first + b) * cap, (first + b) * cap + len);
      this.cols[first + b] = len;
    }
  }

  /** Makes room for `slots` slots per row (growing every buffer by whole chunks). */
  reserve(slots: number): void {
    if (slots <= this.capacity) return;
    let cap = Math.ceil(slots / SLOT_CHUNK) * SLOT_CHUNK;
    if (cap > this.maxCapacity && slots <= this.maxCapacity) cap = this.maxCapacity;
    const { kvHeads: KV, headDim: hd } = this.geom;
    const old = this.capacity;
    if (cap > this.maxCapacity) {
      // Past the room allocated: new buffers (a caller that did not say how long it would run).
      for (const [name, buf] of this.buffers) {
        const grown = new Float32Array(this.maxRows * KV * cap * hd);
        for (let r = 0; r < this.rows * KV; r++) grown.set(buf.subarray(r * old * hd, (r * old + this.cols[Math.floor(r / KV)]) * hd), r * cap * hd);
        this.buffers.set(name, grown);
      }
      this.maxCapacity = cap;
    } else {
      // Rows move apart in place, the last first (each moves to a higher offset, over rows already moved).
      for (const buf of this.buffers.values()) {
        for (let r = this.rows * KV - 1; r > 0; r--) buf.copyWithin(r * cap * hd, r * old * hd, (r * old + this.cols[Math.floor(r / KV)]) * hd);
      }
    }
    const mask = new BigInt64Array(this.maxRows * cap);
    for (let b = 0; b < this.rows; b++) mask.set(this.mask.subarray(b * old, b * old + this.cols[b]), b * cap);
    this.mask = mask;
    this.capacity = cap;
  }

  /** Writes a step's new position (`src(presentName)`: `[B, KV, 1, hd]`) into each row's next slot. */
  writeStep(src: (name: string) => Float32Array): void {
    const { layers, kvHeads: KV, headDim: hd } = this.geom;
    this.reserve(this.length + 1);
    const cap = this.capacity;
    for (let i = 0; i < layers; i++) {
      for (const kv of ['key', 'value'] as const) {
        const from = src(presentName(i, kv));
        const to = this.buffers.get(pastName(i, kv))!;
        for (let r = 0; r < this.rows * KV; r++) {
          const o = (r * cap + this.cols[Math.floor(r / KV)]) * hd;
          for (let d = 0; d < hd; d++) to[o + d] = from[r * hd + d];
        }
      }
    }
    for (let b = 0; b < this.rows; b++) this.mask[b * cap + this.cols[b]++] = 1n;
  }

  /**
   * Writes the last `n` positions of an extend run's `src(presentName)` (`[1, KV, T, hd]`, its new
   * positions) into row `row`'s next `n` slots.
   */
  writeTail(row: number, src: (name: string) => Float32Array, n: number): void {
    const { layers, kvHeads: KV, headDim: hd } = this.geom;
    this.reserve(this.cols[row] + n);
    const cap = this.capacity;
    const c0 = this.cols[row];
    for (let i = 0; i < layers; i++) {
      for (const kv of ['key', 'value'] as const) {
        const from = src(presentName(i, kv));
        const T = from.length / (KV * hd);
        const to = this.buffers.get(pastName(i, kv))!;
        for (let h = 0; h < KV; h++) to.set(from.subarray((h * T + T - n) * hd, (h + 1) * T * hd), ((row * KV + h) * cap + c0) * hd);
      }
    }
    this.mask.fill(1n, row * cap + c0, row * cap + c0 + n);
    this.cols[row] += n;
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

  /** The attention mask of `n` new tokens after row `row`'s slots: `[1, capacity + n]`. */
  rowMask(row: number, n: number): OrtTensor {
    const cap = this.capacity;
    const m = new BigInt64Array(cap + n).fill(1n);
    m.set(this.mask.subarray(row * cap, (row + 1) * cap));
    return toOrt('int64', m, [1, cap + n]) as OrtTensor;
  }

  /** The cache buffers as the step's past inputs (the first `rows` rows, not copied). */
  pastFeeds(): Feeds {
    const { kvHeads: KV, headDim: hd } = this.geom;
    const feeds: Feeds = {};
    const n = this.rows * KV * this.capacity * hd;
    for (const [name, buf] of this.buffers) feeds[name] = toOrt('float32', buf.length === n ? buf : buf.subarray(0, n), [this.rows, KV, this.capacity, hd]);
    return feeds;
  }

  /** Row `row`'s cache as past inputs `[1, KV, capacity, hd]` (not copied). */
  rowPast(row: number): Feeds {
    const { kvHeads: KV, headDim: hd } = this.geom;
    const feeds: Feeds = {};
    const n = KV * this.capacity * hd;
    for (const [name, buf] of this.buffers) feeds[name] = toOrt('float32', buf.subarray(row * n, (row + 1) * n), [1, KV, this.capacity, hd]);
    return feeds;
  }

  /**
   * Preallocated outputs of a step: logits `[B, V]` without a pick (or the picked `token` `[B]`,
   * with `sample` its `logprob` `[B]`) and each layer's new keys/values `[B, KV, 1, hd]`.
   */
  outputs(pick: Pick['head'] | undefined): Record<string, OrtTensor> {
    const { kvHeads: KV, headDim: hd } = this.geom;
    const out: Record<string, OrtTensor> = pick
      ? { token: toOrt('int64', this.tokens(), [this.rows]) as OrtTensor }
      : { logits: toOrt('float32', this.logits(), [this.rows, this.vocab]) as OrtTensor };
    if (pick === 'sample') out.logprob = toOrt('float64', this.logps(), [this.rows]) as OrtTensor;
    for (const [name, buf] of this.fresh) out[name] = toOrt('float32', buf.subarray(0, this.rows * KV * hd), [this.rows, KV, 1, hd]) as OrtTensor;
    return out;
  }

  newSlot(name: string): Float32Array {
    return this.fresh.get(name)!;
  }

  logits(): Float32Array {
    this.logitsBuf ??= new Float32Array(this.maxRows * this.vocab);
    return this.logitsBuf.subarray(0, this.rows * this.vocab);
  }

  tokens(): BigInt64Array {
    return this.tokenBuf.subarray(0, this.rows);
  }

  logps(): Float64Array {
    return this.logpBuf.subarray(0, this.rows);
  }

  /** Hands the cache buffers over (for a later cache); this cache is unusable after. */
  release(): Float32Array[] {
    const out = [...this.buffers.values()];
    this.buffers.clear();
    return out;
  }

  /** Moves row `from` (its filled slots, mask and count) to row `to` of this cache; `from` is left as it was. */
  moveRow(from: number, to: number): void {
    const { kvHeads: KV, headDim: hd } = this.geom;
    const cap = this.capacity;
    const n = this.cols[from];
    for (const buf of this.buffers.values()) {
      for (let h = 0; h < KV; h++) buf.copyWithin((to * KV + h) * cap * hd, (from * KV + h) * cap * hd, ((from * KV + h) * cap + n) * hd);
    }
    this.mask.copyWithin(to * cap, from * cap, (from + 1) * cap);
    this.cols[to] = n;
  }

  /** Copies row `from` of `src` (its filled slots and mask, or only the first `n`) into row `to` of this cache. */
  copyRow(src: SlotCache, from: number, to: number, n = src.cols[from]): void {
    const { kvHeads: KV, headDim: hd } = this.geom;
    this.reserve(n);
    const [cs, cd] = [src.capacity, this.capacity];
    for (const [name, buf] of this.buffers) {
      const s = src.buffers.get(name)!;
      for (let h = 0; h < KV; h++) buf.set(s.subarray((from * KV + h) * cs * hd, ((from * KV + h) * cs + n) * hd), (to * KV + h) * cd * hd);
    }
    this.mask.fill(0n, to * cd, (to + 1) * cd);
    this.mask.set(src.mask.subarray(from * cs, from * cs + n), to * cd);
    this.cols[to] = n;
  }
}
