/**
 * Quantized rollouts from the command line: grpo with rollout_dtype=q4 samples from the quantized
 * live weights (its sampler–trainer log-prob gap is that of q4, far above f32's rounding) with the
 * off-policy mask on; generate --dtype q4 writes its samples; what cannot be honoured is refused in
 * one line (f16, a block size that is no power of two, rollout_dtype in a command that samples
 * nothing, distill at lmbda=0); train takes --device and eval --param device=….
 */
import { mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { initModelFolder } from '../src/models/init.ts';
import { prefzoo } from './helpers/cli.ts';

const dir = mkdtempSync(join(tmpdir(), 'prefzoo-quant-cli-'));
afterAll(() => rmSync(dir, { recursive: true, force: true }));
const model = join(dir, 'model');
const prompts = join(dir, 'prompts.jsonl');

beforeAll(() => {
  initModelFolder(model, 'llama', 'tiny', 5);
  writeFileSync(prompts, ['1+2=', '3+4=', '5+6=', '7+1='].map((p) => JSON.stringify({ prompt: p, answer: String(eval(p.slice(0, -1)) % 10) }) + '\n').join(''));
});

const GRPO = ['max_steps=2', 'batch_size=4', 'num_generations=2', 'max_completion_length=4', 'beta=0', 'learning_rate=1e-3', 'pad_to_multiple_of=8'];
const grpo = (out: string, extra: string[]) => prefzoo('grpo', '--model', model, '--prompts', prompts, '--reward', 'accuracy', '-o', out, '--quiet', ...[...GRPO, ...extra].flatMap((s) => ['--param', s]));
const rows = (out: string) => readFileSync(join(out, 'metrics.jsonl'), 'utf8').trim().split('\n').map((l) => JSON.parse(l) as Record<string, number>);

describe('quantized rollouts', () => {
  it('grpo rollout_dtype=q4 samples from the quantized weights: its sampler gap is far above f32\'s', async () => {
    const [f32, q4] = [join(dir, 'f32'), join(dir, 'q4')];
    const [a, b] = await Promise.all([grpo(f32, []), grpo(q4, ['rollout_dtype=q4', 'rollout_block_size=16'])]);
    expect(a.code, a.stderr).toBe(0);
    expect(b.code, b.stderr).toBe(0);
    const gap = (out: string) => Math.max(...rows(out).map((r) => r['sampling/sampling_logp_difference/max']));
    // f32: the sampler's float64 pick over the same float32 logits as the trainer's, up to summation order.
    expect(gap(f32)).toBeLessThan(1e-3);
    expect(gap(q4)).toBeGreaterThan(1e-2);
    // The off-policy mask defaults on under q4 (off_policy_mask_threshold=0.5), as the run records.
    const cfg = JSON.parse(readFileSync(join(q4, 'config.json'), 'utf8')) as Record<string, unknown>;
    expect(JSON.stringify(cfg)).toContain('"off_policy_mask_threshold":0.5');
  });

  it('generate --dtype q4 writes samples; f16, odd block sizes and settings nothing reads are refused in one line', async () => {
    const out = join(dir, 'g.parquet');
    const g = await prefzoo('generate', '--model', model, '--prompts', prompts, '-o', out, '--dtype', 'q4', '--block-size', '16', '--json');
    expect(g.code, g.stderr).toBe(0);
    expect(JSON.parse(g.stdout).samples).toBe(4);
    const refused = [
      [await prefzoo('generate', '--model', model, '--prompts', prompts, '-o', out, '--dtype', 'f16'), '--dtype=f16'],
      [await grpo(join(dir, 'x1'), ['rollout_dtype=q8', 'rollout_block_size=48']), 'rollout_block_size=48'],
      [await prefzoo('reward-train', '--model', model, '--data', prompts, '-o', join(dir, 'x2'), '--param', 'rollout_dtype=q4'), 'rollout_dtype'],
    ] as const;
    for (const [r, words] of refused) {
      expect(r.code).not.toBe(0);
      expect(r.stderr).toContain(words);
      expect(r.stderr.trim().split('\n')).toHaveLength(1);
    }
  });

  it('train takes --device; eval takes --param device=… and refuses a contradiction', async () => {
    const t = await prefzoo('train', '--model', model, '--data', prompts, '--loss', 'dpo', '-o', join(dir, 't'), '--device', 'gpu9');
    expect(t.stderr).toContain('--device must be');
    const e = await prefzoo('eval', '--model', model, '--ref', model, '--data', prompts, '--param', 'device=webgpu', '--device', 'cpu');
    expect(e.stderr).toContain('--param device=webgpu contradicts --device cpu');
    const other = await prefzoo('eval', '--model', model, '--ref', model, '--data', prompts, '--param', 'gamma=1');
    expect(other.stderr).toContain('eval takes only beta and device');
  });
});
