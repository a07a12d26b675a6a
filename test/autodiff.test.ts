import { describe, it, expect } from 'vitest';
import { Graph, type Tensor } from '../src/onnx/graph.ts';
import { serializeModel, parseModel } from '../src/onnx/proto.ts';
import { Session, toOrt } from '../src/runtime/session.ts';
import { gradients, unbroadcast } from '../src/autodiff/index.ts';
import { RULES } from '../src/autodiff/rules.ts';
import { gradcheck, checkCase, CASES, caseData, analyticGradients, relErr, type GradCase } from '../src/autodiff/gradcheck.ts';

type Feed = [string, 'float64' | 'int64', number[], number[]];

/** Runs `g` on the feeds and returns the named outputs as plain arrays. */
async function run(g: Graph, outs: Tensor[], feeds: Feed[]): Promise<number[][]> {
  const names = outs.map((t, i) => g.output(t, `out_${i}`).name);
  const s = await Session.create(serializeModel(g));
  const r = await s.run(Object.fromEntries(feeds.map(([n, dt, v, dims]) => [
    n, toOrt(dt, dt === 'int64' ? BigInt64Array.from(v.map(BigInt)) : Float64Array.from(v), dims),
  ])));
  return names.map((n) => Array.from(r[n].data as Float64Array));
}

const added = (g: Graph, before: number) => g.nodes.slice(before);

describe('gradcheck: every rule against float64 finite differences', () => {
  it('checks at least 35 ops, every case within 1e-6', async () => {
    const r = await gradcheck();
    const bad = r.results.filter((c) => !(c.maxRelErr <= 1e-6)).map((c) => `${c.op} ${c.name} ${c.symbolic ? 'symbolic' : 'static'}: ${c.maxRelErr}`);
    expect(bad).toEqual([]);
    expect(r.opsChecked).toBeGreaterThanOrEqual(35);
    expect(r.maxRelErr).toBeLessThanOrEqual(1e-6);
  });

  it('has a case for every rule of the table, and each case emits the op it names', () => {
    const emitted = new Set<string>();
    for (const c of CASES) {
      const g = new Graph('case');
      c.build(g, c.inputs.map((spec, i) => g.input(`x${i}`, 'float64', spec.shape)));
      if (g.nodes.some((n) => n.op === c.op)) emitted.add(c.op);
    }
    expect(Object.keys(RULES).filter((op) => !emitted.has(op))).toEqual([]);
  });

  it('composes: a causal attention block with residual, LayerNorm and a tanh-GELU MLP', async () => {
    const block: GradCase = {
      op: 'attention block',
      name: 'x, Wq, Wk, Wv, W1, γ, β',
      inputs: [[2, 3, 4], [4, 4], [4, 4], [4, 4], [4, 6], [4], [4]].map((shape) => ({ shape })),
      build: (g, [x, wq, wk, wv, w1, gamma, beta]) => {
        const q = g.matmul(x, wq);
        const k = g.matmul(x, wk);
        const v = g.matmul(x, wv);
        const causal = g.cast(g.trilu(g.constant(Array(9).fill(1), 'int64', [3, 3]), false), 'bool');
        const scores = g.where(causal, g.mul(g.matmul(q, g.transpose(k, [0, 2, 1])), 0.5), -1e9);
        const h = g.layerNorm(g.add(x, g.matmul(g.softmax(scores, -1), v)), gamma, beta);
        const u = g.matmul(h, w1);
        const inner = g.mul(g.add(u, g.mul(g.pow(u, 3), 0.044715)), Math.sqrt(2 / Math.PI));
        return g.mul(g.mul(u, 0.5), g.add(g.tanh(inner), 1));
      },
    };
    for (const symbolic of [false, true]) expect((await checkCase(block, 7, symbolic)).maxRelErr).toBeLessThan(1e-6);
  });

  it('runs every gradient graph in float32 with the default (optimised) session, matching float64', async () => {
    for (const [k, c] of CASES.entries()) {
      const { data, weights } = caseData(c, 1000 + k);
      const g64 = await analyticGradients(c, data, weights);
      const g32 = await analyticGradients(c, data, weights, { dtype: 'float32' });
      expect(relErr(g32, g64), `${c.op} ${c.name}`).toBeLessThan(1e-5);
    }
  });
});

describe('gradients()', () => {
  it('sums the gradients of a tensor used by several consumers', async () => {
    const g = new Graph();
    const x = g.input('x', 'float64', [3]);
    const a = g.constant([2, -1, 0.5], 'float64', [3]);
    const y = g.add(g.add(g.reduceSum(g.mul(x, a), undefined, false), g.reduceSum(g.exp(x), undefined, false)), g.reduceSum(x, undefined, false));
    const before = g.nodes.length;
    const [dx] = gradients(g, y, [x]);
    expect(added(g, before).filter((n) => n.op === 'Sum')).toHaveLength(1);
    const xv = [0.3, -1.2, 2];
    const [got] = await run(g, [dx!], [['x', 'float64', xv, [3]]]);
    xv.forEach((v, i) => expect(got[i]).toBeCloseTo([2, -1, 0.5][i] + Math.exp(v) + 1, 12));
  });

  it('unbroadcasts through symbolic dims with the dynamic path, right for every runtime shape', async () => {
    const g = new Graph();
    const x = g.input('x', 'float64', ['B', 'M']);
    const b = g.input('b', 'float64', ['N']);
    const w = g.input('w', 'float64', ['B', 'M']);
    const y = g.reduceSum(g.mul(g.add(x, b), w), undefined, false);
    const [db] = gradients(g, y, [b]);
    expect(g.nodes.some((n) => n.op === 'NonZero')).toBe(true);
    const names = [g.output(db!, 'db').name];
    const s = await Session.create(serializeModel(g));
    const wv = [1, 2, 3, 4, 5, 6];
    const feed = (bv: number[]) => ({
      x: toOrt('float64', new Float64Array(6), [2, 3]),
      b: toOrt('float64', Float64Array.from(bv), [bv.length]),
      w: toOrt('float64', Float64Array.from(wv), [2, 3]),
    });
    // b broadcast over M (runtime N = 1): d/db = Σ w; not broadcast (N = M = 3): column sums.
    expect(Array.from((await s.run(feed([0.5]), names)).db.data as Float64Array)).toEqual([21]);
    expect(Array.from((await s.run(feed([0, 1, 2]), names)).db.data as Float64Array)).toEqual([5, 7, 9]);
  });

  it('unbroadcast takes the static path when shapes decide it', () => {
    const g = new Graph();
    const grad = g.input('g', 'float32', ['B', 'T', 8]);
    const bias = g.input('bias', 'float32', [8]);
    const before = g.nodes.length;
    const r = unbroadcast(g, grad, bias);
    expect(r.shape).toEqual([8]);
    expect(added(g, before).map((n) => n.op)).toEqual(['ReduceSum']);
    expect(unbroadcast(g, grad, grad)).toBe(grad);
  });

  it('treats stopGradient outputs and g.noGrad tensors as constants', async () => {
    const g = new Graph();
    const x = g.input('x', 'float64', [2]);
    const frozen = g.exp(x);
    g.noGrad.add(frozen.name);
    const y = g.reduceSum(g.add(g.mul(x, g.stopGradient(x)), frozen), undefined, false);
    const [dx] = gradients(g, y, [x]);
    const [got] = await run(g, [dx!], [['x', 'float64', [1.5, -2], [2]]]);
    expect(got).toEqual([1.5, -2]); // d(x·sg(x))/dx = sg(x); exp(x) contributes nothing
  });

  it('builds no gradient nodes for frozen inputs', () => {
    const build = () => {
      const g = new Graph();
      const x = g.input('x', 'float32', ['B', 4]);
      const w1 = g.input('w1', 'float32', [4, 5]);
      const w2 = g.input('w2', 'float32', [5, 3]);
      const y = g.reduceSum(g.matmul(g.tanh(g.matmul(x, w1)), w2), undefined, false);
      return { g, w1, w2, y };
    };
    const a = build();
    const n0 = a.g.nodes.length;
    const [dw2] = gradients(a.g, a.y, [a.w2]);
    const frozenRun = added(a.g, n0);
    // Only the last layer: ReduceSum's gradient (Shape + Expand over the symbolic batch), one Gemm for dW2.
    expect(frozenRun.map((n) => n.op)).toEqual(['Shape', 'Expand', 'Gemm']);
    expect(frozenRun.some((n) => n.inputs.includes('w2') || n.inputs.includes('w1'))).toBe(false);
    expect(dw2!.shape).toEqual([5, 3]);
    const b = build();
    const n1 = b.g.nodes.length;
    gradients(b.g, b.y, [b.w1, b.w2]);
    expect(b.g.nodes.length - n1).toBeGreaterThan(frozenRun.length);
  });

  it('skips integer paths and non-differentiable ops, and gives null where y does not depend on wrt', async () => {
    const g = new Graph();
    const emb = g.input('emb', 'float64', [4, 2]);
    const ids = g.input('ids', 'int64', [3]);
    const other = g.input('other', 'float64', [2]);
    const shifted = g.op('Mod', [g.add(ids, g.constant(1, 'int64')), g.constant(4, 'int64')], {}, [{ dtype: 'int64', shape: [3] }])[0];
    const rows = g.gather(emb, shifted, 0);
    const y = g.reduceSum(g.mul(rows, g.floor(rows)), undefined, false);
    const [demb, dids, dother] = gradients(g, y, [emb, ids, other]);
    expect(dids).toBeNull();
    expect(dother).toBeNull();
    const ev = [0.5, 1.5, -0.5, 2.5, 3.5, -1.5, 0.25, 4.5];
    const [got] = await run(g, [demb!], [['emb', 'float64', ev, [4, 2]], ['ids', 'int64', [0, 3, 0], [3]], ['other', 'float64', [0, 0], [2]]]);
    // rows picked: 1, 0, 1 → row 1 twice, row 0 once; d/d rows = floor(rows) (Floor has zero gradient).
    expect(got).toEqual([Math.floor(ev[0]), Math.floor(ev[1]), 2 * Math.floor(ev[2]), 2 * Math.floor(ev[3]), 0, 0, 0, 0]);
  });

  it('sums the rows of a gather into its table in both scatter-add forms, for repeated and negative indices and for no rows', async () => {
    const V = 5, D = 3;
    for (const scatterAdd of ['sorted', 'elements'] as const) {
      const g = new Graph();
      const emb = g.input('emb', 'float64', [V, D]);
      const ids = g.input('ids', 'int64', ['N']);
      const u = g.input('u', 'float64', ['N', D]);
      const y = g.reduceSum(g.mul(g.gather(emb, ids, 0), u), undefined, false);
      const n0 = g.nodes.length;
      const [demb] = gradients(g, y, [emb], { scatterAdd });
      expect(added(g, n0).some((n) => n.op === 'TopK')).toBe(scatterAdd === 'sorted');
      const name = g.output(demb!, 'demb').name;
      const s = await Session.create(serializeModel(g));
      for (const idv of [[4, -1, 0, 4, 2, -5, 4, 1], []]) {
        const uv = Float64Array.from({ length: idv.length * D }, (_, i) => Math.sin(i + 1));
        const want = new Float64Array(V * D);
        idv.forEach((v, i) => {
          for (let d = 0; d < D; d++) want[((v + V) % V) * D + d] += uv[i * D + d];
        });
        const r = await s.run({ emb: toOrt('float64', new Float64Array(V * D), [V, D]), ids: toOrt('int64', BigInt64Array.from(idv.map(BigInt)), [idv.length]), u: toOrt('float64', uv, [idv.length, D]) }, [name]);
        const got = Array.from(r[name].data as Float64Array);
        got.forEach((v, k) => expect(v, `${scatterAdd}, ${idv.length} rows, element ${k}`).toBeCloseTo(want[k], 14));
      }
      await s.release();
    }
  });

  it('differentiates a gather read back from ONNX bytes (the gathered rows of unknown shape)', async () => {
    const f = new Graph();
    f.input('emb', 'float32', [4, 2]);
    f.input('ids', 'int64', [3]);
    f.output(f.reduceSum(f.tanh(f.gather(f.tensor('emb'), f.tensor('ids'), 0)), undefined, false), 'y');
    const g = parseModel(serializeModel(f)).graph;
    const name = g.output(gradients(g, g.tensor('y'), [g.tensor('emb')])[0]!, 'demb').name;
    const s = await Session.create(serializeModel(g));
    const ev = [0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8];
    const r = await s.run({ emb: toOrt('float32', Float32Array.from(ev), [4, 2]), ids: toOrt('int64', BigInt64Array.of(1n, 3n, 1n), [3]) }, [name]);
    await s.release();
    const times = [0, 2, 0, 1]; // how often each row is gathered
    Array.from(r[name].data as Float32Array).forEach((v, k) => expect(v).toBeCloseTo(times[k >> 1] * (1 - Math.tanh(ev[k]) ** 2), 6));
  });

  it('fails clearly on an op without a rule only when its gradient is needed', () => {
    const g = new Graph();
    const x = g.input('x', 'float32', [3, 3]);
    const frozen = g.input('frozen', 'float32', [3, 3]);
    const det = g.op('Det', [frozen], {}, [{ dtype: 'float32', shape: [] }])[0];
    const y = g.add(g.reduceSum(x, undefined, false), det);
    expect(gradients(g, y, [x])[0]).not.toBeNull();
    const det2 = g.op('Det', [x], {}, [{ dtype: 'float32', shape: [] }])[0];
    expect(() => gradients(g, g.mul(det2, 2), [x])).toThrow(/no gradient rule for op Det \(node Det_\d+\)/);
    const custom = g.op('FastGelu', [x], {}, [{ dtype: 'float32', shape: [3, 3] }], undefined, 'com.microsoft')[0];
    expect(() => gradients(g, g.reduceSum(custom), [x])).toThrow(/op com\.microsoft\.FastGelu/);
  });

  it('takes an explicit seed for a non-scalar y and defaults to ones', async () => {
    const g = new Graph();
    const x = g.input('x', 'float64', [3]);
    const s = g.input('s', 'float64', [3]);
    const y = g.mul(g.mul(x, x), 3);
    const [withSeed] = gradients(g, y, [x], { seed: s });
    const [ones] = gradients(g, y, [x]);
    const [a, b] = await run(g, [withSeed!, ones!], [['x', 'float64', [1, 2, -1], [3]], ['s', 'float64', [1, 0.5, 2], [3]]]);
    expect(a).toEqual([6, 6, -12]);
    expect(b).toEqual([6, 12, -6]);
  });

  it('emits weight gradients of a shared linear layer as one Gemm, Softmax without Expand', () => {
    const g = new Graph();
    const h = g.input('h', 'float32', ['B', 'T', 16]);
    const w = g.input('w', 'float32', [16, 8]);
    const p = g.softmax(g.matmul(h, w), -1);
    const y = g.reduceSum(g.mul(p, p), undefined, false);
    const n0 = g.nodes.length;
    const [dw] = gradients(g, y, [w]);
    const ops = added(g, n0).map((n) => n.op);
    expect(dw!.shape).toEqual([16, 8]);
    expect(ops.filter((o) => o === 'Gemm')).toHaveLength(1);
    expect(ops.filter((o) => o === 'MatMul' || o === 'Transpose')).toHaveLength(0);
    expect(ops.filter((o) => o === 'Expand')).toHaveLength(1); // the loss ReduceSum's only
  });

  it('differentiates a graph read back from ONNX bytes (intermediate shapes unknown)', async () => {
    // parseModel knows dtypes and shapes of intermediates only from value_info; without it they are
    // float32 of unknown shape, so this runs in float32 and exercises the rank-free unbroadcast.
    const f = new Graph();
    const x = f.input('x', 'float32', [2, 2]);
    const b = f.input('b', 'float32', [2]);
    f.output(f.reduceSum(f.mul(f.tanh(f.add(x, b)), x), undefined, false), 'y');
    const g = parseModel(serializeModel(f)).graph;
    const [dx, db] = gradients(g, g.tensor('y'), [g.tensor('x'), g.tensor('b')]);
    const names = [g.output(dx!, 'dx').name, g.output(db!, 'db').name];
    const s = await Session.create(serializeModel(g));
    const xv = [0.1, -0.4, 0.7, 1.3];
    const bv = [0.2, -0.3];
    const r = await s.run({ x: toOrt('float32', Float32Array.from(xv), [2, 2]), b: toOrt('float32', Float32Array.from(bv), [2]) }, names);
    const t = xv.map((v, i) => Math.tanh(v + bv[i % 2]));
    const ddx = xv.map((v, i) => t[i] + v * (1 - t[i] ** 2));
    const ddb = [0, 1].map((j) => [j, j + 2].reduce((acc, i) => acc + xv[i] * (1 - t[i] ** 2), 0));
    Array.from(r.dx.data as Float32Array).forEach((v, i) => expect(v).toBeCloseTo(ddx[i], 6));
    Array.from(r.db.data as Float32Array).forEach((v, i) => expect(v).toBeCloseTo(ddb[i], 6));
  });
});
