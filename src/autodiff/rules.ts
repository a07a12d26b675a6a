/**
 * The gradient table: ONNX op → rule emitting standard ONNX ops (opset 17) for the gradients of the
 * node's inputs. The math follows ONNX Runtime's gradient_builder.cc, composed from ops every
 * stock ORT build has (no SoftmaxGrad & co). Rules reuse forward outputs (Softmax y, Exp y, …).
 * Adding an op = one row here + one case in gradcheck.ts CASES.
 */
import { Graph, Tensor, attr, type Node } from '../onnx/graph.ts';
import { unbroadcast, reshapeLike, expandLike, zerosLike } from './shape.ts';
import { sortedScatterAdd } from './scatter.ts';

export interface RuleContext {
  g: Graph;
  node: Node;
  /** Input tensors (null for omitted optional inputs). */
  x: (Tensor | null)[];
  /** Output tensors. */
  y: Tensor[];
  /** Upstream gradient of each output (null when no gradient reaches that output). */
  dy: (Tensor | null)[];
  /** Which inputs need a gradient (float, on a path from a wrt tensor). */
  needs: boolean[];
  /** fn() if input i needs a gradient, else null: only needed gradients are built. */
  when(i: number, fn: () => Tensor): Tensor | null;
  int(name: string, dflt: number): number;
  float(name: string, dflt: number): number;
  ints(name: string): number[] | undefined;
  /** How a gather's gradient adds the rows of a repeated index (GradientOptions.scatterAdd). */
  scatterAdd: ScatterAdd;
}

/**
 * 'sorted': rows sorted by index and summed per index in float64 before one ScatterND (scatter.ts);
 * 'elements': ScatterElements(add), for providers without TopK, Unique or float64 (WebGPU).
 * Both repeat to the bit on ONNX Runtime's CPU provider whatever its threads.
 */
export type ScatterAdd = 'sorted' | 'elements';

/** Returns one gradient (or null) per node input. */
export type Rule = (c: RuleContext) => (Tensor | null)[];

/** Ops whose float outputs carry no gradient (piecewise constant, shapes, indices, constants). */
export const NON_DIFFERENTIABLE = new Set([
  'Shape', 'Size', 'Sign', 'Floor', 'Ceil', 'Round', 'ArgMax', 'ArgMin', 'Equal', 'Less', 'LessOrEqual',
  'Greater', 'GreaterOrEqual', 'And', 'Or', 'Xor', 'Not', 'IsNaN', 'IsInf', 'Range', 'ConstantOfShape',
  'Constant', 'NonZero', 'EyeLike', 'RandomNormal', 'RandomUniform', 'RandomNormalLike', 'RandomUniformLike',
  'Bernoulli', 'Multinomial', 'OneHot',
]);

const rank = (t: Tensor) => t.rank;
const norm = (axis: number, r: number) => (axis < 0 ? axis + r : axis);
/** Permutation swapping the last two axes of a rank-r tensor. */
const swapLast = (r: number) => [...Array(r - 2).keys(), r - 1, r - 2];
const dy0 = (c: RuleContext) => c.dy[0]!;
/** ScatterND and the shape arithmetic take int64 only; Gather/Slice also accept int32. */
const int64 = (g: Graph, t: Tensor) => (t.dtype === 'int64' ? t : g.cast(t, 'int64'));

/** Upstream gradient broadcast back into the reduced axes: Unsqueeze when keepdims=0. */
function keepDims(c: RuleContext, t: Tensor, axes: number[] | Tensor | undefined): Tensor {
  if (c.int('keepdims', 1) === 1 || axes === undefined) return t;
  const ax = Array.isArray(axes) ? c.g.ints(axes) : axes;
  const x = c.x[0]!;
  return c.g.op('Unsqueeze', [t, ax], {}, [{ dtype: t.dtype, shape: x.shape && reducedKeep(x, axes) }])[0];
}

function reducedKeep(x: Tensor, axes: number[] | Tensor) {
  if (!Array.isArray(axes)) return x.shape!.map(() => '?');
  const ax = axes.map((a) => norm(a, x.rank));
  return x.shape!.map((d, i) => (ax.includes(i) ? 1 : d));
}

/** Axes of an opset-13 reduction given as input 1 (undefined: all axes). */
function inputAxes(c: RuleContext): number[] | Tensor | undefined {
  const t = c.x[1];
  if (!t) return undefined;
  const known = c.g.constInts(t);
  if (known && known.length === 0) return undefined;
  return known ?? t;
}

/** Number of elements reduced over, as a scalar of x's dtype. */
function reducedCount(g: Graph, x: Tensor, y: Tensor): Tensor {
  const xs = x.staticShape;
  const ys = y.staticShape;
  if (xs && ys) return g.scalar(xs.reduce((a, b) => a * b, 1) / ys.reduce((a, b) => a * b, 1), x.dtype);
  // Divide in int64 (exact) before casting: element counts can exceed float32's 2^24.
  const size = (t: Tensor) => g.op('Size', [t], {}, [{ dtype: 'int64', shape: [] }])[0];
  return g.cast(g.div(size(x), size(y)), x.dtype);
}

/** Gradient of MatMul with numpy semantics (1-D operands, broadcast batch dims). */
function matmulGrad(c: RuleContext): (Tensor | null)[] {
  const { g } = c;
  const [a, b] = c.x as Tensor[];
  const a1 = rank(a) === 1;
  const b1 = rank(b) === 1;
  const A = a1 ? g.unsqueeze(a, [0]) : a;
  const B = b1 ? g.unsqueeze(b, [1]) : b;
  let D = dy0(c);
  if (b1) D = g.unsqueeze(D, [-1]);
  if (a1) D = g.unsqueeze(D, [-2]);
  const T = (t: Tensor) => g.transpose(t, swapLast(rank(t)));
  const da = c.when(0, () => {
    // [.., M, N] @ [.., N, K]; with a 2-D B there is no batch broadcasting of A to undo.
    const r = rank(D) === 2 && rank(B) === 2 ? g.gemm(D, B, null, { transB: true }) : g.matmul(D, T(B));
    const u = rank(B) === 2 ? r : unbroadcast(g, r, A);
    return a1 ? g.squeeze(u, [0]) : u;
  });
  const db = c.when(1, () => {
    // A weight shared over batch dims: fold the batch into one Gemm instead of a [batch, K, N] product.
    const r =
      rank(B) === 2
        ? g.gemm(rank(A) === 2 ? A : g.flatten(A, rank(A) - 1), rank(D) === 2 ? D : g.flatten(D, rank(D) - 1), null, { transA: true })
        : unbroadcast(g, g.matmul(T(A), D), B);
    return b1 ? g.squeeze(r, [1]) : r;
  });
  return [da, db];
}

/** Y = alpha·op(A)·op(B) + beta·C, op = optional transpose. */
function gemmGrad(c: RuleContext): (Tensor | null)[] {
  const { g } = c;
  const [a, b, cc] = c.x;
  const dy = dy0(c);
  const alpha = c.float('alpha', 1);
  // Attributes are float32: use the value the forward op actually multiplies by.
  const beta = Math.fround(c.float('beta', 1));
  const tA = c.int('transA', 0) === 1;
  const tB = c.int('transB', 0) === 1;
  const da = c.when(0, () =>
    tA ? g.gemm(b!, dy, null, { alpha, transA: tB, transB: true }) : g.gemm(dy, b!, null, { alpha, transB: !tB }),
  );
  const db = c.when(1, () =>
    tB ? g.gemm(dy, a!, null, { alpha, transA: true, transB: tA }) : g.gemm(a!, dy, null, { alpha, transA: !tA }),
  );
  const dc = cc ? c.when(2, () => {
    const u = unbroadcast(g, dy, cc);
    return beta === 1 ? u : g.mul(u, beta);
  }) : null;
  return [da, db, dc];
}

/** Slice: zero-pad the gradient back (unit steps) or scatter it along each sliced axis. */
function sliceGrad(c: RuleContext): (Tensor | null)[] {
  const { g } = c;
  const [x, starts, ends, axesT, stepsT] = c.x as Tensor[];
  const dy = dy0(c);
  const r = rank(x);
  const nAx = starts.shape?.[0];
  const axes = axesT ? g.constInts(axesT) : typeof nAx === 'number' ? [...Array(nAx).keys()] : undefined;
  const steps = stepsT ? g.constInts(stepsT) : axes?.map(() => 1);
  if (!axes || !steps) throw new Error(`autodiff: Slice node ${c.node.name} needs constant axes and steps for its gradient`);
  // Element k of a run-time starts/ends tensor, as int64 (Slice also accepts int32).
  const at = (t: Tensor, k: number) => int64(g, g.slice(t, [k], [k + 1]));
  const sv = g.constInts(starts);
  const ev = g.constInts(ends);
  if (steps.every((s) => s === 1)) {
    const before: (number | Tensor)[] = Array(r).fill(0);
    const after: (number | Tensor)[] = Array(r).fill(0);
    axes.forEach((ax, k) => {
      const a = norm(ax, r);
      const d = x.shape![a];
      if (typeof d === 'number' && sv && ev) {
        const clamp = (v: number) => Math.min(Math.max(v < 0 ? v + d : v, 0), d);
        before[a] = clamp(sv[k]);
        after[a] = d - clamp(sv[k]) - Math.max(0, clamp(ev[k]) - clamp(sv[k]));
      } else {
        // start normalised and clamped to [0, dim]; the pad after is what remains past dy.
        const dim = g.dim(x, a);
        const s = sv ? g.ints([sv[k]]) : at(starts, k);
        const sn = g.min(g.max(g.where(g.less(s, 0), g.add(s, dim), s), 0), dim);
        before[a] = sn;
        after[a] = g.sub(g.sub(dim, sn), g.dim(dy, a));
      }
    });
    const all = [...before, ...after];
    const pads = all.every((p) => typeof p === 'number')
      ? g.ints(all as number[])
      : g.concat(all.map((p) => (typeof p === 'number' ? g.ints([p]) : p)), 0);
    return [g.op('Pad', [dy, pads], { mode: attr.string('constant') }, [{ dtype: dy.dtype, shape: x.shape }])[0]];
  }
  // General steps: per sliced axis, scatter into zeros at the indices Slice picked from 0..dim-1.
  let t = dy;
  axes.forEach((ax, k) => {
    const a = norm(ax, r);
    const dim = g.dim(x, a);
    const iota = g.range(0, g.squeeze(dim, [0]), 1);
    const s = sv ? [sv[k]] : at(starts, k);
    const e = ev ? [ev[k]] : at(ends, k);
    const picked = g.slice(iota, s, e, [0], [steps[k]]);
    const shape = Array(r).fill(1);
    shape[a] = -1;
    const idx = g.expand(g.reshape(picked, shape), g.shapeOf(t));
    const mask = g.constant(Array.from({ length: r }, (_, i) => (i === a ? 1 : 0)), 'bool', [r]);
    const zeroShape = g.where(mask, g.shapeOf(x), g.shapeOf(t));
    const zeros = g.constantOfShape(zeroShape, 0, x.dtype);
    t = g.scatterElements(zeros, idx, t, a);
  });
  return [reshapeLike(g, t, x)];
}

/**
 * Gather: the rows of dy accumulate into the gathered rows. Not with ScatterND(add), although it adds
 * whole rows at once: ONNX Runtime's CPU kernel splits its updates over the thread pool, so the
 * additions for a repeated index (a token seen twice) land in varying order, or race, and two runs
 * differ in the last bits. Along axis 0 (embeddings, an output head's target rows) the rows are
 * sorted and summed per index first (scatter.ts), so that the ScatterND places each row once; along
 * another axis, or with `scatterAdd: 'elements'`, ScatterElements(add), which gives each output
 * element to one thread and adds its updates in index order: repeatable too, but element by element.
 */
function gatherGrad(c: RuleContext): (Tensor | null)[] {
  const { g } = c;
  const [x, idx] = c.x as Tensor[];
  const dy = dy0(c);
  const a = norm(c.int('axis', 0), rank(x));
  // One index: a single row to place, nothing to accumulate (and no shape arithmetic).
  if (a === 0 && idx.shape?.length === 0) return [g.scatterND(zerosLike(g, x), g.unsqueeze(int64(g, idx), [-1]), dy, 'add')];
  // Named scatter_add/… so that profiles (scripts/bench/profile.ts) show what the scatter-adds cost.
  return g.scope('scatter_add', () => {
    const xs = x.staticShape;
    // dy with the index dims flattened to one axis (already so for a vector of indices).
    let d2 = dy;
    if (idx.shape?.length !== 1) {
      const flatShape = xs
        ? g.ints(xs.map((d, i) => (i === a ? -1 : d)))
        : g.concat([g.shapeOf(x, 0, a), g.ints([-1]), g.shapeOf(x, a + 1)], 0);
      d2 = g.op('Reshape', [dy, flatShape], {}, [{ dtype: dy.dtype, shape: x.shape!.map((d, i) => (i === a ? '?' : d)) }])[0];
    }
    if (a === 0 && c.scatterAdd === 'sorted') {
      const flat = idx.shape?.length === 1 ? idx : g.reshape(idx, [-1]);
      return [sortedScatterAdd(g, zerosLike(g, x), flat, d2)];
    }
    const shape = Array(rank(x)).fill(1);
    shape[a] = -1;
    // The indices broadcast over the other axes. Expand broadcasts both ways, so against x's shape
    // with a 1 on the axis when it is known: no Shape of dy to compute.
    const i2 = g.expand(g.reshape(idx, shape), xs ? xs.map((d, i) => (i === a ? 1 : d)) : g.shapeOf(d2));
    return [g.scatterElements(zerosLike(g, x), i2, d2, a, 'add')];
  });
}

/** Pad (constant mode, constant non-negative pads): the gradient is the un-padded window of dy. */
function padGrad(c: RuleContext): (Tensor | null)[] {
  const { g } = c;
  const [x, padsT, value] = c.x;
  const pads = g.constInts(padsT!);
  const mode = c.node.attrs.mode;
  if ((mode && mode.kind === 'string' && mode.value !== 'constant') || !pads || pads.some((p) => p < 0) || c.x[3]) {
    throw new Error(`autodiff: Pad node ${c.node.name}: gradients need mode "constant" and constant non-negative pads on all axes`);
  }
  const dy = dy0(c);
  const begin = pads.slice(0, rank(x!));
  const xs = x!.staticShape;
  const ends = xs ? xs.map((d, i) => d + begin[i]) : g.add(g.ints(begin), g.shapeOf(x!));
  const dx = g.op('Slice', [dy, g.ints(begin), Array.isArray(ends) ? g.ints(ends) : ends], {}, [{ dtype: dy.dtype, shape: x!.shape }])[0];
  // The pad value receives everything outside the window.
  const dv = value ? c.when(2, () => reshapeLike(g, g.sub(g.reduceSum(dy, undefined, false), g.reduceSum(dx, undefined, false)), value)) : null;
  return [c.needs[0] ? dx : null, null, dv];
}

/** Concat: each input gets its slice of dy along the axis (one Split when sizes are known). */
function concatGrad(c: RuleContext): (Tensor | null)[] {
  const { g } = c;
  const xs = c.x as Tensor[];
  const dy = dy0(c);
  const a = norm(c.int('axis', 0), rank(dy));
  const sizes = xs.map((t) => t.shape![a]);
  if (sizes.every((s) => typeof s === 'number')) {
    const parts = g.split(dy, sizes as number[], a);
    return xs.map((_, i) => c.when(i, () => parts[i]));
  }
  let offset: Tensor = g.ints([0]);
  return xs.map((t, i) => {
    const start = offset;
    const end = g.add(start, g.dim(t, a));
    offset = end;
    return c.when(i, () => g.op('Slice', [dy, start, end, g.ints([a])], {}, [{ dtype: dy.dtype, shape: t.shape }])[0]);
  });
}

/** Split: concatenate the output gradients, zeros for pieces no gradient reached. */
function splitGrad(c: RuleContext): (Tensor | null)[] {
  const { g } = c;
  const parts = c.y.map((y, i) => c.dy[i] ?? zerosLike(g, y));
  return [g.concat(parts, c.int('axis', 0))];
}

/** LayerNormalization over axes [axis, rank): recomputes mean and 1/σ, then the standard formula. */
function layerNormGrad(c: RuleContext): (Tensor | null)[] {
  const { g } = c;
  const [x, scale, bias] = c.x;
  const dy = dy0(c);
  const r = rank(x!);
  const axes = [...Array(r - norm(c.int('axis', -1), r)).keys()].map((i) => i + norm(c.int('axis', -1), r));
  const eps = Math.fround(c.float('epsilon', 1e-5));
  const xc = g.sub(x!, g.reduceMean(x!, axes));
  const rstd = g.reciprocal(g.sqrt(g.add(g.reduceMean(g.mul(xc, xc), axes), eps)));
  const xhat = g.mul(xc, rstd);
  const dx = c.when(0, () => {
    // dx = rstd·(ĝ − mean(ĝ) − x̂·mean(ĝ·x̂)), ĝ = dy·scale
    const gh = g.mul(dy, scale!);
    return g.mul(rstd, g.sub(g.sub(gh, g.reduceMean(gh, axes)), g.mul(xhat, g.reduceMean(g.mul(gh, xhat), axes))));
  });
  const ds = c.when(1, () => unbroadcast(g, g.mul(dy, xhat), scale!));
  const db = bias ? c.when(2, () => unbroadcast(g, dy, bias)) : null;
  return [dx, ds, db];
}

/** Min/Max of two inputs: the selected side gets dy (the first input on ties). */
function selectGrad(op: 'Min' | 'Max'): Rule {
  return (c) => {
    const { g } = c;
    const dy = dy0(c);
    if (c.x.length === 1) return [dy];
    if (c.x.length !== 2) throw new Error(`autodiff: ${op} node ${c.node.name} has ${c.x.length} inputs; gradients support 1 or 2`);
    const [a, b] = c.x as Tensor[];
    const first = op === 'Max' ? g.greaterOrEqual(a, b) : g.lessOrEqual(a, b);
    return [c.when(0, () => unbroadcast(g, g.where(first, dy, 0), a)), c.when(1, () => unbroadcast(g, g.where(first, 0, dy), b))];
  };
}

/** ReduceMax/ReduceMin: dy goes to the elements equal to the extreme (each of them on ties). */
const extremeGrad: Rule = (c) => {
  const axes = c.ints('axes');
  const x = c.x[0]!;
  const yk = keepDims(c, c.y[0], axes);
  return [c.g.where(c.g.equal(x, yk), keepDims(c, dy0(c), axes), 0)];
};

export const RULES: Record<string, Rule> = {
  // ---- elementwise arithmetic ----
  Add: (c) => [c.when(0, () => unbroadcast(c.g, dy0(c), c.x[0]!)), c.when(1, () => unbroadcast(c.g, dy0(c), c.x[1]!))],
  Sub: (c) => [c.when(0, () => unbroadcast(c.g, dy0(c), c.x[0]!)), c.when(1, () => c.g.neg(unbroadcast(c.g, dy0(c), c.x[1]!)))],
  Mul: (c) => [
    c.when(0, () => unbroadcast(c.g, c.g.mul(dy0(c), c.x[1]!), c.x[0]!)),
    c.when(1, () => unbroadcast(c.g, c.g.mul(dy0(c), c.x[0]!), c.x[1]!)),
  ],
  // d(a/b)/db = −y/b
  Div: (c) => [
    c.when(0, () => unbroadcast(c.g, c.g.div(dy0(c), c.x[1]!), c.x[0]!)),
    c.when(1, () => c.g.neg(unbroadcast(c.g, c.g.div(c.g.mul(dy0(c), c.y[0]), c.x[1]!), c.x[1]!))),
  ],
  Neg: (c) => [c.g.neg(dy0(c))],
  // d(a^b)/da = b·a^(b−1), d(a^b)/db = y·ln a
  Pow: (c) => {
    const { g } = c;
    const [a, b] = c.x as Tensor[];
    return [
      c.when(0, () => unbroadcast(g, g.mul(dy0(c), g.mul(b, g.pow(a, g.sub(b, 1)))), a)),
      c.when(1, () => unbroadcast(g, g.mul(dy0(c), g.mul(c.y[0], g.log(a))), b)),
    ];
  },
  Sum: (c) => c.x.map((x, i) => c.when(i, () => unbroadcast(c.g, dy0(c), x!))),
  Min: selectGrad('Min'),
  Max: selectGrad('Max'),

  // ---- elementwise functions (reusing the forward output where the derivative is a function of it) ----
  Sqrt: (c) => [c.g.div(c.g.mul(dy0(c), 0.5), c.y[0])],
  Reciprocal: (c) => [c.g.neg(c.g.mul(dy0(c), c.g.mul(c.y[0], c.y[0])))],
  Exp: (c) => [c.g.mul(dy0(c), c.y[0])],
  Log: (c) => [c.g.div(dy0(c), c.x[0]!)],
  Tanh: (c) => [c.g.mul(dy0(c), c.g.sub(1, c.g.mul(c.y[0], c.y[0])))],
  Sigmoid: (c) => [c.g.mul(dy0(c), c.g.mul(c.y[0], c.g.sub(1, c.y[0])))],
  Relu: (c) => [c.g.where(c.g.greater(c.y[0], 0), dy0(c), 0)],
  LeakyRelu: (c) => [c.g.where(c.g.greater(c.x[0]!, 0), dy0(c), c.g.mul(dy0(c), Math.fround(c.float('alpha', 0.01))))],
  // d erf(x)/dx = 2/√π · exp(−x²)
  Erf: (c) => [c.g.mul(dy0(c), c.g.mul(c.g.exp(c.g.neg(c.g.mul(c.x[0]!, c.x[0]!))), 2 / Math.sqrt(Math.PI)))],
  Softplus: (c) => [c.g.mul(dy0(c), c.g.sigmoid(c.x[0]!))],
  Abs: (c) => [c.g.mul(dy0(c), c.g.sign(c.x[0]!))],
  Sin: (c) => [c.g.mul(dy0(c), c.g.cos(c.x[0]!))],
  Cos: (c) => [c.g.neg(c.g.mul(dy0(c), c.g.sin(c.x[0]!)))],
  Clip: (c) => {
    const { g } = c;
    const [x, lo, hi] = c.x;
    const dy = dy0(c);
    const inside = [lo && g.greaterOrEqual(x!, lo), hi && g.lessOrEqual(x!, hi)].filter((m): m is Tensor => !!m);
    const mask = inside.length === 2 ? g.and(inside[0], inside[1]) : inside[0];
    return [
      c.when(0, () => (mask ? g.where(mask, dy, 0) : dy)),
      lo ? c.when(1, () => unbroadcast(g, g.where(g.less(x!, lo), dy, 0), lo)) : null,
      hi ? c.when(2, () => unbroadcast(g, g.where(g.greater(x!, hi), dy, 0), hi)) : null,
    ];
  },
  Where: (c) => [
    null,
    c.when(1, () => unbroadcast(c.g, c.g.where(c.x[0]!, dy0(c), 0), c.x[1]!)),
    c.when(2, () => unbroadcast(c.g, c.g.where(c.x[0]!, 0, dy0(c)), c.x[2]!)),
  ],
  Cast: (c) => [c.g.cast(dy0(c), c.x[0]!.dtype)],
  Identity: (c) => [dy0(c)],

  // ---- linear algebra ----
  MatMul: matmulGrad,
  Gemm: gemmGrad,

  // ---- shape manipulation ----
  Transpose: (c) => {
    const perm = c.ints('perm') ?? [...Array(rank(c.x[0]!)).keys()].reverse();
    const inv = perm.map((_, i) => perm.indexOf(i));
    return [c.g.transpose(dy0(c), inv)];
  },
  Reshape: (c) => [reshapeLike(c.g, dy0(c), c.x[0]!)],
  Flatten: (c) => [reshapeLike(c.g, dy0(c), c.x[0]!)],
  Squeeze: (c) => [c.x[1] ? c.g.op('Unsqueeze', [dy0(c), c.x[1]], {}, [{ dtype: dy0(c).dtype, shape: c.x[0]!.shape }])[0] : reshapeLike(c.g, dy0(c), c.x[0]!)],
  Unsqueeze: (c) => [c.g.op('Squeeze', [dy0(c), c.x[1]!], {}, [{ dtype: dy0(c).dtype, shape: c.x[0]!.shape }])[0]],
  Expand: (c) => [unbroadcast(c.g, dy0(c), c.x[0]!)],
  Concat: concatGrad,
  Pad: padGrad,
  Split: splitGrad,
  Slice: sliceGrad,
  Gather: gatherGrad,
  GatherElements: (c) => [c.g.scatterElements(zerosLike(c.g, c.x[0]!), c.x[1]!, dy0(c), c.int('axis', 0), 'add')],
  Trilu: (c) => [c.g.op('Trilu', c.x[1] ? [dy0(c), c.x[1]] : [dy0(c)], { upper: attr.int(c.int('upper', 1)) }, [{ dtype: dy0(c).dtype, shape: c.y[0].shape }])[0]],

  // ---- reductions ----
  ReduceSum: (c) => {
    const axes = inputAxes(c);
    if (axes === undefined && c.int('noop_with_empty_axes', 0) === 1) return [dy0(c)];
    return [expandLike(c.g, keepDims(c, dy0(c), axes), c.x[0]!)];
  },
  ReduceMean: (c) => {
    const axes = c.ints('axes');
    const scaled = c.g.div(keepDims(c, dy0(c), axes), reducedCount(c.g, c.x[0]!, c.y[0]));
    return [expandLike(c.g, scaled, c.x[0]!)];
  },
  ReduceMax: extremeGrad,
  ReduceMin: extremeGrad,
  // d lse/dx = exp(x − lse)
  ReduceLogSumExp: (c) => {
    const axes = c.ints('axes');
    const p = c.g.exp(c.g.sub(c.x[0]!, keepDims(c, c.y[0], axes)));
    return [c.g.mul(p, keepDims(c, dy0(c), axes))];
  },
  ReduceSumSquare: (c) => {
    const axes = c.ints('axes');
    return [c.g.mul(c.g.mul(c.x[0]!, keepDims(c, dy0(c), axes)), 2)];
  },
  CumSum: (c) => {
    const attrs = { exclusive: attr.int(c.int('exclusive', 0)), reverse: attr.int(1 - c.int('reverse', 0)) };
    return [c.g.op('CumSum', [dy0(c), c.x[1]!], attrs, [{ dtype: dy0(c).dtype, shape: c.x[0]!.shape }])[0]];
  },

  // ---- neural-network ops ----
  // dx = y·(dy − Σ dy·y)
  Softmax: (c) => {
    const { g } = c;
    const y = c.y[0];
    const dy = dy0(c);
    return [g.mul(y, g.sub(dy, g.reduceSum(g.mul(dy, y), [c.int('axis', -1)], true)))];
  },
  // dx = dy − exp(y)·Σ dy
  LogSoftmax: (c) => {
    const { g } = c;
    const dy = dy0(c);
    return [g.sub(dy, g.mul(g.exp(c.y[0]), g.reduceSum(dy, [c.int('axis', -1)], true)))];
  },
  LayerNormalization: layerNormGrad,
};
