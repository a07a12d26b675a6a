/**
 * Model parameters as graph tensors. Parameters are graph inputs named exactly as the HF checkpoint
 * names them (one checkpoint feeds the training, eval and optimizer graphs), or initializers for
 * self-contained inference graphs. Adapter tensors sit beside their module's weight; a value head
 * is `value_head.weight [hidden]` + `value_head.bias [1]`.
 */
import type { Graph, Tensor } from '../onnx/graph.ts';
import type { FloatTensor } from './checkpoint.ts';
import { type ModelConfig, hiddenSize, parameterShapes } from './config.ts';
import type { Adapter, FloatDType, ModelParams } from './family.ts';
import { type LoraConfig, loraModules, loraParameterShapes, loraScale } from './lora.ts';
import { dequantizeNode, q4Names } from './quantize-base.ts';

export interface ParameterOptions {
  /** Adds LoRA adapter tensors for these targets. */
  lora?: LoraConfig | null;
  /** Adds the scalar head `value_head.weight`, `value_head.bias`. */
  valueHead?: boolean;
}

export const VALUE_HEAD_WEIGHT = 'value_head.weight';
export const VALUE_HEAD_BIAS = 'value_head.bias';

/** Names and shapes of every parameter: the base model (tied heads not repeated), adapters, value head. */
export function modelParameterShapes(c: ModelConfig, o: ParameterOptions = {}): Map<string, number[]> {
  const s = new Map(parameterShapes(c));
  if (o.lora) for (const [k, v] of loraParameterShapes(c, o.lora)) s.set(k, v);
  if (o.valueHead) {
    s.set(VALUE_HEAD_WEIGHT, [hiddenSize(c)]);
    s.set(VALUE_HEAD_BIAS, [1]);
  }
  return s;
}

/** Declares every parameter as a graph input of `dtype` (float64 for gradient checks). */
export function declareParameters(g: Graph, c: ModelConfig, o: ParameterOptions & { dtype?: FloatDType } = {}): Map<string, Tensor> {
  const dtype = o.dtype ?? 'float32';
  const out = new Map<string, Tensor>();
  for (const [name, shape] of modelParameterShapes(c, o)) out.set(name, g.input(name, dtype, shape));
  return out;
}

/** Bakes weights into the graph as initializers (inference graphs built in memory). */
export function parameterInitializers(g: Graph, weights: Map<string, FloatTensor>, names: Iterable<string>): Map<string, Tensor> {
  const out = new Map<string, Tensor>();
  for (const name of names) {
    const w = weights.get(name);
    if (!w) throw new Error(`no weight named ${name}`);
    out.set(name, g.initializer(name, { dtype: 'float32', dims: w.shape, data: w.data }));
  }
  return out;
}

/** Parameter lookup for the forward builders; adapters are used only when a LoRA config is passed. */
export class Params implements ModelParams {
  private readonly adapted: Set<string>;
  private readonly scale: number;

  constructor(
    readonly tensors: Map<string, Tensor>,
    config: ModelConfig,
    lora?: LoraConfig | null,
  ) {
    this.adapted = new Set(lora ? loraModules(config, lora).map((m) => m.name) : []);
    this.scale = lora ? loraScale(lora) : 0;
  }

  /**
   * The parameter as the forward computes with it: a float16 one (frozen base weights under LoRA,
   * `base_dtype`) is widened to float32 here, where it is used, so that recomputation
   * (src/autodiff/recompute.ts) can widen it again in the backward instead of keeping the copy.
   * A 4-bit one (QLoRA's `load_in_4bit`: declared as `<name>_q4` and `<name>_q4_scale`, see
   * quantize-base.ts) is dequantized here for the same reason.
   */
  get(name: string): Tensor {
    const q = q4Names(name);
    if (!this.tensors.has(name) && this.tensors.has(q.packed)) {
      const g = this.raw(q.packed).graph;
      return g.scope('dequant', () => dequantizeNode(g, this.raw(q.packed), this.raw(q.scales)));
    }
    const t = this.raw(name);
    return t.dtype === 'float16' ? t.graph.scope(`widen`, () => t.graph.cast(t, 'float32')) : t;
  }

  /** The parameter as declared (no widening). */
  raw(name: string): Tensor {
    const t = this.tensors.get(name);
    if (!t) throw new Error(`model parameter "${name}" was not declared`);
    return t;
  }

  /** Rows `ids` of a table (embeddings): gathered, then widened, so only those rows are. */
  rows(name: string, ids: Tensor): Tensor {
    const t = this.raw(name);
    const g = t.graph;
    const r = g.gather(t, ids, 0);
    return r.dtype === 'float16' ? g.cast(r, 'float32') : r;
  }

  /** The adapter of module `name` (e.g. `model.layers.0.self_attn.q_proj`), if adapters are on. */
  adapter(name: string): Adapter | undefined {
    if (!this.adapted.has(name)) return undefined;
    return { A: this.get(`${name}.lora_A.weight`), B: this.get(`${name}.lora_B.weight`), scale: this.scale };
  }
}
