/**
 * `prefzoo eval`: implicit rewards r̂(y) = β·(log π(y|x) − log π_ref(y|x)) of a policy against a
 * reference on a dataset, summarised per kind (pairwise accuracy, listwise NDCG / Kendall τ / top-1,
 * single-trajectory ROC-AUC), overall and per `source`.
 */
import { UserError } from '../cli/errors.ts';
import { loadModel } from '../models/load.ts';
import { maxPositions } from '../models/config.ts';
import { DEFAULT_CONFIG } from '../train/config.ts';
import { loadTokenizer } from '../tokenize/index.ts';
import type { RuntimeOptions } from '../runtime/session.ts';
import { loadData, tokenizeExamples, type TruncationConfig } from '../train/data.ts';
import { Scorer } from '../train/scorer.ts';
import { groupBy, kendallTau, listwiseMetrics, pairwiseMetrics, rocAuc, mean } from './metrics.ts';

export interface EvalOptions {
  policy: string;
  ref: string;
  data: string;
  /** Where a non-canonical input is converted to. */
  workDir: string;
  /** `beta` (default 0.1) scales the implicit rewards. */
  params?: Record<string, unknown>;
  runtime?: RuntimeOptions;
  quiet?: boolean;
  truncation?: TruncationConfig;
  batchSize?: number;
}

export interface EvalSummary {
  kind: string;
  overall: Record<string, number>;
  bySource: Record<string, Record<string, number>>;
}

function betaOf(params: Record<string, unknown> | undefined): number {
  const raw = params?.beta ?? 0.1;
  const b = Number(raw);
  if (!Number.isFinite(b) || b <= 0) throw new UserError(`--param beta must be a number > 0, got ${JSON.stringify(raw)}`);
  return b;
}

/** Summary metrics for the rows `idx` of one kind. */
function summarise(kind: string, idx: number[], rewards: number[][], ex: { scores?: number[]; label?: boolean; reward?: number }[], logps: number[][]): Record<string, number> {
  if (kind === 'pairwise') {
    const m = pairwiseMetrics(idx.map((i) => rewards[i][0]), idx.map((i) => rewards[i][1]));
    return {
      accuracy: m.accuracy,
      margin: m.margin,
      chosen_reward: m.chosen_reward,
      rejected_reward: m.rejected_reward,
      // The policy's own preference, independent of the reference (ties count as wrong).
      preference_accuracy: mean(idx.map((i) => (logps[i][0] > logps[i][1] ? 1 : 0))),
      chosen_logp: mean(idx.map((i) => logps[i][0])),
      rejected_logp: mean(idx.map((i) => logps[i][1])),
      count: m.count,
    };
  }
  if (kind === 'listwise') {
    const m = listwiseMetrics(idx.map((i) => rewards[i]), idx.map((i) => ex[i].scores ?? []));
    return { ndcg: m.ndcg, kendall_tau: m.kendall_tau, top1_accuracy: m.top1_accuracy, count: m.count };
  }
  const r = idx.map((i) => rewards[i][0]);
  if (idx.every((i) => ex[i].label !== undefined)) {
    return { roc_auc: rocAuc(r, idx.map((i) => ex[i].label!)), mean_reward: mean(r), count: idx.length };
  }
  const target = idx.map((i) => ex[i].reward ?? NaN);
  const sorted = [...target].sort((a, b) => a - b);
  const median = sorted[Math.floor(sorted.length / 2)];
  return {
    roc_auc: rocAuc(r, target.map((t) => t >= median)),
    kendall_tau: kendallTau(r, target),
    mean_reward: mean(r),
    count: idx.length,
  };
}

export async function evaluateRows(o: EvalOptions): Promise<EvalSummary> {
  const beta = betaOf(o.params);
  const policy = loadModel(o.policy);
  const ref = loadModel(o.ref);
  const tok = loadTokenizer(o.policy);
  const data = await loadData(o.data, o.workDir);
  // Same truncation as training by default, capped by the model's positions.
  const maxLen = Math.min(o.truncation?.max_length ?? DEFAULT_CONFIG.max_length, maxPositions(policy.config));
  const trunc: TruncationConfig = {
    max_length: maxLen,
    max_prompt_length: Math.min(o.truncation?.max_prompt_length ?? DEFAULT_CONFIG.max_prompt_length, maxLen - 1),
    truncation: o.truncation?.truncation ?? DEFAULT_CONFIG.truncation,
  };
  const { rows, truncated } = tokenizeExamples(data.examples, tok, trunc);
  if (truncated && !o.quiet) process.stderr.write(`eval: ${truncated} of ${rows.length} rows truncated to max_length ${trunc.max_length} / max_prompt_length ${trunc.max_prompt_length}\n`);
  const runtime = o.runtime ?? {};
  const bs = o.batchSize ?? 8;
  const ps = await Scorer.create(policy.config, policy.weights, runtime, tok.padId ?? 0);
  const pl = (await ps.score(data.kind, rows, { batchSize: bs, label: 'policy log-probs', quiet: o.quiet })).logps;
  await ps.release();
  const rs = await Scorer.create(ref.config, ref.weights, runtime, tok.padId ?? 0);
  const rl = (await rs.score(data.kind, rows, { batchSize: bs, label: 'reference log-probs', quiet: o.quiet })).logps;
  await rs.release();
  const rewards = pl.map((lp, i) => lp.map((v, k) => beta * (v - rl[i][k])));
  const all = rows.map((_, i) => i);
  const ex = data.examples;
  const overall = { ...summarise(data.kind, all, rewards, ex, pl), truncated };
  const bySource: Record<string, Record<string, number>> = {};
  if (ex.some((e) => e.source !== undefined)) {
    for (const [src, idx] of groupBy(ex.map((e) => e.source ?? null))) bySource[src] = summarise(data.kind, idx, rewards, ex, pl);
  }
  return { kind: data.kind, overall, bySource };
}

/** A fixed-width table of the summary, one row per source after the overall row. */
export function formatEvalTable(s: EvalSummary): string {
  const keys = Object.keys(s.overall);
  const rows: [string, Record<string, number>][] = [['overall', s.overall], ...Object.entries(s.bySource)];
  const cell = (v: number) => (Number.isInteger(v) ? String(v) : v.toFixed(4));
  const widths = [Math.max(6, ...rows.map((r) => r[0].length)), ...keys.map((k) => Math.max(k.length, ...rows.map((r) => cell(r[1][k] ?? NaN).length)))];
  const line = (cells: string[]) => cells.map((c, i) => (i === 0 ? c.padEnd(widths[i]) : c.padStart(widths[i]))).join('  ');
  return [line(['source', ...keys]), line(widths.map((w) => '-'.repeat(w))), ...rows.map(([name, m]) => line([name, ...keys.map((k) => cell(m[k] ?? NaN))]))].join('\n');
}
