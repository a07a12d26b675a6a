import { describe, it, expect, beforeAll } from 'vitest';
import { mkdtempSync, readFileSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { countParameters, type Arch } from '../src/models/config.ts';
import { loadModel } from '../src/models/load.ts';
import { referenceLogps } from './helpers/reference-forward.ts';
import { prefzoo } from './helpers/cli.ts';

const ARCHS: Arch[] = ['llama', 'qwen2', 'gpt2'];

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
  }, 60_000);

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
    expect(flags.stderr).toMatch(/^prefzoo: --arch: "bert" is not one of llama, qwen2, gpt2\n$/);
  });
});
