/**
 * `prefzoo eval`: implicit rewards r̂(y) = β·(log π(y|x) − log π_ref(y|x)) of a policy against a
 * reference on a dataset, summarised per kind (pairwise accuracy, listwise NDCG / Kendall τ / top-1,
 * single-trajectory ROC-AUC), overall and per `source`.
 */
import { UserError } from '../errors.ts';
import { loadModel } from '../models/load.ts';
import { maxPositions } from '../models/config.ts';
import { loadTokenizer } from '../tokenize/index.ts';
import type { RuntimeOptions } from '../runtime/session.ts';
import type { Reporter } from '../progress.ts';
import { DEFAULT_TRUNCATION, loadData, tokenizeExamples, type Example, type TokenizedExample, type TruncationConfig } from '../../datasets/examples.ts';
import type { ModelConfig } from '../models/config.ts';
import type { FloatTensor } from '../models/checkpoint.ts';
import type { Kind } from '../../datasets/schema.ts';
import { Scorer, scoredLongest } from '../models/scorer.ts';
import { TIE_RTOL, tieTolRef } from '../../losses/core/metrics.ts';
import { groupBy, kendallTau, listwiseMetrics, pairwiseMetrics, rocAuc, mean } from './metrics.ts';

/** A model folder, or a model already in memory (the trainer's current weights). */
export type ModelSource = string | { config: ModelConfig; weights: Map<string, FloatTensor> };

export interface EvalOptions {
  policy: ModelSource;
  ref: ModelSource;
  data: string;
  /** Tokenizer folder (default: the policy's, else the reference's folder). */
  tokenizer?: string;
  /** Where a non-canonical input is converted to. */
  workDir: string;
  /** `beta` (default 0.1) scales the implicit rewards. */
  params?: Record<string, unknown>;
  runtime?: RuntimeOptions;
  /** The scoring progress and the truncation note (the CLI's: on stderr); none without it. */
  reporter?: Reporter;
  truncation?: TruncationConfig;
  batchSize?: number;
  /** Evaluate on the first N rows of the data only (0 or absent: all). */
  maxRows?: number;
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

function resolveModel(m: ModelSource): { config: ModelConfig; weights: Map<string, FloatTensor> } {
  return typeof m === 'string' ? loadModel(m) : m;
}

/** Non-finite log-probs make every metric meaningless: stop like `train` does on a NaN loss. */
function checkFinite(logps: number[][], which: string, model: ModelSource, data: string): void {
  const bad = logps.findIndex((r) => r.some((v) => !Number.isFinite(v)));
  if (bad < 0) return;
  const n = logps.filter((r) => r.some((v) => !Number.isFinite(v))).length;
  const name = typeof model === 'string' ? model : `the ${which} model`;
  throw new UserError(`${name}: the ${which} log-probs are not finite for ${n} of ${logps.length} rows of ${data} (first: row ${bad + 1}, ${logps[bad].find((v) => !Number.isFinite(v))}); no metric would mean anything`);
}

/** Summary metrics for the rows `idx` of one kind. */
function summarise(kind: string, idx: number[], rewards: number[][], ex: { scores?: number[]; label?: boolean; reward?: number }[], logps: number[][], refLogps: number[][], beta: number): Record<string, number> {
  if (kind === 'pairwise') {
    const tol = tieTolRef(beta, idx.map((i) => logps[i][0]), idx.map((i) => refLogps[i][0]), idx.map((i) => logps[i][1]), idx.map((i) => refLogps[i][1]));
    const m = pairwiseMetrics(idx.map((i) => rewards[i][0]), idx.map((i) => rewards[i][1]), tol);
    return {
      accuracy: m.accuracy,
      ties: m.ties,
      margin: m.margin,
      chosen_reward: m.chosen_reward,
      rejected_reward: m.rejected_reward,
      // The policy's own preference, independent of the reference (same rule: ties count as wrong).
      preference_accuracy: mean(idx.map((i) => (logps[i][0] - logps[i][1] > TIE_RTOL * (Math.abs(logps[i][0]) + Math.abs(logps[i][1])) ? 1 : 0))),
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

/**
 * An evaluation set prepared once: data loaded, tokenized, and scored by the reference, so
 * evaluating a policy (every eval_steps during training, or once) only runs the policy.
 */
export class Evaluator {
  private constructor(
    private readonly o: EvalOptions,
    readonly kind: string,
    private readonly rows: TokenizedExample[],
    private readonly examples: Example[],
    private readonly refLogps: number[][],
    private readonly truncated: number,
    private readonly padId: number,
  ) {}

  static async create(o: Omit<EvalOptions, 'policy'> & { policy?: ModelSource }): Promise<Evaluator> {
    const ref = resolveModel(o.ref);
    const tokDir = o.tokenizer ?? (typeof o.policy === 'string' ? o.policy : typeof o.ref === 'string' ? o.ref : undefined);
    if (!tokDir) throw new Error('Evaluator: name the tokenizer folder');
    const tok = loadTokenizer(tokDir);
    const data = await loadData(o.data, o.workDir, { maxRows: o.maxRows });
    if (data.kind === 'single' && data.examples.every((e) => e.reward === undefined && e.label === undefined)) {
      // ROC-AUC and rank correlation need a score per row; SFT conversations have none.
      throw new UserError(`${o.data}: conversations without reward or label (SFT data) have nothing for eval's metrics to rank; evaluate on pairwise, listwise or scored single data`);
    }
    // Same truncation as training by default, capped by the model's positions.
    const maxLen = Math.min(o.truncation?.max_length ?? DEFAULT_TRUNCATION.max_length, maxPositions(ref.config));
    const trunc: TruncationConfig = {
      max_length: maxLen,
      max_prompt_length: Math.min(o.truncation?.max_prompt_length ?? DEFAULT_TRUNCATION.max_prompt_length, maxLen - 1),
      truncation: o.truncation?.truncation ?? DEFAULT_TRUNCATION.truncation,
    };
    const { rows, truncated } = tokenizeExamples(data.examples, tok, trunc, data.tokens);
    if (truncated) o.reporter?.info(`eval: ${truncated} of ${rows.length} rows truncated to max_length ${trunc.max_length} / max_prompt_length ${trunc.max_prompt_length}`);
    const rs = await Scorer.create(ref.config, ref.weights, o.runtime ?? {}, tok.padId ?? 0, scoredLongest(data.kind, rows, { batchSize: o.batchSize }));
    const rl = (await rs.score(data.kind, rows, { batchSize: o.batchSize ?? 8, label: 'reference log-probs', progress: o.reporter?.progress })).logps;
    await rs.release();
    checkFinite(rl, 'reference', o.ref, o.data);
    return new Evaluator({ ...o, policy: o.policy ?? o.ref } as EvalOptions, data.kind, rows, data.examples, rl, truncated, tok.padId ?? 0);
  }

  /** The prompts of the first `n` rows, as text and as the truncated ids scored (eval_generate's prompts). */
  prompts(n: number): { prompt: Example['prompt']; ids: number[] }[] {
    return this.rows.slice(0, n).map((r, i) => ({ prompt: this.examples[i].prompt, ids: r.promptIds }));
  }

  async evaluate(policySource: ModelSource = this.o.policy): Promise<EvalSummary> {
    const beta = betaOf(this.o.params);
    const policy = resolveModel(policySource);
    const ps = await Scorer.create(policy.config, policy.weights, this.o.runtime ?? {}, this.padId, scoredLongest(this.kind as Kind, this.rows, { batchSize: this.o.batchSize }));
    const pl = (await ps.score(this.kind as Kind, this.rows, { batchSize: this.o.batchSize ?? 8, label: 'policy log-probs', progress: this.o.reporter?.progress })).logps;
    await ps.release();
    checkFinite(pl, 'policy', policySource, this.o.data);
    const rl = this.refLogps;
    const rewards = pl.map((lp, i) => lp.map((v, k) => beta * (v - rl[i][k])));
    const ex = this.examples;
    const overall = { ...summarise(this.kind, this.rows.map((_, i) => i), rewards, ex, pl, rl, beta), truncated: this.truncated };
    const bySource: Record<string, Record<string, number>> = {};
    if (ex.some((e) => e.source !== undefined)) {
      for (const [src, idx] of groupBy(ex.map((e) => e.source ?? null))) bySource[src] = summarise(this.kind, idx, rewards, ex, pl, rl, beta);
    }
    return { kind: this.kind, overall, bySource };
  }
}

/** One evaluation of a policy against a reference. */
export async function evaluateRows(o: EvalOptions): Promise<EvalSummary> {
  return (await Evaluator.create(o)).evaluate(o.policy);
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
