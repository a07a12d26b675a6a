import { describe, it, expect } from 'vitest';
import { Graph } from '../src/onnx/graph.ts';
import { serializeModel, parseModel, saveModel, loadModel } from '../src/onnx/proto.ts';
import { Session, toOrt } from '../src/runtime/session.ts';
import { mkdtempSync, existsSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';

/** Independent float64 evaluation of the test graph y = sum(softmax(x @ w + b) * 2, axis 1). */
function reference(x: number[][], w: number[][], b: number[]): number[] {
  return x.map((row) => {
    const z = w[0].map((_, j) => row.reduce((s, xi, i) => s + xi * w[i][j], 0) + b[j]);
    const m = Math.max(...z);
    const e = z.map((v) => Math.exp(v - m));
    const s = e.reduce((a, c) => a + c, 0);
    return e.reduce((acc, v, j) => acc + (v / s) * 2 * (j + 1), 0);
  });
}

function build() {
  const g = new Graph('t');
  const x = g.input('x', 'float64', ['batch', 3]);
  const w = g.input('w', 'float64', [3, 4]);
  const b = g.constant([0.1, -0.2, 0.3, 0.0], 'float64', [4]);
  const z = g.add(g.matmul(x, w), b);
  expect(z.shape).toEqual(['batch', 4]);
  const p = g.softmax(z, -1);
  const weights = g.constant([2, 4, 6, 8], 'float64', [1, 4]);
  const y = g.reduceSum(g.mul(p, weights), [1], false);
  expect(y.shape).toEqual(['batch']);
  g.output(y, 'y');
  return g;
}

describe('graph builder', () => {
  const x = [[0.5, -1, 2], [1, 1, 1]];
  const w = [[0.1, 0.2, 0.3, 0.4], [-0.5, 0.6, -0.7, 0.8], [0.9, -1.0, 1.1, -1.2]];
  const feeds = () => ({
    x: toOrt('float64', Float64Array.from(x.flat()), [2, 3]),
    w: toOrt('float64', Float64Array.from(w.flat()), [3, 4]),
  });

  it('serialises a graph ONNX Runtime runs, matching a float64 reference', async () => {
    const s = await Session.create(serializeModel(build()));
    const out = await s.run(feeds());
    const ref = reference(x, w, [0.1, -0.2, 0.3, 0.0]);
    const got = Array.from(out.y.data as Float64Array);
    got.forEach((v, i) => expect(v).toBeCloseTo(ref[i], 12));
  });

  it('reads a model back and runs it unchanged, also with external data', async () => {
    const g = build();
    const back = parseModel(serializeModel(g)).graph;
    expect(back.nodes.map((n) => n.op)).toEqual(g.nodes.map((n) => n.op));
    expect(back.inputs.map((i) => i.shape)).toEqual([['batch', 3], [3, 4]]);
    const dir = mkdtempSync(join(tmpdir(), 'pz-onnx-'));
    // A big initializer forces the external-data path.
    const big = new Graph('big');
    const xin = big.input('x', 'float32', [256]);
    const c = big.constant(Float32Array.from({ length: 256 }, (_, i) => i / 7), 'float32', [256]);
    big.output(big.mul(xin, c), 'y');
    saveModel(big, join(dir, 'm.onnx'), { externalData: true });
    expect(existsSync(join(dir, 'm.onnx.data'))).toBe(true);
    const loaded = loadModel(join(dir, 'm.onnx')).graph;
    const s = await Session.create(serializeModel(loaded));
    const out = await s.run({ x: toOrt('float32', new Float32Array(256).fill(2), [256]) });
    expect((out.y.data as Float32Array)[14]).toBeCloseTo((14 / 7) * 2, 5);
    const s2 = await Session.create(join(dir, 'm.onnx'));
    const out2 = await s2.run({ x: toOrt('float32', new Float32Array(256).fill(1), [256]) });
    expect((out2.y.data as Float32Array)[255]).toBeCloseTo(255 / 7, 5);
  });

  it('infers shapes through reshape, gather, slice, concat and transpose', () => {
    const g = new Graph();
    const ids = g.input('ids', 'int64', ['B', 'T']);
    const emb = g.input('emb', 'float32', [100, 16]);
    const h = g.gather(emb, ids, 0);
    expect(h.shape).toEqual(['B', 'T', 16]);
    const r = g.reshape(h, [0, 0, 4, 4]);
    expect(r.shape).toEqual(['B', 'T', 4, 4]);
    expect(g.transpose(r, [0, 2, 1, 3]).shape).toEqual(['B', 4, 'T', 4]);
    expect(g.slice(r, [0], [2], [3]).shape).toEqual(['B', 'T', 4, 2]);
    expect(g.concat([r, r], -1).shape).toEqual(['B', 'T', 4, 8]);
    expect(g.reshape(h, [0, -1]).shape![1]).toBe('?');
    expect(g.split(h, [6, 10], -1).map((t) => t.shape)).toEqual([['B', 'T', 6], ['B', 'T', 10]]);
  });
});
