/**
 * A training forward built in pieces keeps ONNX Runtime's arena for its gradient sessions (issue 46):
 * every piece under glibc's 32 MiB mmap bound, the arena reuses its regions from piece to piece, where
 * without it glibc's heap held four times the live tensors. The manifest says so (`inPieces`) only for
 * a graph that was cut; the training artifacts then open the training and fused-step graphs without
 * `arena: false` under the memory-saving runtime, the optimizer graph with it, let each go after its
 * run and open it again for the next; and the step gives the loss and gradients of the graph built whole.
 */
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { afterAll, afterEach, describe, expect, it, vi } from 'vitest';
import { buildArtifacts } from '../src/artifacts/build.ts';
import { ARTIFACT_FILES, readManifest } from '../src/artifacts/manifest.ts';
import { TrainingArtifacts } from '../src/artifacts/training.ts';
import { parseConfig } from '../src/models/config.ts';
import { initWeights } from '../src/models/init.ts';
import { batchShapeOf, collate } from '../src/models/batch.ts';
import { type BatchShape, buildSpec } from '../src/train/graph.ts';
import { resolveLoss } from '../losses/index.ts';
import { benchPairs } from '../scripts/bench/step.ts';
import { type RuntimeOptions, Session } from '../src/runtime/session.ts';
import { LOW_MEMORY_RUNTIME } from '../src/train/run.ts';
import { gradName } from '../src/optim/config.ts';
import { worst } from './helpers/model-fixtures.ts';

const root = fs.mkdtempSync(path.join(os.tmpdir(), 'pz-seq-arena-'));
afterAll(() => fs.rmSync(root, { recursive: true, force: true }));
afterEach(() => vi.restoreAllMocks());

const config = parseConfig({ model_type: 'qwen2', vocab_size: 96, hidden_size: 16, intermediate_size: 24, num_hidden_layers: 2, num_attention_heads: 4, num_key_value_heads: 2, max_position_embeddings: 64, tie_word_embeddings: true });
const rows = benchPairs(config.vocab_size, 2, 24);
const batch = collate(rows, { kind: 'pairwise', padTo: 8, padId: 0, dtype: 'float32', packed: true, refLogps: () => [-3, -4] });

/** Artifacts for the tiny model under recomputation, built for `longest` (undefined: whole). */
function build(name: string, longest?: BatchShape): string {
  const dir = path.join(root, name);
  const spec = buildSpec({ config, kind: 'pairwise', loss: resolveLoss('dpo'), lora: null, valueHead: false, dataKeys: new Set(), packed: true, recompute: true, baseDtype: 'float32', longest }, initWeights(config, 4), { type: 'adamw', betas: [0.9, 0.999], eps: 1e-8, weightDecay: 0, maxGradNorm: 1 });
  buildArtifacts(spec, dir);
  return dir;
}

/** The runtime each graph file was opened with. */
function watchCreate(): Map<string, RuntimeOptions[]> {
  const calls = new Map<string, RuntimeOptions[]>();
  const create = Session.create.bind(Session);
  vi.spyOn(Session, 'create').mockImplementation((model, o = {}, outputs) => {
    const file = typeof model === 'string' ? path.basename(model) : '<graph>';
    calls.set(file, [...(calls.get(file) ?? []), o]);
    return create(model, o, outputs);
  });
  return calls;
}

/** Loss and gradients of one micro-batch, an update through the optimizer graph, then two fused steps. */
async function step(dir: string) {
  const art = await TrainingArtifacts.load(dir, { threads: 1, ...LOW_MEMORY_RUNTIME }, { update: 'graph' });
  const m = readManifest(dir);
  const metrics = await art.computeGradients(batch.feeds);
  const grads = Object.fromEntries(art.trainableNames.map((n) => [n, Float32Array.from(art.store.data(gradName(n)) as Float32Array)]));
  await art.optimizerStep(1e-3);
  const fused = await art.trainStep(batch.feeds, { lr: 1e-3 });
  const again = await art.trainStep(batch.feeds, { lr: 1e-3 });
  await art.release();
  return { loss: metrics.loss, fused: fused.loss, again: again.loss, grads, manifest: m };
}

describe('the arena for a training graph built in pieces', () => {
  it('is recorded only where the forward was cut, and taken by the gradient sessions alone', async () => {
    const shape = batchShapeOf(batch);
    const whole = build('whole');
    // At the real bound (32 MiB) nothing of this model is cut: the manifest is as without `longest`.
    const fits = build('fits', shape);
    // A 4,000-byte bound cuts the forward into pieces (a smaller one multiplies the nodes, and the
    // session's optimisation of them takes tens of seconds).
    const cut = build('cut', { ...shape, bound: 4000 });
    expect(readManifest(whole).inPieces).toBeUndefined();
    expect(fs.readFileSync(path.join(fits, ARTIFACT_FILES.manifest), 'utf8')).toBe(fs.readFileSync(path.join(whole, ARTIFACT_FILES.manifest), 'utf8'));
    expect(readManifest(cut).inPieces).toBe(true);

    const calls = watchCreate();
    const a = await step(whole);
    const wholeCalls = new Map(calls);
    calls.clear();
    const b = await step(cut);
    const m = b.manifest;
    // Not cut: every gradient graph without the arena (the memory-saving runtime), as before.
    for (const f of [m.training.file, m.step!.file, m.optimizer.file]) {
      expect(wholeCalls.get(f)?.length, f).toBeGreaterThan(0);
      for (const o of wholeCalls.get(f)!) expect(o.arena, f).toBe(false);
    }
    // Cut: the training and fused-step graphs keep the arena; the optimizer graph does not.
    for (const f of [m.training.file, m.step!.file]) {
      expect(calls.get(f)?.length, f).toBeGreaterThan(0);
      for (const o of calls.get(f)!) expect(o, f).not.toHaveProperty('arena');
    }
    for (const o of calls.get(m.optimizer.file)!) expect(o.arena).toBe(false);
    // Each gradient session with the arena is let go after its run (its regions not kept beside the
    // update) and opened again by the next: the fused step's twice (at load, after the first step).
    expect([wholeCalls.get(m.training.file)!.length, wholeCalls.get(m.step!.file)!.length]).toEqual([1, 1]);
    expect([calls.get(m.training.file)!.length, calls.get(m.step!.file)!.length]).toEqual([1, 2]);
    // The same step either way, to float32 rounding.
    expect(Math.abs(b.loss - a.loss)).toBeLessThan(1e-5);
    expect(Math.abs(b.fused - a.fused)).toBeLessThan(1e-5);
    expect(Math.abs(b.again - a.again)).toBeLessThan(1e-5);
    expect(b.fused).not.toBe(b.loss); // the update moved the parameters
    for (const [name, g] of Object.entries(a.grads)) {
      expect(g.some((x) => x !== 0), name).toBe(true);
      expect(worst(b.grads[name], g), name).toBeLessThan(1e-4);
    }
  });
});
