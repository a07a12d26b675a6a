import { describe, it, expect, beforeAll } from 'vitest';
import { existsSync, mkdtempSync, readFileSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { countParameters, type Arch } from '../src/models/config.ts';
import { loadModel } from '../src/models/load.ts';
import { initModelFolder } from '../src/models/init.ts';
import { trainAny } from '../src/train/mpo.ts';
import { referenceLogps } from './helpers/reference-forward.ts';
import { prefzoo } from './helpers/cli.ts';

const ARCHS: Arch[] = ['llama', 'qwen2', 'qwen3', 'mistral', 'gemma', 'phi3', 'gpt2'];

describe('prefzoo init-model and logps', () => {
  const root = mkdtempSync(join(tmpdir(), 'pz-cli-models-'));
  const input = join(root, 'x.jsonl');
  const rows = [
    { input_ids: [256, 72, 101, 108, 108, 111, 44, 32, 119, 111, 114, 108, 100], loss_mask: [0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1, 1] },
    { input_ids: [256, 65, 66], loss_mask: [1, 1, 1] },
    { input_ids: [256, 10, 20, 30, 40, 50, 60, 257], loss_mask: [0, 0, 0, 1, 1, 1, 1, 1] },
  ];
  writeFileSync(input, rows.map((r) => JSON.stringify(r)).join('\n') + '\n\n');
  const outputs = new Map<Arch, { init: string; logps: string }>();

  beforeAll(async () => {
    await Promise.all(
      ARCHS.map(async (arch) => {
        const init = await prefzoo('init-model', '--arch', arch, '--preset', 'tiny', '-o', join(root, arch), '--seed', '3');
        expect(init.code, init.stderr).toBe(0);
        const lp = await prefzoo('logps', '--model', join(root, arch), '--input', input, '--batch-size', '2');
        expect(lp.code, lp.stderr).toBe(0);
        outputs.set(arch, { init: init.stdout, logps: lp.stdout });
      }),
    );
  }, 120_000);

  it.each(ARCHS)('%s: prints finite log-probs that match the float64 reference on the written checkpoint', (arch) => {
    const lines = outputs.get(arch)!.logps.trim().split('\n').map((l) => JSON.parse(l) as { logp: number; tokens: number });
    expect(lines).toHaveLength(rows.length);
    const model = loadModel(join(root, arch));
    expect(countParameters(model.config)).toBeLessThan(1_000_000);
    lines.forEach((l, i) => {
      expect(Number.isFinite(l.logp)).toBe(true);
      const ref = referenceLogps(model.config, model.weights, rows[i].input_ids, rows[i].loss_mask);
      expect(l.tokens).toBe(ref.tokens);
      expect(Math.abs(l.logp - ref.logp)).toBeLessThan(1e-4 * Math.abs(ref.logp));
    });
  });

  it('is deterministic in the seed', async () => {
    const again = await prefzoo('init-model', '--arch', 'llama', '-o', join(root, 'llama-again'), '--seed', '3');
    const other = await prefzoo('init-model', '--arch', 'llama', '-o', join(root, 'llama-other'), '--seed', '4');
    expect(again.code + other.code).toBe(0);
    const bytes = (d: string) => readFileSync(join(root, d, 'model.safetensors'));
    expect(bytes('llama-again').equals(bytes('llama'))).toBe(true);
    expect(bytes('llama-other').equals(bytes('llama'))).toBe(false);
    expect(readFileSync(join(root, 'llama', 'tokenizer.json'), 'utf8')).toBe(readFileSync(join(root, 'llama-again', 'tokenizer.json'), 'utf8'));
  });

  it('reports a bad input line as file:line, without a stack trace', async () => {
    const bad = join(root, 'bad.jsonl');
    writeFileSync(bad, JSON.stringify(rows[1]) + '\n' + JSON.stringify({ input_ids: [1, 2, 3], loss_mask: [0, 1] }) + '\n');
    const r = await prefzoo('logps', '--model', join(root, 'gpt2'), '--input', bad);
    expect(r.code).toBe(1);
    expect(r.stderr.trim()).toBe(`prefzoo: ${bad}:2: "loss_mask" must be an array of the same length as input_ids (3)`);
    const flags = await prefzoo('init-model', '--arch', 'bert', '-o', join(root, 'x'));
    expect(flags.code).toBe(1);
    expect(flags.stderr).toMatch(/^prefzoo: --arch: "bert" is not one of llama, qwen2, qwen3, mistral, gemma, phi3, gpt2\n$/);
  });
});

describe('the newer families end to end: init-model, train (4 DPO steps), generate', () => {
  const root = mkdtempSync(join(tmpdir(), 'pz-cli-families-'));
  const pairs = join(root, 'pairs.jsonl');
  // Rows longer than the tiny presets' sliding window (6 positions), so the window is in play.
  writeFileSync(
    pairs,
    Array.from({ length: 8 }, (_, i) => JSON.stringify({ prompt: `Count from ${i}:`, chosen: ` ${i} ${i + 1} ${i + 2} ${i + 3}`, rejected: ` ${i} ${i + 2} ${i + 1}` })).join('\n') + '\n',
  );
  const prompts = join(root, 'prompts.jsonl');
  writeFileSync(prompts, '{"prompt": "Count from 3:"}\n{"prompt": "a longer prompt than the window"}\n');

  it.each(['qwen3', 'mistral', 'gemma', 'phi3'] as const)('%s', async (arch) => {
    const m = join(root, arch);
    // What `prefzoo init-model --arch ARCH --preset tiny` writes (seed 0), made in this process: every
    // family's init-model command runs above.
    initModelFolder(m, arch, 'tiny', 0);
    const run = join(root, `run-${arch}`);
    // What `prefzoo train` runs, in this process (test/faults.test.ts runs the command itself).
    await trainAny({ model: m, data: pairs, loss: 'dpo', out: run, params: ['max_steps=4', 'batch_size=4', 'learning_rate=1e-3'] });
    const metrics = readFileSync(join(run, 'metrics.jsonl'), 'utf8').trim().split('\n').map((l) => JSON.parse(l) as Record<string, number>);
    const steps = metrics.filter((r) => typeof r.loss === 'number');
    expect(steps.at(-1)!.step).toBe(4);
    expect(steps.every((r) => Number.isFinite(r.loss))).toBe(true);
    // The trained model is a loadable model of the same family.
    expect(loadModel(join(run, 'final')).config.model_type).toBe(arch);
    const out = join(root, `gen-${arch}.parquet`);
    const gen = await prefzoo('generate', '--model', join(run, 'final'), '--prompts', prompts, '-o', out, '--n', '2', '--max-new-tokens', '9', '--json');
    expect(gen.code, gen.stderr).toBe(0);
    expect(JSON.parse(gen.stdout)).toMatchObject({ prompts: 2, samples: 4 });
    expect(existsSync(out)).toBe(true);
  }, 60_000);
});
