/**
 * Rewrites a finished graph so that every node has a kernel in ONNX Runtime's WebGPU execution
 * provider (onnxruntime-node 1.30), instead of falling back to the CPU with a host↔device copy on
 * each side. The rewrites compute the same values:
 *
 * - integers: WebGPU has no 64-bit integers, so every int64 tensor becomes int32 (token ids,
 *   positions, indices: all far below 2³¹), graph inputs included (callers feed int32; Session.run
 *   converts int64 feeds). Operands that ONNX requires to be int64 (shapes, axes, starts/ends,
 *   ScatterND indices) stay int64: constants get an int64 twin, computed values a Cast before them.
 * - ops the provider lacks, as compositions of ops it has: Sum → a chain of Add; ConstantOfShape →
 *   Expand of a scalar; Or(a, b) → Not(And(Not a, Not b)); Sign(x) → (x > 0) − (x < 0);
 *   LogSoftmax(x) → (x − max) − log Σ exp(x − max); Slice of int32 → Slice of a float32 copy.
 * - shapes the host would assemble (Concat of a Shape and constants; Shape of a Transpose, which ONNX
 *   Runtime turns into a Gather over int64) → the Shape of a device-side carrier tensor.
 *
 * Shape, ArgMax and NonZero outputs are int64 by definition; their readers must take int64
 * (shape operands). Builders avoid feeding them into arithmetic, and `webgpuPlacement` in
 * src/runtime/placement.ts reports any node that still runs on the CPU.
 */
import { Graph, attr, type Attr, type Node, type Shape, Tensor } from './graph.ts';
import type { DType, TypedArray } from './dtype.ts';

/** Input slots ONNX types as int64 whatever the data (shapes, axes, indices of ScatterND). */
const INT64_SLOTS: Record<string, number[]> = {
  Reshape: [1],
  Expand: [1],
  Slice: [1, 2, 3, 4],
  Squeeze: [1],
  Unsqueeze: [1],
  ReduceSum: [1],
  Tile: [1],
  ConstantOfShape: [0],
  Split: [1],
  Pad: [1],
  TopK: [1],
  Trilu: [1],
  ScatterND: [1],
  OneHot: [1],
};

/** Ops whose output is int64 by definition, whatever their inputs. */
const INT64_OUTPUT = new Set(['Shape', 'Size', 'ArgMax', 'ArgMin', 'NonZero']);

function int64Slot(n: Node, i: number): boolean {
  return n.domain === '' && (INT64_SLOTS[n.op]?.includes(i) ?? false);
}

function toInt32(data: TypedArray): Int32Array {
  const out = new Int32Array(data.length);
  for (let i = 0; i < data.length; i++) {
    const v = Number(data[i] as number | bigint);
    if (v > 2147483647 || v < -2147483648) {
      // Out-of-range sentinels (e.g. Slice's "to the end" INT64_MAX) only appear in int64 slots.
      throw new Error(`lowerForWebGpu: int64 value ${v} does not fit int32`);
    }
    out[i] = v;
  }
  return out;
}

/** Replaces the value entry `name` by one of dtype `dtype` (same shape). */
function retype(g: Graph, name: string, dtype: DType): void {
  const t = g.values.get(name);
  if (!t || t.dtype === dtype) return;
  g.values.set(name, new Tensor(g, name, dtype, t.shape));
}

/** Emits `build`'s nodes and renames its result to `outName` (the replaced node's output). */
function replaceWith(g: Graph, old: Node, build: () => Tensor): Node[] {
  const outName = old.outputs[0];
  const before = g.nodes.length;
  const result = build();
  const added = g.nodes.splice(before);
  const last = g.producer.get(result.name);
  if (!last || !added.includes(last)) throw new Error(`lowerForWebGpu: rewrite of ${old.name} produced no node`);
  const t = g.values.get(outName)!;
  g.values.delete(result.name);
  g.values.set(outName, new Tensor(g, outName, t.dtype, t.shape));
  last.outputs = last.outputs.map((o) => (o === result.name ? outName : o));
  g.producer.delete(result.name);
  for (const n of added) for (const o of n.outputs) g.producer.set(o, n);
  return added;
}

function rewriteOps(g: Graph): void {
  const out: Node[] = [];
  const carriers = new Map<string, Tensor>();
  const base = g.nodes.length;
  for (const n of g.nodes.slice(0, base)) {
    if (n.domain !== '') {
      out.push(n);
      continue;
    }
    const x = (i: number) => g.tensor(n.inputs[i]);
    let added: Node[] | null = null;
    switch (n.op) {
      case 'Sum':
        if (n.inputs.length === 1) break;
        added = replaceWith(g, n, () => n.inputs.slice(1).reduce((acc, name) => g.add(acc, g.tensor(name)), x(0)));
        break;
      case 'ConstantOfShape': {
        const v = n.attrs.value?.kind === 'tensor' ? n.attrs.value.value : { dtype: 'float32' as DType, dims: [1], data: new Float32Array(1) };
        added = replaceWith(g, n, () => g.expand(g.constant(v.data, v.dtype, []), x(0)));
        break;
      }
      case 'Or':
        added = replaceWith(g, n, () => g.not(g.and(g.not(x(0)), g.not(x(1)))));
        break;
      case 'Sign':
        added = replaceWith(g, n, () => {
          const t = x(0);
          return g.sub(g.cast(g.greater(t, 0), t.dtype), g.cast(g.less(t, 0), t.dtype));
        });
        break;
      case 'LogSoftmax': {
        const axis = n.attrs.axis?.kind === 'int' ? n.attrs.axis.value : -1;
        added = replaceWith(g, n, () => {
          const s = g.sub(x(0), g.reduceMax(x(0), [axis], true));
          return g.sub(s, g.log(g.reduceSum(g.exp(s), [axis], true)));
        });
        break;
      }
      case 'Concat':
      case 'Shape': {
        const shape = shapeRewrite(g, n, carriers);
        if (shape) added = replaceWith(g, n, shape);
        break;
      }
    }
    // Nodes a rewrite emitted before its replacement (shared carriers) precede it.
    out.push(...g.nodes.splice(base));
    if (added) out.push(...added);
    else out.push(n);
  }
  g.nodes.splice(0, g.nodes.length, ...out);
}

/**
 * A tensor of shape `shape` (symbolic dims from a graph input, the rest numbers), made on the device
 * from that input by Unsqueeze + Expand, so that `Shape(carrier)` yields the shape without host-side
 * int64 arithmetic. One carrier per shape, shared by every reader. Null when no input has the dims.
 */
function shapeCarrier(g: Graph, shape: Shape, made: Map<string, Tensor>): Tensor | null {
  const key = shape.join(',');
  const hit = made.get(key);
  if (hit) return hit;
  const symbols = shape.filter((d): d is string => typeof d === 'string');
  if (symbols.length === 0 || symbols.includes('?') || new Set(symbols).size !== symbols.length) return null;
  const src = g.inputs.find((i) => i.shape && i.shape.length === symbols.length && i.shape.every((d, k) => d === symbols[k]));
  if (!src) return null;
  const axes = shape.flatMap((d, k) => (typeof d === 'number' ? [k] : []));
  const lifted = axes.length ? g.unsqueeze(g.tensor(src.name), axes) : g.tensor(src.name);
  const carrier = g.expand(lifted, shape.map((d) => (typeof d === 'number' ? d : 1)));
  made.set(key, carrier);
  return carrier;
}

/**
 * Shapes the host would assemble, rebuilt as the Shape of a device-side carrier (shapeCarrier):
 * `Concat(Shape(a), c)` with `c` constant (e.g. `[B, T] ++ [heads, head_dim]`), and `Shape(x)` of a
 * Transpose's output (ONNX Runtime rewrites that into a Gather over the input's int64 shape).
 */
function shapeRewrite(g: Graph, n: Node, made: Map<string, Tensor>): (() => Tensor) | null {
  let target: Shape | null = null;
  if (n.op === 'Concat' && n.inputs.length === 2 && (n.attrs.axis?.kind !== 'int' || n.attrs.axis.value === 0)) {
    const src = g.producer.get(n.inputs[0]);
    const tail = g.constInts(g.tensor(n.inputs[1]));
    const whole = src && src.op === 'Shape' && src.attrs.start === undefined && src.attrs.end === undefined;
    const a = whole ? g.tensor(src.inputs[0]) : null;
    if (a?.shape && tail) target = [...a.shape, ...tail];
  } else if (n.op === 'Shape' && n.attrs.start === undefined && n.attrs.end === undefined && g.producer.get(n.inputs[0])?.op === 'Transpose') {
    target = g.tensor(n.inputs[0]).shape;
  }
  if (!target) return null;
  const carrier = shapeCarrier(g, target, made);
  return carrier ? () => g.shapeOf(carrier) : null;
}

function retypeInt64(g: Graph): void {
  // Values that stay int64: outputs int64 by definition, and what is computed from them (shape
  // arithmetic such as Gather/Concat of a Shape); they run on the CPU and are reported as such.
  const kept = new Set<string>();
  for (const n of g.nodes) {
    if (n.domain !== '') continue;
    const fromKept = n.op !== 'Cast' && n.inputs.some((i, k) => i && !int64Slot(n, k) && kept.has(i));
    if (INT64_OUTPUT.has(n.op) || fromKept) for (const o of n.outputs) if (g.values.get(o)?.dtype === 'int64') kept.add(o);
  }
  // A node computing a kept value from its inputs reads them as int64 too (Shape and the like do not).
  // A node that computes a kept value or compares one (one type T for its operands) reads its other
  // integer operands as int64 too; Shape and the like take any input.
  const touchesKept = (n: Node) =>
    n.op !== 'Cast' && !INT64_OUTPUT.has(n.op) && (n.outputs.some((o) => kept.has(o)) || n.inputs.some((i, k) => !int64Slot(n, k) && kept.has(i)));
  const needsInt64 = (n: Node, k: number) => int64Slot(n, k) || touchesKept(n);

  // Every int64 value (not born int64) becomes int32.
  for (const inp of g.inputs) if (inp.dtype === 'int64') {
    inp.dtype = 'int32';
    retype(g, inp.name, 'int32');
  }
  const int64Consts = new Map<string, string>(); // int32 constant → its int64 twin
  for (const [name, c] of [...g.initializers]) {
    if (c.dtype !== 'int64') continue;
    // A constant read only in int64 slots stays int64.
    const readers = g.nodes.flatMap((n) => n.inputs.map((i, k) => (i === name ? needsInt64(n, k) : null)).filter((v) => v !== null));
    if (readers.length > 0 && readers.every((v) => v)) continue;
    g.initializers.set(name, { dtype: 'int32', dims: c.dims, data: toInt32(c.data) });
    retype(g, name, 'int32');
    if (readers.some((v) => v)) {
      const twin = g.initializer(g.uniq('int64'), c);
      int64Consts.set(name, twin.name);
    }
  }
  for (const n of g.nodes) {
    if (n.op === 'Cast' && n.attrs.to?.kind === 'int' && n.attrs.to.value === 7 /* INT64 */ && !kept.has(n.outputs[0])) n.attrs.to = attr.int(6); // INT32
    if (n.op === 'Constant' && n.attrs.value?.kind === 'tensor' && n.attrs.value.value.dtype === 'int64') {
      const v = n.attrs.value.value;
      n.attrs.value = attr.tensor({ dtype: 'int32', dims: v.dims, data: toInt32(v.data) }) as Attr;
    }
    for (const o of n.outputs) {
      if (!o || kept.has(o)) continue;
      if (g.values.get(o)?.dtype === 'int64') retype(g, o, 'int32');
    }
  }
  for (const o of g.outputs) o.dtype = g.values.get(o.name)?.dtype ?? o.dtype;

  // int64 slots fed int32 values: the constant's twin, or a Cast just before the reader.
  const out: Node[] = [];
  const casts = new Map<string, string>();
  for (const n of g.nodes) {
    n.inputs.forEach((name, k) => {
      if (!name || !needsInt64(n, k) || g.values.get(name)?.dtype !== 'int32') return;
      const twin = int64Consts.get(name);
      if (twin) {
        n.inputs[k] = twin;
        return;
      }
      let c = casts.get(name);
      if (!c) {
        const before = g.nodes.length;
        c = g.cast(g.tensor(name), 'int64').name;
        out.push(...g.nodes.splice(before));
        casts.set(name, c);
      }
      n.inputs[k] = c;
    });
    out.push(n);
  }
  g.nodes.splice(0, g.nodes.length, ...out);
}

/**
 * WebGPU's Slice takes floating point data only: an int32 Slice runs on float32 copies (exact for the
 * ids, positions and indices these graphs slice, all below 2²⁴).
 */
function sliceIntegersAsFloat(g: Graph): void {
  const out: Node[] = [];
  for (const n of g.nodes) {
    if (n.op !== 'Slice' || n.domain !== '' || g.values.get(n.inputs[0])?.dtype !== 'int32') {
      out.push(n);
      continue;
    }
    const before = g.nodes.length;
    const asFloat = g.cast(g.tensor(n.inputs[0]), 'float32');
    const sliced = g.values.get(n.outputs[0])!;
    const floatOut = g.uniq('sliced');
    g.values.set(floatOut, new Tensor(g, floatOut, 'float32', sliced.shape));
    const back = g.cast(g.tensor(floatOut), 'int32');
    const [castIn, castBack] = g.nodes.splice(before);
    n.inputs[0] = asFloat.name;
    // The Cast back takes over the Slice's output name, so readers are unchanged.
    castBack.outputs = [n.outputs[0]];
    g.values.delete(back.name);
    g.producer.set(n.outputs[0], castBack);
    n.outputs = [floatOut];
    g.producer.set(floatOut, n);
    out.push(castIn, n, castBack);
  }
  g.nodes.splice(0, g.nodes.length, ...out);
}

/** Orders nodes so each comes after the producers of its inputs (rewrites append out of order). */
function topoSort(g: Graph): void {
  const ready = new Set<string>([...g.inputs.map((i) => i.name), ...g.initializers.keys(), '']);
  const pending = [...g.nodes];
  const sorted: Node[] = [];
  while (pending.length) {
    const rest: Node[] = [];
    for (const n of pending) {
      if (n.inputs.every((i) => ready.has(i))) {
        sorted.push(n);
        for (const o of n.outputs) ready.add(o);
      } else rest.push(n);
    }
    if (rest.length === pending.length) throw new Error(`lowerForWebGpu: cycle or missing input at ${rest[0].name} (${rest[0].inputs.filter((i) => !ready.has(i)).join(", ")})`);
    pending.splice(0, pending.length, ...rest);
  }
  g.nodes.splice(0, g.nodes.length, ...sorted);
}

/** Drops nodes none of whose outputs is read (what the rewrites left behind) and unread initializers. */
function dropDead(g: Graph): void {
  const outputs = new Set(g.outputs.map((o) => o.name));
  for (;;) {
    const read = new Set(g.nodes.flatMap((n) => n.inputs));
    const live = g.nodes.filter((n) => n.outputs.some((o) => o && (read.has(o) || outputs.has(o))));
    if (live.length === g.nodes.length) break;
    g.nodes.splice(0, g.nodes.length, ...live);
  }
  const read = new Set(g.nodes.flatMap((n) => n.inputs));
  for (const name of [...g.initializers.keys()]) if (!read.has(name) && !outputs.has(name)) g.initializers.delete(name);
}

/** Rewrites `g` in place for the WebGPU execution provider (see the file comment). */
export function lowerForWebGpu(g: Graph): Graph {
  rewriteOps(g);
  retypeInt64(g);
  sliceIntegersAsFloat(g);
  dropDead(g);
  topoSort(g);
  return g;
}
