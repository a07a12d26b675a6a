/**
 * Mixed precision for the GPU: every float32 MatMul and Gemm of a finished graph (forward and
 * backward) runs in float16 on float16 copies of its operands, and its result is widened back to
 * float32 at once. Everything else stays float32: the master weights and optimizer state (graph
 * inputs), norms, softmax, every reduction, the log-prob sums and the loss. Gemm's C term (a bias, or
 * a gradient being accumulated) is added in float32 after the product, never rounded to float16.
 * One float16 copy per tensor is shared by all its readers.
 */
import { type Graph, type Node, Tensor, attr } from './graph.ts';

const HALF = 10; // ONNX TensorProto.FLOAT16
const FLOAT = 1;

/**
 * `keepFloat32`: inputs whose products stay float32 (e.g. `score_select`, whose MatMul sums token
 * log-probs into sequence log-probs), also when read through an Identity (stopGradient).
 */
export function halfPrecisionMatmuls(g: Graph, keepFloat32: readonly string[] = []): Graph {
  const keep = new Set(keepFloat32);
  const kept = (name: string) => keep.has(name) || (g.producer.get(name)?.op === 'Identity' && keep.has(g.producer.get(name)!.inputs[0]));
  const halves = new Map<string, string>();
  const out: Node[] = [];
  const emit = (fn: () => void) => {
    const before = g.nodes.length;
    fn();
    out.push(...g.nodes.splice(before));
  };
  const half = (name: string): string => {
    let h = halves.get(name);
    if (!h) {
      emit(() => {
        h = g.op('Cast', [g.tensor(name)], { to: attr.int(HALF) }, [{ dtype: 'float16', shape: g.tensor(name).shape }])[0].name;
      });
      halves.set(name, h!);
    }
    return h!;
  };
  for (const n of [...g.nodes]) {
    const isMatmul = n.domain === '' && (n.op === 'MatMul' || n.op === 'Gemm');
    if (!isMatmul || g.values.get(n.inputs[0])?.dtype !== 'float32' || n.inputs.some(kept)) {
      out.push(n);
      continue;
    }
    const y = g.values.get(n.outputs[0])!;
    const c = n.op === 'Gemm' && n.inputs[2] ? n.inputs[2] : null;
    const beta = n.attrs.beta?.kind === 'float' ? n.attrs.beta.value : 1;
    // The product in float16, under a new name; the original output becomes its float32 widening.
    const prod = g.uniq(`${n.op}_f16`);
    g.values.set(prod, new Tensor(g, prod, 'float16', y.shape));
    const a = half(n.inputs[0]);
    const b = half(n.inputs[1]);
    n.inputs = [a, b];
    if (n.op === 'Gemm') delete n.attrs.beta;
    const orig = n.outputs[0];
    g.values.delete(orig);
    n.outputs = [prod];
    g.producer.set(prod, n);
    out.push(n);
    emit(() => {
      const wide = g.op('Cast', [g.tensor(prod)], { to: attr.int(FLOAT) }, [{ dtype: 'float32', shape: y.shape }], c ? undefined : orig)[0];
      if (c) {
        const cc = beta === 1 ? g.tensor(c) : g.mul(g.tensor(c), beta);
        g.op('Add', [wide, cc], {}, [{ dtype: 'float32', shape: y.shape }], orig);
      }
    });
  }
  g.nodes.splice(0, g.nodes.length, ...out);
  return g;
}
