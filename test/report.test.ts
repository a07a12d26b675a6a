import { describe, it, expect } from 'vitest';
import { mkdtempSync, writeFileSync, readFileSync, existsSync, statSync } from 'node:fs';
import { pathToFileURL } from 'node:url';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { writeReport, lineChart } from '../src/train/report.ts';
import { UserError } from '../src/errors.ts';

const CHROMIUM = '/usr/bin/chromium';

describe('report', () => {
  it('draws one path per series through every point, and embeds eval and config', () => {
    const dir = mkdtempSync(join(tmpdir(), 'pz-report-'));
    const rows = [1, 2, 3, 4].map((step) => ({ step, loss: 1 / step, 'rewards/accuracies': step / 4, 'rewards/margins': step }));
    writeFileSync(join(dir, 'metrics.jsonl'), rows.map((r) => JSON.stringify(r)).join('\n') + '\n');
    writeFileSync(join(dir, 'eval.json'), JSON.stringify({ accuracy: 0.875 }));
    writeFileSync(join(dir, 'config.json'), JSON.stringify({ loss: 'dpo<x>' }));
    const html = readFileSync(writeReport(dir), 'utf8');
    expect(html.match(/<svg/g)!.length).toBe(3);
    // The loss path has four points: one move and three lines.
    const d = /<path d="([^"]+)"/.exec(html)![1];
    expect(d.match(/[ML]/g)!.length).toBe(4);
    expect(html).toContain('0.875');
    expect(html).toContain('dpo&lt;x&gt;');
    expect(html).not.toMatch(/<script|https?:\/\/(?!www\.w3\.org)/);
  });
  it("draws a method's other metrics too, a family name/… in one panel, without bookkeeping columns", () => {
    const dir = mkdtempSync(join(tmpdir(), 'pz-report-other-'));
    const rows = [1, 2, 3].map((step) => ({ step, epoch: step / 3, learning_rate: 1e-6, tokens: 10, loss: 1 / step, 'objective/win_rate_vs_mixture': 0.5 + step / 10, 'objective/kl': step, grad_norm: 2 }));
    writeFileSync(join(dir, 'metrics.jsonl'), rows.map((r) => JSON.stringify(r)).join('\n') + '\n');
    const html = readFileSync(writeReport(dir), 'utf8');
    expect([...html.matchAll(/<figcaption>([^<]*)<\/figcaption>/g)].map((m) => m[1])).toEqual(['loss', 'objective/…', 'grad_norm']);
    expect(html).toContain('━ win_rate_vs_mixture');
  });
  it('names the missing metrics file', () => {
    expect(() => writeReport('/nonexistent-run')).toThrow(UserError);
    expect(existsSync('/nonexistent-run/report.html')).toBe(false);
  });
  it('maps the extremes of a series to the plot edges', () => {
    const svg = lineChart('t', [{ label: 'a', points: [[0, 0], [10, 5]] }]);
    expect(svg).toContain('M56.0,188.0L408.0,24.0');
  });
});

/** A GRPO run folder as `prefzoo grpo` writes it: TRL's metric names, two evaluations, completions.jsonl. */
function grpoRun(): string {
  const dir = mkdtempSync(join(tmpdir(), 'pz-report-grpo-'));
  const rows: Record<string, number | string>[] = [];
  for (let step = 1; step <= 12; step++) {
    const r = Math.min(1, step / 10);
    rows.push({
      step, loss: -0.01 * step, reward: r, reward_std: 0.3 - r / 5,
      'rewards/accuracy/mean': r, 'rewards/accuracy/std': 0.2, 'rewards/even_len/mean': 0.5, 'rewards/even_len/std': 0.1,
      frac_reward_zero_std: step / 20, entropy: 2 - step / 10, entropy_coef: 0.005 * (step % 3), kl: 0.001 * step,
      'clip_ratio/low_mean': 0.01, 'clip_ratio/high_mean': 0.02, 'clip_ratio/region_mean': 0.03,
      'completions/mean_length': 2, 'completions/min_length': 1, 'completions/max_length': 2, 'completions/mean_terminated_length': 1.5, 'completions/clipped_ratio': 0.25,
      'sampling/sampling_logp_difference/mean': 1e-4, 'sampling/sampling_logp_difference/max': 3e-4, 'sampling/sampling_kl': 5e-9,
      'sampling/importance_sampling_ratio/min': 0.999, 'sampling/importance_sampling_ratio/mean': 1, 'sampling/importance_sampling_ratio/max': 1.001,
    });
  }
  rows.push({ step: 6, split: 'eval', reward: 0.55, 'rewards/accuracy/mean': 0.55 }, { step: 12, split: 'eval', reward: 0.9, 'rewards/accuracy/mean': 0.9 });
  writeFileSync(join(dir, 'metrics.jsonl'), rows.map((r) => JSON.stringify(r)).join('\n') + '\n');
  const completions = [6, 12].flatMap((step) => [0, 1, 2].map((k) => ({ step, prompt: `digits 7 3 <${step}>`, completion: `${k === 2 ? 7 : k}`, rewards: { accuracy: k === 2 ? 1 : 0, even_len: k === 1 ? null : 0.5 }, reward: k === 2 ? 1.5 : 0.5, advantage: k === 2 ? 1.1547 : -0.5774 })));
  writeFileSync(join(dir, 'completions.jsonl'), completions.map((r) => JSON.stringify(r)).join('\n') + '\n');
  writeFileSync(join(dir, 'config.json'), JSON.stringify({ loss: 'grpo' }));
  return dir;
}

const RL_PANELS = [
  'loss', 'reward (mean ± std over the round)', 'reward per function (mean ± std)', 'share of groups with zero reward spread', 'entropy (nats per token)', 'entropy_coef',
  'KL to the reference (k3)', 'clip ratios', 'completion length (tokens)', 'share of completions cut at max_completion_length',
  'sampler–trainer log-prob difference |old − sampling|', 'sampler–trainer KL (k3 estimate)', 'sampler correction ratio',
];

describe('report of an RL run', () => {
  it('draws the panels GRPO fills and no other, evaluations as points, spreads shaded, and the sampled completions', () => {
    const html = readFileSync(writeReport(grpoRun()), 'utf8');
    const captions = [...html.matchAll(/<figcaption>([^<]*)<\/figcaption>/g)].map((m) => m[1].replace(/&amp;/g, '&'));
    expect(captions).toEqual(RL_PANELS);
    expect(html).not.toContain('no data');
    expect(html).not.toContain('implicit-reward accuracy');
    // Two evaluations in each of the two panels that have them: points, no line between them.
    expect(html.match(/<circle class="eval"/g)!.length).toBe(4);
    expect(html.match(/<path /g)!.length).toBe(1 + 1 + 2 + 1 + 1 + 1 + 1 + 3 + 4 + 1 + 2 + 1 + 3);
    expect(html.match(/<polygon class="spread"/g)!.length).toBe(3);
    expect(html).toContain('Sampled completions (rewards and advantages)');
    expect(html).not.toContain('No sample generations');
    expect(html).toContain('digits 7 3 &lt;12&gt;');
    expect(html).toMatch(/<th>accuracy<\/th><th>even_len<\/th><th>reward<\/th><th>advantage<\/th>/);
    expect(html).toContain('<td>—</td>'); // a reward function that did not apply
    expect(html).toContain('<td>1.1547</td>');
  });

  // The report as a person sees it: rendered by Chromium (Debian's chromium package), checked in the DOM and screenshotted.
  it.skipIf(!existsSync(CHROMIUM))('renders in headless Chromium: every panel has a visible plot, the completions table shows, a screenshot is written', async () => {
    const dir = grpoRun();
    const file = writeReport(dir);
    const { chromium } = await import('playwright-core');
    const browser = await chromium.launch({ executablePath: CHROMIUM, args: ['--headless', '--no-sandbox', '--disable-gpu', '--disable-background-networking', '--disable-component-update', '--disable-sync'] });
    try {
      const page = await browser.newPage({ viewport: { width: 1400, height: 900 } });
      await page.goto(pathToFileURL(file).href);
      const figures = await page.$$eval('figure', (fs) =>
        fs.map((f) => {
          const svg = f.querySelector('svg')!;
          const box = svg.getBoundingClientRect();
          const drawn = [...svg.querySelectorAll('path, circle')].map((e) => (e as SVGGraphicsElement).getBBox());
          return { caption: f.querySelector('figcaption')!.textContent, w: box.width, h: box.height, marks: drawn.length, inside: drawn.every((b) => b.x >= 0 && b.y >= 0 && b.x + b.width <= 420 && b.y + b.height <= 220) };
        }),
      );
      expect(figures.map((f) => f.caption)).toEqual(RL_PANELS);
      for (const f of figures) {
        expect(f.w, f.caption!).toBe(420);
        expect(f.h, f.caption!).toBe(220);
        expect(f.marks, f.caption!).toBeGreaterThan(0);
        expect(f.inside, f.caption!).toBe(true);
      }
      const open = await page.$$eval('details.completions[open] tr', (trs) => trs.map((tr) => [...tr.children].map((c) => c.textContent!.trim())));
      expect(open[0]).toEqual(['#', 'completion', 'accuracy', 'even_len', 'reward', 'advantage']);
      expect(open[3]).toEqual(['2', '7', '1', '0.5', '1.5', '1.1547']);
      expect(await page.isVisible('details.completions[open] table')).toBe(true);
      const shot = join(dir, 'report.png');
      await page.screenshot({ path: shot, fullPage: true });
      expect(statSync(shot).size).toBeGreaterThan(20_000);
    } finally {
      await browser.close();
    }
  }, 120_000);
});

describe('report of a distillation run', () => {
  it("draws the distill panels: both KLs in one, the top-K masses, the on-policy share and length, the sampling and teacher seconds; grpo --teacher's k3 alone", () => {
    const dir = mkdtempSync(join(tmpdir(), 'pz-report-distill-'));
    const rows = [1, 2, 3, 4].map((step) => ({
      step, loss: 1 / step, 'distill/kl': 0.5 / step, 'distill/forward_kl': 0.6 / step, 'distill/teacher_topk_mass': 0.9, 'distill/student_topk_mass': 0.2 * step,
      'distill/on_policy': step % 2, 'distill/completion_length': 12, ...(step % 2 ? { 'distill/sample_seconds': 1.5, 'distill/teacher_seconds': 2 } : {}),
      grad_norm: 1, learning_rate: 1e-3, 'tokens/s': 100,
    }));
    writeFileSync(join(dir, 'metrics.jsonl'), rows.map((r) => JSON.stringify(r)).join('\n') + '\n');
    const html = readFileSync(writeReport(dir), 'utf8');
    const captions = [...html.matchAll(/<figcaption>([^<]*)<\/figcaption>/g)].map((m) => m[1].replace(/&#39;|&amp;/g, (e) => (e === '&amp;' ? '&' : "'")));
    expect(captions).toEqual([
      'loss', "KL to the teacher per token (over the teacher's top K + rest)", "share of the probability on the teacher's top K",
      "share of micro-batches on the student's own samples (lmbda)", "the student's samples: mean length (tokens)", "seconds per step: sampling and the teacher's scoring", 'grad_norm',
    ]);
    expect(html).toContain('reverse KL(student ‖ teacher)');
    expect(html).toContain('forward KL(teacher ‖ student)');
    // 1 loss + 2 KLs + 2 masses + 1 + 1 + 2 clocks (two points each) + grad_norm.
    expect(html.match(/<path /g)!.length).toBe(1 + 2 + 2 + 1 + 1 + 2 + 1);

    const grpo = mkdtempSync(join(tmpdir(), 'pz-report-grpo-teacher-'));
    writeFileSync(join(grpo, 'metrics.jsonl'), [1, 2].map((step) => JSON.stringify({ step, loss: 1, 'distill/kl': 0.1 * step })).join('\n') + '\n');
    const g = readFileSync(writeReport(grpo), 'utf8');
    expect([...g.matchAll(/<figcaption>([^<]*)<\/figcaption>/g)].map((m) => m[1])).toEqual(['loss', 'KL to the teacher (k3; grpo --teacher)']);
  });
});
