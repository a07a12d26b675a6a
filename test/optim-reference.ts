/**
 * Float64 reference optimizers written directly from the papers / PyTorch documentation, element by
 * element, with no shared code with src/optim (which folds the scalar algebra differently).
 */

export interface RefParam {
  value: Float64Array;
  decay: boolean;
}

/** PyTorch clip_grad_norm_: returns the scaled gradients (clipped) and the norm before clipping. */
export function refScaleAndClip(grads: Float64Array[], scale: number, maxNorm: number | null): { grads: Float64Array[]; norm: number } {
  const scaled = grads.map((g) => g.map((x) => x * scale));
  let ss = 0;
  for (const g of scaled) for (const x of g) ss += x * x;
  const norm = Math.sqrt(ss);
  if (maxNorm === null) return { grads: scaled, norm };
  const coef = Math.min(1, maxNorm / (norm + 1e-6));
  return { grads: scaled.map((g) => g.map((x) => x * coef)), norm };
}

/** AdamW, Algorithm 2 of Loshchilov & Hutter with PyTorch's ε placement (outside the square root). */
export class RefAdamW {
  m: Float64Array[];
  v: Float64Array[];
  t = 0;
  constructor(
    readonly params: RefParam[],
    readonly o: { beta1: number; beta2: number; eps: number; weightDecay: number; maxGradNorm: number | null },
  ) {
    this.m = params.map((p) => new Float64Array(p.value.length));
    this.v = params.map((p) => new Float64Array(p.value.length));
  }

  step(grads: Float64Array[], lr: number, scale = 1): number {
    this.t++;
    const { grads: gs, norm } = refScaleAndClip(grads, scale, this.o.maxGradNorm);
    const { beta1, beta2, eps, weightDecay } = this.o;
    this.params.forEach((p, k) => {
      const m = this.m[k];
      const v = this.v[k];
      const g = gs[k];
      for (let i = 0; i < p.value.length; i++) {
        if (p.decay) p.value[i] -= lr * weightDecay * p.value[i];
        m[i] = beta1 * m[i] + (1 - beta1) * g[i];
        v[i] = beta2 * v[i] + (1 - beta2) * g[i] * g[i];
        const mHat = m[i] / (1 - Math.pow(beta1, this.t));
        const vHat = v[i] / (1 - Math.pow(beta2, this.t));
        p.value[i] -= (lr * mHat) / (Math.sqrt(vHat) + eps);
      }
    });
    return norm;
  }
}

/** torch.optim.SGD (dampening 0): buffer lazily initialised to the first gradient. */
export class RefSGD {
  buf: (Float64Array | null)[];
  constructor(
    readonly params: RefParam[],
    readonly o: { momentum: number; nesterov: boolean; weightDecay: number; maxGradNorm: number | null },
  ) {
    this.buf = params.map(() => null);
  }

  step(grads: Float64Array[], lr: number, scale = 1): number {
    const { grads: gs, norm } = refScaleAndClip(grads, scale, this.o.maxGradNorm);
    this.params.forEach((p, k) => {
      const d = gs[k].map((x, i) => (p.decay ? x + this.o.weightDecay * p.value[i] : x));
      let dir = d;
      if (this.o.momentum > 0) {
        const prev = this.buf[k];
        const b = prev === null ? Float64Array.from(d) : prev.map((x, i) => this.o.momentum * x + d[i]);
        this.buf[k] = b;
        dir = this.o.nesterov ? d.map((x, i) => x + this.o.momentum * b[i]) : b;
      }
      for (let i = 0; i < p.value.length; i++) p.value[i] -= lr * dir[i];
    });
    return norm;
  }
}

/** Seeded uniform [0, 1), so tests are reproducible. */
export { uniform as rng } from '../src/random.ts';

/** Standard normal via Box–Muller. */
export function gaussian(r: () => number): () => number {
  return () => Math.sqrt(-2 * Math.log(1 - r())) * Math.cos(2 * Math.PI * r());
}
