import { describe, it, expect, afterAll } from 'vitest';
import { existsSync, mkdtempSync, readFileSync, rmSync, writeFileSync, readdirSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { buildArtifacts, TrainingArtifacts, readManifest, ARTIFACT_FILES } from '../src/artifacts/index.ts';
import { loadModel } from '../src/onnx/proto.ts';
import { writeSafetensors } from '../src/models/safetensors.ts';
import { mlpSpec, spirals, batchFeeds, range } from './mlp-spec.ts';

const root = mkdtempSync(join(tmpdir(), 'pz-art-'));
afterAll(() => rmSync(root, { recursive: true, force: true }));

const sgdSpec = (evalNeedsLabels = true) => mlpSpec({ hidden: 5, dtype: 'float64', seed: 9, optimizer: { type: 'sgd', momentum: 0.9 }, evalNeedsLabels });

/** Independent float64 forward of the fixture MLP: mean cross-entropy. */
function refLoss(p: Record<string, Float64Array>, x: Float64Array, y: Int32Array, idx: number[]): number {
  const h = p['fc1.bias'].length;
  let total = 0;
  for (const k of idx) {
    const xi = [x[2 * k] * p.input_scale[0], x[2 * k + 1] * p.input_scale[1]];
    const hid = range(0, h).map((j) => Math.max(0, xi[0] * p['fc1.weight'][j] + xi[1] * p['fc1.weight'][h + j] + p['fc1.bias'][j]));
    const z = range(0, 3).map((c) => hid.reduce((s, v, j) => s + v * p['fc2.weight'][3 * j + c], 0) + p['fc2.bias'][c]);
    const m = Math.max(...z);
    const lse = m + Math.log(z.reduce((s, v) => s + Math.exp(v - m), 0));
    total += lse - z[y[k]];
  }
  return total / idx.length;
}

describe('artifact folder', () => {
  it('writes the three graphs, a manifest and an initial checkpoint', () => {
    const dir = join(root, 'layout');
    buildArtifacts(sgdSpec(false), dir);
    for (const f of Object.values(ARTIFACT_FILES)) expect(existsSync(join(dir, f)), f).toBe(true);
    expect(readdirSync(join(dir, 'checkpoint')).sort()).toEqual(['optimizer.safetensors', 'params.safetensors', 'state.json']);
    const m = readManifest(dir);
    expect(m.params.map((p) => [p.name, p.trainable, p.decay])).toEqual([
      ['fc1.weight', true, true],
      ['fc1.bias', true, false],
      ['fc2.weight', true, true],
      ['fc2.bias', true, false],
      ['input_scale', false, false],
    ]);
    expect(m.training.outputs).toEqual(['loss', 'accuracy', 'grad.fc1.weight', 'grad.fc1.bias', 'grad.fc2.weight', 'grad.fc2.bias']);
    expect(m.training.inputs).toContain('grad_acc.fc2.bias');
    // The running sum is folded into the gradient nodes: no selector flag, zeros start a fresh sum.
    expect(m.training.inputs).not.toContain('accumulate');
    // The eval graph asked only for logits, so pruning dropped the labels input.
    expect(m.eval.inputs).toEqual(['fc1.weight', 'fc1.bias', 'fc2.weight', 'fc2.bias', 'input_scale', 'x']);
    expect(m.eval.outputs).toEqual(['logits']);
    expect(m.optimizer.stateSlots).toEqual(['momentum']);
    expect(m.loss).toEqual({ name: 'cross_entropy', params: {} });
    expect(m.modelConfig).toEqual({ arch: 'mlp', hidden: 5 });
    // Parameters are graph inputs, never initializers.
    const g = loadModel(join(dir, ARTIFACT_FILES.training)).graph;
    for (const p of m.params) expect(g.initializers.has(p.name)).toBe(false);
    expect(g.nodes.some((n) => n.op === 'ArgMax')).toBe(true);
    expect(loadModel(join(dir, ARTIFACT_FILES.eval)).graph.nodes.some((n) => n.op === 'ArgMax')).toBe(false);
  });
});

describe('training graph', () => {
  const data = spirals(10, 4);
  const idx = range(0, data.n);

  it('loss matches an independent float64 forward and gradients match central differences', async () => {
    const dir = join(root, 'fd');
    buildArtifacts(sgdSpec(), dir);
    const art = await TrainingArtifacts.load(dir);
    const params = () => Object.fromEntries(art.paramNames.map((n) => [n, Float64Array.from(art.param(n) as Float64Array)]));
    const p0 = params();
    const m = await art.computeGradients(batchFeeds(data, 'float64', idx));
    expect(m.loss).toBeCloseTo(refLoss(p0, data.x, data.y, idx), 12);
    const h = 1e-6;
    let worst = 0;
    for (const name of art.trainableNames) {
      const grad = art.store.data(`grad.${name}`) as Float64Array;
      for (let i = 0; i < grad.length; i++) {
        const plus = params();
        const minus = params();
        plus[name][i] += h;
        minus[name][i] -= h;
        const fd = (refLoss(plus, data.x, data.y, idx) - refLoss(minus, data.x, data.y, idx)) / (2 * h);
        worst = Math.max(worst, Math.abs(fd - grad[i]) / Math.max(Math.abs(fd), 1e-4));
      }
    }
    expect(worst).toBeLessThan(1e-5);
    await art.release();
  });

  it('two accumulated half-batches give the same update as one full batch', async () => {
    const dir = join(root, 'acc');
    buildArtifacts(mlpSpec({ hidden: 6, dtype: 'float64', seed: 2, optimizer: { type: 'adamw', maxGradNorm: 0.5 } }), dir);
    const full = await TrainingArtifacts.load(dir);
    const halves = await TrainingArtifacts.load(dir);
    for (let step = 0; step < 3; step++) {
      const a = await full.trainStep(batchFeeds(data, 'float64', idx), { lr: 0.01 });
      await halves.trainStep(batchFeeds(data, 'float64', idx.slice(0, 15)), { lr: 0.01, accumulate: true });
      const b = await halves.trainStep(batchFeeds(data, 'float64', idx.slice(15)), { lr: 0.01 });
      expect(b.grad_norm).toBeCloseTo(a.grad_norm, 12);
    }
    for (const n of full.trainableNames) {
      const x = full.param(n) as Float64Array;
      const y = halves.param(n) as Float64Array;
      x.forEach((v, i) => expect(Math.abs(v - y[i])).toBeLessThan(1e-12));
    }
    // Without the accumulate flag the first half's gradients are dropped, which changes the result.
    const dropped = await TrainingArtifacts.load(dir);
    await dropped.computeGradients(batchFeeds(data, 'float64', idx.slice(0, 15)));
    await dropped.optimizerStep(0.01);
    expect(Array.from(dropped.param('fc1.weight') as ArrayLike<number>)).not.toEqual(Array.from(halves.param('fc1.weight') as ArrayLike<number>));
    await Promise.all([full.release(), halves.release(), dropped.release()]);
  });

  it('pre-allocated output buffers and adopted outputs train bit-identically; pre-allocated storage never moves', async () => {
    const dir = join(root, 'modes');
    buildArtifacts(mlpSpec({ hidden: 8, dtype: 'float32', seed: 6, optimizer: { type: 'adamw' } }), dir);
    const a = await TrainingArtifacts.load(dir, {}, { outputMode: 'adopt' });
    const b = await TrainingArtifacts.load(dir, {}, { outputMode: 'preallocated' });
    const buffers = new Set(b.trainableNames.map((n) => b.param(n).buffer));
    for (let s = 0; s < 6; s++) {
      const feeds = batchFeeds(data, 'float32', idx.slice(s * 5, s * 5 + 10));
      await a.trainStep(feeds, { lr: 0.01 });
      await b.trainStep(feeds, { lr: 0.01 });
    }
    for (const n of a.paramNames) expect(Array.from(b.param(n) as ArrayLike<number>), n).toEqual(Array.from(a.param(n) as ArrayLike<number>));
    // Double buffering: after an even number of steps each parameter is back in its first buffer.
    for (const n of b.trainableNames) expect(buffers.has(b.param(n).buffer)).toBe(true);
    await Promise.all([a.release(), b.release()]);
  });
});

describe('checkpoints', () => {
  it('overwrites atomically and rejects a checkpoint that does not fit the artifacts', async () => {
    const dir = join(root, 'ck');
    buildArtifacts(sgdSpec(), dir);
    const art = await TrainingArtifacts.load(dir);
    const ck = join(root, 'ck-out');
    await art.trainStep(batchFeeds(spirals(4, 1), 'float64', range(0, 12)), { lr: 0.1 });
    art.saveCheckpoint(ck, { epoch: 1 });
    await art.trainStep(batchFeeds(spirals(4, 1), 'float64', range(0, 12)), { lr: 0.1 });
    art.saveCheckpoint(ck, { epoch: 2 });
    expect(existsSync(`${ck}.tmp`)).toBe(false);
    expect(existsSync(`${ck}.old`)).toBe(false);
    expect(JSON.parse(readFileSync(join(ck, 'state.json'), 'utf8'))).toEqual({ epoch: 2, step: 2 });

    // A crash after moving the old checkpoint aside but before the rename still loads.
    const crashed = join(root, 'crashed');
    const saved = Float64Array.from(art.param('fc1.weight') as Float64Array);
    art.saveCheckpoint(`${crashed}.old`, { epoch: 3 });
    await art.trainStep(batchFeeds(spirals(4, 1), 'float64', range(0, 12)), { lr: 0.1 });
    expect([...(art.param('fc1.weight') as Float64Array)]).not.toEqual([...saved]);
    expect(art.loadCheckpoint(crashed).epoch).toBe(3);
    // Read straight into the store's memory: the values are the saved ones.
    expect([...(art.param('fc1.weight') as Float64Array)]).toEqual([...saved]);

    writeSafetensors(join(ck, 'params.safetensors'), { 'fc1.weight': { dtype: 'F64', shape: [3, 5], data: new Float64Array(15) } });
    expect(() => art.loadCheckpoint(ck)).toThrow(/fc1\.weight.*F64\[3,5\].*F64\[2,5\]/);
    writeSafetensors(join(ck, 'params.safetensors'), { 'fc1.weight': { dtype: 'F64', shape: [2, 5], data: new Float64Array(10) } });
    expect(() => art.loadCheckpoint(ck)).toThrow(/params\.safetensors: tensor "[^"]+" is missing/);
    writeFileSync(join(ck, 'state.json'), '{"step": -1}');
    expect(() => art.loadCheckpoint(ck)).toThrow(/state\.json.*step/);
    await expect(art.evaluate({})).rejects.toThrow(/batch input "x" is missing/);
    await art.release();
  });
});
