/**
 * Peephole passes over finished graphs: each must leave every output unchanged (up to the rounding
 * order of additions) while removing the nodes it targets.
 */
import { describe, it, expect } from 'vitest';
import { Graph } from '../src/onnx/graph.ts';
import { serializeModel } from '../src/onnx/proto.ts';
import { Session, toOrt } from '../src/runtime/session.ts';
import { gradients } from '../src/autodiff/index.ts';
import { foldScatterAddIntoSum } from '../src/artifacts/simplify.ts';
import { Normal } from '../src/random.ts';

/** A weight both multiplied (as an output head) and gathered by rows with repeats, as in the log-prob graph. */
function headLike(extraTerm: boolean): { g: Graph; names: string[] } {
  const g = new Graph('head');
  const W = g.input('W', 'float64', [7, 3]);
  const h = g.input('h', 'float64', [5, 3]);
  const idx = g.input('idx', 'int64', [5]);
  const logits = g.gemm(h, W, null, { transB: true }); // [5, 7]
  let loss = g.add(g.reduceSum(g.mul(logits, logits), undefined, false), g.reduceSum(g.mul(g.gather(W, idx, 0), h), undefined, false));
  if (extraTerm) loss = g.add(loss, g.reduceSum(g.mul(W, W), undefined, false)); // a third gradient term
  g.output(loss, 'loss');
  const [dW] = gradients(g, loss, [W]);
  g.output(dW!, 'dW');
  return { g, names: ['W', 'h', 'idx'] };
}

describe('foldScatterAddIntoSum', () => {
  it.each([false, true])('starts the scatter-add from the other gradient terms (third term: %s)', async (extraTerm) => {
    const rng = new Normal(3);
    const feeds = {
      W: toOrt('float64', Float64Array.from(rng.fill(21, 1)), [7, 3]),
      h: toOrt('float64', Float64Array.from(rng.fill(15, 1)), [5, 3]),
      idx: toOrt('int64', BigInt64Array.of(2n, 6n, 2n, 0n, 2n), [5]),
    };
    const run = async (g: Graph) => {
      const s = await Session.create(serializeModel(g));
      const out = await s.run(feeds);
      await s.release();
      return Array.from(out.dW.data as Float64Array);
    };
    const plain = headLike(extraTerm).g;
    const before = await run(plain);
    const folded = headLike(extraTerm).g;
    const count = (g: Graph, op: string) => g.nodes.filter((n) => n.op === op).length;
    expect(count(folded, 'ConstantOfShape')).toBeGreaterThan(0);
    const sums = count(folded, 'Sum');
    foldScatterAddIntoSum(folded);
    expect(count(folded, 'ConstantOfShape')).toBe(0);
    expect(count(folded, 'Sum')).toBe(extraTerm ? sums : sums - 1);
    const after = await run(folded);
    // Independent value: dW = 2·logitsᵀ·h + Σ over repeated rows of h (+ 2W).
    const W = feeds.W.data as Float64Array;
    const h = feeds.h.data as Float64Array;
    const expected = new Float64Array(21);
    for (let v = 0; v < 7; v++) {
      for (let n = 0; n < 5; n++) {
        let z = 0;
        for (let d = 0; d < 3; d++) z += h[n * 3 + d] * W[v * 3 + d];
        for (let d = 0; d < 3; d++) expected[v * 3 + d] += 2 * z * h[n * 3 + d];
      }
    }
    [2, 6, 2, 0, 2].forEach((row, n) => {
      for (let d = 0; d < 3; d++) expected[row * 3 + d] += h[n * 3 + d];
    });
    if (extraTerm) for (let i = 0; i < 21; i++) expected[i] += 2 * W[i];
    for (let i = 0; i < 21; i++) {
      expect(Math.abs(after[i] - expected[i])).toBeLessThan(1e-12);
      expect(Math.abs(before[i] - expected[i])).toBeLessThan(1e-12);
    }
  });
});
