/**
 * artifacts.json: everything needed to run the three graphs without the source model — parameter
 * names/shapes/dtypes, batch inputs, each graph's input and output names, optimizer config, loss and
 * model config.
 */
import fs from 'node:fs';
import path from 'node:path';
import { UserError } from '../errors.ts';
import type { DType } from '../onnx/dtype.ts';
import type { Shape } from '../onnx/graph.ts';
import type { ResolvedOptimizerConfig } from '../optim/config.ts';

export const MANIFEST_VERSION = 1;

export const ARTIFACT_FILES = {
  training: 'training_model.onnx',
  eval: 'eval_model.onnx',
  optimizer: 'optimizer_model.onnx',
  step: 'train_step_model.onnx',
  manifest: 'artifacts.json',
  checkpoint: 'checkpoint',
} as const;

/** Fixed names of the training graph's own inputs/outputs. */
export const TRAIN_IO = { loss: 'loss' } as const;

export interface GraphIO {
  inputs: string[];
  outputs: string[];
}

/**
 * Which execution provider the graphs were written for. 'webgpu' graphs are lowered (src/onnx/lower.ts:
 * int32 integers, no ops the WebGPU provider lacks); they run on the CPU as well, with the same values.
 */
export type ArtifactTarget = 'cpu' | 'webgpu';

export interface ArtifactsManifest {
  format: 'prefzoo-training-artifacts';
  version: number;
  opset: number;
  /** Absent in folders written before it existed: 'cpu'. */
  target?: ArtifactTarget;
  /** Precision of the matrix products (src/onnx/half.ts); absent: 'float32'. */
  computeDtype?: 'float32' | 'float16';
  params: { name: string; dtype: DType; shape: number[]; trainable: boolean; decay: boolean }[];
  batchInputs: { name: string; dtype: DType; shape: Shape }[];
  training: GraphIO & {
    file: string;
    loss: string;
    metrics: string[];
    /** param → gradient output */
    grads: Record<string, string>;
    /**
     * null when built without accumulation inputs. `flag` (a bool input selecting grad_acc + ∂ over ∂)
     * exists only in folders built before the sum was folded into the gradient nodes.
     */
    accumulation: { flag?: string; inputs: Record<string, string> } | null;
  };
  eval: GraphIO & { file: string };
  /**
   * Forward, backward and optimizer update in one graph (inputs: the training graph's without the
   * accumulation sums, plus the optimizer's; outputs: loss, metrics and the optimizer's). Absent in
   * folders built before it existed.
   */
  step?: GraphIO & { file: string };
  optimizer: GraphIO & { file: string; dtype: 'float32' | 'float64'; config: ResolvedOptimizerConfig; stateSlots: string[] };
  /**
   * True where the training forward was built in pieces that keep every tensor under glibc's 32 MiB
   * mmap bound (TrainProblem.longest; models/layers.ts TENSOR_BOUND): its gradient sessions then keep
   * ONNX Runtime's arena, whose regions those pieces reuse (artifacts/training.ts). Absent: not cut.
   */
  inPieces?: boolean;
  loss: { name: string; params: Record<string, unknown> } | null;
  modelConfig: unknown;
}

export function readManifest(dir: string): ArtifactsManifest {
  const file = path.join(dir, ARTIFACT_FILES.manifest);
  if (!fs.existsSync(file)) throw new UserError(`${file}: not found (is ${dir} a training-artifacts folder?)`);
  let m: ArtifactsManifest;
  try {
    m = JSON.parse(fs.readFileSync(file, 'utf8'));
  } catch (e) {
    throw new UserError(`${file}: not valid JSON (${(e as Error).message})`);
  }
  if (m.format !== 'prefzoo-training-artifacts') throw new UserError(`${file}: "format" is not prefzoo-training-artifacts`);
  if (m.version !== MANIFEST_VERSION) throw new UserError(`${file}: manifest version ${m.version} is not supported (expected ${MANIFEST_VERSION})`);
  for (const key of ['params', 'batchInputs', 'training', 'eval', 'optimizer'] as const) {
    if (!m[key]) throw new UserError(`${file}: missing "${key}"`);
  }
  for (const g of [m.training, m.eval, m.optimizer]) {
    if (!fs.existsSync(path.join(dir, g.file))) throw new UserError(`${path.join(dir, g.file)}: listed in ${ARTIFACT_FILES.manifest} but missing`);
  }
  return m;
}
