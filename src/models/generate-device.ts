/**
 * Generation that stays on the GPU (WebGPU). `generateIds` hands a batch here when its decoders run
 * on the WebGPU provider; the CPU path (generate.ts) is unchanged.
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
 *   the CPU. Finished rows leave through a Gather graph whose outputs stay on the device.
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
import { mixLogits, sampleToken, type SamplingOptions } from './sampling.ts';
import { takeTokens, type Generated, type GenerateOptions, type GenerateRequest, type MixturePart } from './generate.ts';

/** What a device graph returns for each row's last position (see `deviceHead`). */
export type DeviceHead = 'logits' | 'greedy' | 'sample';

const cacheName = (layer: number, kv: 'key' | 'value') => `cache.${layer}.${kv}`;

/**
 * The decode graph for the device: buildDecodeGraph's prefill or step (logits head), then
 * - step: `cache.<i>.<kv>` = Concat(past, present) along the positions, the cache of the next step;
 * - the head: `greedy` or `sample` → `token` [B] (`pickToken`; float32: WebGPU has no float64);
 *   `logits` → `logits` [B, V].
 */
export function buildDeviceDecodeGraph(config: ModelConfig, o: { past: boolean; weights?: Map<string, FloatTensor>; lora?: LoraConfig | null; head: DeviceHead }): Graph {
  // `weightFirst: false`: the products with fed weights stay x·Wᵀ (the weight-first rewrite is for
  // the CPU's MLAS packing).
  const g = buildDecodeGraph(config, { past: o.past, weights: o.weights, lora: o.lora, head: 'logits', weightFirst: false });
  const { layers } = cacheShape(config);
  const keep = new Set<string>();
  if (o.past) {
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

  /** The prefill (`past` false) or step graph with `head`, its cache outputs left on the device. */
  decodeSession(past: boolean, head: DeviceHead, logitsOnDevice = false): Promise<Session> {
    return this.session(`${past ? 'step' : 'prefill'}/${head}${logitsOnDevice ? '/device' : ''}`, () => {
      const { layers } = cacheShape(this.config);
      const where: Record<string, OutputLocation> = {};
      for (let i = 0; i < layers; i++) for (const kv of ['key', 'value'] as const) where[past ? cacheName(i, kv) : presentName(i, kv)] = 'gpu-buffer';
      where[head === 'logits' ? 'logits' : 'token'] = logitsOnDevice ? 'gpu-buffer' : 'cpu';
      return Session.fromGraph(buildDeviceDecodeGraph(this.config, { past, weights: this.build.weights, lora: this.build.lora, head }), this.build.runtime, where);
    });
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

  /** Keeps cache rows `keep` (in that order), on the device; the old cache tensors are freed. */
  async selectRows(cache: Feeds, keep: number[]): Promise<Feeds> {
    const feeds: Feeds = { ...cache, rows: toOrt('int64', BigInt64Array.from(keep, BigInt), [keep.length]) };
    const out = await counted(await this.rowsSession(), feeds);
    disposeAll(cache);
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

/** A decoder as the device generation sees it (generate.ts's `Decoder`). */
export interface DeviceDecoder {
  readonly config: ModelConfig;
  readonly vocabSize: number;
  readonly device: DeviceDecode | null;
  /** The parameter feeds (host or device tensors); empty when baked. */
  readonly weightFeeds: Feeds;
}

/**
 * `generateIds` on the device for one batch `rowsIdx` of `reqs` (prompts left-padded to `P0`):
 * writes each row's result into `out`. `sampling` is checked; `timer` as generate.ts's.
 */
export async function generateBatchOnDevice(
  parts: (Omit<MixturePart, 'decoder'> & { decoder: DeviceDecoder })[],
  reqs: GenerateRequest[],
  rowsIdx: number[],
  o: GenerateOptions,
  sampling: Required<SamplingOptions>,
  out: Generated[],
  timer: ((label: string, ms: number) => void) | null,
): Promise<void> {
  const devs = parts.map((p) => {
    if (!p.decoder.device) throw new Error('generateBatchOnDevice: a decoder that does not run on the device');
    return p.decoder.device;
  });
  const config = parts[0].decoder.config;
  const V = parts[0].decoder.vocabSize;
  const limit = Math.min(o.vocabLimit ?? config.vocab_size, config.vocab_size);
  const stop = new Set(o.stopIds);
  const single = parts.length === 1 && parts[0].weight === 1;
  // The graph picks unless top-k/top-p (or hostSampling) ask for the host; a mixture's parts leave
  // their logits on the device for a pick graph over their weighted sum.
  // Parts with weight 0 are left out of the sum, as mixLogits leaves them.
  const used = parts.map((_, k) => k).filter((k) => parts[k].weight !== 0);
  const canPick = o.hostSampling ? null : sampling.temperature === 0 ? 'greedy' : sampling.topK === 0 && sampling.topP === 1 ? 'sample' : null;
  const mixed = !single && canPick !== null && used.length > 0;
  const pick = single || mixed ? canPick : null;
  const head: DeviceHead = single && pick ? pick : 'logits';
  const weights = await Promise.all(parts.map((p, k) => devs[k].weights(p.decoder.weightFeeds)));

  let B = rowsIdx.length;
  const P0 = Math.max(1, ...rowsIdx.map((i) => reqs[i].promptIds.length));
  // Host copies of what is fed: the ids and the mask (int32: the lowered graphs take int32).
  let ids = new Int32Array(B * P0).fill(o.padId);
  let mask = new Int32Array(B * P0);
  rowsIdx.forEach((r, b) => {
    const p = reqs[r].promptIds;
    for (let t = 0; t < p.length; t++) {
      ids[b * P0 + P0 - p.length + t] = p[t];
      mask[b * P0 + P0 - p.length + t] = 1;
    }
  });
  let L = P0; // positions in the cache after the prefill
  let caches: Feeds[] = [];
  let active = rowsIdx.slice();
  const got = new Map<number, number[]>(rowsIdx.map((r) => [r, []]));
  const uniform = new Float32Array(B);
  try {
    for (let step = 0; active.length > 0; step++) {
      let t0 = timer ? performance.now() : 0;
      const S = step === 0 ? P0 : 1;
      const M = step === 0 ? P0 : L + 1;
      const feeds: Feeds = { input_ids: toOrt('int32', ids.subarray(0, B * S), [B, S]), attention_mask: toOrt('int32', mask.subarray(0, B * M), [B, M]) };
      const pickFeeds: Feeds = {};
      if (pick) pickFeeds.vocab_limit = toOrt('int64', BigInt64Array.of(BigInt(limit)), [1]);
      if (pick === 'sample') {
        active.forEach((r, b) => (uniform[b] = reqs[r].rng.next()));
        pickFeeds.temperature = toOrt('float32', Float32Array.of(sampling.temperature), []);
        pickFeeds.uniform = toOrt('float32', uniform.subarray(0, B), [B, 1]);
      }
      if (head !== 'logits') Object.assign(feeds, pickFeeds);
      const results: Record<string, OrtTensor>[] = [];
      for (let k = 0; k < parts.length; k++) {
        const s = await devs[k].decodeSession(step > 0, head, mixed);
        const r = await counted(s, { ...weights[k], ...feeds, ...(step > 0 ? caches[k] : {}) });
        if (step > 0) {
          disposeAll(caches[k]);
          caches[k] = renamed(r, cacheName, pastName, config);
        } else caches.push(renamed(r, presentName, pastName, config));
        results.push(r);
      }
      if (mixed) {
        const mf: Feeds = { ...pickFeeds };
        used.forEach((k, j) => {
          mf[`logits.${j}`] = results[k].logits;
          mf[`weight.${j}`] = toOrt('float32', Float32Array.of(parts[k].weight), []);
        });
        const picked = await counted(await devs[0].mixtureSession(used.length, pick!), mf);
        for (const r of results) r.logits.dispose();
        results.unshift(picked);
      }
      traffic.steps++;
      if (timer) {
        timer(step === 0 ? 'prefill' : 'forward', performance.now() - t0);
        t0 = performance.now();
      }
      L = step === 0 ? P0 : L + 1;
      const tokens = pick ? (results[0].token.data as BigInt64Array | Int32Array) : null;
      const { keep, next } = takeTokens(active, got, stop, o.maxNewTokens, out, (b, r) =>
        tokens ? Number(tokens[b]) : sampleToken(mixLogits(results.map((res, k) => ({ logits: (res.logits.data as Float32Array).subarray(b * V, b * V + limit), weight: parts[k].weight }))), sampling, reqs[r].rng),
      );
      if (timer) {
        timer('sample', performance.now() - t0);
        t0 = performance.now();
      }
      if (keep.length === 0) break;
      // The next step's mask: the kept rows' cache columns, then the new token.
      const nextMask = new Int32Array(keep.length * (L + 1));
      keep.forEach((b, i) => {
        nextMask.set(mask.subarray(b * L, (b + 1) * L), i * (L + 1));
        nextMask[i * (L + 1) + L] = 1;
      });
      if (keep.length < B) caches = await Promise.all(caches.map((c, k) => devs[k].selectRows(c, keep)));
      mask = nextMask;
      active = keep.map((b) => active[b]);
      B = keep.length;
      ids = Int32Array.from(next);
      timer?.('bookkeeping', performance.now() - t0);
    }
  } finally {
    for (const c of caches) disposeAll(c);
  }
}
