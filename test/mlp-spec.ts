/**
 * Test fixture: a two-layer MLP classifier on 2-D points as an ArtifactSpec, and a synthetic
 * three-arm spiral data set.
 */
import type { ArtifactSpec, ParamSpec } from '../src/artifacts/index.ts';
import type { OptimizerConfig } from '../src/optim/index.ts';
import { toOrt, type Feeds } from '../src/runtime/session.ts';
import { rng, gaussian } from './optim-reference.ts';

export interface Points {
  x: Float64Array; // [n, 2]
  y: Int32Array; // [n]
  n: number;
}

/** Three interleaved spiral arms (angle noise `noise` radians), class = arm. */
export function spirals(perClass: number, seed: number, noise = 0.15): Points {
  const r = rng(seed);
  const normal = gaussian(r);
  const n = perClass * 3;
  const x = new Float64Array(n * 2);
  const y = new Int32Array(n);
  for (let c = 0; c < 3; c++) {
    for (let i = 0; i < perClass; i++) {
      const k = c * perClass + i;
      const rad = 0.05 + 0.95 * r();
      const theta = rad * 4 + (c * 2 * Math.PI) / 3 + normal() * noise;
      x[2 * k] = rad * Math.cos(theta);
      x[2 * k + 1] = rad * Math.sin(theta);
      y[k] = c;
    }
  }
  return { x, y, n };
}

export function mlpSpec(o: { hidden: number; dtype: 'float32' | 'float64'; seed: number; optimizer: OptimizerConfig; evalNeedsLabels?: boolean }): ArtifactSpec {
  const normal = gaussian(rng(o.seed));
  const F = o.dtype === 'float32' ? Float32Array : Float64Array;
  const init = (n: number, std: number) => {
    const a = new F(n);
    for (let i = 0; i < n; i++) a[i] = normal() * std;
    return a;
  };
  const h = o.hidden;
  const params: ParamSpec[] = [
    { name: 'fc1.weight', dtype: o.dtype, shape: [2, h], trainable: true, data: init(2 * h, Math.sqrt(2 / 2)) },
    { name: 'fc1.bias', dtype: o.dtype, shape: [h], trainable: true, decay: false, data: new F(h) },
    { name: 'fc2.weight', dtype: o.dtype, shape: [h, 3], trainable: true, data: init(h * 3, Math.sqrt(1 / h)) },
    { name: 'fc2.bias', dtype: o.dtype, shape: [3], trainable: true, decay: false, data: new F(3) },
    // A frozen input scale exercises the frozen-parameter path.
    { name: 'input_scale', dtype: o.dtype, shape: [2], trainable: false, data: F.from([2, 2]) },
  ];
  return {
    params,
    batchInputs: [
      { name: 'x', dtype: o.dtype, shape: ['batch', 2] },
      { name: 'labels', dtype: 'int64', shape: ['batch'] },
    ],
    buildForward(g, p, b, mode) {
      const hid = g.relu(g.add(g.matmul(g.mul(b.x, p.input_scale), p['fc1.weight']), p['fc1.bias']));
      const logits = g.add(g.matmul(hid, p['fc2.weight']), p['fc2.bias']);
      if (mode === 'eval' && o.evalNeedsLabels === false) return { outputs: { logits } };
      const logp = g.logSoftmax(logits, -1);
      const picked = g.gatherElements(logp, g.unsqueeze(b.labels, [1]), 1);
      const loss = g.neg(g.reduceMean(picked, undefined, false));
      const correct = g.cast(g.equal(g.argMax(logits, -1, false), b.labels), o.dtype);
      return { loss, metrics: { accuracy: g.reduceMean(correct, undefined, false) }, outputs: { logits } };
    },
    optimizer: o.optimizer,
    loss: { name: 'cross_entropy', params: {} },
    modelConfig: { arch: 'mlp', hidden: h },
  };
}

/** Feeds for rows [start, start + count) of a point set. */
export function batchFeeds(d: Points, dtype: 'float32' | 'float64', idx: ArrayLike<number>): Feeds {
  const n = idx.length;
  const x = dtype === 'float32' ? new Float32Array(n * 2) : new Float64Array(n * 2);
  const labels = new BigInt64Array(n);
  for (let i = 0; i < n; i++) {
    const k = idx[i];
    x[2 * i] = d.x[2 * k];
    x[2 * i + 1] = d.x[2 * k + 1];
    labels[i] = BigInt(d.y[k]);
  }
  return { x: toOrt(dtype, x, [n, 2]), labels: toOrt('int64', labels, [n]) };
}

export const range = (a: number, b: number) => Array.from({ length: b - a }, (_, i) => a + i);
