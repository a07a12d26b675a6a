// `prefzoo artifacts`: the folder a model and a loss give, loaded and stepped; the command's help and bad input.
import { describe, it, expect, beforeAll, afterAll } from 'vitest';
import { mkdtempSync, readdirSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { exportArtifacts } from '../src/train/artifacts.ts';
import { initModelFolder } from '../src/models/init.ts';
import { modelParameterShapes } from '../src/models/params.ts';
import { readConfig } from '../src/models/config.ts';
import { readManifest } from '../src/artifacts/manifest.ts';
import { TrainingArtifacts } from '../src/artifacts/training.ts';
import { collate } from '../src/models/batch.ts';
import { benchPairs } from '../scripts/bench/step.ts';
import { prefzoo } from './helpers/cli.ts';

let dir: string;
let model: string;
beforeAll(() => {
  dir = mkdtempSync(join(tmpdir(), 'prefzoo-artifacts-'));
  model = join(dir, 'model');
  initModelFolder(model, 'llama', 'tiny', 3);
});
afterAll(() => rmSync(dir, { recursive: true, force: true }));

describe('prefzoo artifacts', () => {
  it('writes the three graphs, the checkpoint and artifacts.json; the first DPO step of π = π_ref has loss ln 2', async () => {
    const out = join(dir, 'dpo');
    const r = exportArtifacts({ model, loss: 'dpo', out, params: ['beta=0.1'] });
    expect(r.files).toEqual(['artifacts.json', 'checkpoint', 'eval_model.onnx', 'optimizer_model.onnx', 'train_step_model.onnx', 'training_model.onnx']);
    expect(readdirSync(join(out, 'checkpoint')).sort()).toEqual(['optimizer.safetensors', 'params.safetensors', 'state.json']);
    const m = readManifest(out);
    const config = readConfig(model);
    expect(m.loss?.name).toBe('dpo');
    expect(m.params.map((p) => p.name).sort()).toEqual([...modelParameterShapes(config).keys()].sort());
    expect(r).toMatchObject({ kind: 'pairwise', packed: true, trainable: m.params.length });

    // Reference = the starting policy: every margin is 0, so −log σ(0) = ln 2 exactly (DPO paper, eq. 7).
    const art = await TrainingArtifacts.load(out);
    const rows = benchPairs(config.vocab_size, 3, 16);
    const opts = { kind: 'pairwise' as const, padTo: 16, padId: 0, dtype: 'float32' as const, packed: true };
    const ref = (await art.evaluate(collate(rows, opts).feeds)).logp.data as Float32Array;
    const batch = collate(rows, { ...opts, refLogps: (_, i) => [ref[i], ref[3 + i]] });
    const step = await art.trainStep(batch.feeds, { lr: 1e-3 });
    expect(step.loss).toBeCloseTo(Math.LN2, 5);
    await art.release();
  });

  it('LoRA settings and a single-trajectory loss: only the adapters train; the batch takes the labels the loss reads', () => {
    const r = exportArtifacts({ model, loss: 'kto', out: join(dir, 'kto'), params: ['lora_r=4'] });
    const m = readManifest(r.dir);
    expect(r).toMatchObject({ kind: 'single', packed: false });
    expect(m.params.filter((p) => p.trainable).every((p) => p.name.includes('.lora_'))).toBe(true);
    expect(r.trainable).toBeGreaterThan(0);
    expect(m.batchInputs.map((b) => b.name)).toContain('labels');
  });

  it('--help names the flags; bad input is one line and a non-zero exit, and leaves no folder', async () => {
    const [help, bad, kind, grpo] = await Promise.all([
      prefzoo('artifacts', '--help'),
      prefzoo('artifacts', '--model', model, '--loss', 'nope', '-o', join(dir, 'x')),
      prefzoo('artifacts', '--model', model, '--loss', 'kto', '--kind', 'pairwise', '-o', join(dir, 'y')),
      prefzoo('artifacts', '--model', model, '--loss', 'grpo', '-o', join(dir, 'z')),
    ]);
    expect(help.code).toBe(0);
    for (const flag of ['--model', '--loss', '--out', '--kind', '--param']) expect(help.stdout).toContain(flag);
    expect(bad.code).not.toBe(0);
    expect(bad.stderr.trim().split('\n')).toEqual([expect.stringMatching(/unknown loss "nope"/)]);
    expect(kind.code).not.toBe(0);
    expect(kind.stderr.trim().split('\n')).toEqual([expect.stringMatching(/--kind: loss kto takes single data/)]);
    // GRPO's loss reads per-token log-probs of rollouts, which only grpo's own graph computes.
    expect(grpo.code).not.toBe(0);
    expect(grpo.stderr.trim().split('\n')).toEqual([expect.stringMatching(/loss grpo trains on its own rollouts; prefzoo grpo builds its artifacts/)]);
    expect(readdirSync(dir).sort()).toEqual(['dpo', 'kto', 'model']);
  });
});
