/**
 * Reverse-mode autodiff over ONNX graphs. `gradients` appends to the graph the nodes computing
 * d(y)/d(wrt[i]): a forward sweep marks what depends on `wrt`, one reverse sweep over the nodes
 * calls each op's rule (rules.ts) and sums the gradients of tensors with several consumers.
 */
import { Graph, Tensor, type Node } from '../onnx/graph.ts';
import { isFloat } from '../onnx/dtype.ts';
import { RULES, NON_DIFFERENTIABLE, type RuleContext, type ScatterAdd } from './rules.ts';
import { expandLike } from './shape.ts';

export { unbroadcast } from './shape.ts';
export { RULES, NON_DIFFERENTIABLE, type Rule, type RuleContext, type ScatterAdd } from './rules.ts';

export interface GradientOptions {
  /** Upstream gradient of y (y's dtype and shape); default ones. */
  seed?: Tensor;
  /**
   * Add each new contribution to a tensor's gradient as it arrives (Add chain, same order) instead
   * of one Sum at first use: the contributions need not all be alive at once (recomputation).
   */
  eagerSums?: boolean;
  /** How a gather's gradient adds the rows of a repeated index; default 'sorted' (rules.ts, ScatterAdd). */
  scatterAdd?: ScatterAdd;
}

/**
 * Appends gradient nodes to `g` and returns d(y)/d(wrt[i]) for each i (null where y does not
 * depend on wrt[i] through differentiable float ops). Nodes must be in topological order.
 */
export function gradients(g: Graph, y: Tensor, wrt: Tensor[], opts: GradientOptions = {}): (Tensor | null)[] {
  const producer = g.producer.get(y.name);
  const end = producer ? g.nodes.indexOf(producer) : -1;
  // Forward: float tensors reachable from wrt; noGrad tensors and integer paths stay out.
  const live = new Set(wrt.filter((t) => isFloat(t.dtype)).map((t) => t.name));
  for (let k = 0; k <= end; k++) {
    const n = g.nodes[k];
    if (NON_DIFFERENTIABLE.has(n.op) || !n.inputs.some((i) => live.has(i))) continue;
    for (const o of n.outputs) if (o && !g.noGrad.has(o) && isFloat(g.tensor(o).dtype)) live.add(o);
  }
  if (!live.has(y.name)) return wrt.map(() => null);
  if (opts.seed && opts.seed.dtype !== y.dtype) throw new Error(`gradients: seed ${opts.seed.name} is ${opts.seed.dtype}, y is ${y.dtype}`);

  return g.scope('grad', () => {
    // Pending gradient contributions per tensor name, summed on first use.
    const pending = new Map<string, Tensor[]>();
    const total = (name: string): Tensor | null => {
      const parts = pending.get(name);
      if (!parts) return null;
      if (parts.length > 1) pending.set(name, [g.sum(parts)]);
      return pending.get(name)![0];
    };
    pending.set(y.name, [opts.seed ?? expandLike(g, g.scalar(1, y.dtype), y)]);

    for (let k = end; k >= 0; k--) {
      const node = g.nodes[k];
      const dy = node.outputs.map((o) => (o ? total(o) : null));
      if (dy.every((d) => d === null)) continue;
      const needs = node.inputs.map((i) => i !== '' && live.has(i));
      if (!needs.some(Boolean)) continue;
      const rule = RULES[node.op];
      if (!rule || node.domain !== '') {
        const op = node.domain ? `${node.domain}.${node.op}` : node.op;
        throw new Error(`autodiff: no gradient rule for op ${op} (node ${node.name}); add one to src/autodiff/rules.ts`);
      }
      const dx = rule(context(g, node, dy, needs, opts.scatterAdd ?? 'sorted'));
      dx.forEach((d, i) => {
        if (!d || !needs[i]) return;
        const name = node.inputs[i];
        const parts = pending.get(name) ?? [];
        pending.set(name, opts.eagerSums && parts.length ? [g.add(parts[0], d)] : [...parts, d]);
      });
    }
    return wrt.map((t) => (live.has(t.name) ? total(t.name) : null));
  });
}

function context(g: Graph, node: Node, dy: (Tensor | null)[], needs: boolean[], scatterAdd: ScatterAdd): RuleContext {
  const attrOf = (name: string) => node.attrs[name];
  return {
    g,
    node,
    x: node.inputs.map((i) => (i === '' ? null : g.tensor(i))),
    y: node.outputs.map((o) => g.tensor(o)),
    dy,
    needs,
    scatterAdd,
    when: (i, fn) => (needs[i] ? fn() : null),
    int: (name, dflt) => {
      const a = attrOf(name);
      return a && a.kind === 'int' ? a.value : dflt;
    },
    float: (name, dflt) => {
      const a = attrOf(name);
      return a && a.kind === 'float' ? a.value : dflt;
    },
    ints: (name) => {
      const a = attrOf(name);
      return a && a.kind === 'ints' ? a.value : undefined;
    },
  };
}
