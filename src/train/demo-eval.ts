/**
 * The held-out evaluation a demo prints, kept in its run folder as RUN/demo_eval.json so that
 * `prefzoo report RUN` shows the same before → after figures the demo printed. Every demo (src/demos:
 * the offline `prefzoo demo`, the online ones, GRPO's, the agent demos) writes it with `writeDemoEval`;
 * the report reads it with `readDemoEval` and draws it with `demoEvalTable`. The format stays here,
 * below the demos, because the report (this floor) reads it.
 *
 *   {
 *     "demo": "nash_md",                       what ran (a loss or an online method)
 *     "heldout": "100 held-out prompts, …",    what the figures were measured on
 *     "metrics": { "heldout_accuracy": { "before": 0.12, "after": 0.91 }, … },
 *     "values": { "win_rate_vs_start": 0.93, "seconds": 61.2 }     figures without a before
 *   }
 */
import { existsSync, readFileSync } from 'node:fs';
import { join } from 'node:path';
import { UserError } from '../errors.ts';
import { writeJsonAtomic } from '../io/atomic.ts';

export const DEMO_EVAL_FILE = 'demo_eval.json';

export interface DemoEval {
  /** What ran: the loss of the offline demo, or the online method. */
  demo: string;
  /** What the figures were measured on (shown above the table). */
  heldout: string;
  /** Figures measured on the starting model and on the trained one. */
  metrics: Record<string, { before: number; after: number }>;
  /** Figures without a "before" (a win-rate of the final model against the start, the run's time). */
  values?: Record<string, number>;
}

/**
 * The precision a demo's GRPO run sampled its rollouts in (RUN/config.json's rollout_dtype, given as
 * `--param rollout_dtype=…`; f32 where the run records none), for the demo's --json line: the seed
 * tables per dtype (scripts/bench/dtype-table.sh) read it there.
 */
export function runRolloutDtype(runDir: string): string {
  const file = join(runDir, 'config.json');
  try {
    const v = (JSON.parse(readFileSync(file, 'utf8')) as { rollout_dtype?: unknown }).rollout_dtype;
    return typeof v === 'string' ? v : 'f32';
  } catch {
    throw new UserError(`${file}: unreadable or invalid JSON`);
  }
}

/** Writes RUN/demo_eval.json atomically and returns its path. */
export function writeDemoEval(runDir: string, ev: DemoEval): string {
  const file = join(runDir, DEMO_EVAL_FILE);
  writeJsonAtomic(file, ev);
  return file;
}

/** RUN/demo_eval.json, or null where the run is not a demo's; a damaged file is a one-line error naming it. */
export function readDemoEval(runDir: string): DemoEval | null {
  const file = join(runDir, DEMO_EVAL_FILE);
  if (!existsSync(file)) return null;
  let ev: DemoEval;
  try {
    ev = JSON.parse(readFileSync(file, 'utf8'));
  } catch {
    throw new UserError(`${file}: invalid JSON`);
  }
  const num = (v: unknown) => typeof v === 'number';
  const ok =
    ev !== null && typeof ev === 'object' && typeof ev.demo === 'string' && typeof ev.heldout === 'string' &&
    ev.metrics !== null && typeof ev.metrics === 'object' &&
    Object.values(ev.metrics).every((m) => m !== null && typeof m === 'object' && num(m.before) && num(m.after)) &&
    (ev.values === undefined || (ev.values !== null && typeof ev.values === 'object' && Object.values(ev.values).every(num)));
  if (!ok) throw new UserError(`${file}: not a demo evaluation (expected "demo", "heldout", "metrics": {name: {before, after}}, "values": {name: number})`);
  return ev;
}

function esc(s: string): string {
  return s.replace(/[&<>"]/g, (c) => ({ '&': '&amp;', '<': '&lt;', '>': '&gt;', '"': '&quot;' })[c]!);
}

/** Four decimals, as the demos print them (NaN and infinities by name). */
function fixed(v: number): string {
  return Number.isFinite(v) ? v.toFixed(4) : String(v);
}

/** The demo's evaluation as an HTML fragment: one row per metric, before → after, then the values. */
export function demoEvalTable(ev: DemoEval): string {
  const rows = Object.entries(ev.metrics).map(
    ([k, m]) => `<tr><td>${esc(k)}</td><td>${fixed(m.before)}</td><td>${fixed(m.after)}</td><td>${m.after - m.before >= 0 ? '+' : ''}${fixed(m.after - m.before)}</td></tr>`,
  );
  const values = Object.entries(ev.values ?? {}).map(([k, v]) => `<tr><td>${esc(k)}</td><td colspan="3">${fixed(v)}</td></tr>`);
  return (
    `<p>Demo <code>${esc(ev.demo)}</code>, held-out evaluation: ${esc(ev.heldout)}.</p>` +
    '<table class="demo-eval"><tr><th>metric</th><th>before</th><th>after</th><th>change</th></tr>' +
    rows.join('') +
    values.join('') +
    '</table>'
  );
}
