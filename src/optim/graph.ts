/**
 * Optimizers as ONNX graphs: one `optimizer_model.onnx` updates every trainable parameter at once.
 *
 *   inputs   p, grad.p, <slot>.p (per parameter), step (int64 []), lr ([]), grad_scale ([])
 *   outputs  new.p, new.<slot>.p (per parameter), grad_norm ([])
 *
 * Gradients are first multiplied by grad_scale, then clipped to a global L2 norm (as
 * torch.nn.utils.clip_grad_norm_: coefficient min(1, max_norm / (norm + 1e-6))); `grad_norm` is the
 * norm before clipping. All scalar algebra is done once on [] tensors and folded into the per-element
 * coefficients, so each parameter costs a handful of elementwise nodes.
 */
import { attr, Graph, type Tensor } from '../onnx/graph.ts';
import { UserError } from '../errors.ts';
import {
  type OptimizerConfig,
  type ResolvedOptimizerConfig,
  resolveOptimizerConfig,
  stateSlots,
  gradName,
  stateName,
  updatedName,
  OPTIM_IO,
} from './config.ts';

export type OptimDType = 'float32' | 'float64';

export interface OptimParam {
  name: string;
  shape: number[];
  /** Apply weight decay to this parameter (false for norms and biases). Default true. */
  decay?: boolean;
}

/** Names of every tensor of the optimizer graph, per parameter. */
export interface OptimizerParamIO {
  name: string;
  grad: string;
  output: string;
  /** slot → { input, output } */
  state: { slot: string; input: string; output: string }[];
}

export interface OptimizerGraph {
  graph: Graph;
  config: ResolvedOptimizerConfig;
  dtype: OptimDType;
  params: OptimizerParamIO[];
}

/** Clip threshold added to the norm in the denominator, as PyTorch does, so zero gradients stay finite. */
const CLIP_EPS = 1e-6;

/** Σ x² over all elements, as a [] tensor. */
function sumSquares(g: Graph, x: Tensor): Tensor {
  return g.op('ReduceSumSquare', [x], { keepdims: attr.int(0) }, [{ dtype: x.dtype, shape: [] }])[0];
}

export function buildOptimizerGraph(params: OptimParam[], config: OptimizerConfig, dtype: OptimDType = 'float32'): OptimizerGraph {
  if (params.length === 0) throw new UserError('optimizer: no trainable parameters');
  const seen = new Set<string>();
  for (const p of params) {
    if (seen.has(p.name)) throw new UserError(`optimizer: parameter ${p.name} is listed twice`);
    seen.add(p.name);
  }
  const cfg = resolveOptimizerConfig(config);
  const slots = stateSlots(cfg);
  const g = new Graph(`optimizer_${cfg.type}`);

  // Inputs, grouped per parameter so the graph reads naturally.
  const ins = params.map((p) => ({
    p,
    value: g.input(p.name, dtype, p.shape),
    grad: g.input(gradName(p.name), dtype, p.shape),
    state: slots.map((s) => g.input(stateName(s, p.name), dtype, p.shape)),
  }));
  const stepInt = g.input(OPTIM_IO.step, 'int64', []);
  const lr = g.input(OPTIM_IO.lr, dtype, []);
  const gradScale = g.input(OPTIM_IO.gradScale, dtype, []);
  const step = g.cast(stepInt, dtype);

  // Global norm of the scaled gradients: ‖s·g‖ = s·‖g‖ (s ≥ 0 assumed; |s| keeps it a norm otherwise).
  const rawNorm = g.sqrt(g.sum(ins.map((i) => sumSquares(g, i.grad))));
  const norm = g.mul(rawNorm, g.abs(gradScale));
  g.output(norm, OPTIM_IO.gradNorm);
  // c: the single factor every raw gradient is multiplied by (scale, then clip).
  let c = gradScale;
  if (cfg.maxGradNorm !== null) {
    const clipCoef = g.min(g.div(cfg.maxGradNorm, g.add(norm, CLIP_EPS)), 1);
    c = g.mul(gradScale, clipCoef);
  }

  const io: OptimizerParamIO[] = [];
  const emit = (i: (typeof ins)[number], newP: Tensor, newState: Tensor[]) => {
    const out = g.output(newP, updatedName(i.p.name));
    const state = slots.map((s, k) => {
      const o = g.output(newState[k], updatedName(stateName(s, i.p.name)));
      return { slot: s, input: i.state[k].name, output: o.name };
    });
    io.push({ name: i.p.name, grad: i.grad.name, output: out.name, state });
  };

  if (cfg.type === 'adamw') {
    const [b1, b2] = cfg.betas;
    // Bias corrections bc1 = 1 − β1^t, bc2 = 1 − β2^t.
    const bc1 = g.sub(1, g.pow(g.scalar(b1, dtype), step));
    const bc2 = g.sub(1, g.pow(g.scalar(b2, dtype), step));
    const sqrtBc2 = g.sqrt(bc2);
    // m̂/(√v̂+ε) = (√bc2/bc1)·m/(√v + ε√bc2): one scalar step size, one scalar ε.
    const stepSize = g.div(g.mul(lr, sqrtBc2), bc1);
    const epsHat = g.mul(sqrtBc2, cfg.eps);
    const k1 = g.mul(c, 1 - b1); // m ← β1 m + (1−β1)·c·g
    const k2 = g.mul(g.mul(c, c), 1 - b2); // v ← β2 v + (1−β2)·c²·g²
    const decayFactor = g.sub(1, g.mul(lr, cfg.weightDecay));
    for (const i of ins) {
      g.scope(i.p.name, () => {
        const [m, v] = i.state;
        const m2 = g.add(g.mul(m, b1), g.mul(i.grad, k1));
        const v2 = g.add(g.mul(v, b2), g.mul(g.mul(i.grad, i.grad), k2));
        const upd = g.div(g.mul(m2, stepSize), g.add(g.sqrt(v2), epsHat));
        const decays = (i.p.decay ?? true) && cfg.weightDecay > 0;
        const base = decays ? g.mul(i.value, decayFactor) : i.value;
        emit(i, g.sub(base, upd), [m2, v2]);
      });
    }
  } else {
    const mu = cfg.momentum;
    for (const i of ins) {
      g.scope(i.p.name, () => {
        let d = g.mul(i.grad, c);
        if ((i.p.decay ?? true) && cfg.weightDecay > 0) d = g.add(d, g.mul(i.value, cfg.weightDecay));
        const newState: Tensor[] = [];
        if (mu > 0) {
          // Zero-initialised buffer: the first update gives buf = g, as PyTorch's lazy init does.
          const buf = g.add(g.mul(i.state[0], mu), d);
          newState.push(buf);
          d = cfg.nesterov ? g.add(d, g.mul(buf, mu)) : buf;
        }
        emit(i, g.sub(i.value, g.mul(d, lr)), newState);
      });
    }
  }
  return { graph: g, config: cfg, dtype, params: io };
}
