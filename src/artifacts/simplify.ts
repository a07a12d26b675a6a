/**
 * Peephole clean-ups of a finished graph that remove whole-tensor copies ONNX Runtime would make:
 * Identity nodes that only rename a result into an output, and Expand nodes whose only readers
 * broadcast anyway. Both leave every computed value unchanged.
 */
import type { Graph, Node } from '../onnx/graph.ts';
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
