/**
 * Every demo leaves the held-out evaluation it printed in its run folder (demo_eval.json), and
 * `prefzoo report RUN` shows those before → after figures. Shortened runs: the figures' values do
 * not matter here (the seed sweeps of docs/performance.md measure learning), only that what was
 * printed and what the report shows are the same numbers.
 */
import { describe, it, expect } from 'vitest';
import { mkdirSync, mkdtempSync, readFileSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { prefzoo } from './helpers/cli.ts';
import { demoSplit, runOnlineDemo, warmStartRows } from '../src/demos/online.ts';
import { SeededRandom } from '../src/random.ts';
import { readDemoEval, DEMO_EVAL_FILE } from '../src/train/demo-eval.ts';
import { joinRunMetrics, readMetrics } from '../src/train/report.ts';
import { UserError } from '../src/errors.ts';
import { initModelFolder } from '../src/models/init.ts';
import { demoPairs } from '../src/demos/task.ts';
import { trainMpo } from '../src/train/mpo.ts';


/** The report's HTML for RUN, through the command a user types. */
async function report(run: string): Promise<string> {
  const r = await prefzoo('report', run);
  expect(r.code, r.stderr).toBe(0);
  expect(r.stdout).toContain(join(run, 'report.html'));
  return readFileSync(join(run, 'report.html'), 'utf8');
}

/** The table row of `metric` in the report: its before and after cells as printed (4 decimals). */
function row(html: string, metric: string): string[] {
  const m = new RegExp(`<tr><td>${metric.replace(/[/]/g, '\\/')}</td>((?:<td[^>]*>[^<]*</td>)+)</tr>`).exec(html);
  expect(m, `no row ${metric} in the report`).not.toBeNull();
  return [...m![1].matchAll(/<td[^>]*>([^<]*)<\/td>/g)].map((x) => x[1]);
}

describe('demo run folders hold the evaluation they printed', () => {
  it('prefzoo demo (offline): demo_eval.json holds the printed accuracies, and the report shows them', async () => {
    const dir = mkdtempSync(join(tmpdir(), 'pz-demo-eval-'));
    const r = await prefzoo('demo', '--loss', 'dpo', '--steps', '3', '--seed', '1', '--json', '-o', dir);
    expect(r.code, r.stderr).toBe(0);
    const printed = JSON.parse(r.stdout);
    const ev = readDemoEval(printed.run)!;
    expect(ev.demo).toBe('dpo');
    expect(ev.metrics.accuracy).toEqual({ before: printed.accuracy_before, after: printed.accuracy_after });
    expect(ev.metrics.reward_accuracy).toEqual({ before: printed.reward_accuracy_before, after: printed.reward_accuracy_after });
    expect(ev.values).toEqual({ steps: 3, seconds: printed.seconds });
    const html = await report(printed.run);
    expect(html).not.toContain('No final evaluation recorded');
    expect(row(html, 'accuracy').slice(0, 2)).toEqual([printed.accuracy_before.toFixed(4), printed.accuracy_after.toFixed(4)]);
    expect(row(html, 'reward_accuracy').slice(0, 2)).toEqual([printed.reward_accuracy_before.toFixed(4), printed.reward_accuracy_after.toFixed(4)]);
  }, 120_000);

  it('prefzoo demo --method nash_md: the method run folder holds the evaluation, and the report shows it', async () => {
    const dir = mkdtempSync(join(tmpdir(), 'pz-demo-nash-'));
    const r = await runOnlineDemo({ method: 'nash_md', seed: 2, out: dir, params: ['max_steps=2'], warmStartSteps: 2 });
    expect(r.run).toBe(join(dir, 'nash_md'));
    const ev = readDemoEval(r.run)!;
    expect(ev.demo).toBe('nash_md');
    expect(ev.metrics.heldout_accuracy).toEqual({ before: r.heldout_accuracy_start, after: r.heldout_accuracy_final });
    expect(ev.metrics.train_accuracy).toEqual({ before: r.train_accuracy_start, after: r.train_accuracy_final });
    expect(ev.values!.win_rate_vs_start).toBe(r.win_rate_vs_start);
    const html = await report(r.run);
    expect(html).not.toContain('No final evaluation recorded');
    expect(row(html, 'heldout_accuracy').slice(0, 2)).toEqual([r.heldout_accuracy_start.toFixed(4), r.heldout_accuracy_final.toFixed(4)]);
    expect(row(html, 'win_rate_vs_start')).toEqual([r.win_rate_vs_start.toFixed(4)]);
  }, 180_000);

  // SPPO's iterations and MPO's stages are separate training runs; their run folder's metrics.jsonl joins them.
  it('joinRunMetrics numbers the parts\' steps on and tags their rows', () => {
    const dir = mkdtempSync(join(tmpdir(), 'pz-join-'));
    const part = (name: string, rows: object[]) => {
      mkdirSync(join(dir, name));
      writeFileSync(join(dir, name, 'metrics.jsonl'), rows.map((x) => JSON.stringify(x) + '\n').join(''));
      return join(dir, name);
    };
    const a = part('a', [{ step: 5, loss: 1 }, { step: 10, loss: 0.5 }, { step: 10, split: 'eval', loss: 0.7 }]);
    const b = part('b', [{ step: 3, loss: 0.2 }]);
    joinRunMetrics(dir, [{ dir: a, tag: { iteration: 1 } }, { dir: b, tag: { iteration: 2 } }]);
    expect(readMetrics(dir)).toEqual([
      { step: 5, loss: 1, iteration: 1 },
      { step: 10, loss: 0.5, iteration: 1 },
      { step: 10, split: 'eval', loss: 0.7, iteration: 1 },
      { step: 13, loss: 0.2, iteration: 2 },
    ]);
  });

  // The MPO demo's fix: RPO's NLL term (rpo_alpha) reaches both stages' losses.
  it('mpo hands rpo_alpha to stage 1 (dpo) and to a stage-2 loss that takes it', async () => {
    const dir = mkdtempSync(join(tmpdir(), 'pz-mpo-rpo-'));
    const model = join(dir, 'model');
    initModelFolder(model, 'llama', 'tiny', 0);
    const pairs = demoPairs(3, 16, 0).train.map((p, i) => ({ ...p, chosen_score: 1 + (i % 4), rejected_score: 0 }));
    const data = join(dir, 'pairs.jsonl');
    writeFileSync(data, pairs.map((p) => JSON.stringify(p) + '\n').join(''));
    const settings = ['max_steps=1', 'batch_size=8', 'max_length=32', 'max_prompt_length=16', 'pad_to_multiple_of=16'];
    const lossParams = (run: string) => JSON.parse(readFileSync(join(run, 'config.json'), 'utf8')).loss_params;
    await trainMpo({ model, data, loss: 'mpo', out: join(dir, 'rpo'), params: [...settings, 'rpo_alpha=0.5', 'stage2_loss=ipo'] });
    expect(lossParams(join(dir, 'rpo', 'stage1')).rpo_alpha).toBe('0.5');
    expect(lossParams(join(dir, 'rpo', 'stage2')).rpo_alpha).toBe('0.5');
    await trainMpo({ model, data, loss: 'mpo', out: join(dir, 'plain'), params: settings });
    expect(lossParams(join(dir, 'plain', 'stage1')).rpo_alpha).toBeUndefined();
  }, 120_000);

  it('a damaged demo_eval.json is one line naming the file', () => {
    const dir = mkdtempSync(join(tmpdir(), 'pz-demo-bad-'));
    writeFileSync(join(dir, DEMO_EVAL_FILE), JSON.stringify({ demo: 'x', heldout: 'y', metrics: { a: { before: 1 } } }));
    expect(() => readDemoEval(dir)).toThrow(UserError);
    expect(() => readDemoEval(dir)).toThrow(join(dir, DEMO_EVAL_FILE));
    writeFileSync(join(dir, DEMO_EVAL_FILE), '{');
    expect(() => readDemoEval(dir)).toThrow(/invalid JSON/);
  });
});

describe('the online demos\' warm start', () => {
  it('answers prompts of 1 to 4 distinct digits with one of their own digits; its four-digit prompts are the training ones', () => {
    const { train, heldout } = demoSplit(3);
    const rows = warmStartRows(new SeededRandom(8), train, new Set(heldout));
    expect(rows).toHaveLength(4 * train.length);
    const byLength = [0, 0, 0, 0, 0];
    const answers = new Map<string, number>();
    for (const r of rows) {
      const p = r.prompt as string;
      expect(p).toMatch(/^\d{1,4}:$/);
      const digits = p.slice(0, -1);
      expect(new Set(digits).size).toBe(digits.length);
      byLength[digits.length]++;
      for (const a of r.responses) {
        expect(digits).toContain(a as string);
        expect(a).toHaveLength(1);
        const k = digits.indexOf(a as string);
        if (digits.length === 4) answers.set(String(k), (answers.get(String(k)) ?? 0) + 1);
      }
    }
    expect(byLength.slice(1)).toEqual([200, 200, 200, 200]);
    // The four-digit prompts are exactly the training prompts, once each: no held-out prompt is seen.
    expect(rows.map((r) => r.prompt as string).filter((p) => p.length === 5).sort()).toEqual([...train].sort());
    // No preference among the positions: each of the 400 answers is one of four, about 100 each.
    for (const k of ['0', '1', '2', '3']) expect(Math.abs((answers.get(k) ?? 0) - 100)).toBeLessThan(35);
    expect(warmStartRows(new SeededRandom(8), train, new Set(heldout))).toEqual(rows);
  });
});
