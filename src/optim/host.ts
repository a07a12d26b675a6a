/**
 * AdamW applied in this process, in place, for float32 parameters on the CPU.
 *
 * Why: onnxruntime-node returns every graph output as a fresh JavaScript buffer. The fused step
 * graph's outputs are the updated parameters and both moments — three parameter-sized buffers per
 * step, each allocated, page-faulted and copied (about 0.25 s of a 2.2 s step for 56M parameters),
 * plus ~12 parameter-sized elementwise passes inside the runtime. Here the training graph outputs
 * only the gradients; each is copied into a scratch region of the WebAssembly memory that holds its
 * parameter and moments (which ONNX Runtime reads from there as inputs), and two SIMD kernels
 * (src/optim/wasm.ts) take the global norm and apply the update in one pass: about 0.1 s for 56M
 * parameters. A memory holds at most 4 GiB, so larger models spread over several.
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

export interface Slot {
  param: HostParam;
  /** Which memory holds it, and the byte offsets there of the parameter and its two moments. */
  mem: number;
  p: number;
  m: number;
  v: number;
}

/** One WebAssembly memory: its kernels, a float view, and a scratch region for one gradient at a time. */
interface Mem {
  kernels: Kernels;
  f32: Float32Array;
  buffer: ArrayBuffer;
  /** Byte offset of the gradient scratch (as long as the memory's largest parameter). */
  g: number;
}

/** WebAssembly memories are limited to 4 GiB (65,536 pages of 64 KiB). */
const MAX_PAGES = 65536;
const PAGE = 65536;
const MAX_BYTES = MAX_PAGES * PAGE;
const CLIP_EPS = 1e-6;

const align16 = (n: number) => Math.ceil(n / 16) * 16;

type AdamWConfig = Extract<ResolvedOptimizerConfig, { type: 'adamw' }>;

/**
 * Parameters and moments packed into as few memories as fit: each parameter's three arrays in one
 * memory, plus that memory's gradient scratch. Returns each slot's memory and the memories' sizes.
 */
export function packMemories(params: HostParam[], maxBytes = MAX_BYTES): { slots: Slot[]; sizes: number[]; scratch: number[] } | null {
  const slots: Slot[] = [];
  const sizes: number[] = [];
  const scratch: number[] = [];
  for (const param of params) {
    const b = align16(4 * param.numel);
    const fits = (k: number) => sizes[k] + 3 * b + Math.max(scratch[k], b) <= maxBytes;
    let k = sizes.length - 1;
    if (k < 0 || !fits(k)) {
      if (4 * b > maxBytes) return null;
      sizes.push(0);
      scratch.push(0);
      k++;
    }
    slots.push({ param, mem: k, p: sizes[k], m: sizes[k] + b, v: sizes[k] + 2 * b });
    sizes[k] += 3 * b;
    scratch[k] = Math.max(scratch[k], b);
  }
  return { slots, sizes, scratch };
}

export class HostAdamW {
  private readonly slots = new Map<string, Slot>();

  private constructor(
    readonly config: AdamWConfig,
    private readonly mems: Mem[],
    layout: Slot[],
  ) {
    for (const s of layout) this.slots.set(s.param.name, s);
  }

  /** How many WebAssembly memories hold the parameters and moments (each at most 4 GiB). */
  get memories(): number {
    return this.mems.length;
  }

  /** Why the in-process update cannot serve `params` under `config`, or null when it can. */
  static unsupported(params: HostParam[], config: ResolvedOptimizerConfig): string | null {
    if (config.type !== 'adamw') return `optimizer ${config.type} (the in-process update is AdamW only)`;
    if (!kernelsSupported()) return 'this runtime has no WebAssembly SIMD';
    if (!packMemories(params)) return 'a parameter with its moments and gradient exceeds the 4 GiB of one WebAssembly memory';
    return null;
  }

  /**
   * Lays out every parameter and moment (zeros) in WebAssembly memories of at most 4 GiB each (a
   * 0.5B model takes two), or returns null when unsupported.
   */
  static create(params: HostParam[], config: ResolvedOptimizerConfig, maxBytes = MAX_BYTES): HostAdamW | null {
    if (config.type !== 'adamw' || HostAdamW.unsupported(params, config) !== null) return null;
    const packed = packMemories(params, maxBytes);
    if (!packed) return null;
    const { slots, sizes, scratch } = packed;
    const mems = sizes.map((size, k) => {
      const pages = Math.max(1, Math.ceil((size + scratch[k]) / PAGE));
      const memory = new WebAssembly.Memory({ initial: pages, maximum: pages });
      return { kernels: instantiateKernels(memory), f32: new Float32Array(memory.buffer), buffer: memory.buffer, g: size };
    });
    return new HostAdamW(config, mems, slots);
  }

  private slot(name: string): Slot {
    const s = this.slots.get(name);
    if (!s) throw new Error(`host optimizer: no parameter named ${name}`);
    return s;
  }

  /** The parameter's storage (ONNX Runtime reads it from here; updated in place). */
  param(name: string): Float32Array {
    const s = this.slot(name);
    return new Float32Array(this.mems[s.mem].buffer, s.p, s.param.numel);
  }

  /** Storage of moment `slot` ('m' or 'v') of a parameter. */
  state(slot: string, name: string): Float32Array {
    const s = this.slot(name);
    if (slot !== 'm' && slot !== 'v') throw new Error(`host optimizer: AdamW has no state slot ${slot}`);
    return new Float32Array(this.mems[s.mem].buffer, slot === 'm' ? s.m : s.v, s.param.numel);
  }

  /**
   * One update at step `step` (1-based) with learning rate `lr`, the raw gradients scaled by
   * `gradScale` (1/micro-batches for a mean). Returns the global norm of the scaled gradients
   * before clipping.
   */
  update(grads: ReadonlyMap<string, Float32Array>, step: number, lr: number, gradScale: number): number {
    // Each gradient goes through its memory's scratch (twice: for the norm, then for the update), so
    // the memories never hold a second parameter-sized array per parameter.
    const load = (slot: Slot): Mem => {
      const g = grads.get(slot.param.name);
      if (!g || g.length !== slot.param.numel) throw new Error(`host optimizer: gradient of ${slot.param.name} is missing or has the wrong size`);
      const mem = this.mems[slot.mem];
      mem.f32.set(g, mem.g / 4);
      return mem;
    };
    // The squared norm of the raw gradients, in float64.
    let sq = 0;
    for (const slot of this.slots.values()) {
      const mem = load(slot);
      const n = slot.param.numel;
      const body = n & ~3;
      sq += mem.kernels.sumsq(mem.g, 4 * body);
      for (let i = body; i < n; i++) sq += mem.f32[mem.g / 4 + i] ** 2;
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
      const mem = load(slot);
      const f32 = mem.f32;
      const d = slot.param.decay && cfg.weightDecay > 0 ? f(1 - lr * cfg.weightDecay) : 1;
      const n = slot.param.numel;
      const body = n & ~3;
      mem.kernels.adamw(slot.p, mem.g, slot.m, slot.v, 4 * body, fb1, fb2, k1, k2, s, eps, d);
      // The last n mod 4 elements, with each float32 rounding spelled out.
      for (let i = body; i < n; i++) {
        const P = slot.p / 4 + i;
        const G = f32[mem.g / 4 + i];
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
