/**
 * The one-graph training step: forward, backward and the optimizer update in a single graph, for a
 * step that is not part of an accumulation. Gradients then stay inside ONNX Runtime (its arena)
 * instead of being handed to JavaScript as parameter-sized outputs and fed back to the optimizer
 * graph; the update reads them where the backward pass wrote them.
 */
import { Tensor, type Graph } from '../onnx/graph.ts';
import type { OptimizerGraph } from '../optim/graph.ts';

/** Prefix of the optimizer's own tensor and node names inside the fused graph. */
const SCOPE = 'optimizer/';

/**
 * Appends the optimizer graph to `training` (built without accumulation inputs): the optimizer's
 * `grad.<p>` inputs become the training graph's gradient tensors, its parameter inputs are the
 * training graph's, and its other inputs (state, step, lr, grad_scale) and outputs are added. The
 * gradients are no longer outputs. Returns `training`, changed in place.
 */
export function fuseOptimizer(training: Graph, opt: OptimizerGraph): Graph {
  const g = training;
  const grads = new Set(opt.params.map((p) => p.grad));
  const params = new Set(opt.params.map((p) => p.name));
  for (const name of [...grads, ...params]) {
    if (!g.values.has(name)) throw new Error(`fuseOptimizer: the training graph has no tensor ${name}`);
  }
  const src = opt.graph;
  const shared = new Set([...grads, ...params]);
  const ownInputs = new Set(src.inputs.map((i) => i.name).filter((n) => !shared.has(n)));
  const outputs = new Set(src.outputs.map((o) => o.name));
  // Inputs and outputs keep their names (they are the graph's interface); everything internal is scoped.
  const rename = (name: string) => (name === '' || shared.has(name) || ownInputs.has(name) || outputs.has(name) ? name : SCOPE + name);
  for (const name of [...ownInputs, ...outputs]) {
    if (g.values.has(name)) throw new Error(`fuseOptimizer: ${name} names a tensor of both graphs`);
  }
  for (const i of src.inputs) {
    if (!ownInputs.has(i.name)) continue;
    g.inputs.push({ ...i });
    g.values.set(i.name, new Tensor(g, i.name, i.dtype, i.shape));
  }
  for (const [name, value] of src.initializers) {
    g.initializers.set(rename(name), value);
    g.values.set(rename(name), new Tensor(g, rename(name), value.dtype, value.dims));
  }
  for (const n of src.nodes) {
    const node = { ...n, name: SCOPE + n.name, inputs: n.inputs.map(rename), outputs: n.outputs.map(rename), attrs: { ...n.attrs } };
    g.nodes.push(node);
    n.outputs.forEach((orig, k) => {
      const name = node.outputs[k];
      if (!name) return;
      const t = src.values.get(orig);
      g.values.set(name, new Tensor(g, name, t?.dtype ?? 'float32', t?.shape ?? null));
      g.producer.set(name, node);
    });
  }
  const kept = g.outputs.filter((o) => !grads.has(o.name));
  g.outputs.splice(0, g.outputs.length, ...kept, ...src.outputs.map((o) => ({ ...o })));
  return g;
}

