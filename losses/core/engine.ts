/**
 * Runs a bound loss on a host batch: the float64 reference, or the ONNX subgraph (plus autodiff
 * gradients) through ONNX Runtime in float64 or float32. Used by `prefzoo loss` and the tests.
 */
import { Graph, type Shape } from '../../src/onnx/graph.ts';
import { serializeModel } from '../../src/onnx/proto.ts';
import { Session, toOrt } from '../../src/runtime/session.ts';
import { gradients } from '../../src/autodiff/index.ts';
import type { BoundLoss } from '../index.ts';
import { INDEX_KEYS } from './batch.ts';
import type { BatchTensors, HostBatch, HostTensor, Kind } from './types.ts';

export type FloatDType = 'float32' | 'float64';

export interface LossRun {
  loss: number;
  perExample: number[];
  /** Gradient of the mean loss per differentiable key, flat row-major (dims as the key's). */
  grad: Record<string, Float64Array>;
  metrics: Record<string, number>;
}

/** Symbolic dims of a batch key's graph input. */
function inputShape(key: string, dims: number[]): Shape {
  if (dims.length === 0) return [];
  if (key === 'policy_kl_logps' || key === 'ref_kl_logps') return ['kl_rows'];
  if (dims.length === 3) return ['batch', 'list', key.startsWith('teacher_topk') ? 'topk' : 'vocab'];
  return dims.length === 2 ? ['batch', 'list'] : ['batch'];
}

/** The graph dtype of a batch key: token ids are int64, every other key the run's float dtype. */
function inputDType(key: string, dtype: FloatDType): 'int64' | FloatDType {
  return INDEX_KEYS.has(key) ? 'int64' : dtype;
}

export interface LossGraph {
  graph: Graph;
  kind: Kind;
  /** Differentiable keys with a `grad/<key>` output. */
  gradKeys: string[];
  /** Differentiable keys the loss does not depend on (gradient zero, no output). */
  zeroGradKeys: string[];
  metricNames: string[];
}

/**
 * A standalone graph: one input per batch key, outputs `loss`, `per_example`, `metric/<name>`
 * and, with `withGrad`, `grad/<key>` from autodiff.
 */
export function buildLossGraph(bound: BoundLoss, batch: HostBatch, dtype: FloatDType, withGrad: boolean): LossGraph {
  const g = new Graph(`loss_${bound.spec.replace(/[^a-z0-9_]/g, '_')}`);
  const kind = bound.kindOf(batch);
  const inputs: BatchTensors = {};
  for (const [key, t] of Object.entries(batch)) inputs[key] = g.input(key, inputDType(key, dtype), inputShape(key, t.dims));
  const out = bound.emit(g, inputs, kind);
  g.output(out.loss, 'loss');
  g.output(out.perExample, 'per_example');
  const metricNames = Object.keys(out.metrics);
  for (const name of metricNames) g.output(out.metrics[name], `metric/${name}`);
  const gradKeys: string[] = [];
  const zeroGradKeys: string[] = [];
  if (withGrad) {
    const keys = bound.grads(kind).filter((k) => k in inputs);
    const gs = gradients(g, out.loss, keys.map((k) => inputs[k]));
    keys.forEach((k, i) => {
      const d = gs[i];
      if (d) {
        g.output(d, `grad/${k}`);
        gradKeys.push(k);
      } else zeroGradKeys.push(k);
    });
  }
  return { graph: g, kind, gradKeys, zeroGradKeys, metricNames };
}

/** A batch key's host data as ONNX Runtime takes it: float64, float32, or int64 for token ids. */
function feed(key: string, dtype: FloatDType, t: HostTensor) {
  if (INDEX_KEYS.has(key)) return toOrt('int64', BigInt64Array.from(t.data, (x) => BigInt(x)), t.dims);
  return toOrt(dtype, dtype === 'float64' ? t.data : Float32Array.from(t.data), t.dims);
}

/** Evaluates the ONNX subgraph through ONNX Runtime (CPU). */
export async function runLossOnnx(bound: BoundLoss, batch: HostBatch, opts: { dtype?: FloatDType; grad?: boolean } = {}): Promise<LossRun> {
  const dtype = opts.dtype ?? 'float64';
  const lg = buildLossGraph(bound, batch, dtype, opts.grad ?? false);
  const session = await Session.create(serializeModel(lg.graph));
  try {
    const feeds = Object.fromEntries(Object.entries(batch).map(([k, t]) => [k, feed(k, dtype, t)]));
    const out = await session.run(feeds);
    const read = (name: string) => Float64Array.from(out[name].data as Float32Array | Float64Array);
    const grad: Record<string, Float64Array> = {};
    for (const k of lg.gradKeys) grad[k] = read(`grad/${k}`);
    for (const k of lg.zeroGradKeys) grad[k] = new Float64Array(batch[k].data.length);
    const metrics: Record<string, number> = { loss: read('loss')[0] };
    for (const m of lg.metricNames) metrics[m] = read(`metric/${m}`)[0];
    return { loss: metrics.loss, perExample: Array.from(read('per_example')), grad, metrics };
  } finally {
    await session.release();
  }
}

/** Evaluates the float64 reference (gradients only with `grad`). */
export function runLossReference(bound: BoundLoss, batch: HostBatch, opts: { grad?: boolean } = {}): LossRun {
  const r = bound.reference(batch);
  const kind = bound.kindOf(batch);
  const grad: Record<string, Float64Array> = {};
  if (opts.grad) {
    for (const k of bound.grads(kind)) if (k in batch) grad[k] = r.grad[k] ?? new Float64Array(batch[k].data.length);
  }
  return { loss: r.loss, perExample: r.perExample, grad, metrics: r.metrics };
}

/** A JSON-ready nested array: flat row-major data shaped like `dims` ([B], [B][K] or [B][T][V]). */
export type Nested = number | Nested[];

/** A flat gradient as JSON-ready nested arrays shaped like its key. */
export function shapeLike(data: Float64Array, dims: number[]): Nested[] {
  if (dims.length < 2) return Array.from(data);
  const [n, ...inner] = dims;
  const size = inner.reduce((a, d) => a * d, 1);
  return Array.from({ length: n }, (_, i) => shapeLike(data.subarray(i * size, (i + 1) * size), inner));
}
