import { describe, it, expect } from 'vitest';
import { buildOptimizerGraph, type OptimizerConfig, type OptimDType, type OptimParam, gradName, OPTIM_IO, stateSlots, stateName, defaultDecay } from '../src/optim/index.ts';
import { serializeModel } from '../src/onnx/proto.ts';
import { Session, toOrt } from '../src/runtime/session.ts';
import { TensorStore, type OutputMode } from '../src/runtime/store.ts';
import { lrAt, type LrScheduleConfig } from '../src/optim/schedule.ts';
import { RefAdamW, RefSGD, rng, gaussian, type RefParam } from './optim-reference.ts';

const SPECS: OptimParam[] = [
  { name: 'layer.weight', shape: [7, 5] },
  { name: 'layer.bias', shape: [5], decay: false },
  { name: 'norm.weight', shape: [3, 4, 2], decay: false },
  { name: 'head.weight', shape: [6, 3] },
];

const numel = (s: number[]) => s.reduce((a, b) => a * b, 1);

interface RunResult {
  params: Float64Array[];
  refParams: Float64Array[];
  norms: number[];
  refNorms: number[];
}

/** Runs `steps` updates of the ONNX optimizer and of the float64 reference on the same random gradients. */
async function runBoth(
  config: OptimizerConfig,
  dtype: OptimDType,
  makeRef: (params: RefParam[]) => { step(g: Float64Array[], lr: number, scale: number): number },
  o: { steps?: number; gradScale?: number; mode?: OutputMode; seed?: number } = {},
): Promise<RunResult> {
  const steps = o.steps ?? 100;
  const gradScale = o.gradScale ?? 1;
  const opt = buildOptimizerGraph(SPECS, config, dtype);
  const session = await Session.create(serializeModel(opt.graph), { threads: 1 });
  const normal = gaussian(rng(o.seed ?? 7));
  const store = new TensorStore(o.mode ?? 'adopt');
  const refParams: RefParam[] = [];
  for (const p of SPECS) {
    const init = Float64Array.from({ length: numel(p.shape) }, normal);
    // The float32 graph starts from the float32-rounded values, so both sides start equal.
    if (dtype === 'float32') init.set(Float32Array.from(init));
    store.define(p.name, dtype, p.shape, init);
    for (const s of stateSlots(opt.config)) store.define(stateName(s, p.name), dtype, p.shape);
    refParams.push({ value: init, decay: p.decay ?? true });
  }
  const ref = makeRef(refParams);
  const sched: LrScheduleConfig = { type: 'cosine', lr: 0.05, warmupSteps: Math.min(10, steps), totalSteps: steps };
  const norms: number[] = [];
  const refNorms: number[] = [];
  const updates = opt.params.flatMap((p) => [[p.output, p.name] as const, ...p.state.map((s) => [s.output, s.input] as const)]);
  const F = dtype === 'float32' ? Float32Array : Float64Array;
  for (let t = 1; t <= steps; t++) {
    // Gradients with a spread of scales so clipping and ε both matter.
    const grads = SPECS.map((p, k) => Float64Array.from({ length: numel(p.shape) }, () => normal() * (k + 1) * 0.5));
    if (dtype === 'float32') grads.forEach((g) => g.set(Float32Array.from(g)));
    const lr = lrAt(t, sched);
    const feeds: Record<string, ReturnType<typeof toOrt>> = {
      [OPTIM_IO.step]: toOrt('int64', BigInt64Array.from([BigInt(t)]), []),
      [OPTIM_IO.lr]: toOrt(dtype, F.from([lr]), []),
      [OPTIM_IO.gradScale]: toOrt(dtype, F.from([gradScale]), []),
    };
    for (const name of store.names()) feeds[name] = store.tensor(name);
    SPECS.forEach((p, k) => (feeds[gradName(p.name)] = toOrt(dtype, F.from(grads[k]), p.shape)));
    const out = await store.run(session, feeds, updates, [OPTIM_IO.gradNorm]);
    norms.push(Number((out[OPTIM_IO.gradNorm].data as Float64Array)[0]));
    refNorms.push(ref.step(grads, lr, gradScale));
  }
  const params = SPECS.map((p) => Float64Array.from(store.data(p.name) as Float64Array));
  await session.release();
  return { params, refParams: refParams.map((p) => p.value), norms, refNorms };
}

const flat = (xs: (Float64Array | number)[]) => xs.flatMap((x) => (typeof x === 'number' ? [x] : Array.from(x)));

/** Largest |a − b| / max(|b|, floor) over all elements. */
function maxRel(a: (Float64Array | number)[], b: (Float64Array | number)[], floor = 1e-3): number {
  const fa = flat(a);
  const fb = flat(b);
  expect(fa.length).toBe(fb.length);
  let m = 0;
  for (let i = 0; i < fa.length; i++) m = Math.max(m, Math.abs(fa[i] - fb[i]) / Math.max(Math.abs(fb[i]), floor));
  return m;
}

const adamw = (c: { weightDecay?: number; maxGradNorm?: number | null }): OptimizerConfig => ({
  type: 'adamw',
  betas: [0.9, 0.95],
  eps: 1e-8,
  weightDecay: c.weightDecay ?? 0.1,
  maxGradNorm: c.maxGradNorm ?? null,
});

const refAdamW = (c: { weightDecay?: number; maxGradNorm?: number | null }) => (ps: RefParam[]) =>
  new RefAdamW(ps, { beta1: 0.9, beta2: 0.95, eps: 1e-8, weightDecay: c.weightDecay ?? 0.1, maxGradNorm: c.maxGradNorm ?? null });

describe('AdamW graph', () => {
  it('100 float64 steps match the float64 reference to 1e-6 relative (decay mask, cosine+warmup lr)', async () => {
    const r = await runBoth(adamw({}), 'float64', refAdamW({}));
    expect(maxRel(r.params, r.refParams)).toBeLessThan(1e-6);
    expect(maxRel(r.norms, r.refNorms)).toBeLessThan(1e-12);
    // The run must actually have moved the parameters, or the comparison proves nothing.
    const init = await runBoth(adamw({}), 'float64', refAdamW({}), { steps: 1 });
    expect(maxRel(r.params, init.params)).toBeGreaterThan(1e-2);
  });

  it('with global-norm clipping active and a gradient scale: params and pre-clip grad_norm match', async () => {
    const r = await runBoth(adamw({ maxGradNorm: 1.0 }), 'float64', refAdamW({ maxGradNorm: 1.0 }), { gradScale: 0.5 });
    expect(Math.min(...r.refNorms)).toBeGreaterThan(1.0); // clipping was active on every step
    expect(maxRel(r.params, r.refParams)).toBeLessThan(1e-6);
    expect(maxRel(r.norms, r.refNorms)).toBeLessThan(1e-12);
  });

  it('differs from the reference when the decay mask is ignored (the test can fail)', async () => {
    const r = await runBoth(adamw({}), 'float64', (ps) => refAdamW({})(ps.map((p) => ({ ...p, decay: true }))), { steps: 30 });
    expect(maxRel(r.params, r.refParams)).toBeGreaterThan(1e-4);
  });

  it('float32 graph stays within 2e-5 relative of the float64 reference over 100 steps', async () => {
    const r = await runBoth(adamw({ maxGradNorm: 2 }), 'float32', refAdamW({ maxGradNorm: 2 }));
    expect(maxRel(r.params, r.refParams)).toBeLessThan(2e-5);
  });

  it('pre-allocated output buffers give bit-identical results to adopted outputs', async () => {
    const a = await runBoth(adamw({}), 'float32', refAdamW({}), { steps: 20, mode: 'adopt' });
    const b = await runBoth(adamw({}), 'float32', refAdamW({}), { steps: 20, mode: 'preallocated' });
    a.params.forEach((p, k) => expect(Array.from(b.params[k])).toEqual(Array.from(p)));
  });
});

describe('SGD graph', () => {
  const sgd = (momentum: number, nesterov: boolean, weightDecay: number, maxGradNorm: number | null) => ({
    graph: { type: 'sgd', momentum, nesterov, weightDecay, maxGradNorm } as const,
    ref: (ps: RefParam[]) => new RefSGD(ps, { momentum, nesterov, weightDecay, maxGradNorm }),
  });

  for (const [label, c] of [
    ['momentum 0.9 + weight decay', sgd(0.9, false, 0.01, null)],
    ['nesterov + clipping', sgd(0.8, true, 0.05, 3.0)],
    ['plain SGD (no state)', sgd(0, false, 0, null)],
  ] as const) {
    it(`${label}: 100 float64 steps match the reference to 1e-6`, async () => {
      const r = await runBoth(c.graph, 'float64', c.ref);
      expect(maxRel(r.params, r.refParams)).toBeLessThan(1e-6);
      expect(maxRel(r.norms, r.refNorms)).toBeLessThan(1e-12);
    });
  }
});

describe('optimizer graph interface', () => {
  it('names inputs and outputs by the documented convention', () => {
    const opt = buildOptimizerGraph([{ name: 'w', shape: [2] }], { type: 'adamw' });
    expect(opt.graph.inputs.map((i) => i.name)).toEqual(['w', 'grad.w', 'm.w', 'v.w', 'step', 'lr', 'grad_scale']);
    expect(opt.graph.outputs.map((o) => o.name).sort()).toEqual(['grad_norm', 'new.m.w', 'new.v.w', 'new.w']);
  });

  it('rejects bad hyper-parameters with a message naming them', () => {
    expect(() => buildOptimizerGraph([{ name: 'w', shape: [2] }], { type: 'adamw', betas: [1.2, 0.9] })).toThrow(/beta1/);
    expect(() => buildOptimizerGraph([{ name: 'w', shape: [2] }], { type: 'sgd', momentum: 0, nesterov: true })).toThrow(/nesterov/);
    expect(() => buildOptimizerGraph([{ name: 'w', shape: [2] }], { type: 'adamw', eps: -1 })).toThrow(/eps/);
  });
});

describe('default decay mask', () => {
  it('decays matrices, not biases, norms or vectors', () => {
    expect(defaultDecay('model.layers.0.mlp.up_proj.weight', [8, 4])).toBe(true);
    expect(defaultDecay('model.embed_tokens.weight', [100, 4])).toBe(true);
    expect(defaultDecay('model.layers.0.input_layernorm.weight', [4])).toBe(false);
    expect(defaultDecay('transformer.h.0.ln_1.weight', [4])).toBe(false);
    expect(defaultDecay('model.norm.weight', [4, 1])).toBe(false);
    expect(defaultDecay('lm_head.bias', [4, 1])).toBe(false);
  });
});

describe('lr schedules', () => {
  it('constant with warmup', () => {
    const c: LrScheduleConfig = { type: 'constant', lr: 0.1, warmupSteps: 4 };
    [0.025, 0.05, 0.075, 0.1, 0.1, 0.1].forEach((v, i) => expect(lrAt([1, 2, 3, 4, 5, 1000][i], c)).toBeCloseTo(v, 15));
  });

  it('linear decay to zero at total_steps, with a floor ratio', () => {
    const c: LrScheduleConfig = { type: 'linear', lr: 1, warmupSteps: 10, totalSteps: 110 };
    expect(lrAt(5, c)).toBeCloseTo(0.5, 15);
    expect(lrAt(10, c)).toBe(1);
    expect(lrAt(60, c)).toBeCloseTo(0.5, 15); // halfway through decay
    expect(lrAt(110, c)).toBe(0);
    expect(lrAt(200, c)).toBe(0);
    expect(lrAt(60, { ...c, minLrRatio: 0.2 })).toBeCloseTo(0.2 + 0.8 * 0.5, 15);
  });

  it('cosine: half at the midpoint, known values at quarter points', () => {
    const c: LrScheduleConfig = { type: 'cosine', lr: 2, warmupSteps: 0, totalSteps: 100 };
    expect(lrAt(50, c)).toBeCloseTo(1, 14);
    expect(lrAt(25, c)).toBeCloseTo(1 + Math.SQRT1_2, 14); // 2·½(1 + cos π/4)
    expect(lrAt(75, c)).toBeCloseTo(1 - Math.SQRT1_2, 14);
    expect(lrAt(100, c)).toBeCloseTo(0, 15);
    expect(lrAt(100, { ...c, minLrRatio: 0.1 })).toBeCloseTo(0.2, 14);
    expect(lrAt(3, { ...c, warmupSteps: 6 })).toBeCloseTo(1, 15);
  });

  it('rejects incomplete schedules', () => {
    expect(() => lrAt(1, { type: 'cosine', lr: 1 })).toThrow(/total_steps/);
    expect(() => lrAt(1, { type: 'linear', lr: 1, warmupSteps: 20, totalSteps: 10 })).toThrow(/warmup_steps/);
  });
});
