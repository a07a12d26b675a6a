/**
 * A teacher's top-K next-token log-probabilities (temperature 1) at the counted response positions
 * of tokenized rows, for offline distillation (distill.ts): the teacher's forward over the batch,
 * its head over the counted positions only (`score_index`), the log-softmax, ONNX TopK over it, and
 * the log of the mass outside the K ids computed as a masked log-sum-exp (exact however small, where
 * 1 − Σ of the K probabilities would cancel). Also the refusal of a teacher whose tokenizer is not
 * the student's.
 */
import { existsSync } from 'node:fs';
import { join } from 'node:path';
import { UserError } from '../errors.ts';
import { attr, Graph, type Tensor } from '../onnx/graph.ts';
import type { ModelConfig } from '../models/config.ts';
import type { CausalLM, CausalLMInputs } from '../models/index.ts';
import { lmHead } from '../models/layers.ts';
import { collate } from '../models/batch.ts';
import { productQuant, quantizeBlocks, quantizeProducts, type ProductQuant } from '../models/quantize.ts';
import { int8ExactHere, int8Products, quantizeInt8Columns, type ActivationQuant } from '../models/quantize-int8.ts';
import { Session, toOrt, type Feeds, type RuntimeOptions } from '../runtime/session.ts';
import { startProgress, type ProgressFactory } from '../progress.ts';
import { loadTokenizer, type LoadedTokenizer } from '../tokenize/index.ts';
import type { TokenizedExample } from '../../datasets/examples.ts';
import { logSumExpMasked } from '../../losses/core/ops.ts';

/** One row's teacher targets: for each of its n counted response tokens, in order, K ids and K + 1 log-masses. */
export interface TeacherRow {
  /** `[n·K]` the teacher's K most likely ids at each counted token, most likely first. */
  ids: Int32Array;
  /** `[n·K]` their log-probabilities at temperature 1. */
  logps: Float32Array;
  /** `[n]` the log of the teacher's mass outside those K ids. */
  rest: Float32Array;
}

/**
 * The positions whose next token is counted, as flat indices b·T + t into the `[B, T]` batch
 * (position t predicts token t + 1, so a counted token at t + 1 names position t), in row-major
 * order: the order the teacher's rows are cached in and the training graph reads them. `stride`: the
 * row length of the batch the indices point into, when it is not the mask's `T` (the teacher's input
 * cut short of each row's last token, {@link TeacherTopK.score}).
 */
export function scoreIndex(lossMask: Float32Array, B: number, T: number, stride = T): BigInt64Array {
  const out: bigint[] = [];
  for (let b = 0; b < B; b++) for (let t = 1; t < T; t++) if (lossMask[b * T + t] !== 0) out.push(BigInt(b * stride + t - 1));
  return BigInt64Array.from(out);
}

/**
 * A teacher's forward in a graph and the feeds of its parameters (train/teacher-model.ts: one model, or
 * an AlignDistil pair whose hidden rows and head give the combined logits).
 */
export interface TeacherForward {
  readonly config: ModelConfig;
  forward(g: Graph, inputs: CausalLMInputs): CausalLM;
  feeds(): Feeds;
}

/** The `[M, V]` logits of the hidden rows at `index` (flat b·T + t), ids ≥ `limit` left out (−1e9). */
export function logitsAt(g: Graph, model: CausalLM, index: Tensor, limit: number): Tensor {
  const logits = lmHead(g, g.gather(model.hidden, index, 0), model.headWeight);
  const V = model.config.vocab_size;
  if (limit >= V) return logits;
  return g.add(logits, g.constant(Array.from({ length: V }, (_, v) => (v < limit ? 0 : -1e9)), logits.dtype, [V]));
}

/**
 * The top-K graph: `input_ids`, `attention_mask` [batch, seq], `score_index` [scored] and the
 * parameters → `topk_logps` [scored, K], `topk_ids` [scored, K] (int64) and `rest_logp` [scored].
 * Ids ≥ `limit` (embedding rows past the shared vocabulary) are not part of the distribution.
 */
export function buildTopKGraph(teacher: TeacherForward, K: number, limit: number): Graph {
  const g = new Graph('prefzoo_teacher_topk');
  const inputIds = g.input('input_ids', 'int64', ['batch', 'seq']);
  const attentionMask = g.input('attention_mask', 'int64', ['batch', 'seq']);
  const index = g.input('score_index', 'int64', ['scored']);
  const model = teacher.forward(g, { inputIds, attentionMask });
  const logp = g.logSoftmax(logitsAt(g, model, index, limit), -1); // [M, V]
  const { vals, ids, rest } = K < model.config.vocab_size ? topKAndRest(g, logp, K) : topKAndRestMasked(g, logp, K);
  g.output(vals, 'topk_logps');
  g.output(ids, 'topk_ids');
  g.output(rest, 'rest_logp');
  return g;
}

/** ONNX TopK of the `[M, V]` rows, sorted, the lower id first among equal values (ONNX's tie rule). */
function topK(g: Graph, logp: Tensor, k: number): [Tensor, Tensor] {
  return g.op('TopK', [logp, g.ints([k])], { axis: attr.int(1), largest: attr.int(1), sorted: attr.int(1) }, [
    { dtype: 'float32', shape: ['scored', k] },
    { dtype: 'int64', shape: ['scored', k] },
  ]) as [Tensor, Tensor];
}

/**
 * The K most likely ids and the log of the mass outside them from one TopK of K + 1 (K < V): the
 * (K + 1)-th value m is the largest log-prob outside the K, so shifted by it every one of the K reads
 * exp(min(x − m, 0)) = 1 and every other id exp(x − m) ≤ 1, and
 *
 *   rest = m + log(Σ_v exp(min(logp_v − m, 0)) − K),
 *
 * the sum at least K + 1 (m's own id counts 1), so taking the K away leaves the outside sum to float32
 * rounding of a sum ≤ K + V. Four passes over `[M, V]` (Sub, Clip, Exp, ReduceSum) where the mask of
 * {@link topKAndRestMasked} took ten (docs/performance.md, "Distillation").
 */
export function topKAndRest(g: Graph, logp: Tensor, K: number): { vals: Tensor; ids: Tensor; rest: Tensor } {
  const [vals1, ids1] = topK(g, logp, K + 1);
  const m = g.slice(vals1, [K], [K + 1], [1]); // [M, 1]
  const s = g.sub(g.reduceSum(g.exp(g.clip(g.sub(logp, m), undefined, 0)), [1], true), K);
  return { vals: g.slice(vals1, [0], [K], [1]), ids: g.slice(ids1, [0], [K], [1]), rest: g.squeeze(g.add(g.log(s), m), [1]) };
}

/** The K most likely ids and the rest as a masked log-sum-exp over the ids outside them (any K ≤ V; at K = V the rest is empty). */
export function topKAndRestMasked(g: Graph, logp: Tensor, K: number): { vals: Tensor; ids: Tensor; rest: Tensor } {
  const [vals, ids] = topK(g, logp, K);
  // 1 outside the K ids, 0 at them.
  const outside = g.scatterElements(g.constantOfShape(g.shapeOf(logp), 1), ids, g.constantOfShape(g.shapeOf(ids), 0), 1);
  return { vals, ids, rest: logSumExpMasked(g, logp, outside, 1) };
}

/**
 * The scoring session's runtime from a run's (device, threads): ONNX Runtime's arena kept whatever the
 * teacher's size and no memory pattern, as the decoders run. The memory-saving runtime a large
 * model's training step gets (LOW_MEMORY_RUNTIME, no arena: every intermediate a fresh mapping) made
 * this forward 2.3× slower in process CPU time at 228M parameters (docs/performance.md, "Distillation").
 */
export function scoringRuntime(r: RuntimeOptions): RuntimeOptions {
  return { ...(r.ep ? { ep: r.ep } : {}), ...(r.threads ? { threads: r.threads } : {}), memPattern: false };
}

/**
 * teacher_dtype=int8: the W8A8 teacher (src/models/quantize-int8.ts): int8 weights per output channel,
 * the activations quantized per token (`act`, 'tensor' only for the benches' comparison), on ONNX
 * Runtime's integer GEMM; `head` whether the output head (the products over the vocabulary) is
 * quantized too or stays float32.
 */
export interface Int8Quant {
  int8: true;
  act: ActivationQuant;
  head: boolean;
}

/** The teacher's products: MatMulNBits blocks (q8/q4), or the W8A8 integer GEMM (int8). */
export type TeacherQuant = ProductQuant | Int8Quant;

/** The precisions teacher_dtype takes (f16 declared to be refused in one line; auto resolved by resolveTeacherDtype). */
export const TEACHER_DTYPES = ['auto', 'f32', 'f16', 'q8', 'q4', 'int8'] as const;

/**
 * teacher_dtype=auto, the default: int8 where its integer GEMM runs exactly and the teacher does
 * nothing but score (the CPU, with VNNI: `int8ExactHere`; without seq_kd, whose generations come from
 * the float32 decoder), f32 elsewhere.
 * Any other value is returned as given.
 */
export function resolveTeacherDtype(dtype: string, ep: string, seqKd: boolean, vnni = int8ExactHere()): string {
  if (dtype !== 'auto') return dtype;
  return ep === 'cpu' && !seqKd && vnni ? 'int8' : 'f32';
}

/** teacher_dtype=int8's variant: per-token activations, the head float32 (docs/distill.md, "The teacher's precision"). */
export const INT8_TEACHER: Int8Quant = { int8: true, act: 'token', head: false };

/**
 * The teacher's products under `dtype`: null for f32, q8/q4's MatMulNBits blocks of `block`
 * (productQuant's refusals), or int8's W8A8 products (CPU only: the integer GEMM is the CPU provider's;
 * and only where `vnni`, see int8ExactHere: elsewhere its products can saturate).
 */
export function teacherQuant(dtype: string, block: number, ep: string, names: { dtype: string; block: string }, vnni = int8ExactHere()): TeacherQuant | null {
  dtype = resolveTeacherDtype(dtype, ep, false, vnni);
  if (dtype !== 'int8') {
    if (!(TEACHER_DTYPES as readonly string[]).includes(dtype)) throw new UserError(`${names.dtype}: "${dtype}" is not one of ${TEACHER_DTYPES.join(', ')}`, { setting: names.dtype });
    return productQuant(dtype, block, ep, names);
  }
  if (ep !== 'cpu') throw new UserError(`${names.dtype}=int8: the integer products (MatMulIntegerToFloat) are ONNX Runtime's CPU kernels; on ${ep} use f32`, { setting: names.dtype });
  if (!vnni) throw new UserError(`${names.dtype}=int8: this CPU is not known to have VNNI, without which ONNX Runtime's uint8 × int8 products can saturate; use q8 or f32`, { setting: names.dtype });
  return INT8_TEACHER;
}

/** How a teacher cache records a precision: `q8/32`, `int8` (per-token, float32 head), or the benches' other int8 variants. */
export function teacherDtypeLabel(q: TeacherQuant): string {
  if ('int8' in q) return `int8${q.act === 'token' ? '' : `/${q.act}`}${q.head ? '+head' : ''}`;
  return `q${q.bits}/${q.block}`;
}

/**
 * Turns the products of `g` over fed weights into quantized products over those weights, quantized
 * once and baked in: `MatMulNBits` blocks (q8/q4), or W8A8 products over int8 columns (int8; the
 * head's, `[vocab, hidden]`, only with `quant.head`). Each weight is taken as `[N, K]` (nn.Linear's),
 * or as the transpose of a `[K, N]` one (GPT-2's Conv1D). Returns the feeds the graph still reads
 * (the weights no float product reads any more are dropped).
 */
export function quantizeTeacher(g: Graph, feeds: Feeds, quant: TeacherQuant, vocab: number): Feeds {
  const weight = (name: string, transposed: boolean) => {
    const t = feeds[name];
    if (!t || t.type !== 'float32' || t.dims.length !== 2) return null;
    const [r, c] = t.dims.map(Number);
    const [N, K] = transposed ? [c, r] : [r, c];
    return { data: t.data as Float32Array, N, K };
  };
  if ('int8' in quant) {
    int8Products(g, quant.act, (name, transposed) => {
      const w = weight(name, transposed);
      return w && (w.N !== vocab || quant.head) ? quantizeInt8Columns(w.data, w.N, w.K, transposed) : null;
    });
  } else {
    quantizeProducts(g, quant, (name, transposed) => {
      const w = weight(name, transposed);
      return w && quantizeBlocks(w.data, w.N, w.K, quant.bits, quant.block, transposed);
    });
  }
  const read = new Set(g.inputs.map((i) => i.name));
  return Object.fromEntries(Object.entries(feeds).filter(([name]) => read.has(name)));
}

/** The teacher's top K over rows, batched on one session whose parameters are fed from the weight arrays. */
export class TeacherTopK {
  private constructor(
    private readonly session: Session,
    private readonly params: Feeds,
    readonly K: number,
    private readonly padId: number,
  ) {}

  /**
   * With `quant` (teacher_dtype q8/q4) the teacher's linear weights, the head included, are
   * block-quantized once here and baked into the session as `MatMulNBits` products (the rollouts'
   * quantizer, src/models/quantize.ts); with int8 its projections (and with `head` its head) become
   * int8 columns and W8A8 products (src/models/quantize-int8.ts). The teacher is frozen, so nothing is
   * quantized again. Its embeddings, norms and biases stay float32 and are fed as before.
   */
  static async create(teacher: TeacherForward, o: { K: number; limit: number; runtime: RuntimeOptions; padId: number; quant?: TeacherQuant | null }): Promise<TeacherTopK> {
    const g = buildTopKGraph(teacher, o.K, o.limit);
    let feeds = teacher.feeds();
    if (o.quant) feeds = quantizeTeacher(g, feeds, o.quant, teacher.config.vocab_size);
    return new TeacherTopK(await Session.fromGraph(g, o.runtime), feeds, o.K, o.padId);
  }

  /**
   * Every row's targets (rows of one response each), `batchSize` rows per forward, length-sorted
   * batches. The forward stops short of the batch's last column: a row's last token predicts nothing
   * that is scored and no scored position attends to it (attention is causal), so the input is each
   * row less its last token — the longest row's length less one, rounded up to `padTo` — and the
   * targets are those of the whole rows to float32 rounding.
   */
  async score(rows: readonly TokenizedExample[], o: { batchSize: number; padTo: number; progress?: ProgressFactory }): Promise<TeacherRow[]> {
    const K = this.K;
    const out: TeacherRow[] = new Array(rows.length);
    const len = (r: TokenizedExample) => r.promptIds.length + r.responseIds[0].length;
    const order = rows.map((_, i) => i).sort((a, b) => len(rows[a]) - len(rows[b]));
    const progress = startProgress(o.progress, 'teacher top-K', rows.length);
    try {
      for (let s = 0; s < order.length; s += o.batchSize) {
        const idx = order.slice(s, s + o.batchSize);
        const c = collate(idx.map((i) => rows[i]), { kind: 'single', padTo: o.padTo, padId: this.padId, dtype: 'float32' });
        const T = c.length;
        const longest = Math.max(...idx.map((i) => len(rows[i])));
        const Tin = Math.min(T, Math.max(1, Math.ceil((longest - 1) / o.padTo) * o.padTo));
        const index = scoreIndex(c.feeds.loss_mask.data as Float32Array, idx.length, T, Tin);
        const r = await this.session.run({
          ...this.params,
          input_ids: firstColumns(c.feeds.input_ids, idx.length, T, Tin),
          attention_mask: firstColumns(c.feeds.attention_mask, idx.length, T, Tin),
          score_index: toOrt('int64', index, [index.length]),
        });
        const lp = r.topk_logps.data as Float32Array;
        const ids = r.topk_ids.data as BigInt64Array;
        const rest = r.rest_logp.data as Float32Array;
        // The scored positions are row-major: each row's run of them, in order.
        let m = 0;
        idx.forEach((orig, b) => {
          let n = 0;
          while (m + n < index.length && Number(index[m + n]) < (b + 1) * Tin) n++;
          out[orig] = { ids: Int32Array.from(ids.subarray(m * K, (m + n) * K), Number), logps: lp.slice(m * K, (m + n) * K), rest: rest.slice(m, m + n) };
          m += n;
        });
        progress.update(Math.min(s + o.batchSize, rows.length));
      }
    } finally {
      progress.stop();
    }
    return out;
  }

  async release(): Promise<void> {
    await this.session.release();
  }
}

/** The first `cols` columns of an int64 `[B, T]` tensor. */
function firstColumns(t: Feeds[string], B: number, T: number, cols: number): Feeds[string] {
  if (cols === T) return t;
  const src = t.data as BigInt64Array;
  const out = new BigInt64Array(B * cols);
  for (let b = 0; b < B; b++) out.set(src.subarray(b * T, b * T + cols), b * cols);
  return toOrt('int64', out, [B, cols]);
}

/**
 * Refuses, in one line naming both folders, a teacher whose tokenizer maps ids to other tokens than
 * the student's: the cached top K are the teacher's ids, read as the student's. Equal tokenizer.json
 * files pass at once; otherwise the vocabularies (every id's token) are compared. `use` says what
 * reads the teacher's ids as the student's (offline distillation; grpo --teacher).
 */
export function checkSameTokenizer(teacherDir: string, studentDir: string, student: LoadedTokenizer, use = 'offline distillation reads'): void {
  const a = join(teacherDir, 'tokenizer.json');
  if (!existsSync(a)) throw new UserError(`--teacher ${teacherDir}: no tokenizer.json; distillation needs the teacher's tokenizer to check it is the student's (${studentDir})`, { setting: 'teacher' });
  const teacher = loadTokenizer(teacherDir);
  const differ = (why: string) => new UserError(`--teacher ${teacherDir} and --model ${studentDir} have different tokenizers (${why}); ${use} the teacher's token ids as the student's: use a teacher with the student's tokenizer`, { setting: 'teacher' });
  if (teacher.vocabSize !== student.vocabSize) throw differ(`${teacher.vocabSize} ids against ${student.vocabSize}`);
  for (let id = 0; id < student.vocabSize; id++) {
    const x = teacher.idToToken(id);
    const y = student.idToToken(id);
    if (x !== y) throw differ(`id ${id} is ${JSON.stringify(x)} in the teacher, ${JSON.stringify(y)} in the student`);
  }
}
