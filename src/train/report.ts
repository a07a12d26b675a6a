/**
 * `prefzoo report RUN` → RUN/report.html: the curves of what the run's method logged as inline SVG
 * (no scripts, no network) — loss, and for preference losses accuracy and margin; for RL runs
 * (GRPO) reward in total and per function with their spread, entropy and entropy_coef, KL, clip
 * ratios, completion lengths and the clipped share, the sampler–trainer mismatch; for distillation
 * the KLs to the teacher, the top-K mass covered, the on-policy share and the sampling and teacher
 * seconds of each step — a panel only
 * where the run logged its metric, evaluations as points; the final evaluation table (eval.json,
 * and a demo's before → after from demo_eval.json); sample generations, and an RL run's sampled
 * completions (completions.jsonl) with their rewards and advantages; the run's config.
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

export interface ChartSeries {
  label: string;
  points: [number, number][];
  dashed?: boolean;
  /** Drawn as separate points (evaluations), not a line through them. */
  markers?: boolean;
  /** A shaded spread around the line: [step, low, high] (mean ± std). */
  band?: [number, number, number][];
  /** Index into the palette (default: the series' own); a metric's evaluations take its line's. */
  color?: number;
}

const COLORS = ['#1f77b4', '#d62728', '#2ca02c', '#9467bd', '#ff7f0e', '#8c564b', '#e377c2', '#17becf'];

/** One line chart against `step`: lines, optional spreads, and point series (evaluations). */
export function lineChart(title: string, series: ChartSeries[]): string {
  const W = 420;
  const H = 220;
  const m = { l: 56, r: 12, t: 24, b: 32 };
  const finite = ([x, y]: [number, number]) => Number.isFinite(x) && Number.isFinite(y);
  const bands = series.flatMap((s) => (s.band ?? []).filter(([x, lo, hi]) => Number.isFinite(x) && Number.isFinite(lo) && Number.isFinite(hi)));
  const all = [...series.flatMap((s) => s.points).filter(finite), ...bands.flatMap(([x, lo, hi]) => [[x, lo], [x, hi]] as [number, number][])];
  if (all.length === 0) return `<figure><figcaption>${esc(title)}</figcaption><p>no data</p></figure>`;
  let [x0, x1] = [Math.min(...all.map((p) => p[0])), Math.max(...all.map((p) => p[0]))];
  let [y0, y1] = [Math.min(...all.map((p) => p[1])), Math.max(...all.map((p) => p[1]))];
  if (x0 === x1) [x0, x1] = [x0 - 1, x1 + 1];
  if (y0 === y1) [y0, y1] = [y0 - 0.5, y1 + 0.5];
  const sx = (x: number) => m.l + ((x - x0) / (x1 - x0)) * (W - m.l - m.r);
  const sy = (y: number) => H - m.b - ((y - y0) / (y1 - y0)) * (H - m.t - m.b);
  const color = (i: number) => COLORS[(series[i].color ?? i) % COLORS.length];
  const spreads = series
    .map((s, i) => {
      const b = (s.band ?? []).filter(([x, lo, hi]) => Number.isFinite(x) && Number.isFinite(lo) && Number.isFinite(hi));
      if (b.length < 2) return '';
      const upper = b.map(([x, , hi]) => `${sx(x).toFixed(1)},${sy(hi).toFixed(1)}`);
      const lower = [...b].reverse().map(([x, lo]) => `${sx(x).toFixed(1)},${sy(lo).toFixed(1)}`);
      return `<polygon class="spread" points="${[...upper, ...lower].join(' ')}" fill="${color(i)}" fill-opacity="0.15" stroke="none"/>`;
    })
    .join('');
  const paths = series
    .map((s, i) => {
      const pts = s.points.filter(finite);
      if (!pts.length) return '';
      if (s.markers) return pts.map(([x, y]) => `<circle class="eval" cx="${sx(x).toFixed(1)}" cy="${sy(y).toFixed(1)}" r="3.5" fill="${color(i)}"/>`).join('');
      const d = pts.map(([x, y], k) => `${k ? 'L' : 'M'}${sx(x).toFixed(1)},${sy(y).toFixed(1)}`).join('');
      return `<path d="${d}" fill="none" stroke="${color(i)}" stroke-width="1.5"${s.dashed ? ' stroke-dasharray="4 3"' : ''}/>`;
    })
    .join('');
  const ticks = [0, 0.5, 1]
    .map((f) => {
      const y = y0 + f * (y1 - y0);
      return `<text x="${m.l - 6}" y="${sy(y) + 4}" text-anchor="end" font-size="10">${fmt(y)}</text><line x1="${m.l}" x2="${W - m.r}" y1="${sy(y)}" y2="${sy(y)}" stroke="#ddd"/>`;
    })
    .join('');
  const xt = [x0, x1].map((x) => `<text x="${sx(x)}" y="${H - m.b + 14}" text-anchor="middle" font-size="10">${fmt(x)}</text>`).join('');
  const shown = series.map((s, i) => ({ s, i })).filter(({ s }) => s.points.some(finite));
  const legend = shown.length > 1 || shown.some(({ s }) => s.markers || s.band)
    ? `<div class="legend">${shown.map(({ s, i }) => `<span style="color:${color(i)}">${s.markers ? '●' : '━'} ${esc(s.label)}${s.band?.length ? ' (± std shaded)' : ''}</span>`).join(' ')}</div>`
    : '';
  return (
    `<figure><figcaption>${esc(title)}</figcaption>` +
    `<svg xmlns="http://www.w3.org/2000/svg" width="${W}" height="${H}" viewBox="0 0 ${W} ${H}" role="img" aria-label="${esc(title)}">` +
    `${ticks}${xt}<text x="${(W + m.l) / 2}" y="${H - 4}" text-anchor="middle" font-size="10">step</text>${spreads}${paths}</svg>${legend}</figure>`
  );
}

function seriesOf(rows: MetricRow[], key: string): [number, number][] {
  return rows.filter((r) => typeof r[key] === 'number' && typeof r.step === 'number').map((r) => [r.step as number, r[key] as number]);
}

function bandOf(rows: MetricRow[], key: string, std: string): [number, number, number][] {
  return rows
    .filter((r) => typeof r[key] === 'number' && typeof r[std] === 'number' && typeof r.step === 'number')
    .map((r) => [r.step as number, (r[key] as number) - (r[std] as number), (r[key] as number) + (r[std] as number)]);
}

/** A panel: its title and the metrics it draws (TRL's names), each with an optional spread metric. */
interface Panel {
  title: string;
  series: { key: string; label: string; std?: string }[];
}

/**
 * The panels a run may fill, in the order drawn. A panel is drawn only when the run logged one of its
 * metrics (a DPO run has no reward panel, a GRPO run no implicit-reward accuracy).
 */
function panelsOf(rows: MetricRow[]): Panel[] {
  const keys = new Set(rows.flatMap((r) => Object.keys(r)));
  const one = (key: string, title: string, label = key): Panel => ({ title, series: [{ key, label }] });
  // Reward functions log rewards/<name>/mean and /std (TRL's names).
  const fns = [...keys].map((k) => /^rewards\/(.+)\/mean$/.exec(k)?.[1]).filter((n): n is string => n !== undefined).sort();
  return [
    one('loss', 'loss'),
    one('rewards/accuracies', 'implicit-reward accuracy'),
    one('rewards/margins', 'reward margin'),
    { title: 'reward (mean ± std over the round)', series: [{ key: 'reward', label: 'reward', std: 'reward_std' }] },
    { title: 'reward per function (mean ± std)', series: fns.map((n) => ({ key: `rewards/${n}/mean`, label: n, std: `rewards/${n}/std` })) },
    one('frac_reward_zero_std', 'share of groups with zero reward spread', 'frac_reward_zero_std'),
    one('entropy', 'entropy (nats per token)'),
    one('entropy_coef', 'entropy_coef'),
    one('kl', 'KL to the reference (k3)'),
    // grpo --teacher logs distill/kl alone (a k3 estimate); distill logs both KLs over the teacher's K + 1 outcomes.
    keys.has('distill/forward_kl')
      ? { title: "KL to the teacher per token (over the teacher's top K + rest)", series: [{ key: 'distill/kl', label: 'reverse KL(student ‖ teacher)' }, { key: 'distill/forward_kl', label: 'forward KL(teacher ‖ student)' }] }
      : one('distill/kl', 'KL to the teacher (k3; grpo --teacher)'),
    {
      title: "share of the probability on the teacher's top K",
      series: [
        { key: 'distill/teacher_topk_mass', label: 'teacher' },
        { key: 'distill/student_topk_mass', label: 'student' },
      ],
    },
    one('distill/on_policy', "share of micro-batches on the student's own samples (lmbda)", 'on_policy'),
    one('distill/completion_length', "the student's samples: mean length (tokens)", 'completion_length'),
    {
      title: 'seconds per step: sampling and the teacher\'s scoring',
      series: [
        { key: 'distill/sample_seconds', label: "student's sampling" },
        { key: 'distill/teacher_seconds', label: "teacher's scoring" },
      ],
    },
    {
      title: 'clip ratios',
      series: [
        { key: 'clip_ratio/low_mean', label: 'low' },
        { key: 'clip_ratio/high_mean', label: 'high' },
        { key: 'clip_ratio/region_mean', label: 'region' },
        { key: 'cispo_clip_ratio', label: 'cispo' },
      ],
    },
    one('vespo/phi_seq_mean', 'VESPO weight φ (mean)'),
    {
      title: 'completion length (tokens)',
      series: [
        { key: 'completions/mean_length', label: 'mean' },
        { key: 'completions/min_length', label: 'min' },
        { key: 'completions/max_length', label: 'max' },
        { key: 'completions/mean_terminated_length', label: 'mean terminated' },
      ],
    },
    one('completions/clipped_ratio', 'share of completions cut at max_completion_length', 'clipped_ratio'),
    {
      title: 'sampler–trainer log-prob difference |old − sampling|',
      series: [
        { key: 'sampling/sampling_logp_difference/mean', label: 'mean' },
        { key: 'sampling/sampling_logp_difference/max', label: 'max' },
      ],
    },
    one('sampling/sampling_kl', 'sampler–trainer KL (k3 estimate)', 'KL'),
    {
      title: 'sampler correction ratio',
      series: [
        { key: 'sampling/importance_sampling_ratio/min', label: 'min' },
        { key: 'sampling/importance_sampling_ratio/mean', label: 'mean' },
        { key: 'sampling/importance_sampling_ratio/max', label: 'max' },
      ],
    },
  ].filter((p) => p.series.some((s) => keys.has(s.key)));
}

/** Bookkeeping columns of a metrics row, not curves. */
const NOT_CURVES = new Set(['step', 'epoch', 'split', 'tokens', 'num_tokens', 'tokens/s', 'learning_rate']);

/**
 * The rest of what the run logged (a method's own metrics, e.g. Nash-MD's objective/win_rate_vs_mixture,
 * DPO's rewards/chosen): one panel per metric, or per family `name/…` of several.
 */
function otherPanels(rows: MetricRow[], drawn: Panel[]): Panel[] {
  const taken = new Set(drawn.flatMap((p) => p.series.flatMap((s) => [s.key, ...(s.std ? [s.std] : [])])));
  const keys = [...new Set(rows.flatMap((r) => Object.keys(r).filter((k) => typeof r[k] === 'number')))].filter((k) => !taken.has(k) && !NOT_CURVES.has(k));
  const families = new Map<string, string[]>();
  for (const k of keys) {
    const slash = k.indexOf('/');
    const fam = slash > 0 ? k.slice(0, slash) : k;
    families.set(fam, [...(families.get(fam) ?? []), k]);
  }
  return [...families.entries()].map(([fam, ks]) =>
    ks.length === 1 ? { title: ks[0], series: [{ key: ks[0], label: ks[0] }] } : { title: `${fam}/…`, series: ks.map((k) => ({ key: k, label: k.slice(fam.length + 1) })) },
  );
}

/** The panel's chart: each metric's training line (with its spread), and its evaluations as points. */
function panelChart(p: Panel, train: MetricRow[], evals: MetricRow[]): string {
  const series: ChartSeries[] = [];
  p.series.forEach((s, i) => series.push({ label: s.label, points: seriesOf(train, s.key), band: s.std ? bandOf(train, s.key, s.std) : undefined, color: i }));
  p.series.forEach((s, i) => series.push({ label: `${s.label} (eval)`, points: seriesOf(evals, s.key), markers: true, color: i }));
  return lineChart(p.title, series.filter((s) => s.points.length > 0));
}

/** An RL run's logged completions (RUN/completions.jsonl): prompt, completion, rewards per function, reward, advantage. */
interface CompletionRow {
  step: number;
  prompt: unknown;
  completion: string;
  rewards?: Record<string, number | null>;
  reward?: number | null;
  advantage?: number;
  /** A multi-turn rollout's whole conversation (tool calls and results), its turns and why it ended. */
  messages?: { role: string; content: string; name?: string; tool_calls?: { function: { name: string; arguments: unknown } }[] }[];
  turns?: number;
  stop_reason?: string;
}

/** A multi-turn rollout as a conversation: each message by role, an assistant's tool calls under it. */
function conversationHtml(r: CompletionRow): string {
  const lines = (r.messages ?? []).map((m) => {
    const calls = (m.tool_calls ?? []).map((c) => `\n→ ${c.function.name}(${typeof c.function.arguments === 'string' ? c.function.arguments : JSON.stringify(c.function.arguments)})`).join('');
    return `<div class="msg ${esc(m.role)}"><b>${esc(m.role)}${m.name ? ` ${esc(m.name)}` : ''}</b><pre>${esc(m.content)}${esc(calls)}</pre></div>`;
  });
  return `<div class="conversation"><p>conversation of completion 0: ${r.turns ?? '?'} turns, ended by ${esc(r.stop_reason ?? '?')}</p>${lines.join('')}</div>`;
}

function readCompletions(runDir: string): CompletionRow[] {
  const file = join(runDir, 'completions.jsonl');
  if (!existsSync(file)) return [];
  const out: CompletionRow[] = [];
  readFileSync(file, 'utf8')
    .split('\n')
    .forEach((line, i) => {
      if (!line.trim()) return;
      try {
        out.push(JSON.parse(line) as CompletionRow);
      } catch {
        throw new UserError(`${file}:${i + 1}: invalid JSON`);
      }
    });
  return out;
}

const promptText = (p: unknown) => (typeof p === 'string' ? p : Array.isArray(p) ? p.map((m: { role: string; content: string }) => `${m.role}: ${m.content}`).join('\n') : JSON.stringify(p));

/** The last `keep` logged steps of completions, one table each (the newest open). */
function completionsSection(rows: CompletionRow[], keep = 4): string {
  const steps = [...new Set(rows.map((r) => r.step))].sort((a, b) => a - b);
  const shown = steps.slice(-keep);
  const num = (v: number | null | undefined) => (v === null || v === undefined ? '—' : fmt(v));
  const tables = shown.map((step, i) => {
    const at = rows.filter((r) => r.step === step);
    const fns = [...new Set(at.flatMap((r) => Object.keys(r.rewards ?? {})))];
    const prompts = [...new Set(at.map((r) => promptText(r.prompt)))];
    return (
      `<details class="completions"${i === shown.length - 1 ? ' open' : ''}><summary>step ${step} (${at.length} completions)</summary>` +
      prompts.map((p) => `<pre>${esc(p)}</pre>`).join('') +
      (at[0]?.messages ? conversationHtml(at[0]) : '') +
      `<table><tr><th>#</th><th>completion</th>${fns.map((f) => `<th>${esc(f)}</th>`).join('')}<th>reward</th><th>advantage</th></tr>` +
      at.map((r, k) => `<tr><td>${k}</td><td><pre>${esc(r.completion)}</pre></td>${fns.map((f) => `<td>${num(r.rewards?.[f])}</td>`).join('')}<td>${num(r.reward)}</td><td>${num(r.advantage)}</td></tr>`).join('') +
      '</table></details>'
    );
  });
  return `<p>${steps.length} logged steps in completions.jsonl${steps.length > shown.length ? `; the last ${shown.length} shown` : ''}.</p>\n${tables.join('\n')}`;
}

export function renderReport(runDir: string): string {
  const rows = readMetrics(runDir);
  const train = rows.filter((r) => r.split === undefined || r.split === 'train');
  const evals = rows.filter((r) => r.split === 'eval');
  const known = panelsOf(rows);
  const charts = [...known, ...otherPanels(rows, known)].map((p) => panelChart(p, train, evals)).join('\n');
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
  const completions = readCompletions(runDir);
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
  // An RL run's own samples are its completions; the eval-sample section appears there only when recorded.
  const sampleSection = completions.length
    ? `<h2>Sampled completions (rewards and advantages)</h2>\n${completionsSection(completions)}${sampleSets.length ? `\n<h2>Sample generations (greedy, eval prompts)</h2>\n${samples}` : ''}`
    : `<h2>Sample generations (greedy, eval prompts)</h2>\n${samples}`;
  const cfgFile = join(runDir, 'config.json');
  const cfg = existsSync(cfgFile) ? readFileSync(cfgFile, 'utf8') : '{}';
  const hubRows = hubSnapshots(cfg).map(([k, s]) => `<tr><td>${esc(k)}</td><td>${esc(`${s.repo}@${s.revision}`)}</td><td><code>${esc(s.commit)}</code></td><td>${esc(s.from)}</td></tr>`);
  return `<!doctype html><html><head><meta charset="utf-8"><title>prefzoo run report</title>
<style>body{font-family:system-ui,sans-serif;margin:2em;max-width:1400px}figure{display:inline-block;margin:0 1em 1em 0;vertical-align:top}
figcaption{font-weight:600}.legend{font-size:11px;max-width:420px}.legend span{margin-right:1em}table{border-collapse:collapse}td,th{border:1px solid #ccc;padding:2px 8px;text-align:left}
pre{background:#f6f6f6;padding:1em;overflow:auto}td pre{padding:0.2em;margin:0}</style></head><body>
<h1>prefzoo run: ${esc(runDir)}</h1>
<p>${train.length} logged training steps${evals.length ? `, ${evals.length} evaluations (drawn as points)` : ''}.</p>
${charts}
<h2>Final evaluation</h2>
${evalTable}
${sampleSection}
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
