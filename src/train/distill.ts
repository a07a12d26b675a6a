/**
 * `prefzoo distill`: offline knowledge distillation of a student (`--model`) from a teacher
 * (`--teacher`) on any data `train` reads: the responses of single rows, the chosen side of pairs,
 * SFT conversations with their masks (only the assistant's own tokens). The teacher's top-K
 * log-probs at temperature 1 on every counted response token are computed once and cached beside
 * the reference cache (teacher-topk.ts, teacher-cache.ts); then the student takes KD steps with the
 * `gkd` loss (losses/gkd.ts) against that sparse teacher, on the training loop (loop.ts), so
 * checkpoints, --resume, metrics rows and the final save are train's.
 *
 * The training graph runs the student's head over the counted positions only (`score_index`, as the
 * teacher's does): its `[M, V]` logits go to the gkd subgraph as one row of M positions
 * (`student_logits [1, M, V]`, the teacher's ids, log-probs and rest mass `[1, M, ·]`,
 * `completion_mask` all ones), which takes the log-softmax, gathers the K ids and forms the rest as a
 * masked log-sum-exp. gkd's loss is Σ over counted tokens / their number, so the one-row layout
 * gives the loss of the `[B, T]` layout, and no `[B, T, V]` tensor is made.
 *
 * Run folder: train's (config.json, artifacts/, checkpoints/, metrics.jsonl, final/), with
 * `data/teacher.parquet` and `data/teacher.json` (what made the cache: the teacher's files, the data,
 * the tokens, K); a cache made by anything else is refused.
 */
import { existsSync } from 'node:fs';
import { join } from 'node:path';
import type { ArtifactSpec } from '../artifacts/build.ts';
import { UserError } from '../errors.ts';
import type { ModelConfig } from '../models/config.ts';
import { collate } from '../models/batch.ts';
import { buildCausalLM } from '../models/index.ts';
import { loadModel } from '../models/load.ts';
import type { Tensor } from '../onnx/graph.ts';
import { toOrt } from '../runtime/session.ts';
import { loadTokenizer, type LoadedTokenizer } from '../tokenize/index.ts';
import { loadData, tokenizeExamples, type TokenizedExample } from '../../datasets/examples.ts';
import { resolveLoss, type BoundLoss } from '../../losses/index.ts';
import { resolveConfig, type TrainConfig } from './config.ts';
import { runOnline, splitDraws, type OnlineContext, type OnlineMethod, type OnlineOptions, type RoundInfo, type SpecInput } from './loop.ts';
import { modelParamSpecs, optimizerOf, runtimeOf, type MicroBatch } from './run.ts';
import { declareCommand, defineSettings, ONLINE_LOOP_SETTINGS, type SettingsOf } from './settings.ts';
import { readTeacherCache, teacherCacheIdentity, writeTeacherCache } from './teacher-cache.ts';
import { checkSameTokenizer, logitsAt, scoreIndex, TeacherTopK, type TeacherRow } from './teacher-topk.ts';

const GROUP = 'Distillation';

export const DISTILL_SETTINGS = defineSettings({
  distill_topk: {
    type: 'int', default: 32, min: 1, max: 1 << 20, group: GROUP,
    doc: "K: the teacher's most likely tokens cached at each response token (log-probs at temperature 1, float16, and the log of the mass outside them)",
  },
});

export type DistillSettings = SettingsOf<typeof DISTILL_SETTINGS>;

/**
 * What distill honours: the loop's settings but the device's (the CPU only, for now), and train's
 * data settings. The loss's `beta` and `temperature` are gkd's parameters.
 */
export const DISTILL_HONOURS = [
  ...ONLINE_LOOP_SETTINGS.filter((k) => k !== 'device' && k !== 'compute_dtype'),
  'max_length', 'max_prompt_length', 'truncation', 'max_samples',
] as const;

declareCommand('distill', { honours: DISTILL_HONOURS, own: DISTILL_SETTINGS, lossParams: 'gkd' });

export interface DistillOptions extends OnlineOptions {
  /** The teacher's model folder: any architecture with the student's tokenizer. */
  teacher: string;
  /** Any data `train` reads. */
  data: string;
  /** Settings and gkd's parameters by name, typed (after `params`). */
  settings?: Readonly<Record<string, unknown>>;
}

export interface DistillResult {
  finalDir: string;
  steps: number;
  seconds: number;
  last: Record<string, number>;
  /** Whether the teacher's targets were read from the run's cache (else computed). */
  cached: boolean;
}

export async function distill(o: DistillOptions): Promise<DistillResult> {
  const { config, lossParams, own } = resolveConfig({ configFile: o.configFile, params: o.params, settings: o.settings, base: o.base, command: 'distill' });
  const loss = resolveLoss('gkd', lossParams);
  const K = (own as unknown as DistillSettings).distill_topk;
  // Refused before the run folder is made: a teacher that is no folder, or reads other token ids.
  if (!existsSync(join(o.teacher, 'config.json'))) throw new UserError(`--teacher ${o.teacher}: not a model folder (no config.json)`);
  checkSameTokenizer(o.teacher, o.model, loadTokenizer(o.model));
  const method = new OfflineDistillation(o, config, loss, K);
  const r = await runOnline(o, (s) => method.load(s), method, {
    config,
    record: () => ({ teacher: o.teacher, data: o.data, kind: method.kind, loss: 'gkd', loss_params: loss.terms[0].params, distill_topk: K }),
    inputs: [
      { key: 'teacher', now: o.teacher, flag: '--teacher' },
      { key: 'data', now: o.data, flag: '--data' },
    ],
  });
  return { finalDir: r.finalDir, steps: r.steps, seconds: r.seconds, last: r.last, cached: method.cached };
}

/** Tokens of a one-response row that a position predicts (the first token of the sequence has none), under its mask. */
export function countedTokens(r: TokenizedExample): number {
  const mask = r.responseMasks?.[0];
  let n = 0;
  r.responseIds[0].forEach((_, j) => {
    if ((!mask || mask[j]) && (r.promptIds.length > 0 || j > 0)) n++;
  });
  return n;
}

/** A row's one response: the row's own (single), the chosen one (pairwise), with its mask. */
function oneResponse(r: TokenizedExample): TokenizedExample {
  return { ...r, responseIds: [r.responseIds[0]], ...(r.responseMasks ? { responseMasks: [r.responseMasks[0]] } : {}), klResponseIds: undefined };
}

/** The student's training graph: its head over the counted positions, the gkd loss against the teacher's top K there. */
function distillSpec(s: SpecInput, loss: BoundLoss, K: number): ArtifactSpec {
  const F = 'float32' as const;
  return {
    params: modelParamSpecs(s.model, s.init, s.lora, false),
    batchInputs: [
      { name: 'input_ids', dtype: 'int64', shape: ['rows', 'len'] },
      { name: 'attention_mask', dtype: 'int64', shape: ['rows', 'len'] },
      { name: 'score_index', dtype: 'int64', shape: ['scored'] },
      { name: 'teacher_topk_ids', dtype: 'int64', shape: ['scored', K] },
      { name: 'teacher_topk_logps', dtype: F, shape: ['scored', K] },
      { name: 'teacher_rest_logps', dtype: F, shape: ['scored'] },
    ],
    optimizer: optimizerOf(s.config),
    loss: { name: 'gkd', params: loss.terms[0].params },
    modelConfig: s.model,
    buildForward(g, params, batch) {
      const model = buildCausalLM(g, s.model, new Map(Object.entries(params)), { inputIds: batch.input_ids, attentionMask: batch.attention_mask }, { lora: s.lora });
      const logits = logitsAt(g, model, batch.score_index, s.model.vocab_size); // [M, V]
      const one = (x: Tensor) => g.unsqueeze(x, [0]);
      const rest = one(batch.teacher_rest_logps); // [1, M]
      const r = g.scope('loss', () => loss.emit(g, {
        student_logits: one(logits),
        teacher_topk_ids: one(batch.teacher_topk_ids),
        teacher_topk_logps: one(batch.teacher_topk_logps),
        teacher_rest_logps: rest,
        completion_mask: g.constantOfShape(g.shapeOf(rest), 1),
      }, 'distill'));
      // Monitoring (no gradient): the share of each model's mass on the teacher's K ids, per token.
      const metrics = g.scope('distill_stats', () => {
        const tokens = g.max(g.cast(g.dim(batch.score_index, 0), F), g.constant([1], F, [1]));
        const perToken = (lp: Tensor) => g.squeeze(g.div(g.reduceSum(g.reduceSum(g.exp(lp), [1], false), undefined, true), tokens), [0]);
        const student = g.gatherElements(g.logSoftmax(g.stopGradient(logits), -1), batch.teacher_topk_ids, 1);
        return { 'distill/teacher_topk_mass': perToken(batch.teacher_topk_logps), 'distill/student_topk_mass': perToken(student) };
      });
      return { loss: r.loss, metrics: { ...r.metrics, ...metrics } };
    },
  };
}

/** A round: the micro-batches' row indices. */
type Round = number[][];

/**
 * Distillation as a method of the training loop: items are row indices; `load` reads the data and
 * the teacher's targets (cached, or computed and cached); a round is gradient_accumulation_steps
 * micro-batches of batch_size rows, as train's.
 */
class OfflineDistillation implements OnlineMethod<number, Round> {
  readonly name = 'distill';
  readonly partialRounds = true;
  kind = '';
  cached = false;
  private rows: TokenizedExample[] = [];
  private targets: TeacherRow[] = [];
  private tok!: LoadedTokenizer;

  constructor(
    private readonly o: DistillOptions,
    private readonly config: TrainConfig,
    private readonly loss: BoundLoss,
    private readonly K: number,
  ) {}

  /** The data stage (train's reading and tokenization) and the teacher stage (its cache). */
  async load(x: { run: string; tok: LoadedTokenizer; info: (line: string) => void; model: ModelConfig }): Promise<number[]> {
    const { config, o } = this;
    this.tok = x.tok;
    const data = await loadData(o.data, join(x.run, 'data'), { seed: config.seed, maxRows: config.max_samples });
    if (data.kind === 'listwise') throw new UserError(`${o.data}: is listwise data; distill trains on one response per row (single rows, the chosen side of pairs, or conversations)`);
    this.kind = data.kind;
    const t = tokenizeExamples(data.examples, x.tok, config, data.tokens);
    this.rows = t.rows.map(oneResponse);
    const masked = this.rows.filter((r) => r.responseMasks).length;
    x.info(`data: ${this.rows.length} ${data.kind} rows from ${o.data}${data.kind === 'pairwise' ? ' (the chosen responses)' : ''}${masked ? `, ${masked} with tool calls or several turns (only the assistant's own tokens distilled)` : ''}${t.truncated ? `, ${t.truncated} truncated to max_length ${config.max_length} / max_prompt_length ${config.max_prompt_length}` : ''}`);
    if (this.rows.some((r) => r.responseIds[0].length === 0)) {
      throw new UserError(`${o.data}: a response is empty after tokenization and truncation (max_length ${config.max_length} leaves no room); raise max_length or lower max_prompt_length`);
    }
    this.targets = await this.teacherStage(x.run, x.model, x.info);
    return this.rows.map((_, i) => i);
  }

  /** The teacher's top K of every row: the run's cache when it was made by this teacher on these rows, else computed and cached. */
  private async teacherStage(run: string, student: ModelConfig, info: (line: string) => void): Promise<TeacherRow[]> {
    const { config, o, K } = this;
    const identity = teacherCacheIdentity({ teacher: o.teacher, dataFiles: [o.data], truncation: config, rows: this.rows, topk: K });
    const cached = await readTeacherCache(run, identity);
    let rows: TeacherRow[];
    if (cached) {
      rows = cached;
      this.cached = true;
      info(`teacher: top-${K} targets read from ${join(run, 'data', 'teacher.parquet')}`);
    } else {
      const teacher = loadModel(o.teacher);
      // A teacher with more embedding rows than the student (padded past the shared tokenizer) has
      // ids the student cannot score: its distribution is taken over the ids both have.
      const limit = Math.min(teacher.config.vocab_size, student.vocab_size);
      if (limit < teacher.config.vocab_size) info(`teacher: ${teacher.config.vocab_size} embedding rows, the student ${student.vocab_size}; its distribution is taken over the first ${limit} ids`);
      if (K > limit) throw new UserError(`distill_topk=${K}: more than the ${limit} token ids the teacher and student share`);
      const t0 = Date.now();
      const scorer = await TeacherTopK.create(teacher.config, teacher.weights, { K, limit, runtime: runtimeOf(config, teacher.config), padId: this.tok.padId ?? 0 });
      try {
        rows = await scorer.score(this.rows, { batchSize: config.batch_size * 2, padTo: config.pad_to_multiple_of, progress: o.reporter?.progress });
      } finally {
        await scorer.release();
      }
      rows = await writeTeacherCache(run, rows, identity);
      info(`teacher: top-${K} targets of ${rows.length} rows computed in ${((Date.now() - t0) / 1000).toFixed(1)}s and cached in ${join(run, 'data', 'teacher.parquet')}`);
    }
    rows.forEach((r, i) => {
      if (r.rest.length !== countedTokens(this.rows[i])) throw new UserError(`${join(run, 'data', 'teacher.parquet')}: row ${i} holds ${r.rest.length} tokens, the data has ${countedTokens(this.rows[i])}; start again with --overwrite`);
    });
    if (rows.length !== this.rows.length) throw new UserError(`${join(run, 'data', 'teacher.parquet')}: ${rows.length} rows cached, the data has ${this.rows.length}; start again with --overwrite`);
    return rows;
  }

  draws(config: TrainConfig): { size: number; count: number } {
    return { size: config.batch_size, count: config.gradient_accumulation_steps };
  }

  needsBaseWeights(): boolean {
    return false;
  }

  spec(s: SpecInput): ArtifactSpec {
    return distillSpec(s, this.loss, this.K);
  }

  async collect(_ctx: OnlineContext, idx: readonly number[], info: RoundInfo): Promise<Round> {
    return splitDraws(idx, info);
  }

  async microBatches(_ctx: OnlineContext, round: Round): Promise<MicroBatch[]> {
    return round.map((idx) => this.microBatch(idx));
  }

  /** Rows collated as train's single rows, the counted positions listed, the teacher's targets at them in the same order. */
  private microBatch(idx: readonly number[]): MicroBatch {
    const K = this.K;
    const c = collate(idx.map((i) => this.rows[i]), { kind: 'single', padTo: this.config.pad_to_multiple_of, padId: this.tok.padId ?? 0, dtype: 'float32' });
    const index = scoreIndex(c.feeds.loss_mask.data as Float32Array, idx.length, c.length);
    const M = index.length;
    const ids = new BigInt64Array(M * K);
    const logps = new Float32Array(M * K);
    const rest = new Float32Array(M);
    let m = 0;
    for (const i of idx) {
      const t = this.targets[i];
      t.ids.forEach((id, j) => (ids[m * K + j] = BigInt(id)));
      logps.set(t.logps, m * K);
      rest.set(t.rest, m);
      m += t.rest.length;
    }
    if (m !== M) throw new Error(`distill: ${M} counted positions in the batch, ${m} cached`);
    return {
      feeds: {
        input_ids: c.feeds.input_ids,
        attention_mask: c.feeds.attention_mask,
        score_index: toOrt('int64', index, [M]),
        teacher_topk_ids: toOrt('int64', ids, [M, K]),
        teacher_topk_logps: toOrt('float32', logps, [M, K]),
        teacher_rest_logps: toOrt('float32', rest, [M]),
      },
      tokens: c.tokens,
    };
  }
}
