/**
 * Peephole clean-ups of a finished graph that remove whole-tensor copies ONNX Runtime would make:
 * Identity nodes that only rename a result into an output, and Expand nodes whose only readers
 * broadcast anyway. Both leave every computed value unchanged.
 */
import { type Graph, type Node, Tensor } from '../onnx/graph.ts';
import { sameShape } from '../autodiff/shape.ts';

/**
 * Names graph outputs at their producers: an Identity that only renames a computed tensor into an
 * output is dropped and the producer writes the output name directly, so ONNX Runtime does not copy
 * the tensor (per parameter and optimizer slot, a parameter-sized copy each run).
 */
export function foldOutputIdentities(g: Graph): void {
  const outputs = new Set(g.outputs.map((o) => o.name));
  const graphInputs = new Set(g.inputs.map((i) => i.name));
  const renamed = new Set<string>();
  const drop = new Set<Node>();
  for (const n of g.nodes) {
    if (n.op !== 'Identity' || n.domain !== '' || !outputs.has(n.outputs[0])) continue;
    const from = n.inputs[0];
    const producer = g.producer.get(from);
    if (!producer || drop.has(producer) || outputs.has(from) || graphInputs.has(from) || g.initializers.has(from) || renamed.has(from)) continue;
    const to = n.outputs[0];
    renamed.add(from);
    drop.add(n);
    producer.outputs = producer.outputs.map((o) => (o === from ? to : o));
    for (const m of g.nodes) if (m !== n) m.inputs = m.inputs.map((i) => (i === from ? to : i));
    g.producer.set(to, producer);
    g.producer.delete(from);
  }
  if (drop.size) g.nodes.splice(0, g.nodes.length, ...g.nodes.filter((n) => !drop.has(n)));
}

const BROADCASTING = new Set(['Add', 'Sub', 'Mul', 'Div']);

/**
 * Drops an Expand whose readers are all binary broadcasting ops whose other operand already has the
 * expanded shape: they produce the same values from the unexpanded tensor without the `[.., big]`
 * intermediate (e.g. the gradient of a row sum, broadcast back over the vocabulary).
 */
export function elideBroadcastExpands(g: Graph): void {
  const outputs = new Set(g.outputs.map((o) => o.name));
  const readers = new Map<string, Node[]>();
  for (const n of g.nodes) for (const i of n.inputs) if (i) readers.set(i, [...(readers.get(i) ?? []), n]);
  const drop = new Set<Node>();
  for (const n of g.nodes) {
    if (n.op !== 'Expand' || n.domain !== '' || outputs.has(n.outputs[0])) continue;
    const e = g.values.get(n.outputs[0]);
    const users = readers.get(n.outputs[0]) ?? [];
    if (!e || users.length === 0) continue;
    const ok = users.every((u) => {
      if (!BROADCASTING.has(u.op) || u.domain !== '' || u.inputs.length !== 2 || u.inputs[0] === u.inputs[1]) return false;
      const other = g.values.get(u.inputs[u.inputs[0] === n.outputs[0] ? 1 : 0]);
      return !!other && sameShape(other.shape, e.shape);
    });
    if (!ok) continue;
    for (const u of users) u.inputs = u.inputs.map((i) => (i === n.outputs[0] ? n.inputs[0] : i));
    drop.add(n);
  }
  if (drop.size) g.nodes.splice(0, g.nodes.length, ...g.nodes.filter((n) => !drop.has(n)));
}

/** A ConstantOfShape whose fill value is 0 (the default when no value is given). */
export function isZeroFill(n: Node): boolean {
  if (n.op !== 'ConstantOfShape' || n.domain !== '') return false;
  const v = n.attrs.value;
  if (!v) return true;
  return v.kind === 'tensor' && Array.from(v.value.data as ArrayLike<number | bigint>).every((x) => Number(x) === 0);
}

/** A scatter-add (ScatterElements or ScatterND with reduction "add"): its data input is where the sum starts. */
export function isScatterAdd(n: Node): boolean {
  const reduction = n.attrs.reduction;
  return (n.op === 'ScatterElements' || n.op === 'ScatterND') && n.domain === '' && reduction?.kind === 'string' && reduction.value === 'add';
}

/**
 * Sum(x, …, Scatter(zeros, idx, u, add)) → Scatter(Sum(x, …), idx, u, add): the scatter-add
 * starts from the other terms instead of a zero tensor, so the zero fill and one pass of the Sum go
 * (for a gathered weight that is also a matmul operand, such as the output head whose target rows
 * are gathered, two parameter-sized passes per step). Only the rounding order of the additions changes.
 */
export function foldScatterAddIntoSum(g: Graph): void {
  const outputs = new Set(g.outputs.map((o) => o.name));
  const readers = new Map<string, number>();
  for (const n of g.nodes) for (const i of n.inputs) if (i) readers.set(i, (readers.get(i) ?? 0) + 1);
  const replace = new Map<Node, Node[]>();
  const drop = new Set<Node>();
  for (const sum of g.nodes) {
    if (sum.op !== 'Sum' || sum.domain !== '' || sum.inputs.length < 2) continue;
    const at = sum.inputs.findIndex((name) => {
      const s = g.producer.get(name);
      if (!s || !isScatterAdd(s) || drop.has(s)) return false;
      const zeros = g.producer.get(s.inputs[0]);
      return !!zeros && isZeroFill(zeros) && readers.get(s.inputs[0]) === 1 && readers.get(name) === 1 && !outputs.has(name) && sum.inputs.indexOf(name) === sum.inputs.lastIndexOf(name);
    });
    if (at < 0) continue;
    const scatter = g.producer.get(sum.inputs[at])!;
    const zeros = g.producer.get(scatter.inputs[0])!;
    const rest = sum.inputs.filter((_, i) => i !== at);
    const out = sum.outputs[0];
    const nodes: Node[] = [];
    let start = rest[0];
    if (rest.length > 1) {
      const t = g.tensor(out);
      start = `${out}/terms`;
      nodes.push({ ...sum, name: `${sum.name}/terms`, inputs: rest, outputs: [start] });
      g.values.set(start, new Tensor(g, start, t.dtype, t.shape));
    }
    const moved: Node = { ...scatter, inputs: [start, scatter.inputs[1], scatter.inputs[2]], outputs: [out] };
    nodes.push(moved);
    replace.set(sum, nodes);
    drop.add(scatter).add(zeros);
    g.values.delete(scatter.outputs[0]);
    g.producer.delete(scatter.outputs[0]);
    for (const n of nodes) for (const o of n.outputs) g.producer.set(o, n);
  }
  if (!replace.size) return;
  g.nodes.splice(0, g.nodes.length, ...g.nodes.flatMap((n) => (drop.has(n) ? [] : replace.get(n) ?? [n])));
}
