import { describe, it, expect, afterAll } from 'vitest';
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { buildArtifacts, TrainingArtifacts, readManifest } from '../src/artifacts/index.ts';
import { prepareBench } from '../scripts/bench/step.ts';
import { collate } from '../src/models/batch.ts';
import { toOrt } from '../src/runtime/session.ts';
import { mlpSpec, spirals, batchFeeds, range } from './mlp-spec.ts';

const root = mkdtempSync(join(tmpdir(), 'pz-fused-'));
afterAll(() => rmSync(root, { recursive: true, force: true }));

const data = spirals(10, 5);
const idx = range(0, data.n);

/** Largest |a − b| / max(|b|, floor) over every trainable parameter and optimizer state of two runners. */
function maxRelDiff(a: TrainingArtifacts, b: TrainingArtifacts, floor: number): number {
  let worst = 0;
  const names = [...a.trainableNames, ...a.store.names().filter((n) => /^(m|v|momentum)\./.test(n))];
  for (const n of names) {
    const x = a.store.data(n) as Float64Array;
    const y = b.store.data(n) as Float64Array;
    for (let i = 0; i < x.length; i++) worst = Math.max(worst, Math.abs(x[i] - y[i]) / Math.max(Math.abs(y[i]), floor));
  }
  return worst;
}

describe('fused training step', () => {
  it('takes the same steps as the training graph followed by the optimizer graph', async () => {
    const dir = join(root, 'mlp');
    buildArtifacts(mlpSpec({ hidden: 6, dtype: 'float64', seed: 3, optimizer: { type: 'adamw', maxGradNorm: 0.5, weightDecay: 0.01 } }), dir);
    const m = readManifest(dir);
    expect(m.step!.inputs.some((n) => n.startsWith('grad_acc.') || n.startsWith('grad.'))).toBe(false);
    expect(m.step!.outputs).toEqual(expect.arrayContaining(['loss', 'accuracy', 'grad_norm', 'new.fc1.weight']));
    expect(m.step!.outputs.some((n) => n.startsWith('grad.'))).toBe(false);
    for (const mode of ['adopt', 'preallocated'] as const) {
      const fused = await TrainingArtifacts.load(dir, {}, { outputMode: mode });
      const split = await TrainingArtifacts.load(dir, {}, { outputMode: mode });
      for (let s = 0; s < 4; s++) {
        const batch = batchFeeds(data, 'float64', idx.slice(s * 5, s * 5 + 20));
        const a = await fused.trainStep(batch, { lr: 0.05 });
        const g = await split.computeGradients(batch);
        const { gradNorm } = await split.optimizerStep(0.05);
        expect(a.loss).toBeCloseTo(g.loss, 12);
        expect(a.grad_norm).toBeCloseTo(gradNorm, 12);
      }
      expect(fused.step).toBe(4);
      expect(maxRelDiff(fused, split, 1e-8)).toBeLessThan(1e-10);
      await Promise.all([fused.release(), split.release()]);
    }
  });

  it('keeps parameters, optimizer state and the step count when the loss is not finite', async () => {
    const dir = join(root, 'nan');
    buildArtifacts(mlpSpec({ hidden: 4, dtype: 'float32', seed: 4, optimizer: { type: 'adamw' } }), dir);
    for (const [mode, update] of [['adopt', 'graph'], ['preallocated', 'graph'], ['adopt', 'host']] as const) {
      const art = await TrainingArtifacts.load(dir, {}, { outputMode: mode, update });
      await art.trainStep(batchFeeds(data, 'float32', idx), { lr: 0.01 });
      const before = new Map(art.store.names().filter((n) => !n.startsWith('grad.')).map((n) => [n, Float32Array.from(art.store.data(n) as Float32Array)]));
      const bad = batchFeeds(data, 'float32', idx);
      (bad.x.data as Float32Array)[0] = NaN;
      const m = await art.trainStep(bad, { lr: 0.01 });
      expect(Number.isFinite(m.loss)).toBe(false);
      expect(art.step).toBe(1);
      for (const [n, v] of before) expect(Array.from(art.store.data(n) as Float32Array), n).toEqual(Array.from(v));
      // The runner still trains afterwards.
      const ok = await art.trainStep(batchFeeds(data, 'float32', idx), { lr: 0.01 });
      expect(Number.isFinite(ok.loss)).toBe(true);
      expect(art.step).toBe(2);
      await art.release();
    }
  });

  it('trains the bench llama (DPO, float32) like the two-graph path', async () => {
    const setup = prepareBench(join(root, 'llama'), 'tiny', 2, 16);
    const load = async () => {
      const art = await TrainingArtifacts.load(setup.artDir, {}, { checkpoint: false, update: 'graph' });
      expect(art.updater).toBe('graph');
      for (const [name, value] of setup.initial) art.setParam(name, value);
      return art;
    };
    const fused = await load();
    const split = await load();
    const c = collate(setup.rows, { kind: 'pairwise', padTo: 8, padId: setup.padId, dtype: 'float32', refLogps: () => [-40, -41], packed: setup.packed });
    c.feeds.ref_logps = toOrt('float32', Float32Array.from([-40, -41, -40.5, -41.5]), [4]);
    for (let s = 0; s < 3; s++) {
      const a = await fused.trainStep(c.feeds, { lr: 1e-3 });
      const g = await split.computeGradients(c.feeds);
      const { gradNorm } = await split.optimizerStep(1e-3);
      expect(Math.abs(a.loss - g.loss)).toBeLessThan(1e-5);
      expect(Math.abs(a.grad_norm - gradNorm) / gradNorm).toBeLessThan(1e-4);
    }
    let worst = 0;
    for (const n of fused.trainableNames) {
      const x = fused.param(n) as Float32Array;
      const y = split.param(n) as Float32Array;
      for (let i = 0; i < x.length; i++) worst = Math.max(worst, Math.abs(x[i] - y[i]));
    }
    // Three AdamW steps of size ≤ lr: the runs agree far below one step.
    expect(worst).toBeLessThan(1e-5);
    await Promise.all([fused.release(), split.release()]);
  });

  it('the in-process AdamW update trains the bench llama like the fused graph', async () => {
    const setup = prepareBench(join(root, 'llama-host'), 'tiny', 2, 16);
    const load = async (update: 'graph' | 'host') => {
      const art = await TrainingArtifacts.load(setup.artDir, {}, { checkpoint: false, update });
      expect(art.updater).toBe(update);
      for (const [name, value] of setup.initial) art.setParam(name, value);
      return art;
    };
    const graph = await load('graph');
    const host = await load('host');
    const c = collate(setup.rows, { kind: 'pairwise', padTo: 8, padId: setup.padId, dtype: 'float32', refLogps: () => [-40, -41], packed: setup.packed });
    c.feeds.ref_logps = toOrt('float32', Float32Array.from([-40, -41, -40.5, -41.5]), [4]);
    for (let s = 0; s < 3; s++) {
      const a = await graph.trainStep(c.feeds, { lr: 1e-3 });
      const b = await host.trainStep(c.feeds, { lr: 1e-3 });
      expect(Math.abs(a.loss - b.loss)).toBeLessThan(1e-5);
      expect(Math.abs(a.grad_norm - b.grad_norm) / a.grad_norm).toBeLessThan(1e-4);
    }
    expect(host.step).toBe(3);
    let worst = 0;
    let moved = 0;
    for (const n of graph.trainableNames) {
      const x = graph.param(n) as Float32Array;
      const y = host.param(n) as Float32Array;
      const start = setup.initial.get(n)!;
      for (let i = 0; i < x.length; i++) {
        worst = Math.max(worst, Math.abs(x[i] - y[i]));
        moved = Math.max(moved, Math.abs(y[i] - Number(start[i])));
      }
    }
    expect(worst).toBeLessThan(1e-5);
    expect(moved).toBeGreaterThan(1e-3);
    // Checkpoints hold the same tensors whichever way the update ran.
    host.saveCheckpoint(join(root, 'host-ckpt'));
    const back = await TrainingArtifacts.load(setup.artDir, {}, { checkpoint: join(root, 'host-ckpt'), update: 'graph' });
    for (const n of host.trainableNames) expect(Array.from(back.param(n) as Float32Array)).toEqual(Array.from(host.param(n) as Float32Array));
    expect(back.step).toBe(3);
    await Promise.all([graph.release(), host.release(), back.release()]);
  });

  it('refuses the in-process update where it cannot run, with the reason', async () => {
    const dir = join(root, 'sgd');
    buildArtifacts(mlpSpec({ hidden: 4, dtype: 'float32', seed: 4, optimizer: { type: 'sgd' } }), dir);
    await expect(TrainingArtifacts.load(dir, {}, { update: 'host' })).rejects.toThrow(/cannot run here: optimizer sgd/);
    const auto = await TrainingArtifacts.load(dir, {});
    expect(auto.updater).toBe('graph');
    await auto.release();
  });
});
