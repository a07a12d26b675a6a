/**
 * Optimizer configuration and the tensor-naming convention shared by the optimizer graph, the
 * training graph (gradient outputs) and checkpoints (state tensors).
 */
import { UserError } from '../errors.ts';

/** AdamW (Loshchilov & Hutter, "Decoupled Weight Decay Regularization"), PyTorch semantics. */
export interface AdamWConfig {
  type: 'adamw';
  /** (β1, β2), default (0.9, 0.999). */
  betas?: [number, number];
  /** ε added to √v̂, default 1e-8. */
  eps?: number;
  /** Decoupled decay λ: p ← p·(1 − lr·λ) before the Adam update, default 0.01. */
  weightDecay?: number;
  /** Global L2 norm the gradients are clipped to; null or 0 turns clipping off (default null). */
  maxGradNorm?: number | null;
}

/** SGD with heavy-ball momentum (PyTorch semantics, no dampening). */
export interface SGDConfig {
  type: 'sgd';
  /** μ, default 0 (plain SGD, no state). */
  momentum?: number;
  /** Nesterov momentum: step along g + μ·buf instead of buf. */
  nesterov?: boolean;
  /** L2 weight decay added to the gradient: g ← g + λ·p (coupled, as in torch.optim.SGD), default 0. */
  weightDecay?: number;
  maxGradNorm?: number | null;
}

export type OptimizerConfig = AdamWConfig | SGDConfig;

/** A config with every default filled in. */
export type ResolvedOptimizerConfig =
  | { type: 'adamw'; betas: [number, number]; eps: number; weightDecay: number; maxGradNorm: number | null }
  | { type: 'sgd'; momentum: number; nesterov: boolean; weightDecay: number; maxGradNorm: number | null };

function finite(v: number, what: string, lo: number, hi: number, loOpen = false, hiOpen = false): number {
  const bad = !Number.isFinite(v) || (loOpen ? v <= lo : v < lo) || (hiOpen ? v >= hi : v > hi);
  if (bad) throw new UserError(`optimizer parameter ${what} must be in ${loOpen ? '(' : '['}${lo}, ${hi}${hiOpen ? ')' : ']'}, got ${v}`);
  return v;
}

/** Fills defaults and validates ranges (errors name the parameter). */
export function resolveOptimizerConfig(c: OptimizerConfig): ResolvedOptimizerConfig {
  const clip = c.maxGradNorm === undefined || c.maxGradNorm === null || c.maxGradNorm === 0 ? null : finite(c.maxGradNorm, 'max_grad_norm', 0, Infinity, true, true);
  if (c.type === 'adamw') {
    const [b1, b2] = c.betas ?? [0.9, 0.999];
    return {
      type: 'adamw',
      betas: [finite(b1, 'beta1', 0, 1, false, true), finite(b2, 'beta2', 0, 1, false, true)],
      eps: finite(c.eps ?? 1e-8, 'eps', 0, Infinity, true, true),
      weightDecay: finite(c.weightDecay ?? 0.01, 'weight_decay', 0, Infinity, false, true),
      maxGradNorm: clip,
    };
  }
  if (c.type === 'sgd') {
    const momentum = finite(c.momentum ?? 0, 'momentum', 0, 1, false, true);
    if (c.nesterov && momentum === 0) throw new UserError('optimizer parameter nesterov needs momentum > 0');
    return { type: 'sgd', momentum, nesterov: !!c.nesterov, weightDecay: finite(c.weightDecay ?? 0, 'weight_decay', 0, Infinity, false, true), maxGradNorm: clip };
  }
  throw new UserError(`unknown optimizer type "${(c as { type: unknown }).type}" (expected adamw or sgd)`);
}

/**
 * The usual decay mask (as in HF/TRL trainers): matrices decay; biases, norm weights and other
 * vectors do not.
 */
export function defaultDecay(name: string, shape: readonly number[]): boolean {
  return shape.length >= 2 && !/norm|(^|\.)bias$/i.test(name);
}

/** Per-parameter state slots of an optimizer, in graph order. */
export function stateSlots(c: ResolvedOptimizerConfig): string[] {
  if (c.type === 'adamw') return ['m', 'v'];
  return c.momentum > 0 ? ['momentum'] : [];
}

// ---- names ---------------------------------------------------------------------------------
// A parameter keeps its own (checkpoint) name as a graph input; everything derived from it is a
// dotted prefix, so names never collide with HF parameter names (which never start with these).

/** Gradient of parameter p: a training-graph output and an optimizer-graph input. */
export const gradName = (p: string): string => `grad.${p}`;
/** Running gradient sum fed back into the training graph when accumulating micro-batches. */
export const gradAccName = (p: string): string => `grad_acc.${p}`;
/** Optimizer state slot (m, v, momentum) of parameter p: graph input and checkpoint tensor name. */
export const stateName = (slot: string, p: string): string => `${slot}.${p}`;
/** Updated value of a parameter or state tensor (ONNX forbids an output named like an input). */
export const updatedName = (name: string): string => `new.${name}`;

/** Scalar inputs/outputs of the optimizer graph. */
export const OPTIM_IO = {
  /** int64 scalar: 1-based index of the update being applied (bias correction uses it). */
  step: 'step',
  /** scalar of the parameter dtype: learning rate of this update. */
  lr: 'lr',
  /** scalar: gradients are multiplied by it first (1/k after accumulating k micro-batches). */
  gradScale: 'grad_scale',
  /** scalar output: global L2 norm of the scaled gradients before clipping. */
  gradNorm: 'grad_norm',
} as const;
