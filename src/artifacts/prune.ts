/**
 * Dead-node elimination: keeps only what the graph outputs need, so the eval graph carries no
 * gradient-only inputs and the training graph no eval-only ones (ORT insists on every declared input).
 */
import type { Graph } from '../onnx/graph.ts';

/** Removes, in place, nodes, initializers and inputs that no output depends on (`keepInputs` always stay). */
export function pruneGraph(g: Graph, keepInputs: ReadonlySet<string> = new Set()): void {
  const needed = new Set(g.outputs.map((o) => o.name));
  const kept: typeof g.nodes = [];
  for (let k = g.nodes.length - 1; k >= 0; k--) {
    const n = g.nodes[k];
    if (!n.outputs.some((o) => o && needed.has(o))) continue;
    kept.push(n);
    for (const i of n.inputs) if (i) needed.add(i);
  }
  kept.reverse();
  g.nodes.splice(0, g.nodes.length, ...kept);
  for (const name of [...g.initializers.keys()]) if (!needed.has(name)) g.initializers.delete(name);
  const inputs = g.inputs.filter((i) => needed.has(i.name) || keepInputs.has(i.name));
  g.inputs.splice(0, g.inputs.length, ...inputs);
}

