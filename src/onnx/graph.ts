/**
 * A typed ONNX graph builder. Tensors are handles carrying dtype and (symbolic) shape; each verb
 * emits one standard ONNX node (opset 17) and infers its output's dtype and shape, so later layers
 * (autodiff, models, losses) can reason about ranks and broadcasting without running anything.
 *
 * Dimensions are numbers when known, strings when symbolic ('batch', 'seq'); the string '?' means
 * unknown. A shape of `null` means even the rank is unknown (only for ops the builder cannot infer).
 */
import { type DType, type TypedArray, ONNX_DTYPE, typedArrayFrom, isFloat, elementAsNumber } from './dtype.ts';

export const OPSET = 17;

export type Dim = number | string;
export type Shape = Dim[];

/** A constant tensor held in JS (initializers, Constant node values). */
export interface ConstTensor {
  dtype: DType;
  dims: number[];
  data: TypedArray;
}

/** ONNX attribute values, tagged because JS numbers cannot tell INT from FLOAT. */
export type Attr =
  | { kind: 'int'; value: number }
  | { kind: 'float'; value: number }
  | { kind: 'ints'; value: number[] }
  | { kind: 'floats'; value: number[] }
  | { kind: 'string'; value: string }
  | { kind: 'strings'; value: string[] }
  | { kind: 'tensor'; value: ConstTensor };

export const attr = {
  int: (value: number): Attr => ({ kind: 'int', value }),
  float: (value: number): Attr => ({ kind: 'float', value }),
  ints: (value: number[]): Attr => ({ kind: 'ints', value }),
  floats: (value: number[]): Attr => ({ kind: 'floats', value }),
  string: (value: string): Attr => ({ kind: 'string', value }),
  strings: (value: string[]): Attr => ({ kind: 'strings', value }),
  tensor: (value: ConstTensor): Attr => ({ kind: 'tensor', value }),
};

export interface Node {
  op: string;
  domain: string;
  name: string;
  /** Input tensor names; '' marks an omitted optional input. */
  inputs: string[];
  outputs: string[];
  attrs: Record<string, Attr>;
}

export interface ValueInfo {
  name: string;
  dtype: DType;
  shape: Shape | null;
}

/** A handle to a tensor of a graph. */
export class Tensor {
  constructor(
    readonly graph: Graph,
    readonly name: string,
    readonly dtype: DType,
    readonly shape: Shape | null,
  ) {}

  get rank(): number {
    if (this.shape === null) throw new Error(`rank of ${this.name} is unknown`);
    return this.shape.length;
  }

  /** Shape with every dim a known number, or null. */
  get staticShape(): number[] | null {
    if (this.shape === null || this.shape.some((d) => typeof d !== 'number')) return null;
    return this.shape as number[];
  }
}

/** An operand: a tensor, or a JS number taken as a scalar of the other operand's dtype. */
export type Operand = Tensor | number;

const UNKNOWN = '?';

function broadcastDim(a: Dim, b: Dim): Dim {
  if (a === b) return a;
  if (a === 1) return b;
  if (b === 1) return a;
  if (typeof a === 'number' && typeof b === 'number') throw new Error(`cannot broadcast ${a} with ${b}`);
  if (typeof a === 'number') return a;
  if (typeof b === 'number') return b;
  return UNKNOWN;
}

/** Numpy-style broadcast of shapes (null if any rank is unknown). */
export function broadcastShapes(...shapes: (Shape | null)[]): Shape | null {
  if (shapes.some((s) => s === null)) return null;
  const rank = Math.max(...shapes.map((s) => s!.length));
  const out: Dim[] = [];
  for (let i = 0; i < rank; i++) {
    let d: Dim = 1;
    for (const s of shapes as Shape[]) {
      const j = i - (rank - s.length);
      if (j >= 0) d = broadcastDim(d, s[j]);
    }
    out.push(d);
  }
  return out;
}

function normAxis(axis: number, rank: number): number {
  const a = axis < 0 ? axis + rank : axis;
  if (a < 0 || a >= rank) throw new Error(`axis ${axis} out of range for rank ${rank}`);
  return a;
}

function product(dims: Dim[]): Dim {
  let p = 1;
  for (const d of dims) {
    if (typeof d !== 'number') return UNKNOWN;
    p *= d;
  }
  return p;
}

export class Graph {
  readonly nodes: Node[] = [];
  readonly inputs: ValueInfo[] = [];
  readonly outputs: ValueInfo[] = [];
  readonly initializers = new Map<string, ConstTensor>();
  /** Every tensor the graph knows, by name. */
  readonly values = new Map<string, Tensor>();
  /** Name of the node producing each tensor. */
  readonly producer = new Map<string, Node>();
  /** Tensors through which no gradient flows (outputs of `stopGradient`). */
  readonly noGrad = new Set<string>();
  private counter = 0;
  private prefixes: string[] = [];

  constructor(readonly name = 'prefzoo') {}

  // ---- naming -------------------------------------------------------------------------------

  /** A fresh tensor/node name under the current scope. */
  uniq(base: string): string {
    const p = this.prefixes.length ? this.prefixes.join('/') + '/' : '';
    let name: string;
    do name = `${p}${base}_${this.counter++}`;
    while (this.values.has(name));
    return name;
  }

  /** Runs `fn` with names prefixed by `prefix/` (readable graphs: `layers.0/attn/MatMul_7`). */
  scope<R>(prefix: string, fn: () => R): R {
    this.prefixes.push(prefix);
    try {
      return fn();
    } finally {
      this.prefixes.pop();
    }
  }

  tensor(name: string): Tensor {
    const t = this.values.get(name);
    if (!t) throw new Error(`no tensor named ${name}`);
    return t;
  }

  private declare(name: string, dtype: DType, shape: Shape | null): Tensor {
    if (this.values.has(name)) throw new Error(`tensor name ${name} is already used`);
    const t = new Tensor(this, name, dtype, shape);
    this.values.set(name, t);
    return t;
  }

  // ---- graph interface ----------------------------------------------------------------------

  input(name: string, dtype: DType, shape: Shape | null): Tensor {
    const t = this.declare(name, dtype, shape);
    this.inputs.push({ name, dtype, shape });
    return t;
  }

  /** Marks `t` as a graph output, renaming through Identity when a different name is asked. */
  output(t: Tensor, name?: string): Tensor {
    let out = t;
    if (name !== undefined && name !== t.name) {
      out = this.op('Identity', [t], {}, [{ dtype: t.dtype, shape: t.shape }], name)[0];
    }
    if (this.outputs.some((o) => o.name === out.name)) return out;
    this.outputs.push({ name: out.name, dtype: out.dtype, shape: out.shape });
    return out;
  }

  /** A named initializer (weights baked into the model). */
  initializer(name: string, value: ConstTensor): Tensor {
    const t = this.declare(name, value.dtype, value.dims);
    this.initializers.set(name, value);
    return t;
  }

  /** A constant tensor (emitted as an initializer, deduplicated for small scalars). */
  constant(values: number | number[] | TypedArray, dtype: DType = 'float32', dims?: number[]): Tensor {
    const data =
      typeof values === 'number'
        ? typedArrayFrom(dtype, [values])
        : Array.isArray(values)
          ? typedArrayFrom(dtype, values)
          : values;
    const shape = dims ?? (typeof values === 'number' ? [] : [data.length]);
    if (product(shape) !== data.length) throw new Error(`constant: ${data.length} values for shape [${shape}]`);
    const key = data.length <= 8 ? `${dtype}:${shape.join(',')}:${Array.from(data as ArrayLike<number | bigint>).join(',')}` : '';
    if (key) {
      const hit = this.constCache.get(key);
      if (hit) return hit;
    }
    const t = this.initializer(this.uniq('const'), { dtype, dims: shape, data });
    if (key) this.constCache.set(key, t);
    return t;
  }
  private constCache = new Map<string, Tensor>();

  scalar(value: number, dtype: DType = 'float32'): Tensor {
    return this.constant(value, dtype);
  }

  /** 1-D int64 constant (axes, shapes, starts). */
  ints(values: number[]): Tensor {
    return this.constant(values, 'int64', [values.length]);
  }

  /** The value of `t` if it is known at build time (initializer or Constant node). */
  constValue(t: Tensor | string): ConstTensor | undefined {
    const name = typeof t === 'string' ? t : t.name;
    const init = this.initializers.get(name);
    if (init) return init;
    const n = this.producer.get(name);
    if (n && n.op === 'Constant' && n.attrs.value?.kind === 'tensor') return n.attrs.value.value;
    return undefined;
  }

  /** Known int values of a 1-D constant (axes, shapes), or undefined. */
  constInts(t: Tensor): number[] | undefined {
    const c = this.constValue(t);
    if (!c) return undefined;
    return Array.from({ length: c.data.length }, (_, i) => elementAsNumber(c.data, i));
  }

  // ---- generic node emission ----------------------------------------------------------------

  /**
   * Emits a node. `outs` gives each output's dtype and shape (the verbs infer these); names are
   * generated unless `outName` is given for a single output.
   */
  op(
    opType: string,
    inputs: (Tensor | null)[],
    attrs: Record<string, Attr> = {},
    outs: { dtype: DType; shape: Shape | null }[] = [],
    outName?: string,
    domain = '',
  ): Tensor[] {
    for (const t of inputs) {
      if (t && t.graph !== this) throw new Error(`${opType}: input ${t.name} belongs to another graph`);
    }
    const name = this.uniq(opType);
    const outputs = outs.map((o, i) =>
      this.declare(outName !== undefined && outs.length === 1 ? outName : `${name}${outs.length > 1 ? `_o${i}` : ''}`, o.dtype, o.shape),
    );
    const node: Node = {
      op: opType,
      domain,
      name,
      inputs: inputs.map((t) => (t ? t.name : '')),
      outputs: outputs.map((t) => t.name),
      attrs,
    };
    this.nodes.push(node);
    for (const o of outputs) this.producer.set(o.name, node);
    return outputs;
  }

  /** Adds a node read from a model file (names given, shapes unknown unless provided). */
  addNode(node: Node, outInfo?: (name: string) => ValueInfo | undefined): void {
    for (const o of node.outputs) {
      if (!o) continue;
      const info = outInfo?.(o);
      if (!this.values.has(o)) this.declare(o, info?.dtype ?? 'float32', info?.shape ?? null);
      this.producer.set(o, node);
    }
    this.nodes.push(node);
  }

  private one(opType: string, inputs: (Tensor | null)[], attrs: Record<string, Attr>, dtype: DType, shape: Shape | null): Tensor {
    return this.op(opType, inputs, attrs, [{ dtype, shape }])[0];
  }

  private lift(x: Operand, like: DType): Tensor {
    return typeof x === 'number' ? this.scalar(x, like) : x;
  }

  private binary(opType: string, a: Operand, b: Operand, outDtype?: DType): Tensor {
    if (typeof a === 'number' && typeof b === 'number') throw new Error(`${opType}: at least one operand must be a tensor`);
    const dt = typeof a === 'number' ? (b as Tensor).dtype : a.dtype;
    const ta = this.lift(a, dt);
    const tb = this.lift(b, dt);
    if (ta.dtype !== tb.dtype) throw new Error(`${opType}: dtype mismatch ${ta.dtype} vs ${tb.dtype} (${ta.name}, ${tb.name})`);
    return this.one(opType, [ta, tb], {}, outDtype ?? dt, broadcastShapes(ta.shape, tb.shape));
  }

  private unary(opType: string, x: Tensor, attrs: Record<string, Attr> = {}): Tensor {
    return this.one(opType, [x], attrs, x.dtype, x.shape);
  }

  // ---- elementwise --------------------------------------------------------------------------

  add(a: Operand, b: Operand) { return this.binary('Add', a, b); }
  sub(a: Operand, b: Operand) { return this.binary('Sub', a, b); }
  mul(a: Operand, b: Operand) { return this.binary('Mul', a, b); }
  div(a: Operand, b: Operand) { return this.binary('Div', a, b); }
  pow(a: Operand, b: Operand) { return this.binary('Pow', a, b); }
  min(a: Operand, b: Operand) { return this.binary('Min', a, b); }
  max(a: Operand, b: Operand) { return this.binary('Max', a, b); }
  equal(a: Operand, b: Operand) { return this.binary('Equal', a, b, 'bool'); }
  less(a: Operand, b: Operand) { return this.binary('Less', a, b, 'bool'); }
  lessOrEqual(a: Operand, b: Operand) { return this.binary('LessOrEqual', a, b, 'bool'); }
  greater(a: Operand, b: Operand) { return this.binary('Greater', a, b, 'bool'); }
  greaterOrEqual(a: Operand, b: Operand) { return this.binary('GreaterOrEqual', a, b, 'bool'); }
  and(a: Tensor, b: Tensor) { return this.binary('And', a, b, 'bool'); }
  or(a: Tensor, b: Tensor) { return this.binary('Or', a, b, 'bool'); }
  not(x: Tensor) { return this.unary('Not', x); }

  neg(x: Tensor) { return this.unary('Neg', x); }
  sqrt(x: Tensor) { return this.unary('Sqrt', x); }
  reciprocal(x: Tensor) { return this.unary('Reciprocal', x); }
  exp(x: Tensor) { return this.unary('Exp', x); }
  log(x: Tensor) { return this.unary('Log', x); }
  tanh(x: Tensor) { return this.unary('Tanh', x); }
  sigmoid(x: Tensor) { return this.unary('Sigmoid', x); }
  relu(x: Tensor) { return this.unary('Relu', x); }
  erf(x: Tensor) { return this.unary('Erf', x); }
  softplus(x: Tensor) { return this.unary('Softplus', x); }
  abs(x: Tensor) { return this.unary('Abs', x); }
  sign(x: Tensor) { return this.unary('Sign', x); }
  floor(x: Tensor) { return this.unary('Floor', x); }
  sin(x: Tensor) { return this.unary('Sin', x); }
  cos(x: Tensor) { return this.unary('Cos', x); }
  identity(x: Tensor) { return this.unary('Identity', x); }

  /** Where(cond, a, b): a where cond is true, else b. */
  where(cond: Tensor, a: Operand, b: Operand): Tensor {
    const dt = typeof a === 'number' ? (typeof b === 'number' ? 'float32' : b.dtype) : a.dtype;
    const ta = this.lift(a, dt);
    const tb = this.lift(b, dt);
    return this.one('Where', [cond, ta, tb], {}, dt, broadcastShapes(cond.shape, ta.shape, tb.shape));
  }

  clip(x: Tensor, min?: number | Tensor, max?: number | Tensor): Tensor {
    const lo = min === undefined ? null : this.lift(min, x.dtype);
    const hi = max === undefined ? null : this.lift(max, x.dtype);
    return this.one('Clip', [x, lo, hi], {}, x.dtype, x.shape);
  }

  cast(x: Tensor, to: DType): Tensor {
    return this.one('Cast', [x], { to: attr.int(ONNX_DTYPE[to]) }, to, x.shape);
  }

  // ---- linear algebra -----------------------------------------------------------------------

  /** Numpy matmul semantics, batch dims broadcast. */
  matmul(a: Tensor, b: Tensor): Tensor {
    if (a.dtype !== b.dtype) throw new Error(`MatMul: dtype mismatch ${a.dtype} vs ${b.dtype}`);
    let shape: Shape | null = null;
    if (a.shape && b.shape) {
      const sa = a.shape.length === 1 ? [1, a.shape[0]] : a.shape;
      const sb = b.shape.length === 1 ? [b.shape[0], 1] : b.shape;
      const batch = broadcastShapes(sa.slice(0, -2), sb.slice(0, -2))!;
      shape = [...batch];
      if (a.shape.length > 1) shape.push(sa[sa.length - 2]);
      if (b.shape.length > 1) shape.push(sb[sb.length - 1]);
    }
    return this.one('MatMul', [a, b], {}, a.dtype, shape);
  }

  gemm(a: Tensor, b: Tensor, c?: Tensor | null, o: { alpha?: number; beta?: number; transA?: boolean; transB?: boolean } = {}): Tensor {
    const attrs: Record<string, Attr> = {};
    if (o.alpha !== undefined) attrs.alpha = attr.float(o.alpha);
    if (o.beta !== undefined) attrs.beta = attr.float(o.beta);
    if (o.transA) attrs.transA = attr.int(1);
    if (o.transB) attrs.transB = attr.int(1);
    let shape: Shape | null = null;
    if (a.shape && b.shape) shape = [o.transA ? a.shape[1] : a.shape[0], o.transB ? b.shape[0] : b.shape[1]];
    return this.one('Gemm', [a, b, c ?? null], attrs, a.dtype, shape);
  }

  // ---- shape manipulation -------------------------------------------------------------------

  transpose(x: Tensor, perm?: number[]): Tensor {
    const p = perm ?? (x.shape ? x.shape.map((_, i) => x.shape!.length - 1 - i) : undefined);
    const attrs: Record<string, Attr> = p ? { perm: attr.ints(p) } : {};
    return this.one('Transpose', [x], attrs, x.dtype, x.shape && p ? p.map((i) => x.shape![i]) : null);
  }

  /** Reshape to a constant shape (0 copies the input dim, -1 is inferred) or to a runtime shape tensor. */
  reshape(x: Tensor, shape: number[] | Tensor): Tensor {
    if (Array.isArray(shape)) {
      let out: Dim[] | null = shape.map((d, i) => (d === 0 ? (x.shape ? x.shape[i] : UNKNOWN) : d));
      const neg = shape.indexOf(-1);
      if (neg >= 0) {
        const total = x.shape ? product(x.shape) : UNKNOWN;
        const known = product(out.filter((_, i) => i !== neg));
        out[neg] = typeof total === 'number' && typeof known === 'number' ? total / known : UNKNOWN;
        // Keep a symbolic dim when the other dims are exactly the input's other dims.
        if (out[neg] === UNKNOWN && x.shape && x.shape.length === out.length) {
          const others = out.every((d, i) => i === neg || d === x.shape![i]);
          if (others) out[neg] = x.shape[neg];
        }
      }
      return this.one('Reshape', [x, this.ints(shape)], {}, x.dtype, out);
    }
    const n = shape.shape?.[0];
    return this.one('Reshape', [x, shape], {}, x.dtype, typeof n === 'number' ? Array(n).fill(UNKNOWN) : null);
  }

  flatten(x: Tensor, axis = 1): Tensor {
    const shape = x.shape ? [product(x.shape.slice(0, axis)), product(x.shape.slice(axis))] : [UNKNOWN, UNKNOWN];
    return this.one('Flatten', [x], { axis: attr.int(axis) }, x.dtype, shape);
  }

  squeeze(x: Tensor, axes: number[]): Tensor {
    let shape: Shape | null = null;
    if (x.shape) {
      const ax = axes.map((a) => normAxis(a, x.shape!.length));
      shape = x.shape.filter((_, i) => !ax.includes(i));
    }
    return this.one('Squeeze', [x, this.ints(axes)], {}, x.dtype, shape);
  }

  unsqueeze(x: Tensor, axes: number[]): Tensor {
    let shape: Shape | null = null;
    if (x.shape) {
      const rank = x.shape.length + axes.length;
      const ax = axes.map((a) => normAxis(a, rank));
      shape = [];
      let j = 0;
      for (let i = 0; i < rank; i++) shape.push(ax.includes(i) ? 1 : x.shape[j++]);
    }
    return this.one('Unsqueeze', [x, this.ints(axes)], {}, x.dtype, shape);
  }

  concat(xs: Tensor[], axis: number): Tensor {
    const first = xs[0];
    let shape: Shape | null = null;
    if (xs.every((t) => t.shape)) {
      const a = normAxis(axis, first.shape!.length);
      shape = [...first.shape!];
      const dims = xs.map((t) => t.shape![a]);
      shape[a] = dims.every((d) => typeof d === 'number') ? (dims as number[]).reduce((s, d) => s + d, 0) : UNKNOWN;
    }
    return this.one('Concat', xs, { axis: attr.int(axis) }, first.dtype, shape);
  }

  /** Splits along `axis` into pieces of the given sizes. */
  split(x: Tensor, sizes: number[], axis = 0): Tensor[] {
    const outs = sizes.map((s) => {
      if (!x.shape) return { dtype: x.dtype, shape: null };
      const shape = [...x.shape];
      shape[normAxis(axis, shape.length)] = s;
      return { dtype: x.dtype, shape };
    });
    return this.op('Split', [x, this.ints(sizes)], { axis: attr.int(axis) }, outs);
  }

  /** Slice with constant starts/ends (numbers) or runtime tensors. */
  slice(x: Tensor, starts: number[] | Tensor, ends: number[] | Tensor, axes?: number[], steps?: number[]): Tensor {
    let shape: Shape | null = x.shape ? [...x.shape] : null;
    if (shape) {
      const ax = axes ?? shape.map((_, i) => i);
      ax.forEach((a, k) => {
        const i = normAxis(a, shape!.length);
        const d = shape![i];
        if (Array.isArray(starts) && Array.isArray(ends) && typeof d === 'number' && (!steps || steps[k] === 1)) {
          const clampIdx = (v: number) => Math.min(Math.max(v < 0 ? v + d : v, 0), d);
          shape![i] = Math.max(0, clampIdx(ends[k]) - clampIdx(starts[k]));
        } else if (Array.isArray(starts) && Array.isArray(ends) && starts[k] >= 0 && ends[k] >= 0 && ends[k] < 2 ** 31 && (!steps || steps[k] === 1)) {
          shape![i] = typeof d === 'number' ? Math.max(0, Math.min(ends[k], d) - starts[k]) : UNKNOWN;
        } else {
          shape![i] = UNKNOWN;
        }
      });
    }
    const st = Array.isArray(starts) ? this.ints(starts) : starts;
    const en = Array.isArray(ends) ? this.ints(ends) : ends;
    const inputs = [x, st, en, axes ? this.ints(axes) : null, steps ? this.ints(steps) : null];
    while (inputs[inputs.length - 1] === null) inputs.pop();
    return this.one('Slice', inputs, {}, x.dtype, shape);
  }

  gather(data: Tensor, indices: Tensor, axis = 0): Tensor {
    let shape: Shape | null = null;
    if (data.shape && indices.shape) {
      const a = normAxis(axis, data.shape.length);
      shape = [...data.shape.slice(0, a), ...indices.shape, ...data.shape.slice(a + 1)];
    }
    return this.one('Gather', [data, indices], { axis: attr.int(axis) }, data.dtype, shape);
  }

  gatherElements(data: Tensor, indices: Tensor, axis = 0): Tensor {
    return this.one('GatherElements', [data, indices], { axis: attr.int(axis) }, data.dtype, indices.shape);
  }

  /** ScatterElements (reduction 'none' or 'add'): used by gradient rules of gathers. */
  scatterElements(data: Tensor, indices: Tensor, updates: Tensor, axis = 0, reduction: 'none' | 'add' = 'none'): Tensor {
    return this.one('ScatterElements', [data, indices, updates], { axis: attr.int(axis), reduction: attr.string(reduction) }, data.dtype, data.shape);
  }

  /** ScatterND (reduction 'none' or 'add'). */
  scatterND(data: Tensor, indices: Tensor, updates: Tensor, reduction: 'none' | 'add' = 'none'): Tensor {
    return this.one('ScatterND', [data, indices, updates], { reduction: attr.string(reduction) }, data.dtype, data.shape);
  }

  expand(x: Tensor, shape: number[] | Tensor): Tensor {
    if (Array.isArray(shape)) {
      return this.one('Expand', [x, this.ints(shape)], {}, x.dtype, broadcastShapes(x.shape, shape));
    }
    const n = shape.shape?.[0];
    const target = typeof n === 'number' ? Array(n).fill(UNKNOWN) : null;
    return this.one('Expand', [x, shape], {}, x.dtype, target && x.shape && x.shape.length <= target.length ? target : null);
  }

  // ---- reductions ---------------------------------------------------------------------------

  private reducedShape(x: Tensor, axes: number[] | undefined, keepdims: boolean): Shape | null {
    if (!x.shape) return null;
    const ax = axes === undefined ? x.shape.map((_, i) => i) : axes.map((a) => normAxis(a, x.shape!.length));
    if (keepdims) return x.shape.map((d, i) => (ax.includes(i) ? 1 : d));
    return x.shape.filter((_, i) => !ax.includes(i));
  }

  /** ReduceSum (axes as an input since opset 13); all axes when `axes` is omitted. */
  reduceSum(x: Tensor, axes?: number[], keepdims = true): Tensor {
    const inputs = axes ? [x, this.ints(axes)] : [x];
    return this.one('ReduceSum', inputs, { keepdims: attr.int(keepdims ? 1 : 0) }, x.dtype, this.reducedShape(x, axes, keepdims));
  }

  private reduceAttr(opType: string, x: Tensor, axes: number[] | undefined, keepdims: boolean): Tensor {
    const attrs: Record<string, Attr> = { keepdims: attr.int(keepdims ? 1 : 0) };
    if (axes) attrs.axes = attr.ints(axes);
    return this.one(opType, [x], attrs, x.dtype, this.reducedShape(x, axes, keepdims));
  }

  reduceMean(x: Tensor, axes?: number[], keepdims = true) { return this.reduceAttr('ReduceMean', x, axes, keepdims); }
  reduceMax(x: Tensor, axes?: number[], keepdims = true) { return this.reduceAttr('ReduceMax', x, axes, keepdims); }
  reduceMin(x: Tensor, axes?: number[], keepdims = true) { return this.reduceAttr('ReduceMin', x, axes, keepdims); }
  reduceLogSumExp(x: Tensor, axes?: number[], keepdims = true) { return this.reduceAttr('ReduceLogSumExp', x, axes, keepdims); }
  reduceSumSquare(x: Tensor, axes?: number[], keepdims = true) { return this.reduceAttr('ReduceSumSquare', x, axes, keepdims); }

  argMax(x: Tensor, axis = -1, keepdims = true): Tensor {
    return this.one('ArgMax', [x], { axis: attr.int(axis), keepdims: attr.int(keepdims ? 1 : 0) }, 'int64', this.reducedShape(x, [axis], keepdims));
  }

  cumSum(x: Tensor, axis: number, o: { exclusive?: boolean; reverse?: boolean } = {}): Tensor {
    const attrs: Record<string, Attr> = {};
    if (o.exclusive) attrs.exclusive = attr.int(1);
    if (o.reverse) attrs.reverse = attr.int(1);
    return this.one('CumSum', [x, this.constant(axis, 'int64')], attrs, x.dtype, x.shape);
  }

  // ---- neural-network ops -------------------------------------------------------------------

  softmax(x: Tensor, axis = -1) { return this.unary('Softmax', x, { axis: attr.int(axis) }); }
  logSoftmax(x: Tensor, axis = -1) { return this.unary('LogSoftmax', x, { axis: attr.int(axis) }); }

  /** LayerNormalization over the trailing axes from `axis`; scale and bias have the normalised shape. */
  layerNorm(x: Tensor, scale: Tensor, bias: Tensor | null, o: { axis?: number; epsilon?: number } = {}): Tensor {
    const attrs: Record<string, Attr> = { axis: attr.int(o.axis ?? -1), epsilon: attr.float(o.epsilon ?? 1e-5) };
    return this.one('LayerNormalization', [x, scale, bias], attrs, x.dtype, x.shape);
  }

  // ---- shapes and index helpers (not differentiable) ----------------------------------------

  shapeOf(x: Tensor, start?: number, end?: number): Tensor {
    const attrs: Record<string, Attr> = {};
    if (start !== undefined) attrs.start = attr.int(start);
    if (end !== undefined) attrs.end = attr.int(end);
    let n: Dim = UNKNOWN;
    if (x.shape) {
      const r = x.shape.length;
      const s = start === undefined ? 0 : start < 0 ? start + r : start;
      const e = end === undefined ? r : end < 0 ? end + r : end;
      n = Math.max(0, e - s);
    }
    return this.one('Shape', [x], attrs, 'int64', [n]);
  }

  /** Size of dim `axis` of x as a 1-element int64 tensor. */
  dim(x: Tensor, axis: number): Tensor {
    const a = normAxis(axis, x.rank);
    return this.shapeOf(x, a, a + 1);
  }

  range(start: Operand, limit: Operand, delta: Operand, dtype: DType = 'int64'): Tensor {
    const s = this.lift(start, dtype);
    const l = this.lift(limit, dtype);
    const d = this.lift(delta, dtype);
    return this.one('Range', [s, l, d], {}, dtype, [UNKNOWN]);
  }

  constantOfShape(shape: Tensor, value: number, dtype: DType = 'float32'): Tensor {
    const n = shape.shape?.[0];
    return this.one(
      'ConstantOfShape',
      [shape],
      { value: attr.tensor({ dtype, dims: [1], data: typedArrayFrom(dtype, [value]) }) },
      dtype,
      typeof n === 'number' ? Array(n).fill(UNKNOWN) : null,
    );
  }

  trilu(x: Tensor, upper: boolean, k?: Tensor): Tensor {
    return this.one('Trilu', k ? [x, k] : [x], { upper: attr.int(upper ? 1 : 0) }, x.dtype, x.shape);
  }

  /** Sum of several tensors of one dtype (Sum node; one input degenerates to Identity). */
  sum(xs: Tensor[]): Tensor {
    if (xs.length === 1) return xs[0];
    return this.one('Sum', xs, {}, xs[0].dtype, broadcastShapes(...xs.map((t) => t.shape)));
  }

  /** Identity in the forward pass; autodiff treats the result as a constant. */
  stopGradient(x: Tensor): Tensor {
    const y = this.one('Identity', [x], {}, x.dtype, x.shape);
    this.noGrad.add(y.name);
    return y;
  }

  /** Stable −log σ(z) = softplus(−z). */
  negLogSigmoid(z: Tensor): Tensor {
    return this.softplus(this.neg(z));
  }

  /** Checks that x is a floating tensor (gradients exist only for those). */
  static isDifferentiable(t: Tensor): boolean {
    return isFloat(t.dtype);
  }
}
