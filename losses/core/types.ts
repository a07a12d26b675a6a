/**
 * Shared types of the loss zoo. Every loss works on per-sequence statistics (summed log-probs,
 * token counts, scores), or, for GRPO, per-token log-probs [B, T]; only the distillation losses
 * (GKD) read distributions, the student's and teacher's logits [B, T, V] or the teacher's top K
 * [B, T, K]. One module serves training (ONNX subgraph) and evaluation (float64 TypeScript reference).
 */
import type { Graph, Tensor } from '../../src/onnx/graph.ts';
import type { Kind as DataKind } from '../../datasets/names.ts';

/**
 * The data a loss consumes: pairs, ranked lists, single trajectories, Nash-MD's on-policy pairs, or
 * GRPO's groups of sampled completions with per-token log-probs, or the scalar rewards a reward
 * model gives the two responses of a pair (Bradley–Terry), or a student's and a teacher's
 * distributions over the vocabulary at each completion position (`distill`: GKD).
 */
export type Kind = DataKind | 'nash_md' | 'grpo' | 'reward_pairs' | 'distill';

/** A float64 batch tensor on the host, row-major: dims [B], [B, K], [B, T] or [B, T, V] ([] for a batch scalar such as `kl`); token ids are integers held as floats. */
export interface HostTensor {
  dims: number[];
  data: Float64Array;
}

/** Batch tensors by their snake_case key (`policy_chosen_logps`, `mask`, …). */
export type HostBatch = Record<string, HostTensor>;

/** Batch tensors of a graph by key: [B], [B, K], [B, T] or [B, T, V], all of one float dtype (counts and masks included) except token ids (int64). */
export type BatchTensors = Record<string, Tensor>;

export type ParamValue = number | boolean | string | null;
export type Params = Record<string, ParamValue>;

/** A public loss parameter (CLI `--param name=value`, config key). */
export interface ParamSpec {
  name: string;
  type: 'number' | 'integer' | 'boolean' | 'enum';
  /** null: optional and unset unless given. */
  default: number | boolean | string | null;
  doc: string;
  min?: number;
  max?: number;
  /** Open bounds: min < v (not ≤), v < max (not ≥). */
  minOpen?: boolean;
  maxOpen?: boolean;
  choices?: readonly string[];
  /** Other accepted names (e.g. a peer toolkit's name for the same parameter). */
  aliases?: readonly string[];
  /** The name TRL's config gives the parameter, shown in `--help`. */
  trl?: string;
}

/** Which batch keys a loss reads, given its parameters and the batch kind. */
export interface KeySet {
  required: string[];
  optional: string[];
  /** Alternatives: at least one group must be present in full (KTO: `kl`, or both KL log-prob columns). */
  oneOf?: string[][];
}

/** Float64 result of one loss on one batch. */
export interface RefResult {
  perExample: number[];
  /** Gradient of Σ_i coef_i · L_i w.r.t. each differentiable key (same dims as the key). */
  grad: Record<string, Float64Array>;
  /** Batch metrics (plain means over the rows), e.g. TRL's `rewards/accuracies`. */
  metrics?: Record<string, number>;
}

/** ONNX result of one loss: per-example values [B] and scalar metric tensors. */
export interface EmitResult {
  perExample: Tensor;
  metrics?: Record<string, Tensor>;
}

/** See `LossModule.schedule`. */
export type Schedule = 'single' | 'mpo_stages';

export interface LossModule<P extends Params = Params> {
  name: string;
  /** Title of the paper the loss comes from. */
  paper: string;
  /** Primary kind (first of `kinds`). */
  kind: Kind;
  kinds: readonly Kind[];
  params: readonly ParamSpec[];
  /** False when a row's loss depends on other rows (AOT sorts the batch): no per-row weights then. */
  rowwise: boolean;
  /**
   * How the trainer runs the loss: one run over the data (`single`, the default), or MPO's split by
   * reward margin into two runs (`mpo_stages`, src/train/mpo.ts).
   */
  schedule?: Schedule;
  /** Checks between parameters, after each was range-checked. */
  check?(p: P): void;
  keys(p: P, kind: Kind): KeySet;
  /** Keys the loss is differentiable in (policy log-probs; DRO's values). */
  grads(p: P, kind: Kind): string[];
  /** Float64 reference: per-example losses and the gradient of Σ_i coef_i·L_i. */
  ref(batch: HostBatch, p: P, coef: Float64Array, kind: Kind): RefResult;
  /** ONNX emitter: appends the loss to `g` on the batch tensors. */
  emit(g: Graph, inputs: BatchTensors, p: P, kind: Kind): EmitResult;
}
