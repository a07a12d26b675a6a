/**
 * Generation that stays on the GPU (WebGPU): the generation loop's backend (backend.ts) when its
 * decoders run on the WebGPU provider.
 *
 * What stays on the device through a whole generation:
 * - the weights: a fed-weights decoder's parameters are uploaded once (one run of an upload graph
 *   whose outputs are left in GPU buffers) and reused for every step and every later generation
 *   until `setWeights` gives new ones; weights that already are GPU buffers (the training session's
 *   parameters, handed over by the online loop) are fed as they are; baked weights are initializers.
 * - the key/value cache: the prefill leaves its `present.*` keys/values `[B, KV, S, hd]` on the
 *   device as the cache; each step feeds them as `past.*` and returns `cache.*` = past ++ the new
 *   token's keys/values (a Concat on the device, left there), which the next step feeds. Attention is
 *   the CPU path's own (the cache and the new token scored apart), so the logits are computed as on
 *   the CPU. Rows leave (or are parked, or copied for a fork) through a Gather graph whose outputs
 *   stay on the device, and join the batch through a Concat graph that left-pads the shorter side
 *   with zero slots (masked); a parked row extended by several tokens runs the extend graph, whose
 *   `present.*` are its cache and the new tokens' keys/values together.
 * - the logits: the graph picks the token (greedy: ArgMax; sampling without top-k/top-p: a float32
 *   draw with each row's uniform, see `pickToken`), so only the `[B]` ids come back. A mixture of
 *   models (Nash-MD's opponent) leaves each part's logits on the device and a small graph picks from
 *   their weighted sum. Top-k/top-p bring the last-position logits `[B, V]` back and sample on the
 *   host exactly as the CPU path does; the cache still stays on the device.
 *
 * Per step the host sends the new ids `[B, 1]`, the attention mask `[B, L+1]` (int32), and for
 * sampling the uniforms `[B, 1]`; it gets back the ids `[B]` (int64). `deviceTraffic()` counts those
 * copies from the tensors' own locations, for the tests and the bench.
 */
import type { ModelConfig } from './config.ts';
import type { FloatTensor } from './checkpoint.ts';
import type { LoraConfig } from './lora.ts';
import { Graph, type Tensor } from '../onnx/graph.ts';
import { Session, toOrt, type Feeds, type OrtTensor, type OutputLocation, type RuntimeOptions } from '../runtime/session.ts';
import { buildDecodeGraph, cacheShape, pastName, presentName } from './decode.ts';
import type { DecodeBackend, PickSpec, PrefillGroup, RunOut } from './backend.ts';

/** What a device graph returns for each row's last position (see `deviceHead`). */
export type DeviceHead = 'logits' | 'greedy' | 'sample';

const cacheName = (layer: number, kv: 'key' | 'value') => `cache.${layer}.${kv}`;

/**
 * The decode graph for the device: buildDecodeGraph's prefill, step or extend (logits head), then
 * - step: `cache.<i>.<kv>` = Concat(past, present) along the positions, the cache of the next step;
 * - extend (`past` and `extend`): any number of new tokens; `present.<i>.<kv>` = past ++ new;
 * - the head: `greedy` or `sample` → `token` [B] (`pickToken`; float32: WebGPU has no float64);
 *   `logits` → `logits` [B, V].
 */
export function buildDeviceDecodeGraph(config: ModelConfig, o: { past: boolean; extend?: boolean; weights?: Map<string, FloatTensor>; lora?: LoraConfig | null; head: DeviceHead }): Graph {
  // `weightFirst: false`: the products with fed weights stay x·Wᵀ (the weight-first rewrite is for
  // the CPU's MLAS packing). The extend graph's `present.*` are past ++ new: the row's next cache.
  const extend = o.past && (o.extend ?? false);
  const g = buildDecodeGraph(config, { past: o.past, concatPast: extend, weights: o.weights, lora: o.lora, head: 'logits', weightFirst: false });
  const { layers } = cacheShape(config);
  const keep = new Set<string>();
  if (o.past && !extend) {
    for (let i = 0; i < layers; i++) {
      for (const kv of ['key', 'value'] as const) g.output(g.concat([g.tensor(pastName(i, kv)), g.tensor(presentName(i, kv))], 2), cacheName(i, kv));
    }
    for (let i = 0; i < layers; i++) for (const kv of ['key', 'value'] as const) keep.add(cacheName(i, kv));
  } else {
    for (let i = 0; i < layers; i++) for (const kv of ['key', 'value'] as const) keep.add(presentName(i, kv));
  }
  if (o.head === 'logits') keep.add('logits');
  else {
    pickToken(g, g.tensor('logits'), o.head);
    keep.add('token');
  }
  // The step's new keys/values only feed the Concat; the prefill's are the cache.
  const outs = g.outputs.filter((v) => keep.has(v.name));
  g.outputs.length = 0;
  g.outputs.push(...outs);
  return g;
}

/**
 * `token` [B] picked from `logits` [B, V] among the ids below `vocab_limit` [1]: `greedy` the first
 * ArgMax; `sample` the first id whose running sum of e^((l − max)/temperature) exceeds `uniform`
 * [B, 1] times the total, in float32 (the CPU graph draws the same way in float64).
 */
export function pickToken(g: Graph, logits: Tensor, head: 'greedy' | 'sample'): void {
  const limited = g.slice(logits, g.ints([0]), g.input('vocab_limit', 'int64', [1]), [1]); // [B, V']
  if (head === 'greedy') {
    g.output(g.argMax(limited, 1, false), 'token');
    return;
  }
  const shifted = g.sub(limited, g.reduceMax(limited, [1], true));
  const running = g.cumSum(g.exp(g.div(shifted, g.input('temperature', 'float32', []))), 1);
  const total = g.slice(running, [-1], [2 ** 40], [1]); // [B, 1]
  // The last id passes whatever u·total rounds to (u within 6e-8 of 1 makes it total in float32):
  // as sampleToken, the draw falls back to the last id, never to id 0.
  const passed = g.concat([g.slice(running, [0], [-1], [1]), g.add(g.mul(total, 0), Infinity)], 1);
  const beyond = g.cast(g.greater(passed, g.mul(g.input('uniform', 'float32', ['batch', 1]), total)), 'int32');
  g.output(g.argMax(beyond, 1, false), 'token');
}

/**
 * The pick from a geometric mixture of `n` models' logits (Nash-MD's opponent): `logits.<k>` [B, V]
 * (GPU buffers of the decode steps), Σ_k `weight.<k>`·logits_k accumulated in float32 in the order
 * of mixLogits (sampling.ts), then `pickToken`.
 */
export function mixtureGraph(n: number, head: 'greedy' | 'sample'): Graph {
  const g = new Graph('prefzoo_mixture_pick');
  let sum: Tensor | null = null;
  for (let k = 0; k < n; k++) {
    const term = g.mul(g.input(`logits.${k}`, 'float32', ['batch', 'vocab']), g.input(`weight.${k}`, 'float32', []));
    sum = sum ? g.add(sum, term) : term;
  }
  pickToken(g, sum!, head);
  return g;
}

/** The cache rows `rows` of every cache tensor, left on the device. */
export function selectRowsGraph(config: ModelConfig): Graph {
  const g = new Graph('prefzoo_cache_rows');
  const { layers, kvHeads, headDim } = cacheShape(config);
  const rows = g.input('rows', 'int64', ['kept']);
  for (let i = 0; i < layers; i++) {
    for (const kv of ['key', 'value'] as const) g.output(g.gather(g.input(pastName(i, kv), 'float32', ['batch', kvHeads, 'past', headDim]), rows, 0), cacheName(i, kv));
  }
  return g;
}

/**
 * Two batches' caches as one: `a.past.*` `[Ba, KV, La, hd]` then `b.past.*` `[Bb, KV, Lb, hd]` along
 * the rows, as `cache.*`. `pad` ('a' or 'b') left-pads that side with `padding` `[n]` zero slots
 * (n = the other's length minus its own; the masks on the host mark them), made by broadcasting on
 * the device: no shape arithmetic.
 */
export function joinGraph(config: ModelConfig, pad: 'a' | 'b' | null): Graph {
  const g = new Graph('prefzoo_cache_join');
  const { layers, kvHeads, headDim } = cacheShape(config);
  const padding = pad ? g.reshape(g.input('padding', 'float32', ['pad']), [1, 1, -1, 1]) : null;
  const padded = (x: Tensor) => g.concat([g.expand(padding!, g.shapeOf(g.slice(x, [0], [1], [2]))), x], 2);
  for (let i = 0; i < layers; i++) {
    for (const kv of ['key', 'value'] as const) {
      const side = (s: 'a' | 'b') => {
        const x = g.input(`${s}.${pastName(i, kv)}`, 'float32', [`rows_${s}`, kvHeads, `past_${s}`, headDim]);
        return pad === s ? padded(x) : x;
      };
      g.output(g.concat([side('a'), side('b')], 0), cacheName(i, kv));
    }
  }
  return g;
}

/** Parameters as graph outputs of the same name, through one Identity each: run once, they are left on the device. */
export function uploadGraph(shapes: Map<string, number[]>): Graph {
  const g = new Graph('prefzoo_upload');
  for (const [name, shape] of shapes) g.output(g.identity(g.input(name, 'float32', shape)), `${name}.device`);
  return g;
}

/** Host↔device copies of the device generations since the last `resetDeviceTraffic()`. */
export interface DeviceTraffic {
  /** Graph runs (prefill, steps, row selections, weight uploads). */
  runs: number;
  /** Decode steps (one token per row each; a mixture of two models runs two per step). */
  steps: number;
  /** Host tensors fed to device graphs, and their bytes. */
  uploads: number;
  uploadBytes: number;
  /** Outputs returned to host memory, and their bytes. */
  downloads: number;
  downloadBytes: number;
  /** Of those, the bytes fed or returned by the weight upload graph. */
  weightUploadBytes: number;
}

const traffic: DeviceTraffic = { runs: 0, steps: 0, uploads: 0, uploadBytes: 0, downloads: 0, downloadBytes: 0, weightUploadBytes: 0 };

export function deviceTraffic(): DeviceTraffic {
  return { ...traffic };
}

export function resetDeviceTraffic(): void {
  for (const k of Object.keys(traffic) as (keyof DeviceTraffic)[]) traffic[k] = 0;
}

const bytesOf = (t: OrtTensor) => (t.location === 'cpu' ? (t.data as ArrayBufferView).byteLength : 0);

/** Runs `s`, counting host feeds and host outputs. */
async function counted(s: Session, feeds: Feeds, fetches?: readonly string[]): Promise<Record<string, OrtTensor>> {
  traffic.runs++;
  for (const t of Object.values(feeds)) {
    if (t.location !== 'cpu') continue;
    traffic.uploads++;
    traffic.uploadBytes += bytesOf(t);
  }
  const out = await s.run(feeds, fetches);
  for (const t of Object.values(out)) {
    if (t.location !== 'cpu') continue;
    traffic.downloads++;
    traffic.downloadBytes += bytesOf(t);
  }
  return out;
}

/**
 * A decoder's device side: its sessions (built on first use, outputs placed as above) and its
 * weights on the device.
 */
export class DeviceDecode {
  private readonly sessions = new Map<string, Promise<Session>>();
  /** The host tensors last uploaded and their device copies (fed-weights decoders). */
  private uploaded: { from: Feeds; to: Feeds } | null = null;

  constructor(
    readonly config: ModelConfig,
    private readonly shapes: Map<string, number[]>,
    private readonly build: { weights?: Map<string, FloatTensor>; lora?: LoraConfig | null; runtime: RuntimeOptions },
  ) {}

  private session(key: string, make: () => Promise<Session>): Promise<Session> {
    let s = this.sessions.get(key);
    if (!s) {
      s = make();
      this.sessions.set(key, s);
    }
    return s;
  }

  /** The prefill, step or extend graph with `head`, its cache outputs left on the device. */
  decodeSession(kind: 'prefill' | 'step' | 'extend', head: DeviceHead, logitsOnDevice = false): Promise<Session> {
    return this.session(`${kind}/${head}${logitsOnDevice ? '/device' : ''}`, () => {
      const { layers } = cacheShape(this.config);
      const where: Record<string, OutputLocation> = {};
      for (let i = 0; i < layers; i++) for (const kv of ['key', 'value'] as const) where[kind === 'step' ? cacheName(i, kv) : presentName(i, kv)] = 'gpu-buffer';
      where[head === 'logits' ? 'logits' : 'token'] = logitsOnDevice ? 'gpu-buffer' : 'cpu';
      const g = buildDeviceDecodeGraph(this.config, { past: kind !== 'prefill', extend: kind === 'extend', weights: this.build.weights, lora: this.build.lora, head });
      return Session.fromGraph(g, this.build.runtime, where);
    });
  }

  private joinSession(pad: 'a' | 'b' | null): Promise<Session> {
    return this.session(`join/${pad}`, () => {
      const g = joinGraph(this.config, pad);
      return Session.fromGraph(g, this.build.runtime, Object.fromEntries(g.outputs.map((v) => [v.name, 'gpu-buffer' as const])));
    });
  }

  /**
   * Caches `a` (`la` slots) and `b` (`lb`) as one, a's rows first, the shorter left-padded with
   * zero slots; the inputs are freed.
   */
  async join(a: Feeds, la: number, b: Feeds, lb: number): Promise<Feeds> {
    const pad = la === lb ? null : la < lb ? 'a' : 'b';
    const feeds: Feeds = {};
    for (const [name, t] of Object.entries(a)) feeds[`a.${name}`] = t;
    for (const [name, t] of Object.entries(b)) feeds[`b.${name}`] = t;
    if (pad) feeds.padding = toOrt('float32', new Float32Array(Math.abs(la - lb)), [Math.abs(la - lb)]);
    const out = await counted(await this.joinSession(pad), feeds);
    disposeAll(a);
    disposeAll(b);
    return renamed(out, cacheName, pastName, this.config);
  }

  /** The pick from a mixture of `n` models' device logits (see `mixtureGraph`); the ids come back. */
  mixtureSession(n: number, head: 'greedy' | 'sample'): Promise<Session> {
    return this.session(`mixture/${n}/${head}`, () => Session.fromGraph(mixtureGraph(n, head), this.build.runtime, { token: 'cpu' }));
  }

  private rowsSession(): Promise<Session> {
    return this.session('rows', () => {
      const g = selectRowsGraph(this.config);
      return Session.fromGraph(g, this.build.runtime, Object.fromEntries(g.outputs.map((v) => [v.name, 'gpu-buffer' as const])));
    });
  }

  /**
   * The weights to feed, on the device: `params` as they are where they already are GPU buffers;
   * host ones uploaded in one run, kept until `params` holds other tensors.
   */
  async weights(params: Feeds): Promise<Feeds> {
    const names = Object.keys(params);
    if (names.length === 0 || names.every((n) => params[n].location === 'gpu-buffer')) return params;
    const up = this.uploaded;
    if (up && names.every((n) => up.from[n] === params[n])) return up.to;
    this.disposeUploaded();
    const s = await this.session('upload', () => {
      const g = uploadGraph(this.shapes);
      return Session.fromGraph(g, this.build.runtime, Object.fromEntries(g.outputs.map((v) => [v.name, 'gpu-buffer' as const])));
    });
    const feeds: Feeds = {};
    const to: Feeds = {};
    for (const n of names) {
      if (params[n].location === 'gpu-buffer') to[n] = params[n];
      else feeds[n] = params[n];
    }
    const before = traffic.uploadBytes;
    const out = await counted(s, feeds);
    traffic.weightUploadBytes += traffic.uploadBytes - before;
    for (const n of Object.keys(feeds)) to[n] = out[`${n}.device`];
    this.uploaded = { from: { ...params }, to };
    return to;
  }

  /** Cache rows `keep` (in that order, repeats allowed), on the device; the old cache tensors are freed unless `keepOld`. */
  async selectRows(cache: Feeds, keep: number[], keepOld = false): Promise<Feeds> {
    const feeds: Feeds = { ...cache, rows: toOrt('int64', BigInt64Array.from(keep, BigInt), [keep.length]) };
    const out = await counted(await this.rowsSession(), feeds);
    if (!keepOld) disposeAll(cache);
    return renamed(out, cacheName, pastName, this.config);
  }

  private disposeUploaded(): void {
    if (!this.uploaded) return;
    for (const [n, t] of Object.entries(this.uploaded.to)) if (this.uploaded.from[n] !== t) t.dispose();
    this.uploaded = null;
  }

  async release(): Promise<void> {
    this.disposeUploaded();
    const all = await Promise.allSettled(this.sessions.values());
    this.sessions.clear();
    for (const r of all) if (r.status === 'fulfilled') await r.value.release();
  }
}

function disposeAll(feeds: Feeds): void {
  for (const t of Object.values(feeds)) if (t.location === 'gpu-buffer') t.dispose();
}

/** Outputs named `from(i, kv)` as feeds named `to(i, kv)`. */
function renamed(out: Record<string, OrtTensor>, from: typeof cacheName, to: typeof pastName, config: ModelConfig): Feeds {
  const { layers } = cacheShape(config);
  const feeds: Feeds = {};
  for (let i = 0; i < layers; i++) for (const kv of ['key', 'value'] as const) feeds[to(i, kv)] = out[from(i, kv)];
  return feeds;
}

/** A decoder as the device generation sees it (decoder.ts's `Decoder`). */
export interface DeviceDecoder {
  readonly config: ModelConfig;
  readonly vocabSize: number;
  readonly device: DeviceDecode | null;
  /** The parameter feeds (host or device tensors); empty when baked. */
  readonly weightFeeds: Feeds;
}

/** Caches of some rows on the device (one `Feeds` per part of the mixture) and their masks `[B, L]` on the host. */
interface DeviceRows {
  caches: Feeds[];
  mask: Int32Array;
  L: number;
}

/**
 * The generation loop's backend on WebGPU: the batch's caches on the device, left-padded to a
 * common length `L` (each row's real slots marked by its mask on the host), parked rows as caches
 * of their own. Host traffic per step: the ids, the mask and the uniforms up; the picked ids back.
 */
export class DeviceBackend implements DecodeBackend {
  readonly padPrefill = true;
  readonly copiesPrefix = false;
  private readonly devs: DeviceDecode[];
  private weights: Feeds[] | null = null;
  private batch: DeviceRows | null = null;
  private order: number[] = [];
  private readonly parked = new Map<number, DeviceRows>();
  /** The parts in the weighted sum (weight 0 is left out, as mixLogits leaves it). */
  private readonly used: number[];
  private readonly config: ModelConfig;
  private readonly V: number;

  constructor(
    private readonly parts: { decoder: DeviceDecoder; weight: number }[],
    private readonly o: { padId: number },
  ) {
    this.devs = parts.map((p) => {
      if (!p.decoder.device) throw new Error('DeviceBackend: a decoder that does not run on the device');
      return p.decoder.device;
    });
    this.config = parts[0].decoder.config;
    this.V = parts[0].decoder.vocabSize;
    this.used = parts.map((_, k) => k).filter((k) => parts[k].weight !== 0);
  }

  private get single(): boolean {
    return this.parts.length === 1 && this.parts[0].weight === 1;
  }

  canPick(pick: PickSpec): boolean {
    // The device draws in float32 and returns no log-probabilities: those rows sample on the host.
    if (pick.head === 'sample' && pick.logprobs) return false;
    return this.single || this.used.length > 0;
  }

  batchRows(): readonly number[] {
    return this.order;
  }

  /** The weights on the device, uploaded on first use (and again after setWeights). */
  private async weightFeeds(): Promise<Feeds[]> {
    this.weights ??= await Promise.all(this.parts.map((p, k) => this.devs[k].weights(p.decoder.weightFeeds)));
    return this.weights;
  }

  /**
   * One run of `kind` over `ids` `[n, S]` under `mask` `[n, M]` for every part (`past` their caches,
   * freed after), then the pick: each part's new caches and the answer.
   */
  private async run(kind: 'prefill' | 'step' | 'extend', ids: Int32Array, mask: Int32Array, n: number, past: Feeds[] | null, pick: PickSpec | null, uniform: Float64Array | null): Promise<{ caches: Feeds[]; out: RunOut }> {
    const S = ids.length / n;
    const weights = await this.weightFeeds();
    const mixed = !this.single && pick !== null;
    const head: DeviceHead = this.single && pick ? pick.head : 'logits';
    const feeds: Feeds = { input_ids: toOrt('int32', ids, [n, S]), attention_mask: toOrt('int32', mask, [n, mask.length / n]) };
    const pickFeeds: Feeds = {};
    if (pick) pickFeeds.vocab_limit = toOrt('int64', BigInt64Array.of(BigInt(pick.limit)), [1]);
    if (pick?.head === 'sample') {
      pickFeeds.temperature = toOrt('float32', Float32Array.of(pick.temperature), []);
      pickFeeds.uniform = toOrt('float32', Float32Array.from(uniform!), [n, 1]);
    }
    if (head !== 'logits') Object.assign(feeds, pickFeeds);
    const results: Record<string, OrtTensor>[] = [];
    const caches: Feeds[] = [];
    for (let k = 0; k < this.parts.length; k++) {
      const s = await this.devs[k].decodeSession(kind, head, mixed);
      const r = await counted(s, { ...weights[k], ...feeds, ...(past ? past[k] : {}) });
      if (past) disposeAll(past[k]);
      caches.push(renamed(r, kind === 'step' ? cacheName : presentName, pastName, this.config));
      results.push(r);
    }
    traffic.steps++;
    if (mixed) {
      const mf: Feeds = { ...pickFeeds };
      this.used.forEach((k, j) => {
        mf[`logits.${j}`] = results[k].logits;
        mf[`weight.${j}`] = toOrt('float32', Float32Array.of(this.parts[k].weight), []);
      });
      const picked = await counted(await this.devs[0].mixtureSession(this.used.length, pick!.head), mf);
      for (const r of results) r.logits.dispose();
      return { caches, out: { tokens: picked.token.data as BigInt64Array } };
    }
    if (pick) return { caches, out: { tokens: results[0].token.data as BigInt64Array } };
    return { caches, out: { logits: results.map((r) => r.logits.data as Float32Array) } };
  }

  async leave(rows: readonly number[], park: (row: number) => boolean): Promise<void> {
    if (rows.length === 0 || !this.batch) return;
    const going = new Set(rows);
    const batch = this.batch;
    const keep: number[] = [];
    for (let b = 0; b < this.order.length; b++) {
      const r = this.order[b];
      if (!going.has(r)) keep.push(b);
      else if (park(r)) this.parked.set(r, await this.rowsOf(batch, [b], true));
    }
    this.order = keep.map((b) => this.order[b]);
    if (keep.length === 0) {
      for (const c of batch.caches) disposeAll(c);
      this.batch = null;
    } else this.batch = await this.rowsOf(batch, keep, false);
  }

  /** Rows `pick` of `from` (caches gathered on the device, masks on the host); `from`'s caches are freed unless `keepOld`. */
  private async rowsOf(from: DeviceRows, pick: number[], keepOld: boolean): Promise<DeviceRows> {
    const caches = await Promise.all(from.caches.map((c, k) => this.devs[k].selectRows(c, pick, keepOld)));
    const mask = new Int32Array(pick.length * from.L);
    pick.forEach((b, i) => mask.set(from.mask.subarray(b * from.L, (b + 1) * from.L), i * from.L));
    return { caches, mask, L: from.L };
  }

  /** `rows` appended to the batch (its caches and theirs freed into the joined ones). */
  private async append(rows: DeviceRows): Promise<void> {
    const a = this.batch;
    if (!a) {
      this.batch = rows;
      return;
    }
    const L = Math.max(a.L, rows.L);
    const caches = await Promise.all(a.caches.map((c, k) => this.devs[k].join(c, a.L, rows.caches[k], rows.L)));
    const Ba = a.mask.length / a.L;
    const Bb = rows.mask.length / rows.L;
    const mask = new Int32Array((Ba + Bb) * L);
    for (let b = 0; b < Ba; b++) mask.set(a.mask.subarray(b * a.L, (b + 1) * a.L), b * L + L - a.L);
    for (let b = 0; b < Bb; b++) mask.set(rows.mask.subarray(b * rows.L, (b + 1) * rows.L), (Ba + b) * L + L - rows.L);
    this.batch = { caches, mask, L };
  }

  async join(rows: readonly number[]): Promise<void> {
    for (const r of rows) {
      const own = this.parked.get(r);
      if (!own) throw new Error(`generation: row ${r} has no parked cache`);
      this.parked.delete(r);
      await this.append(own);
      this.order.push(r);
    }
  }

  async step(tokens: readonly number[], pick: PickSpec | null, uniform: Float64Array | null): Promise<RunOut> {
    const a = this.batch!;
    const B = this.order.length;
    const mask = new Int32Array(B * (a.L + 1));
    for (let b = 0; b < B; b++) {
      mask.set(a.mask.subarray(b * a.L, (b + 1) * a.L), b * (a.L + 1));
      mask[b * (a.L + 1) + a.L] = 1;
    }
    const { caches, out } = await this.run('step', Int32Array.from(tokens), mask, B, a.caches, pick, uniform);
    this.batch = { caches, mask, L: a.L + 1 };
    return out;
  }

  async extend(row: number, tokens: readonly number[], pick: PickSpec | null, uniform: Float64Array | null): Promise<RunOut> {
    const own = this.parked.get(row);
    if (!own) throw new Error(`generation: row ${row} has no parked cache`);
    const S = tokens.length;
    const mask = new Int32Array(own.L + S).fill(1);
    mask.set(own.mask);
    const { caches, out } = await this.run('extend', Int32Array.from(tokens), mask, 1, own.caches, pick, uniform);
    this.parked.set(row, { caches, mask, L: own.L + S });
    return out;
  }

  async prefill(group: PrefillGroup, pick: PickSpec | null, uniform: Float64Array | null): Promise<RunOut> {
    const n = group.rows.length;
    const S = Math.max(1, ...group.prompts.map((p) => p.length));
    const ids = new Int32Array(n * S).fill(this.o.padId);
    const mask = new Int32Array(n * S);
    group.prompts.forEach((p, b) => {
      for (let t = 0; t < p.length; t++) {
        ids[b * S + S - p.length + t] = p[t];
        mask[b * S + S - p.length + t] = 1;
      }
    });
    const { caches, out } = await this.run('prefill', ids, mask, n, null, pick, uniform);
    await this.append({ caches, mask, L: S });
    this.order.push(...group.rows);
    return out;
  }

  async copy(from: number, to: number, slots?: number): Promise<void> {
    if (slots !== undefined) throw new Error('generation: the device backend copies whole caches only');
    const own = this.parked.get(from);
    const b = own ? 0 : this.order.indexOf(from);
    if (b < 0) throw new Error(`generation: row ${from} has no cache`);
    this.parked.set(to, await this.rowsOf(own ?? this.batch!, [b], true));
  }

  async clone(from: number, to: number): Promise<void> {
    await this.copy(from, to);
    await this.join([to]);
  }

  free(row: number): void {
    const own = this.parked.get(row);
    if (own) for (const c of own.caches) disposeAll(c);
    this.parked.delete(row);
  }

  async close(): Promise<void> {
    for (const r of [...this.parked.keys()]) this.free(r);
    if (this.batch) for (const c of this.batch.caches) disposeAll(c);
    this.batch = null;
    this.order = [];
    this.weights = null;
  }
}
