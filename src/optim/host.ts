/**
 * AdamW applied in this process, in place, for float32 parameters on the CPU.
 *
 * Why: onnxruntime-node returns every graph output as a fresh JavaScript buffer. The fused step
 * graph's outputs are the updated parameters and both moments — three parameter-sized buffers per
 * step, each allocated, page-faulted and copied (about 0.25 s of a 2.2 s step for 56M parameters),
 * plus ~12 parameter-sized elementwise passes inside the runtime. Here the training graph outputs
 * only the gradients; they are copied into one WebAssembly memory that also holds the parameters and
 * moments (which ONNX Runtime reads from there as inputs), and two SIMD kernels (src/optim/wasm.ts)
 * take the global norm and apply the update in one pass: about 0.1 s for 56M parameters.
 *
 * The arithmetic is the optimizer graph's (src/optim/graph.ts): gradients scaled by
 * c = gradScale · min(1, max_norm / (‖gradScale·g‖ + 1e-6)), then per element
 *   m ← β1·m + ((1−β1)·c)·g,  v ← β2·v + ((1−β2)·c²)·g²,
 *   p ← p·(1 − lr·λ) − (m · lr·√bc2/bc1) / (√v + ε·√bc2),  bc_i = 1 − β_i^t,
 * each operation a rounded float32 operation in that order. The scalars are computed in float64
 * (the graph computes them in float32), and the norm is accumulated in float64 (the graph: float32),
 * so the two paths agree to float32 rounding, not bit for bit.
 */
import type { ResolvedOptimizerConfig } from './config.ts';
import { instantiateKernels, kernelsSupported, type Kernels } from './wasm.ts';

export interface HostParam {
  name: string;
  numel: number;
  /** Weight decay applies to this parameter. */
  decay: boolean;
}

interface Slot {
  param: HostParam;
  /** Byte offsets in the memory of the parameter, its gradient and its two moments. */
  p: number;
  g: number;
  m: number;
  v: number;
}

/** WebAssembly memories are limited to 4 GiB (65,536 pages of 64 KiB). */
const MAX_PAGES = 65536;
const PAGE = 65536;
const CLIP_EPS = 1e-6;

const align16 = (n: number) => Math.ceil(n / 16) * 16;

type AdamWConfig = Extract<ResolvedOptimizerConfig, { type: 'adamw' }>;

export class HostAdamW {
  private readonly slots = new Map<string, Slot>();
  private readonly kernels: Kernels;
  private readonly f32: Float32Array;

  private constructor(
    readonly config: AdamWConfig,
    private readonly memory: WebAssembly.Memory,
    layout: Slot[],
  ) {
    for (const s of layout) this.slots.set(s.param.name, s);
    this.kernels = instantiateKernels(memory);
    this.f32 = new Float32Array(memory.buffer);
  }

  /** Why the in-process update cannot serve `params` under `config`, or null when it can. */
  static unsupported(params: HostParam[], config: ResolvedOptimizerConfig): string | null {
    if (config.type !== 'adamw') return `optimizer ${config.type} (the in-process update is AdamW only)`;
    if (!kernelsSupported()) return 'this runtime has no WebAssembly SIMD';
    const bytes = params.reduce((n, p) => n + 4 * align16(4 * p.numel), 0);
    if (Math.ceil(bytes / PAGE) > MAX_PAGES) return `${(bytes / 2 ** 30).toFixed(1)} GiB of parameters, gradients and moments exceed the 4 GiB of one WebAssembly memory`;
    return null;
  }

  /** Lays out every parameter, gradient and moment in one memory (zeros), or returns null when unsupported. */
  static create(params: HostParam[], config: ResolvedOptimizerConfig): HostAdamW | null {
    if (config.type !== 'adamw' || HostAdamW.unsupported(params, config) !== null) return null;
    let at = 0;
    const take = (n: number) => {
      const o = at;
      at += align16(4 * n);
      return o;
    };
    const layout = params.map((param) => ({ param, p: take(param.numel), g: take(param.numel), m: take(param.numel), v: take(param.numel) }));
    const pages = Math.max(1, Math.ceil(at / PAGE));
    const memory = new WebAssembly.Memory({ initial: pages, maximum: pages });
    return new HostAdamW(config, memory, layout);
  }

  private slot(name: string): Slot {
    const s = this.slots.get(name);
    if (!s) throw new Error(`host optimizer: no parameter named ${name}`);
    return s;
  }

  /** The parameter's storage (ONNX Runtime reads it from here; updated in place). */
  param(name: string): Float32Array {
    const s = this.slot(name);
    return new Float32Array(this.memory.buffer, s.p, s.param.numel);
  }

  /** Storage of moment `slot` ('m' or 'v') of a parameter. */
  state(slot: string, name: string): Float32Array {
    const s = this.slot(name);
    if (slot !== 'm' && slot !== 'v') throw new Error(`host optimizer: AdamW has no state slot ${slot}`);
    return new Float32Array(this.memory.buffer, slot === 'm' ? s.m : s.v, s.param.numel);
  }

  /**
   * One update at step `step` (1-based) with learning rate `lr`, the raw gradients scaled by
   * `gradScale` (1/micro-batches for a mean). Returns the global norm of the scaled gradients
   * before clipping.
   */
  update(grads: ReadonlyMap<string, Float32Array>, step: number, lr: number, gradScale: number): number {
    const f32 = this.f32;
    // Gradients into the memory, and the squared norm of the raw gradients in float64.
    let sq = 0;
    for (const s of this.slots.values()) {
      const g = grads.get(s.param.name);
      if (!g || g.length !== s.param.numel) throw new Error(`host optimizer: gradient of ${s.param.name} is missing or has the wrong size`);
      f32.set(g, s.g / 4);
      const n = s.param.numel;
      const body = n & ~3;
      sq += this.kernels.sumsq(s.g, 4 * body);
      for (let i = body; i < n; i++) sq += g[i] * g[i];
    }
    const cfg = this.config;
    const norm = Math.sqrt(sq) * Math.abs(gradScale);
    const c = cfg.maxGradNorm === null ? gradScale : gradScale * Math.min(cfg.maxGradNorm / (norm + CLIP_EPS), 1);
    const [b1, b2] = cfg.betas;
    const bc1 = 1 - Math.pow(b1, step);
    const sqrtBc2 = Math.sqrt(1 - Math.pow(b2, step));
    const f = Math.fround;
    const s = f((lr * sqrtBc2) / bc1);
    const eps = f(sqrtBc2 * cfg.eps);
    const k1 = f(c * (1 - b1));
    const k2 = f(c * c * (1 - b2));
    const fb1 = f(b1);
    const fb2 = f(b2);
    for (const slot of this.slots.values()) {
      const d = slot.param.decay && cfg.weightDecay > 0 ? f(1 - lr * cfg.weightDecay) : 1;
      const n = slot.param.numel;
      const body = n & ~3;
      this.kernels.adamw(slot.p, slot.g, slot.m, slot.v, 4 * body, fb1, fb2, k1, k2, s, eps, d);
      // The last n mod 4 elements, with each float32 rounding spelled out.
      for (let i = body; i < n; i++) {
        const P = slot.p / 4 + i;
        const G = f32[slot.g / 4 + i];
        const M = slot.m / 4 + i;
        const V = slot.v / 4 + i;
        f32[M] = f(f(f32[M] * fb1) + f(G * k1));
        f32[V] = f(f(f32[V] * fb2) + f(f(G * G) * k2));
        f32[P] = f(f(f32[P] * d) - f(f(f32[M] * s) / f(f(Math.sqrt(f32[V])) + eps)));
      }
    }
    return norm;
  }
}
