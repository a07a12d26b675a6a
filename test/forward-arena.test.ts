/**
 * Forward-only sessions keep ONNX Runtime's CPU arena under the memory-saving runtime (issue 46): the
 * eval graph of the training artifacts, the reference/eval scorer and the online reference scorer are
 * opened without `arena: false`, the gradient graphs with it; and the eval session, whose arena holds
 * what its forward grew, is let go before a gradient run and opened again by the next evaluation,
 * giving the same outputs. Session creation is watched through a spy on `Session.create`.
 */
import { describe, it, expect, afterAll, afterEach, vi } from 'vitest';
import { mkdtempSync, rmSync } from 'node:fs';
import { availableParallelism, tmpdir } from 'node:os';
import { join } from 'node:path';
import { buildArtifacts, TrainingArtifacts, readManifest } from '../src/artifacts/index.ts';
import { forwardRuntime, Session, sessionOptions, type RuntimeOptions } from '../src/runtime/session.ts';
import { serve } from '../src/index.ts';
import { LOW_MEMORY_RUNTIME } from '../src/train/run.ts';
import { Scorer } from '../src/models/scorer.ts';
import { ReferenceScorer } from '../src/online/reference.ts';
import { presetConfig } from '../src/models/config.ts';
import { initModelFolder, initWeights } from '../src/models/init.ts';
import { mlpSpec, spirals, batchFeeds, range } from './mlp-spec.ts';

const root = mkdtempSync(join(tmpdir(), 'pz-forward-arena-'));
afterAll(() => rmSync(root, { recursive: true, force: true }));
afterEach(() => vi.restoreAllMocks());

/** The runtimes `Session.create` was given, with the file each opened (a graph built in memory: '<graph>'). */
function watchCreate(): { file: string; runtime: RuntimeOptions }[] {
  const calls: { file: string; runtime: RuntimeOptions }[] = [];
  const create = Session.create.bind(Session);
  vi.spyOn(Session, 'create').mockImplementation((model, o = {}, outputs) => {
    calls.push({ file: typeof model === 'string' ? model.split('/').pop()! : '<graph>', runtime: o });
    return create(model, o, outputs);
  });
  return calls;
}

describe('forward-only sessions under the memory-saving runtime', () => {
  it('forwardRuntime drops only the arena switch', () => {
    expect(forwardRuntime({ ep: 'cpu', threads: 2, ...LOW_MEMORY_RUNTIME })).toEqual({ ep: 'cpu', threads: 2, memPattern: false });
    expect(forwardRuntime({ threads: 1 })).toEqual({ threads: 1 });
  });

  it('the eval graph keeps the arena, the gradient graphs go without; the eval session is let go before a step and reopened with the same outputs', async () => {
    const dir = join(root, 'mlp');
    buildArtifacts(mlpSpec({ hidden: 6, dtype: 'float32', seed: 3, optimizer: { type: 'adamw' } }), dir);
    const m = readManifest(dir);
    const data = spirals(10, 5);
    const batch = batchFeeds(data, 'float32', range(0, data.n));
    const calls = watchCreate();
    const release = vi.spyOn(Session.prototype, 'release');
    for (const [runtime, lowMemory] of [[{ threads: 1, ...LOW_MEMORY_RUNTIME }, true], [{ threads: 1 }, false]] as const) {
      calls.length = 0;
      release.mockClear();
      const art = await TrainingArtifacts.load(dir, runtime, { update: 'graph' });
      const first = Float32Array.from((await art.evaluate(batch)).logits.data as Float32Array);
      await art.trainStep(batch, { lr: 0 }); // lr 0: the parameters stay, so the next evaluation must agree
      const again = (await art.evaluate(batch)).logits.data as Float32Array;
      expect(Array.from(again)).toEqual(Array.from(first));
      const evals = calls.filter((c) => c.file === m.eval.file);
      const grads = calls.filter((c) => c.file !== m.eval.file);
      expect(grads.length).toBeGreaterThan(0);
      for (const c of grads) expect(c.runtime.arena).toBe(lowMemory ? false : undefined);
      for (const c of evals) expect(c.runtime).not.toHaveProperty('arena');
      // Under the memory-saving runtime the eval session was released by the step and opened again.
      expect(evals.length).toBe(lowMemory ? 2 : 1);
      expect(release).toHaveBeenCalledTimes(lowMemory ? 1 : 0);
      await art.release();
    }
  });

  it('the scorer and the online reference scorer open their sessions with the arena', async () => {
    const config = presetConfig('llama', 'tiny', { vocabSize: 128 });
    const weights = initWeights(config, 7);
    const calls = watchCreate();
    const runtime = { threads: 1, ...LOW_MEMORY_RUNTIME };
    const scorer = await Scorer.create(config, weights, runtime, 0);
    const ref = await ReferenceScorer.create(config, weights, runtime);
    expect(calls.length).toBe(2);
    for (const c of calls) expect(c.runtime).toEqual({ threads: 1, memPattern: false });
    await scorer.release();
    await ref.release();
  });
});

describe('the CPU\'s default intra-op threads', () => {
  it('are PREFZOO_THREADS when set, one per core otherwise; a named count wins; a bad value is refused naming the variable', () => {
    const saved = process.env.PREFZOO_THREADS;
    try {
      process.env.PREFZOO_THREADS = '3';
      expect(sessionOptions({}).intraOpNumThreads).toBe(3);
      expect(sessionOptions({ threads: 2 }).intraOpNumThreads).toBe(2);
      expect(sessionOptions({ ep: 'webgpu' }).intraOpNumThreads).toBeUndefined();
      delete process.env.PREFZOO_THREADS;
      expect(sessionOptions({}).intraOpNumThreads).toBe(availableParallelism());
      for (const bad of ['0', '-1', '1.5', 'two']) {
        process.env.PREFZOO_THREADS = bad;
        expect(() => sessionOptions({})).toThrow(`PREFZOO_THREADS must be a positive integer, got "${bad}"`);
      }
    } finally {
      if (saved === undefined) delete process.env.PREFZOO_THREADS;
      else process.env.PREFZOO_THREADS = saved;
    }
  });
});

describe("a served model's sessions stop spinning between steps", () => {
  it('sessionOptions maps spinStop to session.force_spinning_stop; serve() opens every decode session with it', async () => {
    expect(sessionOptions({ spinStop: true }).extra).toEqual({ session: { force_spinning_stop: '1' } });
    expect(sessionOptions({}).extra).toBeUndefined();
    // spin: false already keeps the threads from spinning at all: spinStop adds nothing there.
    expect(sessionOptions({ spin: false, spinStop: true }).extra).toEqual({ session: { intra_op: { allow_spinning: '0' }, inter_op: { allow_spinning: '0' } } });
    const dir = join(root, 'served');
    initModelFolder(dir, 'llama', 'tiny', 0);
    const calls = watchCreate();
    const server = await serve({ model: dir, port: 0 });
    try {
      const res = await fetch(`${server.url}/completions`, { method: 'POST', headers: { 'content-type': 'application/json' }, body: JSON.stringify({ model: dir, prompt: 'a b c', max_tokens: 3, temperature: 0 }) });
      expect(res.status).toBe(200);
    } finally {
      await server.close();
    }
    expect(calls.length).toBeGreaterThan(0);
    for (const c of calls) expect(c.runtime.spinStop).toBe(true);
  });
});
