/**
 * Reverse-mode autodiff over ONNX graphs. `gradients` appends to the graph the nodes computing
 * d(y)/d(wrt[i]): a forward sweep marks what depends on `wrt`, one reverse sweep over the nodes
 * calls each op's rule (rules.ts) and sums the gradients of tensors with several consumers.
 */
import { attr, Graph, Tensor, type Node } from '../onnx/graph.ts';
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
  /**
   * With `eagerSums`: a contribution made by a Gemm without a C input takes the running sum as its C
   * (β = 1) instead of an Add after it. ONNX Runtime's Gemm writes into C's buffer, so the pieces of a
   * chunked forward (head slices, runs of rows) sum their weight gradients into one tensor, where an
   * Add chain makes two fresh ones per piece (`[V, D]`, 519 MiB at Qwen2.5-0.5B's head: issue 46).
   */
  gemmSums?: boolean;
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
        pending.set(name, opts.eagerSums && parts.length ? [sumInto(g, parts[0], d, opts.gemmSums ?? false)] : [...parts, d]);
      });
    }
    return wrt.map((t) => (live.has(t.name) ? total(t.name) : null));
  });
}

/**
 * `sum + d`: folded into d's Gemm as its C when `gemm` and nothing has read d yet (a rule's fresh
 * output; both are contributions to one tensor's gradient, so of one shape), else an Add.
 */
function sumInto(g: Graph, sum: Tensor, d: Tensor, gemm: boolean): Tensor {
  const node = g.producer.get(d.name);
  if (gemm && node?.op === 'Gemm' && node.domain === '' && (node.inputs.length < 3 || node.inputs[2] === '') && node.outputs.length === 1 && sum.dtype === d.dtype) {
    let read = false;
    for (let k = g.nodes.length - 1; k >= 0 && g.nodes[k] !== node; k--) if (g.nodes[k].inputs.includes(d.name)) read = true;
    if (!read) {
      node.inputs[2] = sum.name;
      node.attrs.beta = attr.float(1);
      return d;
    }
  }
  return g.add(sum, d);
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
