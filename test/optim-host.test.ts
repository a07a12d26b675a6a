/**
 * The in-process AdamW (src/optim/host.ts and its WebAssembly kernels) against the float64 reference
 * optimizer, a float32 emulation of its own arithmetic, and the ONNX optimizer graph.
 */
import { describe, it, expect } from 'vitest';
import { HostAdamW, packMemories, type HostParam } from '../src/optim/host.ts';
import { kernelsSupported } from '../src/optim/wasm.ts';
import { buildOptimizerGraph, resolveOptimizerConfig, gradName, OPTIM_IO, stateName, updatedName } from '../src/optim/index.ts';
import { serializeModel } from '../src/onnx/proto.ts';
import { Session, toOrt, type Feeds } from '../src/runtime/session.ts';
import { lrAt } from '../src/optim/schedule.ts';
import { RefAdamW, rng, gaussian } from './optim-reference.ts';

// Sizes with every remainder mod 4, so the kernels' 4-lane body and the scalar tail both run.
const PARAMS: HostParam[] = [
  { name: 'layer.weight', numel: 35, decay: true },
  { name: 'layer.bias', numel: 5, decay: false },
  { name: 'norm.weight', numel: 24, decay: false },
  { name: 'head.weight', numel: 18, decay: true },
  { name: 'big.weight', numel: 4099, decay: true },
];

const config = (maxGradNorm: number | null, weightDecay = 0.1) =>
  resolveOptimizerConfig({ type: 'adamw', betas: [0.9, 0.95], eps: 1e-8, weightDecay, maxGradNorm });

function randomGrads(normal: () => number, scale: number): Map<string, Float32Array> {
  return new Map(PARAMS.map((p, k) => [p.name, Float32Array.from({ length: p.numel }, () => normal() * (k + 1) * scale)]));
}

describe('host AdamW', () => {
  it('runs here (WebAssembly SIMD is available on Node 20)', () => {
    expect(kernelsSupported()).toBe(true);
    expect(HostAdamW.unsupported(PARAMS, config(1))).toBeNull();
    expect(HostAdamW.unsupported(PARAMS, resolveOptimizerConfig({ type: 'sgd' }))).toMatch(/AdamW only/);
    expect(HostAdamW.unsupported([{ name: 'huge', numel: 300_000_000, decay: true }], config(1))).toMatch(/exceeds the 4 GiB/);
    // A 0.5B model (136M-element embedding, then layers) spreads over two memories.
    const big = [{ name: 'embed', numel: 136_134_656, decay: true }, ...Array.from({ length: 24 }, (_, i) => ({ name: `layer${i}`, numel: 14_912_000, decay: true }))];
    expect(HostAdamW.unsupported(big, config(1))).toBeNull();
    const packed = packMemories(big)!;
    expect(packed.sizes.length).toBe(2);
    packed.sizes.forEach((size, k) => expect(size + packed.scratch[k]).toBeLessThanOrEqual(2 ** 32));
  });

  it('spread over several memories, updates exactly as in one', () => {
    const one = HostAdamW.create(PARAMS, config(0.5))!;
    const many = HostAdamW.create(PARAMS, config(0.5), 66_000)!;
    expect(one.memories).toBe(1);
    expect(many.memories).toBeGreaterThan(1);
    const normal = gaussian(rng(5));
    for (const p of PARAMS) {
      const init = Float32Array.from({ length: p.numel }, normal);
      one.param(p.name).set(init);
      many.param(p.name).set(init);
    }
    for (let t = 1; t <= 3; t++) {
      const grads = randomGrads(normal, 0.9);
      expect(many.update(grads, t, 0.02, 1)).toBe(one.update(grads, t, 0.02, 1));
    }
    for (const p of PARAMS) {
      expect(Array.from(many.param(p.name))).toEqual(Array.from(one.param(p.name)));
      expect(Array.from(many.state('v', p.name))).toEqual(Array.from(one.state('v', p.name)));
    }
  });

  it('matches a float32 emulation of the same arithmetic bit for bit (kernel body and tail)', () => {
    const cfg = config(0.5);
    const host = HostAdamW.create(PARAMS, cfg)!;
    const normal = gaussian(rng(11));
    const f = Math.fround;
    const emu = PARAMS.map((p) => ({ p: Float32Array.from({ length: p.numel }, normal), m: new Float32Array(p.numel), v: new Float32Array(p.numel) }));
    PARAMS.forEach((p, k) => host.param(p.name).set(emu[k].p));
    for (let t = 1; t <= 5; t++) {
      const grads = randomGrads(normal, 0.7);
      const lr = 0.01 * t;
      const norm = host.update(grads, t, lr, 0.5);
      // The scalars as host.ts documents them, then every element in float32.
      let sq = 0;
      for (const g of grads.values()) for (const x of g) sq += x * x;
      expect(norm).toBeCloseTo(Math.sqrt(sq) * 0.5, 10);
      const c = 0.5 * Math.min(0.5 / (norm + 1e-6), 1);
      const sqrtBc2 = Math.sqrt(1 - 0.95 ** t);
      const s = f((lr * sqrtBc2) / (1 - 0.9 ** t));
      const eps = f(sqrtBc2 * 1e-8);
      const k1 = f(c * (1 - 0.9));
      const k2 = f(c * c * (1 - 0.95));
      PARAMS.forEach((p, k) => {
        const d = p.decay ? f(1 - lr * 0.1) : 1;
        const g = grads.get(p.name)!;
        const e = emu[k];
        for (let i = 0; i < p.numel; i++) {
          e.m[i] = f(f(e.m[i] * f(0.9)) + f(g[i] * k1));
          e.v[i] = f(f(e.v[i] * f(0.95)) + f(f(g[i] * g[i]) * k2));
          e.p[i] = f(f(e.p[i] * d) - f(f(e.m[i] * s) / f(f(Math.sqrt(e.v[i])) + eps)));
        }
      });
    }
    PARAMS.forEach((p, k) => {
      expect(Array.from(host.param(p.name)), p.name).toEqual(Array.from(emu[k].p));
      expect(Array.from(host.state('m', p.name))).toEqual(Array.from(emu[k].m));
      expect(Array.from(host.state('v', p.name))).toEqual(Array.from(emu[k].v));
    });
  });

  it.each([null, 2])('stays within 2e-5 of the float64 reference over 100 steps (max_grad_norm %s)', (maxGradNorm) => {
    const host = HostAdamW.create(PARAMS, config(maxGradNorm))!;
    const normal = gaussian(rng(7));
    const ref = new RefAdamW(
      PARAMS.map((p) => ({ value: new Float64Array(p.numel), decay: p.decay })),
      { beta1: 0.9, beta2: 0.95, eps: 1e-8, weightDecay: 0.1, maxGradNorm },
    );
    const initial = PARAMS.map((p) => Float32Array.from({ length: p.numel }, normal));
    PARAMS.forEach((p, k) => {
      host.param(p.name).set(initial[k]);
      ref.params[k].value.set(initial[k]);
    });
    const sched = { type: 'cosine' as const, lr: 0.05, warmupSteps: 10, totalSteps: 100 };
    let clipped = 0;
    for (let t = 1; t <= 100; t++) {
      const grads = randomGrads(normal, 0.5);
      const lr = lrAt(t, sched);
      const norm = host.update(grads, t, lr, 0.8);
      const refNorm = ref.step(PARAMS.map((p) => Float64Array.from(grads.get(p.name)!)), lr, 0.8);
      expect(Math.abs(norm - refNorm) / refNorm).toBeLessThan(1e-12);
      if (maxGradNorm !== null && refNorm > maxGradNorm) clipped++;
    }
    if (maxGradNorm !== null) expect(clipped).toBeGreaterThan(50);
    // Float32 storage: each step rounds p (relative 6e-8) and its update; over 100 steps of size
    // ≤ lr the drift stays near 1e-6 absolute, so the bar is relative above 0.05 and absolute below.
    let worst = 0;
    let moved = 0;
    PARAMS.forEach((p, k) => {
      const a = host.param(p.name);
      const b = ref.params[k].value;
      for (let i = 0; i < p.numel; i++) {
        worst = Math.max(worst, Math.abs(a[i] - b[i]) / Math.max(Math.abs(b[i]), 0.05));
        moved = Math.max(moved, Math.abs(b[i] - initial[k][i]));
      }
    });
    expect(worst).toBeLessThan(2e-5);
    expect(moved).toBeGreaterThan(0.1);
  });

  it('agrees with the ONNX optimizer graph (float32) to float32 rounding', async () => {
    const cfg = config(1);
    const opt = buildOptimizerGraph(PARAMS.map((p) => ({ name: p.name, shape: [p.numel], decay: p.decay })), cfg, 'float32');
    const session = await Session.create(serializeModel(opt.graph), { threads: 1 });
    const host = HostAdamW.create(PARAMS, cfg)!;
    const normal = gaussian(rng(5));
    const state = new Map<string, Float32Array>();
    for (const p of PARAMS) {
      const init = Float32Array.from({ length: p.numel }, normal);
      host.param(p.name).set(init);
      state.set(p.name, Float32Array.from(init));
      state.set(stateName('m', p.name), new Float32Array(p.numel));
      state.set(stateName('v', p.name), new Float32Array(p.numel));
    }
    for (let t = 1; t <= 20; t++) {
      const grads = randomGrads(normal, 1);
      const feeds: Feeds = {
        [OPTIM_IO.step]: toOrt('int64', BigInt64Array.of(BigInt(t)), []),
        [OPTIM_IO.lr]: toOrt('float32', Float32Array.of(0.01), []),
        [OPTIM_IO.gradScale]: toOrt('float32', Float32Array.of(1), []),
      };
      for (const [k, v] of state) feeds[k] = toOrt('float32', v, [v.length]);
      for (const p of PARAMS) feeds[gradName(p.name)] = toOrt('float32', grads.get(p.name)!, [p.numel]);
      const out = await session.run(feeds);
      for (const k of state.keys()) state.set(k, Float32Array.from(out[updatedName(k)].data as Float32Array));
      const norm = host.update(grads, t, 0.01, 1);
      expect(Math.abs(norm - Number(out[OPTIM_IO.gradNorm].data[0])) / norm).toBeLessThan(1e-6);
    }
    await session.release();
    let worst = 0;
    for (const p of PARAMS) {
      const a = host.param(p.name);
      const b = state.get(p.name)!;
      for (let i = 0; i < p.numel; i++) worst = Math.max(worst, Math.abs(a[i] - b[i]) / Math.max(Math.abs(b[i]), 1e-2));
    }
    expect(worst).toBeLessThan(1e-5);
  });
});
