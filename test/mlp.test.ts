import { describe, it, expect, afterAll } from 'vitest';
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { buildArtifacts, TrainingArtifacts } from '../src/artifacts/index.ts';
import { lrAt, type LrScheduleConfig } from '../src/optim/index.ts';
import { mlpSpec, spirals, batchFeeds, range } from './mlp-spec.ts';
import { rng } from './optim-reference.ts';

const root = mkdtempSync(join(tmpdir(), 'pz-mlp-'));
afterAll(() => rmSync(root, { recursive: true, force: true }));

/** Fisher–Yates with a seeded PRNG. */
function shuffled(n: number, r: () => number): number[] {
  const a = range(0, n);
  for (let i = n - 1; i > 0; i--) {
    const j = Math.floor(r() * (i + 1));
    [a[i], a[j]] = [a[j], a[i]];
  }
  return a;
}

describe('MLP trained only through the artifacts (training graph + optimizer graph on ORT)', () => {
  it('reaches ≥ 95% accuracy on held-out spiral points', async () => {
    const dir = join(root, 'learn');
    buildArtifacts(mlpSpec({ hidden: 64, dtype: 'float32', seed: 1, optimizer: { type: 'adamw', weightDecay: 1e-4, maxGradNorm: 5 } }), dir);
    const art = await TrainingArtifacts.load(dir, { threads: 1 });
    const train = spirals(300, 11);
    const test = spirals(200, 12);
    const all = range(0, test.n);
    const heldOut = async () => {
      const out = await art.evaluate(batchFeeds(test, 'float32', all));
      const logits = out.logits.data as Float32Array;
      let correct = 0;
      for (let i = 0; i < test.n; i++) {
        const row = [logits[3 * i], logits[3 * i + 1], logits[3 * i + 2]];
        if (row.indexOf(Math.max(...row)) === test.y[i]) correct++;
      }
      return { acc: correct / test.n, metric: Number(out.accuracy.data[0]) };
    };
    const before = await heldOut();
    expect(before.acc).toBeLessThan(0.7);

    const epochs = 60;
    const batch = 100;
    const steps = epochs * (train.n / batch);
    const sched: LrScheduleConfig = { type: 'cosine', lr: 0.02, warmupSteps: 20, totalSteps: steps };
    const r = rng(5);
    let firstLoss = NaN;
    let lastLoss = NaN;
    for (let e = 0; e < epochs; e++) {
      const order = shuffled(train.n, r);
      for (let s = 0; s < train.n; s += batch) {
        const m = await art.trainStep(batchFeeds(train, 'float32', order.slice(s, s + batch)), { lr: lrAt(art.step + 1, sched) });
        if (Number.isNaN(firstLoss)) firstLoss = m.loss;
        lastLoss = m.loss;
        expect(Number.isFinite(m.grad_norm)).toBe(true);
      }
    }
    expect(art.step).toBe(steps);
    expect(lastLoss).toBeLessThan(firstLoss / 5);
    const after = await heldOut();
    expect(after.acc).toBeGreaterThanOrEqual(0.95);
    // The graph's own accuracy metric agrees with the JS count from the logits.
    expect(after.metric).toBeCloseTo(after.acc, 6);
    await art.release();
  });

  it('checkpoint round trip continues training bit-identically (10 steps vs 5 + save/load + 5)', async () => {
    const dir = join(root, 'ckpt');
    buildArtifacts(mlpSpec({ hidden: 16, dtype: 'float32', seed: 3, optimizer: { type: 'adamw', maxGradNorm: 1 } }), dir);
    const data = spirals(40, 21);
    const batches = range(0, 10).map((k) => batchFeeds(data, 'float32', range((k * 12) % 108, ((k * 12) % 108) + 12)));
    const sched: LrScheduleConfig = { type: 'linear', lr: 0.05, warmupSteps: 3, totalSteps: 10 };

    const straight = await TrainingArtifacts.load(dir);
    for (const b of batches) await straight.trainStep(b, { lr: lrAt(straight.step + 1, sched) });

    const first = await TrainingArtifacts.load(dir);
    for (const b of batches.slice(0, 5)) await first.trainStep(b, { lr: lrAt(first.step + 1, sched) });
    const ck = join(root, 'ckpt-run', 'checkpoint-5');
    first.saveCheckpoint(ck, { epoch: 0, rng: [1, 2, 3], dataCursor: { index: 5 }, config: { lr: 0.05 } });
    await first.release();

    const resumed = await TrainingArtifacts.load(dir, {}, { checkpoint: ck });
    expect(resumed.step).toBe(5);
    const state = resumed.loadCheckpoint(ck);
    expect(state).toMatchObject({ step: 5, epoch: 0, rng: [1, 2, 3], dataCursor: { index: 5 } });
    for (const b of batches.slice(5)) await resumed.trainStep(b, { lr: lrAt(resumed.step + 1, sched) });

    for (const name of straight.paramNames) {
      expect(Array.from(resumed.param(name) as ArrayLike<number>), name).toEqual(Array.from(straight.param(name) as ArrayLike<number>));
    }
    // And training did change the trainable parameters relative to the initial checkpoint.
    const fresh = await TrainingArtifacts.load(dir);
    expect(Array.from(fresh.param('fc1.weight') as ArrayLike<number>)).not.toEqual(Array.from(straight.param('fc1.weight') as ArrayLike<number>));
    expect(Array.from(fresh.param('input_scale') as ArrayLike<number>)).toEqual(Array.from(straight.param('input_scale') as ArrayLike<number>));
    await Promise.all([straight.release(), resumed.release(), fresh.release()]);
  });
});
