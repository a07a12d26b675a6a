/** `prefzoo loss` end to end: output shape, engines agreeing, one-line errors. */
import { describe, it, expect } from 'vitest';
import { mkdtempSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join, resolve } from 'node:path';
import { prefzoo } from './helpers/cli.ts';

const FIX = resolve(__dirname, 'fixtures', 'losses');

describe('prefzoo loss', () => {
  it('prints one JSON line {loss, per_example, grad}; onnx and reference agree', async () => {
    const [onnx, ref] = await Promise.all([
      prefzoo('loss', 'lipo', '--input', join(FIX, 'listwise.json'), '--grad', '--param', 'beta=0.5'),
      prefzoo('loss', 'lipo', '--input', join(FIX, 'listwise.json'), '--grad', '--param', 'beta=0.5', '--engine', 'reference'),
    ]);
    expect(onnx.code).toBe(0);
    expect(onnx.stdout.trim().split('\n')).toHaveLength(1);
    const a = JSON.parse(onnx.stdout);
    const b = JSON.parse(ref.stdout);
    expect(Object.keys(a)).toEqual(['loss', 'per_example', 'grad']);
    expect(a.per_example).toHaveLength(2);
    expect(a.grad.policy_logps).toHaveLength(2);
    expect(a.grad.policy_logps[1]).toHaveLength(4);
    expect(a.grad.policy_logps[1][3]).toBe(0); // padded entry
    expect(a.loss).toBeCloseTo(b.loss, 12);
    a.grad.policy_logps.flat().forEach((v: number, i: number) => expect(v).toBeCloseTo(b.grad.policy_logps.flat()[i], 12));
  });

  it('dro gives gradients for policy log-probs and values; no grad key without --grad', async () => {
    const r = await prefzoo('loss', 'dro', '--input', join(FIX, 'single.json'), '--grad', '--param', 'tau=0.5');
    expect(Object.keys(JSON.parse(r.stdout).grad)).toEqual(['policy_logps', 'values']);
    const m = await prefzoo('loss', 'dpo:0.8,sft:1', '--input', join(FIX, 'pairwise.json'), '--metrics');
    const out = JSON.parse(m.stdout);
    expect(out.grad).toBeUndefined();
    expect(out.metrics['rewards/accuracies']).toBeGreaterThanOrEqual(0);
  });

  it('fails with one line naming the key or parameter', async () => {
    const dir = mkdtempSync(join(tmpdir(), 'pz-loss-'));
    const bad = join(dir, 'b.json');
    writeFileSync(bad, JSON.stringify({ policy_chosen_logps: [-1], policy_rejected_logps: [-2], ref_chosen_logps: [-1] }));
    const [missing, param] = await Promise.all([
      prefzoo('loss', 'dpo', '--input', bad),
      prefzoo('loss', 'dpo', '--input', join(FIX, 'pairwise.json'), '--param', 'beta=0'),
    ]);
    expect(missing.code).toBe(1);
    expect(missing.stderr.trim().split('\n')).toHaveLength(1);
    expect(missing.stderr).toMatch(/^prefzoo: .*b\.json: missing key "ref_rejected_logps"/);
    expect(param.code).toBe(1);
    expect(param.stderr).toMatch(/^prefzoo: loss dpo: parameter beta must be \(0, ∞\), got "0"/);
  });
});
