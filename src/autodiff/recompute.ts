/**
 * Activation recomputation ("gradient checkpointing"; Chen et al. 2016, "Training Deep Nets with
 * Sublinear Memory Cost"): a rewrite of a graph that already holds its gradient nodes. The forward
 * is cut into segments (a model's layers); a segment's outputs that later forward nodes read are the
 * checkpoints, kept as before. Every other forward tensor of the segment that the backward reads is
 * instead recomputed from the segment's inputs by a copy of the forward nodes producing it, placed
 * just before the segment's first backward node. The forward activations then die as soon as the
 * forward has used them, and one segment's activations are alive at a time during the backward.
 *
 * Two things make the runtime honour the placement. The copies read the segment's entry tensors
 * through a gate that depends on the last gradient tensor computed before the segment's backward:
 * activations as `x + z`, graph inputs (weights) as `Reshape(x, Shape(x) + z)` (an alias, no copy),
 * with z = Cast(g < g) = 0 for one element g of that gradient (0 even when g is NaN). The copies then
 * cannot run before the backward reaches the segment, whatever order the runtime picks, and no
 * common-subexpression pass can merge them back into the originals. `x + 0` is x, so the gradients
 * are the same numbers as without recomputation.
 */
import type { Graph, Node, Tensor } from '../onnx/graph.ts';
import { isFloat } from '../onnx/dtype.ts';

export interface RecomputeStats {
  segments: number;
  /** Forward nodes copied into the backward. */
  nodes: number;
}

/**
 * Rewrites `g` in place. Nodes before `firstBackward` are the forward; `segmentOf(node)` names a
 * forward node's segment (null: not recomputed, e.g. shared index tensors).
 */
export function recomputeSegments(g: Graph, firstBackward: number, segmentOf: (n: Node) => string | null): RecomputeStats {
  const forward = g.nodes.slice(0, firstBackward);
  const backward = g.nodes.slice(firstBackward);
  const segOfTensor = new Map<string, string>();
  const producerIndex = new Map<string, number>();
  forward.forEach((n, i) => {
    const s = segmentOf(n);
    for (const o of n.outputs) {
      if (!o) continue;
      producerIndex.set(o, i);
      if (s !== null) segOfTensor.set(o, s);
    }
  });
  // Checkpoints: tensors of a segment that another segment's forward nodes read (and graph outputs).
  // What only unsegmented nodes read (a widened weight, the last layer's output) is recomputed too.
  const graphOutputs = new Set<string>(g.outputs.map((o) => o.name));
  const boundary = new Set<string>(graphOutputs);
  for (const n of forward) {
    const s = segmentOf(n);
    if (s === null) continue;
    for (const i of n.inputs) if (segOfTensor.has(i) && segOfTensor.get(i) !== s) boundary.add(i);
  }
  // Per segment: the tensors the backward reads, and the first backward node reading one.
  const wanted = new Map<string, { tensors: Set<string>; first: number }>();
  backward.forEach((n, b) => {
    for (const i of n.inputs) {
      const s = segOfTensor.get(i);
      if (s === undefined || boundary.has(i)) continue;
      if (!wanted.has(s)) wanted.set(s, { tensors: new Set(), first: b });
      wanted.get(s)!.tensors.add(i);
    }
  });
  // Entry tensors that several segments read (positions, masks, rotary tables) are shared: no barrier.
  const readers = new Map<string, Set<string>>();
  for (const n of forward) {
    const s = segmentOf(n);
    if (s === null) continue;
    for (const i of n.inputs) if (i && segOfTensor.get(i) !== s) (readers.get(i) ?? readers.set(i, new Set()).get(i)!).add(s);
  }

  // The last backward node reading each tensor, to tell which tensors a stretch of backward hands on.
  const lastRead = new Map<string, number>();
  backward.forEach((n, b) => {
    for (const i of n.inputs) if (i) lastRead.set(i, b);
  });
  const starts = [...wanted.values()].map((w) => w.first).sort((a, b) => a - b);

  const inserts = new Map<Node, Node[]>();
  let copied = 0;
  for (const [seg, { tensors, first }] of wanted) {
    // The forward nodes of the segment that the wanted tensors depend on, in forward order.
    const need = new Set<number>();
    const stack = [...tensors];
    while (stack.length) {
      const t = stack.pop()!;
      const k = producerIndex.get(t);
      if (k === undefined || need.has(k) || segOfTensor.get(t) !== seg) continue;
      need.add(k);
      for (const i of forward[k].inputs) if (i && !boundary.has(i)) stack.push(i);
    }
    // The barrier: every float tensor that the backward since the previous segment's start hands on
    // to what comes after (its data gradients, the weight gradients and their running sums). The
    // copies then wait until the backward of the segment before is complete. Waiting for one of
    // its tensors only is not enough: ONNX Runtime orders nodes by a depth-first walk from the
    // outputs, which leaves whatever the next reader does not need (a weight's gradient, read by no
    // node) for last, keeping that segment's activations alive until the very end.
    const from = starts.filter((b) => b < first).at(-1) ?? 0;
    const barrier: string[] = [];
    for (let b = from; b < first; b++) {
      for (const o of backward[b].outputs) {
        if (o && isFloat(g.tensor(o).dtype) && ((lastRead.get(o) ?? -1) >= first || boundary.has(o) || graphOutputs.has(o))) barrier.push(o);
      }
    }
    if (!barrier.length) {
      const last = backward
        .slice(0, first)
        .flatMap((n) => n.outputs)
        .reverse()
        .find((o) => o && isFloat(g.tensor(o).dtype));
      if (last) barrier.push(last);
    }
    const start = g.nodes.length;
    const rename = new Map<string, Tensor>();
    let gate: Tensor | null = null;
    const entry = (x: string): Tensor => {
      const t = g.tensor(x);
      const shared = (readers.get(x)?.size ?? 0) > 1;
      if (!barrier.length || shared || !isFloat(t.dtype)) return t;
      if (!rename.has(x)) {
        // s < s: false, yet computed from the gradients arriving here, which ties the copies to this
        // point. s sums the first element of each (0 for an empty tensor; a NaN or ±inf sum is still not < itself).
        gate ??= g.scope('gate', () => {
          const firsts = barrier.map((b) => {
            const e = g.reduceSum(g.slice(g.reshape(g.tensor(b), [-1]), [0], [1]), undefined, false);
            return e.dtype === 'float32' ? e : g.cast(e, 'float32');
          });
          const s = firsts.length === 1 ? firsts[0] : g.sum(firsts);
          return g.less(s, s);
        });
        const z = gate;
        rename.set(
          x,
          producerIndex.has(x) ? g.add(t, g.cast(z, t.dtype)) : g.op('Reshape', [t, g.add(g.shapeOf(t), g.cast(z, 'int64'))], {}, [{ dtype: t.dtype, shape: t.shape }])[0],
        );
      }
      return rename.get(x)!;
    };
    g.scope(`recompute/${seg}`, () => {
      for (const k of [...need].sort((a, b) => a - b)) {
        const n = forward[k];
        const inputs = n.inputs.map((i) => (i === '' ? null : segOfTensor.get(i) === seg && !boundary.has(i) ? rename.get(i)! : entry(i)));
        // An omitted optional output comes back as an unread one.
        const outs = n.outputs.map((o) => (o ? { dtype: g.tensor(o).dtype, shape: g.tensor(o).shape } : { dtype: 'float32' as const, shape: null }));
        const made = g.op(n.op, inputs, n.attrs, outs, undefined, n.domain);
        n.outputs.forEach((o, j) => o && rename.set(o, made[j]));
      }
    });
    copied += need.size;
    for (const n of backward) n.inputs = n.inputs.map((i) => (tensors.has(i) ? rename.get(i)!.name : i));
    inserts.set(backward[first], g.nodes.splice(start));
  }
  // Splice the copies in before each segment's first backward reader (the order stays topological).
  const order: Node[] = [];
  for (const n of g.nodes) order.push(...(inserts.get(n) ?? []), n);
  g.nodes.splice(0, g.nodes.length, ...order);
  return { segments: wanted.size, nodes: copied };
}
