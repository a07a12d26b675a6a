/**
 * Random initialisation of a model's weights, deterministic in the seed: HF's scheme — every
 * projection and embedding N(0, 0.02), norm scales 1, biases 0; GPT-2 also scales the residual
 * output projections (`c_proj`) by 1/√(2·n_layer) as its paper and HF do.
 */
import type { FloatTensor } from './checkpoint.ts';
import { type ModelConfig, hiddenSize, parameterShapes } from './config.ts';

/** HF's `initializer_range` default. */
export const INIT_STD = 0.02;

/** A seeded source of uniform and normal numbers (splitmix64 state stepping, Box–Muller pairs). */
export class Normal {
  private state: bigint;
  private spare: number | null = null;

  constructor(seed: number) {
    this.state = BigInt.asUintN(64, BigInt(Math.trunc(seed)) * 0x9e3779b97f4a7c15n + 0x632be59bd9b4e019n);
  }

  /** Uniform in [0, 1) with 53 random bits. */
  uniform(): number {
    this.state = BigInt.asUintN(64, this.state + 0x9e3779b97f4a7c15n);
    let z = this.state;
    z = BigInt.asUintN(64, (z ^ (z >> 30n)) * 0xbf58476d1ce4e5b9n);
    z = BigInt.asUintN(64, (z ^ (z >> 27n)) * 0x94d049bb133111ebn);
    z ^= z >> 31n;
    return Number(z >> 11n) / 2 ** 53;
  }

  /** Standard normal. */
  next(): number {
    if (this.spare !== null) {
      const s = this.spare;
      this.spare = null;
      return s;
    }
    const u = 1 - this.uniform();
    const v = this.uniform();
    const r = Math.sqrt(-2 * Math.log(u));
    this.spare = r * Math.sin(2 * Math.PI * v);
    return r * Math.cos(2 * Math.PI * v);
  }

  fill(n: number, std: number): Float32Array {
    const a = new Float32Array(n);
    for (let i = 0; i < n; i++) a[i] = this.next() * std;
    return a;
  }
}

/** Fresh weights of a config, by HF name (tied heads are not separate tensors). */
export function initWeights(c: ModelConfig, seed: number, std = INIT_STD): Map<string, FloatTensor> {
  const rng = new Normal(seed);
  const out = new Map<string, FloatTensor>();
  const layers = c.model_type === 'gpt2' ? c.n_layer : c.num_hidden_layers;
  for (const [name, shape] of parameterShapes(c)) {
    const n = shape.reduce((a, b) => a * b, 1);
    let data: Float32Array;
    if (/(norm|ln_\d|ln_f)\.weight$/.test(name)) data = new Float32Array(n).fill(1);
    else if (name.endsWith('.bias')) data = new Float32Array(n);
    else if (c.model_type === 'gpt2' && name.endsWith('c_proj.weight')) data = rng.fill(n, std / Math.sqrt(2 * layers));
    else data = rng.fill(n, std);
    out.set(name, { shape, data });
  }
  return out;
}

/** A scalar head `value_head.weight [hidden]`, `value_head.bias [1]`: weight N(0, 0.02), bias 0. */
export function initValueHead(c: ModelConfig, seed: number): Map<string, FloatTensor> {
  const d = hiddenSize(c);
  const rng = new Normal(seed);
  return new Map([
    ['value_head.weight', { shape: [d], data: rng.fill(d, INIT_STD) }],
    ['value_head.bias', { shape: [1], data: new Float32Array(1) }],
  ]);
}
