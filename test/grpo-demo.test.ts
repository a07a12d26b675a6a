/**
 * `prefzoo demo --method grpo`, shortened (2 GRPO steps): the warm start's π_0 answers one of the
 * prompt's digits without favouring the last one (the task's answer), so its held-out accuracy is at
 * chance among the prompt's digits; the run folder holds the evaluation printed, and `prefzoo report`
 * shows it. Whether the demo learns is measured by the seed sweep of docs/losses.md ("The GRPO demo"),
 * not here.
 */
import { describe, it, expect } from 'vitest';
import { mkdtempSync, readFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { prefzoo } from './helpers/cli.ts';
import { maskedPrompt, runGrpoDemo } from '../src/demos/grpo.ts';
import { ModelSampler } from '../src/online/policy.ts';
import { readDemoEval } from '../src/train/demo-eval.ts';

describe('prefzoo demo --method grpo', () => {
  it('the warm start shows one digit of each prompt, in place', () => {
    expect(maskedPrompt('4719:', 0)).toBe('4---:');
    expect(maskedPrompt('4719:', 3)).toBe('---9:');
    expect(maskedPrompt('0358:', 2)).toBe('--5-:');
  });

  it('π_0 copies a digit of the prompt, any of the four; the run folder holds what was printed and the report shows it', async () => {
    const dir = mkdtempSync(join(tmpdir(), 'pz-demo-grpo-'));
    const r = await runGrpoDemo({ seed: 0, out: dir, params: ['max_steps=2', 'logging_steps=1'] });
    expect(r.steps).toBe(2);
    expect(r.run).toBe(join(dir, 'grpo'));

    // π_0 on the held-out prompts: which digit of the prompt each answer is (or none).
    const heldout = readFileSync(join(dir, 'heldout.jsonl'), 'utf8').trim().split('\n').map((l) => (JSON.parse(l) as { prompt: string }).prompt);
    const pi0 = await ModelSampler.load(join(dir, 'start', 'final'));
    const samples = await pi0.sample(heldout, { temperature: 1, maxNewTokens: 2, n: 8, seed: 3 });
    await pi0.release();
    const at = [0, 0, 0, 0];
    for (const s of samples) {
      const k = heldout[s.promptIndex].indexOf(s.response);
      if (s.response.length === 1 && k >= 0 && k < 4) at[k]++;
    }
    const share = at.map((c) => c / samples.length);
    // Nearly every answer is a digit of the prompt (a uniform guess over ten digits: 40%) …
    expect(share.reduce((a, b) => a + b, 0)).toBeGreaterThan(0.7);
    // … and every position gets a fair part of them: π_0 has learnt copying, not which digit.
    for (const s of share) expect(s).toBeGreaterThan(0.1);
    expect(r.heldout_accuracy_start).toBeLessThan(0.4);

    const ev = readDemoEval(r.run)!;
    expect(ev.demo).toBe('grpo');
    expect(ev.metrics.heldout_accuracy).toEqual({ before: r.heldout_accuracy_start, after: r.heldout_accuracy_final });
    expect(ev.metrics.reward_mean).toEqual({ before: r.reward_mean_start, after: r.reward_mean_final });
    const report = await prefzoo('report', r.run);
    expect(report.code, report.stderr).toBe(0);
    const html = readFileSync(join(r.run, 'report.html'), 'utf8');
    expect(html).not.toContain('No final evaluation recorded');
    expect(html).toContain(`<tr><td>heldout_accuracy</td><td>${r.heldout_accuracy_start.toFixed(4)}</td><td>${r.heldout_accuracy_final.toFixed(4)}</td>`);
    // The RL panels GRPO fills, none it never fills, its evaluations as points, and its sampled completions.
    for (const panel of ['reward (mean ± std over the round)', 'reward per function (mean ± std)', 'entropy (nats per token)', 'clip ratios', 'completion length (tokens)']) expect(html).toContain(`<figcaption>${panel}</figcaption>`);
    expect(html).not.toContain('no data');
    expect(html).not.toContain('implicit-reward accuracy');
    expect(html).toContain('<circle class="eval"');
    expect(html).toContain('Sampled completions (rewards and advantages)');
    expect(html).toMatch(/<th>accuracy<\/th><th>reward<\/th><th>advantage<\/th>/);
  }, 180_000);
});
