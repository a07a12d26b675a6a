/**
 * `prefzoo demo --method distill`, cut down (a few steps of each stage): the JSON keys, the
 * accuracies as shares of the held-out samples, the step counts as the runs' own (a run stopped at
 * its first evaluation reaching the target; null and the whole budget when the target is out of
 * reach), the evaluations in the runs' metrics, and the refusal of settings the demo cannot honour.
 * Whether distillation beats GRPO to the target is measured by the seed table (docs/distill.md,
 * "Demo"; scripts/bench/distill-demo.sh), not here.
 */
import { describe, it, expect } from 'vitest';
import { existsSync, mkdtempSync, readFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { prefzoo } from './helpers/cli.ts';
import { runDistillDemo, type DistillDemoResult } from '../src/demos/distill.ts';
import { METHOD_DEMOS } from '../src/demos/index.ts';
import { readDemoEval } from '../src/train/demo-eval.ts';

const rowsOf = (run: string) => readFileSync(join(run, 'metrics.jsonl'), 'utf8').trim().split('\n').map((l) => JSON.parse(l) as Record<string, number | string>);

describe('prefzoo demo --method distill', () => {
  it('refuses, before anything runs, a setting it fixes, one distill does not honour, and an unknown one', async () => {
    for (const [param, message] of [
      ['lmbda=0.5', '--param lmbda=0.5: the distill demo sets lmbda itself: the demo is on-policy distillation (lmbda=1)'],
      ['max_steps=10', '--param max_steps=10: the distill demo sets max_steps itself'],
      ['seed=3', "the demo's --seed seeds every stage"],
      ['device=webgpu', 'device'],
      ['num_generatons=4', 'num_generatons'],
    ]) {
      const dir = mkdtempSync(join(tmpdir(), 'pz-demo-distill-bad-'));
      await expect(runDistillDemo({ seed: 0, out: join(dir, 'out'), params: [param] }), param).rejects.toThrow(message);
      expect(existsSync(join(dir, 'out')), param).toBe(false);
    }
    // Through the command: one line, a non-zero exit.
    const r = await prefzoo('demo', '--method', 'distill', '--param', 'lmbda=0.5');
    expect(r.code).not.toBe(0);
    expect(r.stderr.trim().split('\n'), r.stderr).toEqual(['prefzoo: --param lmbda=0.5: the distill demo sets lmbda itself: the demo is on-policy distillation (lmbda=1)']);
  }, 60_000);

  it('counts the steps to the target (the first evaluation reaching it), or null when the budget ends first', async () => {
    const dir = mkdtempSync(join(tmpdir(), 'pz-demo-distill-'));
    // A target every model reaches (a hundredth of the teacher's accuracy): distillation stops at its
    // first evaluation (step 2 of 4); GRPO's budget (1 step) ends before its first evaluation.
    const r = await runDistillDemo({ seed: 1, out: dir, warmStartSteps: 20, teacherSteps: 20, distillBudget: 4, grpoBudget: 1, evalEvery: 2, targetShare: 0.01 });
    const keys: (keyof DistillDemoResult)[] = ['teacher_accuracy', 'student_accuracy_start', 'student_accuracy_final', 'distill_steps', 'grpo_steps', 'seconds', 'seed'];
    for (const k of keys) expect(r, k).toHaveProperty(k);
    for (const a of [r.teacher_accuracy, r.student_accuracy_start, r.student_accuracy_final, r.grpo_accuracy_final]) {
      expect(a).toBeGreaterThanOrEqual(0);
      expect(a).toBeLessThanOrEqual(1);
      // A share of 100 prompts × 8 samples.
      expect(Math.abs(a * 800 - Math.round(a * 800))).toBeLessThan(1e-6);
    }
    expect(r.seed).toBe(1);
    expect(r.beta).toBe(0);
    expect(r.target_accuracy).toBeCloseTo(0.01 * r.teacher_accuracy, 12);
    expect(r.distill_steps).toBe(2);
    expect(r.grpo_steps).toBeNull();
    expect(JSON.parse(JSON.stringify(r))).toMatchObject({ distill_steps: 2, grpo_steps: null });
    expect(r.run).toBe(join(dir, 'distill'));
    // Distillation really stopped there: its last training row is step 2 of a budget of 4, its final model saved.
    const rows = rowsOf(r.run);
    expect(rows.filter((x) => x.split === undefined).map((x) => x.step)).toEqual([1, 2]);
    expect(rows.filter((x) => x.split === 'eval').map((x) => x.step)).toEqual([0, 2]);
    expect(existsSync(join(r.run, 'final', 'model.safetensors'))).toBe(true);
    // GRPO ran its whole budget: its one step, evaluated only as the start.
    const grpoRows = rowsOf(join(dir, 'grpo'));
    expect(grpoRows.filter((x) => x.split === undefined).map((x) => x.step)).toEqual([1]);
    expect(grpoRows.filter((x) => x.split === 'eval').map((x) => x.step)).toEqual([0]);
    // Distillation sampled its own completions (lmbda=1): every micro-batch on-policy, answers of at most 2 tokens.
    for (const x of rowsOf(r.run).filter((x) => x.split === undefined)) {
      expect(x['distill/on_policy']).toBe(1);
      expect(x['distill/completion_length']).toBeLessThanOrEqual(2);
    }
    const evals = rowsOf(r.run).filter((x) => x.split === 'eval');
    expect(evals[0]['rewards/accuracy/mean']).toBe(r.student_accuracy_start);
    expect(evals[1]['rewards/accuracy/mean']).toBe(r.student_accuracy_final);
    const ev = readDemoEval(r.run)!;
    expect(ev.demo).toBe('distill');
    expect(ev.metrics.heldout_accuracy).toEqual({ before: r.student_accuracy_start, after: r.student_accuracy_final });
    expect(ev.values).toMatchObject({ teacher_accuracy: r.teacher_accuracy, distill_steps: 2 });
    expect(ev.values).not.toHaveProperty('grpo_steps');
    // The teacher is bigger than the student and shares its tokenizer.
    expect(r.teacher_parameters).toBeGreaterThan(r.student_parameters);
    expect(readFileSync(join(dir, 'teacher', 'final', 'tokenizer.json'), 'utf8')).toBe(readFileSync(join(dir, 'start', 'final', 'tokenizer.json'), 'utf8'));
    const report = await prefzoo('report', r.run);
    expect(report.code, report.stderr).toBe(0);
    expect(readFileSync(join(r.run, 'report.html'), 'utf8')).toContain(`<tr><td>heldout_accuracy</td><td>${r.student_accuracy_start.toFixed(4)}</td><td>${r.student_accuracy_final.toFixed(4)}</td>`);
    const lines = METHOD_DEMOS.distill.lines(r as never);
    expect(lines[2]).toBe(`steps to ${r.target_accuracy.toFixed(3)} (0.01 × the teacher's; evaluated every 2 steps): distill 2 steps, grpo not within 1 step`);
  }, 120_000);
});
