/**
 * `prefzoo report RUN` → RUN/report.html: loss, accuracy and margin curves as inline SVG (no
 * scripts, no network), the final evaluation table (eval.json, and a demo's before → after from
 * demo_eval.json) and the run's config.
 */
import { existsSync, readFileSync } from 'node:fs';
import { writeFileAtomic } from '../io/atomic.ts';
import { join } from 'node:path';
import { UserError } from '../errors.ts';
import { readSamples } from './samples.ts';
import { demoEvalTable, readDemoEval } from './demo-eval.ts';

export type MetricRow = Record<string, number | string>;

export function readMetrics(runDir: string): MetricRow[] {
  const file = join(runDir, 'metrics.jsonl');
  if (!existsSync(file)) throw new UserError(`${file}: not found (is ${runDir} a training run folder?)`);
  const rows: MetricRow[] = [];
  readFileSync(file, 'utf8')
    .split('\n')
    .forEach((line, i) => {
      if (!line.trim()) return;
      try {
        rows.push(JSON.parse(line));
      } catch {
        throw new UserError(`${file}:${i + 1}: invalid JSON`);
      }
    });
  return rows;
}

/**
 * Writes OUT/metrics.jsonl from runs that ran one after another (MPO's stages):
 * each part's rows carry its `tag` fields, and its steps are numbered on after the previous parts'
 * last training step, so one report draws the whole schedule.
 */
export function joinRunMetrics(out: string, parts: readonly { dir: string; tag: Record<string, number> }[]): void {
  const rows: MetricRow[] = [];
  let offset = 0;
  for (const part of parts) {
    const own = readMetrics(part.dir);
    for (const r of own) rows.push({ ...r, ...(typeof r.step === 'number' ? { step: r.step + offset } : {}), ...part.tag });
    offset += own.filter((r) => r.split !== 'eval' && typeof r.step === 'number').reduce((m, r) => Math.max(m, r.step as number), 0);
  }
  writeFileAtomic(join(out, 'metrics.jsonl'), rows.map((r) => JSON.stringify(r) + '\n').join(''));
}

function esc(s: string): string {
  return s.replace(/[&<>"]/g, (c) => ({ '&': '&amp;', '<': '&lt;', '>': '&gt;', '"': '&quot;' })[c]!);
}

function fmt(v: number): string {
  if (!Number.isFinite(v)) return String(v);
  const a = Math.abs(v);
  return a !== 0 && (a < 1e-3 || a >= 1e5) ? v.toExponential(2) : String(Math.round(v * 1e4) / 1e4);
}

/** One line chart of `key` against `step` (train rows, and eval rows drawn dashed if present). */
export function lineChart(title: string, series: { label: string; points: [number, number][]; dashed?: boolean }[]): string {
  const W = 420;
  const H = 220;
  const m = { l: 56, r: 12, t: 24, b: 32 };
  const all = series.flatMap((s) => s.points).filter(([x, y]) => Number.isFinite(x) && Number.isFinite(y));
  if (all.length === 0) return `<figure><figcaption>${esc(title)}</figcaption><p>no data</p></figure>`;
  let [x0, x1] = [Math.min(...all.map((p) => p[0])), Math.max(...all.map((p) => p[0]))];
  let [y0, y1] = [Math.min(...all.map((p) => p[1])), Math.max(...all.map((p) => p[1]))];
  if (x0 === x1) [x0, x1] = [x0 - 1, x1 + 1];
  if (y0 === y1) [y0, y1] = [y0 - 0.5, y1 + 0.5];
  const sx = (x: number) => m.l + ((x - x0) / (x1 - x0)) * (W - m.l - m.r);
  const sy = (y: number) => H - m.b - ((y - y0) / (y1 - y0)) * (H - m.t - m.b);
  const colors = ['#1f77b4', '#d62728', '#2ca02c', '#9467bd'];
  const paths = series
    .map((s, i) => {
      const pts = s.points.filter(([x, y]) => Number.isFinite(x) && Number.isFinite(y));
      if (!pts.length) return '';
      const d = pts.map(([x, y], k) => `${k ? 'L' : 'M'}${sx(x).toFixed(1)},${sy(y).toFixed(1)}`).join('');
      return `<path d="${d}" fill="none" stroke="${colors[i % colors.length]}" stroke-width="1.5"${s.dashed ? ' stroke-dasharray="4 3"' : ''}/>`;
    })
    .join('');
  const ticks = [0, 0.5, 1]
    .map((f) => {
      const y = y0 + f * (y1 - y0);
      return `<text x="${m.l - 6}" y="${sy(y) + 4}" text-anchor="end" font-size="10">${fmt(y)}</text><line x1="${m.l}" x2="${W - m.r}" y1="${sy(y)}" y2="${sy(y)}" stroke="#ddd"/>`;
    })
    .join('');
  const xt = [x0, x1].map((x) => `<text x="${sx(x)}" y="${H - m.b + 14}" text-anchor="middle" font-size="10">${fmt(x)}</text>`).join('');
  const legend = series
    .map((s, i) => `<text x="${m.l + 8 + i * 90}" y="${m.t - 8}" font-size="10" fill="${colors[i % colors.length]}">${esc(s.label)}</text>`)
    .join('');
  return (
    `<figure><figcaption>${esc(title)}</figcaption>` +
    `<svg xmlns="http://www.w3.org/2000/svg" width="${W}" height="${H}" viewBox="0 0 ${W} ${H}" role="img" aria-label="${esc(title)}">` +
    `${ticks}${xt}<text x="${(W + m.l) / 2}" y="${H - 4}" text-anchor="middle" font-size="10">step</text>${paths}${legend}</svg></figure>`
  );
}

function seriesOf(rows: MetricRow[], key: string): [number, number][] {
  return rows.filter((r) => typeof r[key] === 'number' && typeof r.step === 'number').map((r) => [r.step as number, r[key] as number]);
}

export function renderReport(runDir: string): string {
  const rows = readMetrics(runDir);
  const train = rows.filter((r) => r.split === undefined || r.split === 'train');
  const evals = rows.filter((r) => r.split === 'eval');
  const charts = [
    ['loss', 'loss'],
    ['rewards/accuracies', 'implicit-reward accuracy'],
    ['rewards/margins', 'reward margin'],
    ['reward', 'mean reward (GRPO)'],
  ]
    .map(([key, title]) =>
      lineChart(title, [
        { label: 'train', points: seriesOf(train, key) },
        { label: 'eval', points: seriesOf(evals, key), dashed: true },
      ]),
    )
    .join('\n');
  const evalFile = join(runDir, 'eval.json');
  // A demo's run holds the before → after evaluation the demo printed (demo-eval.ts).
  const demo = readDemoEval(runDir);
  let evalTable = demo ? demoEvalTable(demo) : '<p>No final evaluation recorded (eval.json is absent).</p>';
  if (existsSync(evalFile)) {
    const ev = JSON.parse(readFileSync(evalFile, 'utf8')) as Record<string, unknown>;
    evalTable =
      (demo ? evalTable : '') +
      '<table><tr><th>metric</th><th>value</th></tr>' +
      Object.entries(ev)
        .filter(([, v]) => typeof v === 'number' || typeof v === 'string')
        .map(([k, v]) => `<tr><td>${esc(k)}</td><td>${typeof v === 'number' ? fmt(v) : esc(String(v))}</td></tr>`)
        .join('') +
      '</table>';
  }
  const sampleSets = readSamples(runDir);
  const promptText = (p: unknown) => (typeof p === 'string' ? p : Array.isArray(p) ? p.map((m: { role: string; content: string }) => `${m.role}: ${m.content}`).join('\n') : JSON.stringify(p));
  const samples = sampleSets.length
    ? sampleSets
        .map(
          (set, i) =>
            `<details${i === sampleSets.length - 1 ? ' open' : ''}><summary>step ${set.step} (${set.rows.length} prompts)</summary>` +
            '<table><tr><th>#</th><th>prompt</th><th>reference</th><th>policy</th></tr>' +
            set.rows.map((r) => `<tr><td>${r.index}</td><td><pre>${esc(promptText(r.prompt))}</pre></td><td><pre>${esc(r.reference)}</pre></td><td><pre>${esc(r.policy)}</pre></td></tr>`).join('') +
            '</table></details>',
        )
        .join('\n')
    : '<p>No sample generations (set eval_generate=N to record them).</p>';
  const cfgFile = join(runDir, 'config.json');
  const cfg = existsSync(cfgFile) ? readFileSync(cfgFile, 'utf8') : '{}';
  const hubRows = hubSnapshots(cfg).map(([k, s]) => `<tr><td>${esc(k)}</td><td>${esc(`${s.repo}@${s.revision}`)}</td><td><code>${esc(s.commit)}</code></td><td>${esc(s.from)}</td></tr>`);
  return `<!doctype html><html><head><meta charset="utf-8"><title>prefzoo run report</title>
<style>body{font-family:system-ui,sans-serif;margin:2em;max-width:1400px}figure{display:inline-block;margin:0 1em 1em 0}
figcaption{font-weight:600}table{border-collapse:collapse}td,th{border:1px solid #ccc;padding:2px 8px;text-align:left}
pre{background:#f6f6f6;padding:1em;overflow:auto}</style></head><body>
<h1>prefzoo run: ${esc(runDir)}</h1>
<p>${train.length} logged training steps${evals.length ? `, ${evals.length} evaluations` : ''}.</p>
${charts}
<h2>Final evaluation</h2>
${evalTable}
<h2>Sample generations (greedy, eval prompts)</h2>
${samples}
${hubRows.length ? `<h2>Hub snapshots</h2>\n<table><tr><th>input</th><th>repo@revision</th><th>commit</th><th>from</th></tr>${hubRows.join('')}</table>` : ''}
<h2>Configuration</h2>
<pre>${esc(cfg)}</pre>
</body></html>
`;
}

/** The Hub snapshots a run's config.json records (docs/hub.md), by input. */
function hubSnapshots(cfg: string): [string, { repo: string; revision: string; commit: string; from: string }][] {
  try {
    const hub = (JSON.parse(cfg) as { hub?: Record<string, { repo: string; revision: string; commit: string; from: string }> }).hub;
    return hub ? Object.entries(hub) : [];
  } catch {
    return [];
  }
}

/** Writes RUN/report.html atomically and returns its path. */
export function writeReport(runDir: string): string {
  const html = renderReport(runDir);
  const out = join(runDir, 'report.html');
  writeFileAtomic(out, html);
  return out;
}
