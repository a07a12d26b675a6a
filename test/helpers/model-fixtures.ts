/** Small configs, random weights and a runner for the model graphs, shared by the model tests. */
import { Graph } from '../../src/onnx/graph.ts';
import { serializeModel } from '../../src/onnx/proto.ts';
import { Session, toOrt, type Feeds } from '../../src/runtime/session.ts';
import { parseConfig, type ModelConfig, type Arch } from '../../src/models/config.ts';
import type { FloatTensor } from '../../src/models/checkpoint.ts';
import { buildCausalLM, declareParameters, valueHead, type LoraConfig } from '../../src/models/index.ts';
import { sequenceLogps } from '../../src/models/logps.ts';
import { initWeights } from '../../src/models/init.ts';
import { Normal } from '../../src/random.ts';

/**
 * Smaller than the tiny preset, with GQA (4 heads, 2 KV heads) and untied or tied heads. Members'
 * own features are on and small enough to matter: a head_dim other than hidden/heads (qwen3, gemma),
 * a sliding window shorter than the test rows (mistral, phi3), half-width rotary (phi3).
 */
const MEMBER_EXTRAS: Partial<Record<Arch, Record<string, unknown>>> = {
  qwen3: { head_dim: 12 },
  mistral: { sliding_window: 4 },
  gemma: { head_dim: 12 },
  phi3: { partial_rotary_factor: 0.5, sliding_window: 5 },
};

export function testConfig(arch: Arch, o: { tied?: boolean; extra?: Record<string, unknown> } = {}): ModelConfig {
  if (arch === 'gpt2') {
    return parseConfig({ model_type: 'gpt2', vocab_size: 53, n_embd: 24, n_layer: 2, n_head: 3, n_positions: 32, tie_word_embeddings: o.tied ?? true, ...o.extra });
  }
  return parseConfig({
    model_type: arch,
    vocab_size: 53,
    hidden_size: 32,
    intermediate_size: 40,
    num_hidden_layers: 2,
    num_attention_heads: 4,
    num_key_value_heads: 2,
    rope_theta: 500,
    rms_norm_eps: 1e-5,
    max_position_embeddings: 64,
    tie_word_embeddings: o.tied ?? false,
    ...MEMBER_EXTRAS[arch],
    ...o.extra,
  });
}

/**
 * Random weights with a large spread (std 0.3, norms and biases perturbed) so the network is far from
 * linear and uniform and a wrong convention shows.
 */
export function randomWeights(c: ModelConfig, seed: number): Map<string, FloatTensor> {
  const w = initWeights(c, seed, 0.3);
  const rng = new Normal(seed + 1000);
  for (const [name, t] of w) {
    if (name.endsWith('.bias') || /(norm|ln_\d|ln_f)\.weight$/.test(name)) {
      for (let i = 0; i < t.data.length; i++) t.data[i] += 0.2 * rng.next();
    }
  }
  return w;
}

export interface Row {
  ids: number[];
  /** Loss mask over `ids`. */
  loss: number[];
}

export interface PaddedBatch {
  ids: number[][];
  attention: number[][];
  loss: number[][];
  /** Offset of each row's first real token. */
  offset: number[];
}

/** Pads rows to `T`, each to the left or right as `sides` says, with junk ids under the mask. */
export function pad(rows: Row[], T: number, sides: ('left' | 'right')[], junk = 7): PaddedBatch {
  const b: PaddedBatch = { ids: [], attention: [], loss: [], offset: [] };
  rows.forEach((r, i) => {
    const n = T - r.ids.length;
    const left = sides[i] === 'left' ? n : 0;
    const right = n - left;
    b.ids.push([...Array(left).fill(junk), ...r.ids, ...Array(right).fill(junk)]);
    b.attention.push([...Array(left).fill(0), ...r.ids.map(() => 1), ...Array(right).fill(0)]);
    b.loss.push([...Array(left).fill(1), ...r.loss, ...Array(right).fill(0)]);
    b.offset.push(left);
  });
  // Left pads carry loss_mask = 1 on purpose: the attention mask alone must keep them out.
  b.loss = b.loss.map((l, i) => l.map((v, t) => (b.attention[i][t] ? v : 0)));
  return b;
}

export interface RunOptions {
  dtype?: 'float32' | 'float64';
  lora?: LoraConfig | null;
  /** Declare adapter parameters even if the forward does not use them. */
  declareLora?: LoraConfig | null;
  valueIndex?: number[];
}

export interface RunResult {
  logits: Float64Array;
  logp: Float64Array;
  tokens: Float64Array;
  tokenLogps: Float64Array;
  value?: Float64Array;
  V: number;
}

/** Builds the graph once per call, feeds the weights as inputs and returns everything as float64. */
export async function runModel(c: ModelConfig, weights: Map<string, FloatTensor>, batch: PaddedBatch, o: RunOptions = {}): Promise<RunResult> {
  const dtype = o.dtype ?? 'float32';
  const g = new Graph('test');
  const inputIds = g.input('input_ids', 'int64', ['batch', 'seq']);
  const attentionMask = g.input('attention_mask', 'int64', ['batch', 'seq']);
  const lossMask = g.input('loss_mask', dtype, ['batch', 'seq']);
  const params = declareParameters(g, c, { dtype, lora: o.declareLora ?? o.lora, valueHead: o.valueIndex !== undefined });
  const model = buildCausalLM(g, c, params, { inputIds, attentionMask }, { lora: o.lora });
  const r = sequenceLogps(g, model, lossMask, { perToken: true });
  g.output(model.logits(), 'logits');
  g.output(r.logp, 'logp');
  g.output(r.tokens, 'tokens');
  g.output(r.tokenLogps!, 'token_logps');
  if (o.valueIndex) g.output(valueHead(g, model, params, g.input('value_index', 'int64', ['batch'])), 'value');
  const session = await Session.create(serializeModel(g));
  const B = batch.ids.length;
  const T = batch.ids[0].length;
  const F = dtype === 'float32' ? Float32Array : Float64Array;
  const feeds: Feeds = {
    input_ids: toOrt('int64', BigInt64Array.from(batch.ids.flat().map(BigInt)), [B, T]),
    attention_mask: toOrt('int64', BigInt64Array.from(batch.attention.flat().map(BigInt)), [B, T]),
    loss_mask: toOrt(dtype, F.from(batch.loss.flat()), [B, T]),
  };
  if (o.valueIndex) feeds.value_index = toOrt('int64', BigInt64Array.from(o.valueIndex.map(BigInt)), [B]);
  for (const [name, t] of params) {
    const w = weights.get(name);
    if (!w) throw new Error(`test weights lack ${name}`);
    feeds[name] = toOrt(dtype, F.from(w.data), t.staticShape!);
  }
  const out = await session.run(feeds);
  await session.release();
  const f64 = (k: string) => Float64Array.from(out[k].data as Float32Array);
  return {
    logits: f64('logits'),
    logp: f64('logp'),
    tokens: f64('tokens'),
    tokenLogps: f64('token_logps'),
    value: o.valueIndex ? f64('value') : undefined,
    V: c.vocab_size,
  };
}

export function randomIds(n: number, vocab: number, rng: Normal): number[] {
  return Array.from({ length: n }, () => Math.floor(rng.uniform() * vocab));
}

/** Largest |a − b| relative to the largest |b|. */
export function worst(a: ArrayLike<number>, b: ArrayLike<number>): number {
  let scale = 0;
  let d = 0;
  for (let i = 0; i < b.length; i++) {
    scale = Math.max(scale, Math.abs(b[i]));
    d = Math.max(d, Math.abs(a[i] - b[i]));
  }
  return d / scale;
}

/** Feeds of a padded batch (ids, attention and loss masks) and the parameters `names` from `w`. */
export function feedsOf(g: Graph, b: PaddedBatch, w: Map<string, FloatTensor>, names: Iterable<string>): Feeds {
  const B = b.ids.length;
  const T = b.ids[0].length;
  const feeds: Feeds = {
    input_ids: toOrt('int64', BigInt64Array.from(b.ids.flat().map(BigInt)), [B, T]),
    attention_mask: toOrt('int64', BigInt64Array.from(b.attention.flat().map(BigInt)), [B, T]),
    loss_mask: toOrt('float32', Float32Array.from(b.loss.flat()), [B, T]),
  };
  for (const n of names) feeds[n] = toOrt('float32', Float32Array.from(w.get(n)!.data), g.tensor(n).staticShape!);
  return feeds;
}
