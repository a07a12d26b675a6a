/**
 * Emits a training-artifacts folder from a forward-graph builder:
 *
 *   training_model.onnx   params + batch (+ grad_acc.<p>, accumulate) → loss, metrics, grad.<p>
 *   eval_model.onnx       params + batch → eval outputs, metrics, loss (whatever they need, pruned)
 *   optimizer_model.onnx  see src/optim/graph.ts
 *   train_step_model.onnx training graph (no accumulation) + optimizer in one graph (fuse.ts)
 *   artifacts.json        the manifest (manifest.ts)
 *   checkpoint/           initial values (step 0) when the spec carries them; otherwise none
 *
 * Gradient accumulation happens in the training graph: it takes the running sums `grad_acc.<p>` and
 * outputs `grad.<p>` = grad_acc.<p> + ∂loss/∂p. Feeding the previous `grad.<p>` back sums
 * micro-batches without a JS loop, and a fresh accumulation is fed zeros (never a stale sum, so a
 * non-finite one cannot carry over); the optimizer's `grad_scale` input (1/k) then turns the sum into
 * a mean. The sum is folded into the node producing each gradient where it can be (a Gemm's C input,
 * a Sum's extra operand, a scatter-add's starting tensor), so it costs no pass of its own.
 */
import fs from 'node:fs';
import path from 'node:path';
import { Graph, OPSET, attr, type Node, type Shape, type Tensor } from '../onnx/graph.ts';
import type { DType, TypedArray } from '../onnx/dtype.ts';
import { isFloat } from '../onnx/dtype.ts';
import { saveModel } from '../onnx/proto.ts';
import { lowerForWebGpu } from '../onnx/lower.ts';
import { halfPrecisionMatmuls } from '../onnx/half.ts';
import { gradients } from '../autodiff/index.ts';
import { recomputeSegments } from '../autodiff/recompute.ts';
import { zerosLike } from '../autodiff/shape.ts';
import { UserError } from '../errors.ts';
import { buildOptimizerGraph, defaultDecay, type OptimizerConfig, gradName, gradAccName, stateName } from '../optim/index.ts';
import { pruneGraph } from './prune.ts';
import { elideBroadcastExpands, foldOutputIdentities, foldScatterAddIntoSum, isScatterAdd, isZeroFill } from './simplify.ts';
import { fuseOptimizer } from './fuse.ts';
import { writeCheckpoint, type CheckpointTensor } from './checkpoint.ts';
import { writeFileAtomic } from '../io/atomic.ts';
import { ARTIFACT_FILES, MANIFEST_VERSION, TRAIN_IO, type ArtifactTarget, type ArtifactsManifest, type GraphIO } from './manifest.ts';

export interface ParamSpec {
  /** The checkpoint name (e.g. `model.layers.0.mlp.up_proj.weight`); also the graph input name. */
  name: string;
  dtype: DType;
  shape: number[];
  trainable: boolean;
  /** Weight decay applies (default: defaultDecay(name, shape), i.e. matrices only, no norms). */
  decay?: boolean;
  /** Initial values; when every parameter has them, an initial checkpoint (step 0) is written. */
  data?: TypedArray;
}

export interface BatchInputSpec {
  name: string;
  dtype: DType;
  /** Dims may be symbolic ('batch', 'seq'). */
  shape: Shape;
}

export interface ForwardOutputs {
  /** Scalar loss; required in 'train' mode. */
  loss?: Tensor;
  /** Scalar metrics reported each step (TRL names, e.g. `rewards/accuracies`). */
  metrics?: Record<string, Tensor>;
  /** Extra eval-graph outputs (per-sequence log-probs, predictions...). */
  outputs?: Record<string, Tensor>;
}

export interface ArtifactSpec {
  params: ParamSpec[];
  batchInputs: BatchInputSpec[];
  /** Builds the forward pass into `g`; called once per graph ('train' and 'eval'). */
  buildForward(g: Graph, params: Record<string, Tensor>, batch: Record<string, Tensor>, mode: 'train' | 'eval'): ForwardOutputs;
  optimizer: OptimizerConfig;
  /** Loss name and parameters, recorded in artifacts.json. */
  loss?: { name: string; params?: Record<string, unknown> };
  /** Model configuration (e.g. the HF config.json), recorded in artifacts.json. */
  modelConfig?: unknown;
  /** Emit grad_acc inputs and the accumulate flag (default true). */
  gradientAccumulation?: boolean;
  /**
   * Activation recomputation: names the segment of each forward node (null: none); the backward
   * then recomputes a segment's activations from its inputs (src/autodiff/recompute.ts).
   */
  recompute?: (node: Node) => string | null;
  /**
   * Under recomputation, sum the weight gradients of a forward built in pieces in place: each
   * piece's Gemm takes the running sum as its C (autodiff GradientOptions.gemmSums). Asked after the
   * forward is built: true where it was cut into pieces (TrainProblem.longest), so other graphs stay
   * as they were built before.
   */
  gemmSums?: () => boolean;
}

function graphIO(g: Graph): GraphIO {
  return { inputs: g.inputs.map((i) => i.name), outputs: g.outputs.map((o) => o.name) };
}

function declareInputs(g: Graph, spec: ArtifactSpec) {
  const params: Record<string, Tensor> = {};
  for (const p of spec.params) params[p.name] = g.input(p.name, p.dtype, p.shape);
  const batch: Record<string, Tensor> = {};
  for (const b of spec.batchInputs) batch[b.name] = g.input(b.name, b.dtype, b.shape);
  return { params, batch };
}

function isScalarShape(t: Tensor): boolean {
  return t.shape !== null && (t.shape.length === 0 || t.staticShape?.every((d) => d === 1) === true);
}

function outputNamed(g: Graph, reserved: Set<string>, t: Tensor, name: string, what: string): void {
  if (reserved.has(name)) throw new UserError(`artifacts: ${what} name "${name}" collides with a parameter, batch input or gradient name`);
  reserved.add(name);
  g.output(t, name);
}

function checkSpec(spec: ArtifactSpec): void {
  const names = new Set<string>();
  for (const p of [...spec.params, ...spec.batchInputs]) {
    if (names.has(p.name)) throw new UserError(`artifacts: the name "${p.name}" is used twice (parameters and batch inputs share one namespace)`);
    names.add(p.name);
  }
  const trainable = spec.params.filter((p) => p.trainable);
  if (trainable.length === 0) throw new UserError('artifacts: no trainable parameters');
  const dtypes = new Set(trainable.map((p) => p.dtype));
  if (dtypes.size > 1 || !['float32', 'float64'].includes(trainable[0].dtype)) {
    throw new UserError(`artifacts: trainable parameters must all be float32 or all float64, got ${[...dtypes].join(', ')}`);
  }
  for (const p of spec.params) {
    if (!p.shape.every((d) => Number.isInteger(d) && d >= 0)) throw new UserError(`artifacts: parameter ${p.name} needs a static shape, got [${p.shape}]`);
    if (p.data && p.data.length !== p.shape.reduce((a, b) => a * b, 1)) {
      throw new UserError(`artifacts: parameter ${p.name} has shape [${p.shape}] but ${p.data.length} initial values`);
    }
  }
}

/**
 * Builds the training graph (forward + autodiff + accumulation), pruned. For WebGPU a gather's
 * gradient is ScatterElements(add): the sorted segment sums need TopK, Unique and float64, which
 * that provider lacks (and its scatter-adds are not repeatable anyway: docs/architecture.md, Determinism).
 */
export function buildTrainingGraph(spec: ArtifactSpec, target: ArtifactTarget = 'cpu'): { graph: Graph; metrics: string[]; inPieces: boolean } {
  const g = new Graph('training');
  const { params, batch } = declareInputs(g, spec);
  const fwd = spec.buildForward(g, params, batch, 'train');
  if (!fwd.loss) throw new UserError('artifacts: buildForward returned no loss in train mode');
  if (!isFloat(fwd.loss.dtype) || !isScalarShape(fwd.loss)) throw new UserError(`artifacts: the loss must be a float scalar, got ${fwd.loss.dtype}[${fwd.loss.shape}]`);
  const reserved = new Set([...spec.params.map((p) => p.name), ...spec.batchInputs.map((b) => b.name)]);
  const trainable = spec.params.filter((p) => p.trainable);
  for (const p of trainable) reserved.add(gradName(p.name)).add(gradAccName(p.name));
  outputNamed(g, reserved, fwd.loss, TRAIN_IO.loss, 'loss');
  const metrics = Object.keys(fwd.metrics ?? {});
  for (const [name, t] of Object.entries(fwd.metrics ?? {})) outputNamed(g, reserved, t, name, 'metric');

  const wrt = trainable.map((p) => params[p.name]);
  const firstBackward = g.nodes.length;
  const lowMemory = spec.recompute !== undefined;
  const inPieces = lowMemory && (spec.gemmSums?.() ?? false);
  const grads = gradients(g, fwd.loss, wrt, { eagerSums: lowMemory, gemmSums: inPieces, scatterAdd: target === 'webgpu' ? 'elements' : 'sorted' });
  const accumulate = spec.gradientAccumulation ?? true;
  // A tensor that is the gradient of two parameters must not take either one's running sum.
  const seen = new Map<string, number>();
  for (const d of grads) if (d) seen.set(d.name, (seen.get(d.name) ?? 0) + 1);
  trainable.forEach((p, i) => {
    g.scope(`grad_out/${p.name}`, () => {
      // A parameter the loss does not reach still gets a (zero) gradient, so the optimizer's inputs are uniform.
      let d = grads[i] ?? zerosLike(g, wrt[i]);
      if (accumulate) {
        const acc = g.input(gradAccName(p.name), p.dtype, p.shape);
        d = (seen.get(d.name) ?? 0) > 1 ? g.add(d, acc) : accumulateInto(g, d, acc);
      }
      g.output(d, gradName(p.name));
    });
  });
  if (spec.recompute) recomputeSegments(g, firstBackward, spec.recompute);
  pruneGraph(g, new Set(accumulate ? trainable.map((p) => gradAccName(p.name)) : []));
  return { graph: g, metrics, inPieces };
}

/**
 * d + acc, folded into d's producer when nothing else reads d: Gemm gets acc as its C input (β = 1),
 * Sum gets it as one more operand, a scatter-add into zeros starts from acc instead. Otherwise an Add.
 */
export function accumulateInto(g: Graph, d: Tensor, acc: Tensor): Tensor {
  const readers = (name: string) => g.nodes.filter((n) => n.inputs.includes(name)).length;
  const node = g.producer.get(d.name);
  const private_ = node && readers(d.name) === 0 && !g.outputs.some((o) => o.name === d.name) && node.outputs.length === 1;
  if (node && private_) {
    if (node.op === 'Gemm' && (node.inputs.length < 3 || node.inputs[2] === '')) {
      node.inputs[2] = acc.name;
      node.attrs.beta = attr.float(1);
      return d;
    }
    if (node.op === 'Sum') {
      node.inputs.push(acc.name);
      return d;
    }
    const zeros = isScatterAdd(node) ? g.producer.get(node.inputs[0]) : undefined;
    if (zeros && isZeroFill(zeros) && readers(node.inputs[0]) === 1) {
      node.inputs[0] = acc.name;
      return d;
    }
  }
  return g.add(d, acc);
}

/** Builds the eval graph: forward only, outputs = eval outputs + metrics + loss (when given). */
export function buildEvalGraph(spec: ArtifactSpec): Graph {
  const g = new Graph('eval');
  const { params, batch } = declareInputs(g, spec);
  const fwd = spec.buildForward(g, params, batch, 'eval');
  const reserved = new Set([...spec.params.map((p) => p.name), ...spec.batchInputs.map((b) => b.name)]);
  if (fwd.loss) outputNamed(g, reserved, fwd.loss, TRAIN_IO.loss, 'loss');
  for (const [name, t] of Object.entries(fwd.metrics ?? {})) outputNamed(g, reserved, t, name, 'metric');
  for (const [name, t] of Object.entries(fwd.outputs ?? {})) outputNamed(g, reserved, t, name, 'eval output');
  if (g.outputs.length === 0) throw new UserError('artifacts: buildForward returned nothing to evaluate in eval mode');
  pruneGraph(g);
  return g;
}

/** Writes the artifacts folder `outDir` (created if needed) and returns its manifest. */
export function buildArtifacts(spec: ArtifactSpec, outDir: string, opts: { target?: ArtifactTarget; computeDtype?: 'float32' | 'float16' } = {}): ArtifactsManifest {
  const target = opts.target ?? 'cpu';
  const computeDtype = opts.computeDtype ?? 'float32';
  checkSpec(spec);
  const trainable = spec.params.filter((p) => p.trainable);
  const dtype = trainable[0].dtype as 'float32' | 'float64';
  const training = buildTrainingGraph(spec, target);
  const evalGraph = buildEvalGraph(spec);
  const opt = buildOptimizerGraph(
    trainable.map((p) => ({ name: p.name, shape: p.shape, decay: p.decay ?? defaultDecay(p.name, p.shape) })),
    spec.optimizer,
    dtype,
  );
  const stepGraph = fuseOptimizer(buildTrainingGraph({ ...spec, gradientAccumulation: false }, target).graph, opt);
  for (const g of [training.graph, evalGraph, opt.graph, stepGraph]) {
    elideBroadcastExpands(g);
    foldScatterAddIntoSum(g);
    foldOutputIdentities(g);
    // Sequence sums of token log-probs (score_select's MatMul) stay float32 under float16 compute.
    if (computeDtype === 'float16' && g !== opt.graph) halfPrecisionMatmuls(g, ['score_select']);
    if (target === 'webgpu') lowerForWebGpu(g);
    // The peepholes leave nodes nothing reads (a Shape whose Expand went). ONNX Runtime would run
    // them last, keeping what they read (a [rows, vocabulary] tensor per head slice) alive until then.
    pruneGraph(g, new Set(g.inputs.map((i) => i.name)));
  }
  fs.mkdirSync(outDir, { recursive: true });
  saveModel(training.graph, path.join(outDir, ARTIFACT_FILES.training));
  saveModel(evalGraph, path.join(outDir, ARTIFACT_FILES.eval));
  saveModel(opt.graph, path.join(outDir, ARTIFACT_FILES.optimizer));
  saveModel(stepGraph, path.join(outDir, ARTIFACT_FILES.step));

  const accumulate = spec.gradientAccumulation ?? true;
  const manifest: ArtifactsManifest = {
    format: 'prefzoo-training-artifacts',
    version: MANIFEST_VERSION,
    opset: OPSET,
    params: spec.params.map((p) => ({ name: p.name, dtype: p.dtype, shape: p.shape, trainable: p.trainable, decay: p.decay ?? defaultDecay(p.name, p.shape) })),
    target,
    computeDtype,
    // Lowered graphs take int32 where the spec says int64 (see src/onnx/lower.ts).
    batchInputs: spec.batchInputs.map((b) => ({ name: b.name, dtype: [...training.graph.inputs, ...evalGraph.inputs].find((i) => i.name === b.name)?.dtype ?? b.dtype, shape: b.shape })),
    training: {
      file: ARTIFACT_FILES.training,
      ...graphIO(training.graph),
      loss: TRAIN_IO.loss,
      metrics: training.metrics,
      grads: Object.fromEntries(trainable.map((p) => [p.name, gradName(p.name)])),
      accumulation: accumulate ? { inputs: Object.fromEntries(trainable.map((p) => [p.name, gradAccName(p.name)])) } : null,
    },
    eval: { file: ARTIFACT_FILES.eval, ...graphIO(evalGraph) },
    step: { file: ARTIFACT_FILES.step, ...graphIO(stepGraph) },
    // Written only where true, so a manifest of a graph not cut into pieces is as before.
    ...(training.inPieces ? { inPieces: true } : {}),
    optimizer: {
      file: ARTIFACT_FILES.optimizer,
      ...graphIO(opt.graph),
      dtype,
      config: opt.config,
      stateSlots: opt.params[0].state.map((s) => s.slot),
    },
    loss: spec.loss ? { name: spec.loss.name, params: spec.loss.params ?? {} } : null,
    modelConfig: spec.modelConfig ?? null,
  };
  writeFileAtomic(path.join(outDir, ARTIFACT_FILES.manifest), [Buffer.from(JSON.stringify(manifest, null, 2) + '\n')]);

  // The folder's checkpoint always belongs to this build: a stale one could silently fit new graphs.
  const ckptDir = path.join(outDir, ARTIFACT_FILES.checkpoint);
  fs.rmSync(ckptDir, { recursive: true, force: true });
  if (spec.params.every((p) => p.data)) {
    const params = new Map<string, CheckpointTensor>(spec.params.map((p) => [p.name, { dtype: p.dtype, shape: p.shape, data: p.data! }]));
    const state = new Map<string, CheckpointTensor>();
    const n = (s: number[]) => s.reduce((a, b) => a * b, 1);
    for (const p of trainable) {
      for (const slot of manifest.optimizer.stateSlots) {
        state.set(stateName(slot, p.name), { dtype, shape: p.shape, data: dtype === 'float32' ? new Float32Array(n(p.shape)) : new Float64Array(n(p.shape)) });
      }
    }
    writeCheckpoint(ckptDir, params, state, { step: 0 });
  }
  return manifest;
}
