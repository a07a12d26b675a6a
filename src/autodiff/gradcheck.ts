/**
 * Gradient check: every rule of the table against central finite differences, both evaluated by
 * ONNX Runtime in float64. Each case builds a small graph, reduces its output to the scalar
 * sum(out · W) with a fixed random W (so every output element matters), and compares the analytic
 * gradient of each float input with (f(x + h) − f(x − h)) / 2h, h = 1e-6 · max(1, |x|).
 */
import { Graph, Tensor } from '../onnx/graph.ts';
import { serializeModel } from '../onnx/proto.ts';
import { Session, toOrt } from '../runtime/session.ts';
import { gradients, type GradientOptions } from './index.ts';
import { uniform } from '../random.ts';

/** How an input's values are drawn: uniform in [lo, hi], optionally kept ≥ gap away from 0 (kinks). */
export interface InputSpec {
  shape: number[];
  lo?: number;
  hi?: number;
  awayFromZero?: number;
}

export interface GradCase {
  /** The op whose rule is under test. */
  op: string;
  /** What the variant exercises (broadcasting, axis, repeated indices, …). */
  name: string;
  inputs: InputSpec[];
  /** Builds the op output from the float64 inputs (integer operands are constants inside). */
  build: (g: Graph, xs: Tensor[]) => Tensor;
  /** Opset of the graphs (default 17). */
  opset?: number;
  /**
   * Forward used for the finite differences when ORT has no float64 kernel for the op at any opset
   * (Erf): an independent float64 evaluation of the same function from standard ops.
   */
  reference?: (g: Graph, xs: Tensor[]) => Tensor;
  /** Options of the gradient graph (a rule's other form, e.g. scatterAdd 'elements'). */
  gradients?: GradientOptions;
}

export interface CaseResult {
  op: string;
  name: string;
  symbolic: boolean;
  maxRelErr: number;
  /** Number of gradient elements compared. */
  elements: number;
}

function draw(spec: InputSpec, rand: () => number): Float64Array {
  const n = spec.shape.reduce((a, b) => a * b, 1);
  const lo = spec.lo ?? -1;
  const hi = spec.hi ?? 1;
  return Float64Array.from({ length: n }, () => {
    const v = lo + (hi - lo) * rand();
    const gap = spec.awayFromZero ?? 0;
    return Math.abs(v) < gap ? (v < 0 ? -gap : gap) - v : v;
  });
}

/** A copy of g holding only the nodes and initializers the named outputs need. */
export function prune(g: Graph, outputs: string[]): Graph {
  const need = new Set(outputs);
  const keep = new Set<number>();
  for (let k = g.nodes.length - 1; k >= 0; k--) {
    const n = g.nodes[k];
    if (!n.outputs.some((o) => need.has(o))) continue;
    keep.add(k);
    for (const i of n.inputs) if (i) need.add(i);
  }
  const p = new Graph(g.name);
  for (const v of g.inputs) p.input(v.name, v.dtype, v.shape);
  for (const [name, t] of g.initializers) if (need.has(name)) p.initializer(name, t);
  g.nodes.forEach((n, k) => {
    if (keep.has(k)) p.addNode(n, (name) => {
      const t = g.tensor(name);
      return { name, dtype: t.dtype, shape: t.shape };
    });
  });
  for (const o of outputs) p.output(p.tensor(o));
  return p;
}

export interface EvalOptions {
  /** Inputs get named dims, so rules take their dynamic-shape paths. */
  symbolic?: boolean;
  /** Element type of the inputs (float32 checks that every emitted op has a float32 kernel). */
  dtype?: 'float64' | 'float32';
}

/** Graph of loss = sum(op(x) · W) for a case. */
function lossGraph(c: GradCase, fwd: (g: Graph, xs: Tensor[]) => Tensor, weights: Float64Array, o: EvalOptions) {
  const g = new Graph(`gradcheck_${c.op}`);
  const dtype = o.dtype ?? 'float64';
  const xs = c.inputs.map((s, i) => g.input(`x${i}`, dtype, o.symbolic ? s.shape.map((_, j) => `x${i}_d${j}`) : s.shape));
  const out = fwd(g, xs);
  const loss = (dims: number[]) => {
    const w = g.constant(Array.from(weights.subarray(0, dims.reduce((a, b) => a * b, 1))), out.dtype, dims);
    return g.reduceSum(g.mul(out, w), undefined, false);
  };
  return { g, xs, out, loss };
}

/**
 * No graph optimisation: ORT's fusions may fold a scalar Mul into a float32 `alpha` attribute
 * (MatMulScaleFusion), rounding float64 constants to float32 and hiding real errors at 1e-8.
 */
const SESSION = { optLevel: 'disabled' as const };

const toArray = (dtype: 'float64' | 'float32', v: Float64Array) => (dtype === 'float64' ? v : Float32Array.from(v));

/** Seeded input values and loss weights of a case. */
export function caseData(c: GradCase, seed: number): { data: Float64Array[]; weights: Float64Array } {
  const rand = uniform(seed);
  const data = c.inputs.map((s) => draw(s, rand));
  return { data, weights: Float64Array.from({ length: 4096 }, () => 2 * rand() - 1) };
}

/** Output dims of a case (static by construction of the cases). */
function outputDims(c: GradCase): number[] {
  const out = lossGraph(c, c.build, new Float64Array(0), {}).out;
  const dims = out.staticShape;
  if (!dims) throw new Error(`gradcheck ${c.op}/${c.name}: output shape ${JSON.stringify(out.shape)} is not static`);
  return dims;
}

/** d loss / d x_i from the gradient graph that `gradients` builds, run by ONNX Runtime. */
export async function analyticGradients(c: GradCase, data: Float64Array[], weights: Float64Array, o: EvalOptions = {}): Promise<Float64Array[]> {
  const dtype = o.dtype ?? 'float64';
  const an = lossGraph(c, c.build, weights, o);
  const grads = gradients(an.g, an.loss(outputDims(c)), an.xs, c.gradients);
  const names = grads.map((t, i) => {
    if (!t) throw new Error(`gradcheck ${c.op}/${c.name}: no gradient for input ${i}`);
    return an.g.output(t, `grad_${i}`).name;
  });
  const s = await Session.create(serializeModel(prune(an.g, names), { opset: c.opset ?? 17 }), SESSION);
  const out = await s.run(Object.fromEntries(data.map((v, i) => [`x${i}`, toOrt(dtype, toArray(dtype, v), c.inputs[i].shape)])));
  await s.release();
  return names.map((n, i) => {
    const a = Float64Array.from(out[n].data as Float64Array | Float32Array);
    if (a.length !== data[i].length) throw new Error(`gradcheck ${c.op}/${c.name}: gradient ${i} has ${a.length} elements, input has ${data[i].length}`);
    return a;
  });
}

/** Central finite differences of the float64 loss, h = 1e-6 · max(1, |x|). */
export async function numericGradients(c: GradCase, data: Float64Array[], weights: Float64Array): Promise<Float64Array[]> {
  const fd = lossGraph(c, c.reference ?? c.build, weights, {});
  fd.g.output(fd.loss(outputDims(c)), 'loss');
  const s = await Session.create(serializeModel(fd.g, { opset: c.opset ?? 17 }), SESSION);
  const f = async (vals: Float64Array[]) => {
    const out = await s.run(Object.fromEntries(vals.map((v, i) => [`x${i}`, toOrt('float64', v, c.inputs[i].shape)])));
    return (out.loss.data as Float64Array)[0];
  };
  const grads: Float64Array[] = [];
  for (let i = 0; i < data.length; i++) {
    const gi = new Float64Array(data[i].length);
    for (let j = 0; j < data[i].length; j++) {
      const x0 = data[i][j];
      const h = 1e-6 * Math.max(1, Math.abs(x0));
      const plus = data.map((v) => v.slice());
      const minus = data.map((v) => v.slice());
      plus[i][j] = x0 + h;
      minus[i][j] = x0 - h;
      // Divide by the step actually represented in float64, not the nominal one.
      gi[j] = ((await f(plus)) - (await f(minus))) / (plus[i][j] - minus[i][j]);
    }
    grads.push(gi);
  }
  await s.release();
  return grads;
}

/** max |a − b| over all elements, relative to the largest magnitude in either (infinity norm). */
export function relErr(a: Float64Array[], b: Float64Array[]): number {
  let diff = 0;
  let scale = 0;
  a.forEach((ai, i) => ai.forEach((v, j) => {
    diff = Math.max(diff, Math.abs(v - b[i][j]));
    scale = Math.max(scale, Math.abs(v), Math.abs(b[i][j]));
  }));
  return scale > 0 ? diff / scale : diff;
}

/** Runs one case: analytic (static or symbolic shapes) against finite differences, float64. */
export async function checkCase(c: GradCase, seed: number, symbolic = false): Promise<CaseResult> {
  const { data, weights } = caseData(c, seed);
  const analytic = await analyticGradients(c, data, weights, { symbolic });
  const numeric = await numericGradients(c, data, weights);
  return { op: c.op, name: c.name, symbolic, maxRelErr: relErr(analytic, numeric), elements: data.reduce((n, d) => n + d.length, 0) };
}

export interface GradcheckSummary {
  results: CaseResult[];
  opsChecked: number;
  maxRelErr: number;
}

/**
 * Runs every case (default: the built-in table), each with static and with symbolic input shapes
 * (not for cases with a reference forward: the symbolic gradient graph needs the op's own output shape).
 */
export async function gradcheck(cases: GradCase[] = CASES): Promise<GradcheckSummary> {
  const results: CaseResult[] = [];
  for (const [k, c] of cases.entries()) {
    for (const symbolic of c.reference ? [false] : [false, true]) results.push(await checkCase(c, 1000 + k, symbolic));
  }
  return {
    results,
    opsChecked: new Set(results.map((r) => r.op)).size,
    maxRelErr: Math.max(...results.map((r) => r.maxRelErr)),
  };
}

// ---- the cases ---------------------------------------------------------------------------------

const pos = (shape: number[]): InputSpec => ({ shape, lo: 0.5, hi: 2 });
const any = (shape: number[]): InputSpec => ({ shape });
const kinkFree = (shape: number[]): InputSpec => ({ shape, awayFromZero: 0.1 });
const i64 = (g: Graph, values: number[], dims: number[]) => g.constant(values, 'int64', dims);

/** erf(x) = 2/√π · x · Σₙ (−1)ⁿ x²ⁿ / (n!(2n+1)), Horner in x² with 40 terms: float64-exact for |x| ≤ 2. */
function erfSeries(g: Graph, x: Tensor): Tensor {
  const coef: number[] = [];
  for (let n = 0, fact = 1; n < 40; n++, fact *= n) coef.push((n % 2 ? -1 : 1) / (fact * (2 * n + 1)));
  const z = g.mul(x, x);
  let p = g.add(g.mul(z, coef[39]), coef[38]);
  for (let n = 37; n >= 0; n--) p = g.add(g.mul(p, z), coef[n]);
  return g.mul(g.mul(x, p), 2 / Math.sqrt(Math.PI));
}

export const CASES: GradCase[] = [
  // elementwise binary, with numpy broadcasting both ways
  { op: 'Add', name: '[2,3]+[3]', inputs: [any([2, 3]), any([3])], build: (g, [a, b]) => g.add(a, b) },
  { op: 'Add', name: '[2,1,3]+[4,1]', inputs: [any([2, 1, 3]), any([4, 1])], build: (g, [a, b]) => g.add(a, b) },
  { op: 'Sub', name: '[2,3]-[2,1]', inputs: [any([2, 3]), any([2, 1])], build: (g, [a, b]) => g.sub(a, b) },
  { op: 'Mul', name: '[3]*[2,3]', inputs: [any([3]), any([2, 3])], build: (g, [a, b]) => g.mul(a, b) },
  { op: 'Mul', name: 'x*x (two uses)', inputs: [any([2, 3])], build: (g, [a]) => g.mul(a, a) },
  { op: 'Div', name: '[2,3]/[1,3]', inputs: [any([2, 3]), pos([1, 3])], build: (g, [a, b]) => g.div(a, b) },
  { op: 'Pow', name: 'x^2.5', inputs: [pos([2, 3])], build: (g, [a]) => g.pow(a, 2.5) },
  { op: 'Pow', name: 'x^y broadcast', inputs: [pos([2, 3]), any([3])], build: (g, [a, b]) => g.pow(a, b) },
  { op: 'Min', name: '[2,3] vs [3]', inputs: [any([2, 3]), any([3])], build: (g, [a, b]) => g.min(a, b) },
  { op: 'Max', name: '[2,3] vs [2,1]', inputs: [any([2, 3]), any([2, 1])], build: (g, [a, b]) => g.max(a, b) },
  { op: 'Sum', name: '3 inputs broadcast', inputs: [any([2, 3]), any([3]), any([2, 1])], build: (g, xs) => g.sum(xs) },
  { op: 'Where', name: 'broadcast branches', inputs: [any([2, 3]), any([3])],
    build: (g, [a, b]) => g.where(g.constant([1, 0, 1, 0, 0, 1], 'bool', [2, 3]), a, b) },
  // elementwise unary
  { op: 'Neg', name: 'x', inputs: [any([2, 3])], build: (g, [a]) => g.neg(a) },
  { op: 'Sqrt', name: 'x>0', inputs: [pos([2, 3])], build: (g, [a]) => g.sqrt(a) },
  { op: 'Reciprocal', name: 'x>0', inputs: [pos([2, 3])], build: (g, [a]) => g.reciprocal(a) },
  { op: 'Exp', name: 'x', inputs: [any([2, 3])], build: (g, [a]) => g.exp(a) },
  { op: 'Log', name: 'x>0', inputs: [pos([2, 3])], build: (g, [a]) => g.log(a) },
  { op: 'Tanh', name: 'x', inputs: [any([2, 3])], build: (g, [a]) => g.tanh(a) },
  { op: 'Sigmoid', name: 'x', inputs: [any([2, 3])], build: (g, [a]) => g.sigmoid(a) },
  { op: 'Relu', name: '|x|>0.1', inputs: [kinkFree([2, 3])], build: (g, [a]) => g.relu(a) },
  { op: 'LeakyRelu', name: '|x|>0.1', inputs: [kinkFree([2, 3])], build: (g, [a]) => g.op('LeakyRelu', [a], { alpha: { kind: 'float', value: 0.2 } }, [{ dtype: a.dtype, shape: a.shape }])[0] },
  { op: 'Erf', name: 'FD via float64 series (no double Erf kernel in ORT)', inputs: [any([2, 3])], build: (g, [a]) => g.erf(a), reference: (g, [a]) => erfSeries(g, a) },
  // Softplus has no double kernel at opset 17; at opset 18 ORT runs its ONNX function body in float64.
  { op: 'Softplus', name: 'opset 18 function body', inputs: [{ shape: [2, 3], lo: -3, hi: 3 }], build: (g, [a]) => g.softplus(a), opset: 18 },
  { op: 'Abs', name: '|x|>0.1', inputs: [kinkFree([2, 3])], build: (g, [a]) => g.abs(a) },
  { op: 'Sin', name: 'x', inputs: [any([2, 3])], build: (g, [a]) => g.sin(a) },
  { op: 'Cos', name: 'x', inputs: [any([2, 3])], build: (g, [a]) => g.cos(a) },
  { op: 'Clip', name: 'bounds ±0.5', inputs: [{ shape: [3, 4], lo: -1, hi: 1 }], build: (g, [a]) => g.clip(a, -0.5, 0.5) },
  { op: 'Clip', name: 'tensor bounds', inputs: [any([3, 4]), { shape: [], lo: -0.6, hi: -0.4 }, { shape: [], lo: 0.4, hi: 0.6 }], build: (g, [a, lo, hi]) => g.clip(a, lo, hi) },
  { op: 'Cast', name: 'float64→float64', inputs: [any([2, 3])], build: (g, [a]) => g.cast(a, 'float64') },
  { op: 'Identity', name: 'x', inputs: [any([2, 3])], build: (g, [a]) => g.identity(a) },
  // linear algebra
  { op: 'MatMul', name: '[3,4]@[4,2]', inputs: [any([3, 4]), any([4, 2])], build: (g, [a, b]) => g.matmul(a, b) },
  { op: 'MatMul', name: '[2,3,4]@[4,5] (shared weight)', inputs: [any([2, 3, 4]), any([4, 5])], build: (g, [a, b]) => g.matmul(a, b) },
  { op: 'MatMul', name: '[2,1,3,4]@[3,4,2] batch broadcast', inputs: [any([2, 1, 3, 4]), any([3, 4, 2])], build: (g, [a, b]) => g.matmul(a, b) },
  { op: 'MatMul', name: '[3,4]@[2,4,5]', inputs: [any([3, 4]), any([2, 4, 5])], build: (g, [a, b]) => g.matmul(a, b) },
  { op: 'MatMul', name: '[4]@[2,4,3] (1-D left)', inputs: [any([4]), any([2, 4, 3])], build: (g, [a, b]) => g.matmul(a, b) },
  { op: 'MatMul', name: '[2,3,4]@[4] (1-D right)', inputs: [any([2, 3, 4]), any([4])], build: (g, [a, b]) => g.matmul(a, b) },
  { op: 'MatMul', name: '[4]@[4] (dot)', inputs: [any([4]), any([4])], build: (g, [a, b]) => g.matmul(a, b) },
  { op: 'Gemm', name: 'A·B + C[n]', inputs: [any([3, 4]), any([4, 2]), any([2])], build: (g, [a, b, c]) => g.gemm(a, b, c) },
  { op: 'Gemm', name: 'transA, α=0.7, β=1.3', inputs: [any([4, 3]), any([4, 2]), any([3, 1])], build: (g, [a, b, c]) => g.gemm(a, b, c, { transA: true, alpha: 0.7, beta: 1.3 }) },
  { op: 'Gemm', name: 'transB', inputs: [any([3, 4]), any([2, 4])], build: (g, [a, b]) => g.gemm(a, b, null, { transB: true }) },
  { op: 'Gemm', name: 'transA+transB', inputs: [any([4, 3]), any([2, 4]), any([3, 2])], build: (g, [a, b, c]) => g.gemm(a, b, c, { transA: true, transB: true, alpha: -1.5 }) },
  // shape manipulation
  { op: 'Transpose', name: 'perm [1,2,0]', inputs: [any([2, 3, 4])], build: (g, [a]) => g.transpose(a, [1, 2, 0]) },
  { op: 'Transpose', name: 'default reverse', inputs: [any([2, 3])], build: (g, [a]) => g.transpose(a) },
  { op: 'Reshape', name: '[2,3,4]→[6,-1]', inputs: [any([2, 3, 4])], build: (g, [a]) => g.reshape(a, [6, -1]) },
  { op: 'Flatten', name: 'axis 2', inputs: [any([2, 3, 2])], build: (g, [a]) => g.flatten(a, 2) },
  { op: 'Squeeze', name: 'axes [1,-1]', inputs: [any([2, 1, 3, 1])], build: (g, [a]) => g.squeeze(a, [1, -1]) },
  { op: 'Unsqueeze', name: 'axes [0,-1]', inputs: [any([2, 3])], build: (g, [a]) => g.unsqueeze(a, [0, -1]) },
  { op: 'Expand', name: '[3,1]→[2,3,4]', inputs: [any([3, 1])], build: (g, [a]) => g.expand(a, [2, 3, 4]) },
  { op: 'Concat', name: 'axis 1, three inputs', inputs: [any([2, 1]), any([2, 3]), any([2, 2])], build: (g, xs) => g.concat(xs, 1) },
  { op: 'Concat', name: 'same tensor twice, axis -1', inputs: [any([2, 3])], build: (g, [a]) => g.concat([a, a], -1) },
  { op: 'Split', name: 'all pieces used', inputs: [any([2, 6])], build: (g, [a]) => {
    const [p, q, r] = g.split(a, [1, 2, 3], 1);
    return g.concat([g.mul(p, 2), r, g.exp(q)], 1);
  } },
  { op: 'Split', name: 'one piece unused', inputs: [any([5, 2])], build: (g, [a]) => g.split(a, [2, 3], 0)[1] },
  { op: 'Slice', name: 'unit steps, negative ends', inputs: [any([4, 5])], build: (g, [a]) => g.slice(a, [1, 0], [-1, -2], [0, 1]) },
  { op: 'Slice', name: 'step 2 and step -1', inputs: [any([5, 4])], build: (g, [a]) => g.reshape(g.slice(a, [0, -1], [5, 0], [0, 1], [2, -1]), [3, 3]) },
  { op: 'Slice', name: 'run-time int32 starts/ends', inputs: [any([4, 5])], build: (g, [a]) => {
    const i32 = (v: number[]) => g.cast(g.ints(v), 'int32');
    const s = g.op('Slice', [a, i32([1, -3]), i32([3, 100]), g.constant([0, 1], 'int32', [2])], {}, [{ dtype: a.dtype, shape: ['?', '?'] }])[0];
    return g.reshape(s, [2, 3]);
  } },
  { op: 'Pad', name: 'constant value as input', inputs: [any([2, 3]), any([])], build: (g, [a, v]) =>
    g.op('Pad', [a, g.ints([1, 0, 0, 2]), v], { mode: { kind: 'string', value: 'constant' } }, [{ dtype: a.dtype, shape: [3, 5] }])[0] },
  { op: 'Gather', name: 'axis 0, repeated 2-D indices', inputs: [any([5, 3])], build: (g, [a]) => g.gather(a, i64(g, [1, 3, 1, 0, 3, 3], [2, 3]), 0) },
  { op: 'Gather', name: 'axis 0, repeated + negative', inputs: [any([5, 3])], build: (g, [a]) => g.gather(a, i64(g, [4, -1, 0, 4, 2, -5, 4], [7]), 0) },
  { op: 'Gather', name: 'axis 0, ScatterElements (WebGPU)', inputs: [any([5, 3])], build: (g, [a]) => g.gather(a, i64(g, [1, 3, 1, 0, 3, 3], [2, 3]), 0), gradients: { scatterAdd: 'elements' } },
  { op: 'Gather', name: 'axis 1, repeated + negative', inputs: [any([2, 4, 3])], build: (g, [a]) => g.gather(a, i64(g, [2, -1, 2, 0], [4]), 1) },
  { op: 'Gather', name: 'int32 indices', inputs: [any([4, 2])], build: (g, [a]) => g.gather(a, g.constant([1, 3, 1], 'int32', [3]), 0) },
  { op: 'Gather', name: 'scalar index', inputs: [any([4, 3])], build: (g, [a]) => g.gather(a, i64(g, [2], []), 0) },
  { op: 'GatherElements', name: 'axis 1, repeated', inputs: [any([3, 4])], build: (g, [a]) => g.gatherElements(a, i64(g, [0, 0, 3, 1, 1, 1, 2, 3, 2], [3, 3]), 1) },
  { op: 'Trilu', name: 'lower, k=1', inputs: [any([3, 4])], build: (g, [a]) => g.trilu(a, false, g.constant(1, 'int64')) },
  // reductions
  { op: 'ReduceSum', name: 'axis 1, keepdims 0', inputs: [any([2, 3, 4])], build: (g, [a]) => g.reduceSum(a, [1], false) },
  { op: 'ReduceSum', name: 'all axes', inputs: [any([2, 3])], build: (g, [a]) => g.reduceSum(a) },
  { op: 'ReduceMean', name: 'axes [0,2]', inputs: [any([2, 3, 4])], build: (g, [a]) => g.reduceMean(a, [0, 2], false) },
  { op: 'ReduceMean', name: 'axis -1 keepdims', inputs: [any([3, 4])], build: (g, [a]) => g.reduceMean(a, [-1]) },
  { op: 'ReduceMax', name: 'axis 1', inputs: [any([3, 4])], build: (g, [a]) => g.reduceMax(a, [1], false) },
  { op: 'ReduceMin', name: 'axis 0 keepdims', inputs: [any([3, 4])], build: (g, [a]) => g.reduceMin(a, [0]) },
  { op: 'ReduceLogSumExp', name: 'axis -1', inputs: [any([3, 4])], build: (g, [a]) => g.reduceLogSumExp(a, [-1], false) },
  { op: 'ReduceSumSquare', name: 'axis 1', inputs: [any([3, 4])], build: (g, [a]) =>
    g.op('ReduceSumSquare', [a], { axes: { kind: 'ints', value: [1] }, keepdims: { kind: 'int', value: 0 } }, [{ dtype: a.dtype, shape: [3] }])[0] },
  { op: 'CumSum', name: 'axis 1', inputs: [any([2, 4])], build: (g, [a]) => g.cumSum(a, 1) },
  { op: 'CumSum', name: 'exclusive reverse', inputs: [any([2, 4])], build: (g, [a]) => g.cumSum(a, 1, { exclusive: true, reverse: true }) },
  // neural-network ops
  { op: 'Softmax', name: 'axis -1', inputs: [any([2, 3, 4])], build: (g, [a]) => g.softmax(a, -1) },
  { op: 'Softmax', name: 'axis 1', inputs: [any([2, 3, 4])], build: (g, [a]) => g.softmax(a, 1) },
  { op: 'LogSoftmax', name: 'axis -1', inputs: [any([3, 5])], build: (g, [a]) => g.logSoftmax(a, -1) },
  { op: 'LogSoftmax', name: 'axis 0', inputs: [any([3, 5])], build: (g, [a]) => g.logSoftmax(a, 0) },
  { op: 'LayerNormalization', name: 'axis -1, scale + bias', inputs: [any([2, 3, 4]), any([4]), any([4])], build: (g, [x, s, b]) => g.layerNorm(x, s, b) },
  { op: 'LayerNormalization', name: 'axis 1, no bias', inputs: [any([2, 3, 2]), any([3, 2])], build: (g, [x, s]) => g.layerNorm(x, s, null, { axis: 1, epsilon: 1e-3 }) },
];
