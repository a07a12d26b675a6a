/**
 * Batched sampling with a key/value cache. A `Decoder` holds the prefill and step sessions of one
 * model; `generateIds` left-pads a batch of prompts, prefills once, then feeds one token per step,
 * drawing each row's token from the (mixture of the) decoders' logits with that row's own random
 * stream. Finished rows leave the batch (their cache rows are dropped), so a long answer in the batch
 * does not make the short ones pay.
 */
import { type ModelConfig, maxPositions } from './config.ts';
import type { FloatTensor } from './checkpoint.ts';
import type { LoraConfig } from './lora.ts';
import { modelParameterShapes } from './params.ts';
import { Session, toOrt, type Feeds, type OrtTensor, type RuntimeOptions } from '../runtime/session.ts';
import { UserError } from '../errors.ts';
import type { SeededRandom } from '../random.ts';
import type { LoadedTokenizer } from '../tokenize/index.ts';
import { buildDecodeGraph, cacheShape, pastName, presentName } from './decode.ts';
import { mixLogits, sampleToken, samplingOptions, type SamplingOptions } from './sampling.ts';

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
}

export class Decoder {
  private params: Feeds = {};

  private constructor(
    readonly config: ModelConfig,
    private readonly prefillSession: Session,
    private readonly stepSession: Session,
    private readonly shapes: Map<string, number[]>,
    readonly baked: boolean,
  ) {}

  static async create(config: ModelConfig, weights: Map<string, FloatTensor>, o: DecoderOptions = {}): Promise<Decoder> {
    const bake = o.bake ?? false;
    const gw = bake ? weights : undefined;
    const prefill = await Session.fromGraph(buildDecodeGraph(config, { past: false, weights: gw, lora: o.lora }), o.runtime);
    const step = await Session.fromGraph(buildDecodeGraph(config, { past: true, weights: gw, lora: o.lora }), o.runtime);
    const d = new Decoder(config, prefill, step, modelParameterShapes(config, { lora: o.lora }), bake);
    if (!bake) d.setWeights((name) => weights.get(name)?.data);
    return d;
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

  get vocabSize(): number {
    return this.config.vocab_size;
  }

  /**
   * Runs S new tokens per row. `ids` [B, S]; `mask` [B, L] covers the cache and the new tokens.
   * Returns the logits of each row's last new token `[B, V]` and the extended cache.
   */
  async forward(ids: BigInt64Array, mask: BigInt64Array, rows: number, cache: KVCache | null): Promise<{ logits: Float32Array; cache: KVCache }> {
    const S = ids.length / rows;
    const L = mask.length / rows;
    const feeds: Feeds = { ...this.params, input_ids: toOrt('int64', ids, [rows, S]), attention_mask: toOrt('int64', mask, [rows, L]) };
    if (cache) Object.assign(feeds, cache.tensors);
    const out = await (cache ? this.stepSession : this.prefillSession).run(feeds);
    const { layers } = cacheShape(this.config);
    const tensors: Feeds = {};
    for (let i = 0; i < layers; i++) {
      for (const kv of ['key', 'value'] as const) tensors[pastName(i, kv)] = out[presentName(i, kv)];
    }
    return { logits: out.logits.data as Float32Array, cache: { rows, length: L, tensors } };
  }

  async release(): Promise<void> {
    await this.prefillSession.release();
    await this.stepSession.release();
  }
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
  // Similar prompt lengths share a batch (less padding); each row's stream makes the order irrelevant.
  const order = reqs.map((_, i) => i).sort((a, b) => reqs[a].promptIds.length - reqs[b].promptIds.length);
  const batchSize = o.batchSize ?? 32;
  for (let s = 0; s < order.length; s += batchSize) {
    const rowsIdx = order.slice(s, s + batchSize);
    const P0 = Math.max(1, ...rowsIdx.map((i) => reqs[i].promptIds.length));
    if (P0 + o.maxNewTokens > maxPos) {
      throw new UserError(`a prompt of ${P0} tokens plus max_new_tokens ${o.maxNewTokens} exceeds the model's ${maxPos} positions`);
    }
    let B = rowsIdx.length;
    let ids = new BigInt64Array(B * P0).fill(BigInt(o.padId));
    let mask = new BigInt64Array(B * P0);
    rowsIdx.forEach((r, b) => {
      const p = reqs[r].promptIds;
      for (let t = 0; t < p.length; t++) {
        ids[b * P0 + P0 - p.length + t] = BigInt(p[t]);
        mask[b * P0 + P0 - p.length + t] = 1n;
      }
    });
    let caches: (KVCache | null)[] = parts.map(() => null);
    let active = rowsIdx.slice();
    const got = new Map<number, number[]>(rowsIdx.map((r) => [r, []]));
    let L = P0;
    for (let step = 0; active.length > 0; step++) {
      const results: { logits: Float32Array; cache: KVCache }[] = [];
      for (let k = 0; k < parts.length; k++) results.push(await parts[k].decoder.forward(ids, mask, B, caches[k]));
      caches = results.map((r) => r.cache);
      const V = parts[0].decoder.vocabSize;
      const keep: number[] = [];
      const next: number[] = [];
      active.forEach((r, b) => {
        const row = mixLogits(results.map((res, k) => ({ logits: res.logits.subarray(b * V, b * V + limit), weight: parts[k].weight })));
        const tok = sampleToken(row, sampling, reqs[r].rng);
        const seq = got.get(r)!;
        seq.push(tok);
        if (stop.has(tok)) out[r] = { ids: seq, stopped: true };
        else if (seq.length >= o.maxNewTokens) out[r] = { ids: seq, stopped: false };
        else {
          keep.push(b);
          next.push(tok);
        }
      });
      if (keep.length === 0) break;
      if (keep.length < B) caches = caches.map((c) => selectCacheRows(c!, keep));
      const newMask = new BigInt64Array(keep.length * (L + 1));
      keep.forEach((b, i) => {
        newMask.set(mask.subarray(b * L, (b + 1) * L), i * (L + 1));
        newMask[i * (L + 1) + L] = 1n;
      });
      active = keep.map((b) => active[b]);
      B = keep.length;
      L += 1;
      mask = newMask;
      ids = BigInt64Array.from(next.map(BigInt));
    }
  }
  return out;
}

/** The text of a sampled response: its ids without the final stop token. */
export function responseText(tok: LoadedTokenizer, ids: readonly number[], stopped: boolean): string {
  return tok.decode(stopped ? ids.slice(0, -1) : ids, { skipSpecialTokens: false });
}
