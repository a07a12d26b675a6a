/**
 * `prefzoo distill`: knowledge distillation of a student (`--model`) from a teacher (`--teacher`) on
 * any data `train` reads: the responses of single rows, the chosen side of pairs, SFT conversations
 * with their masks (only the assistant's own tokens). The teacher's top-K log-probs at temperature 1
 * on every counted response token are computed once and cached beside the reference cache
 * (teacher-topk.ts, teacher-cache.ts); then the student takes KD steps with the `gkd` loss
 * (losses/gkd.ts) against that sparse teacher, on the training loop (loop.ts), so checkpoints,
 * --resume, metrics rows and the final save are train's.
 *
 * On-policy (GKD's `lmbda`, TRL's semantics): each micro-batch is, with probability lmbda, the
 * student's own samples for its rows' prompts — drawn from the live weights (`ctx.policy()`) on the
 * generation engine, each row from its own stream seeded from the run's random stream — and the
 * teacher's top K on those samples is computed then (the same scorer, never cached), the loss
 * counting the sampled tokens only. lmbda = 1 with beta = 1 is on-policy distillation (reverse KL on
 * the student's samples); lmbda = 0, the default, is the offline run, unchanged.
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
import { readFileSync } from 'node:fs';
import { join } from 'node:path';
import type { ArtifactSpec } from '../artifacts/build.ts';
import { UserError } from '../errors.ts';
import { maxPositions, parseConfig, type ModelConfig } from '../models/config.ts';
import { generateIds, type Decoder, type GenerateRequest, type MixturePart } from '../models/generate.ts';
import { sampleRandom } from '../models/sampling.ts';
import type { SeededRandom } from '../random.ts';
import { collate } from '../models/batch.ts';
import { buildCausalLM } from '../models/index.ts';
import type { Tensor } from '../onnx/graph.ts';
import { toOrt } from '../runtime/session.ts';
import { loadTokenizer, type LoadedTokenizer } from '../tokenize/index.ts';
import { loadData, tokenizeExamples, type TokenizedExample } from '../../datasets/examples.ts';
import { resolveLoss, type BoundLoss } from '../../losses/index.ts';
import { resolveConfig, type TrainConfig } from './config.ts';
import { runOnline, splitDraws, type OnlineContext, type OnlineMethod, type OnlineOptions, type RoundInfo, type SpecInput } from './loop.ts';
import { modelParamSpecs, optimizerOf, runtimeOf, type MicroBatch } from './run.ts';
import { declareCommand, defineSettings, ONLINE_LOOP_SETTINGS, ROLLOUT, type SettingsOf } from './settings.ts';
import { readTeacherCache, teacherCacheIdentity, writeTeacherCache } from './teacher-cache.ts';
import { logitsAt, resolveTeacherDtype, scoreIndex, scoringRuntime, TEACHER_DTYPES, teacherQuant, TeacherTopK, type TeacherQuant, type TeacherRow } from './teacher-topk.ts';
import { TEACHER_SETTINGS, TeacherSpec } from './teacher-model.ts';
import { seqKdFiles, seqKdIdentity, teacherGenerations } from './seq-kd.ts';
import { AGENT_SETTINGS, refuseAgentSettings } from './agent-settings.ts';
import type { Text } from '../../datasets/schema.ts';

const GROUP = 'Distillation';

const ON_POLICY = 'Sampling: on-policy distillation (lmbda > 0) and seq_kd';

export const DISTILL_SETTINGS = defineSettings({
  distill_topk: {
    type: 'int', default: 32, min: 1, max: 1 << 20, group: GROUP,
    doc: "K: the teacher's most likely tokens cached at each response token (log-probs at temperature 1, float16, and the log of the mass outside them)",
  },
  seq_kd: {
    type: 'boolean', default: false, group: GROUP, trl: 'seq_kd', paper: 'Kim & Rush (2016), sequence-level KD',
    doc: "train on the teacher's own generations for the data's prompts (made once with the sampling settings, cached in RUN/data) instead of the data's responses; with lmbda, the micro-batches that are not on-policy",
  },
  ...TEACHER_SETTINGS,
  teacher_dtype: {
    type: 'enum', choices: [...TEACHER_DTYPES], default: 'auto', group: GROUP,
    doc: "the precision of the teacher's top-K scoring: auto (int8 on a CPU with VNNI, f32 on other CPUs and devices and with seq_kd), f32, q8/q4 (its linear weights block-quantized once, the products MatMulNBits), int8 (int8 weights per channel and int8 activations per token on ONNX Runtime's integer GEMM; CPU only)",
    more: "auto, the default, is int8 where the integer GEMM runs exactly (an x86-64 CPU with VNNI: without it ONNX Runtime's uint8 × int8 kernels add pairs of products in 16 bits, which can saturate; src/models/quantize-int8.ts, int8ExactHere) and the teacher only scores, f32 on other CPUs, on WebGPU/CUDA and with seq_kd (whose generations come from the float32 decoder); the run's record and the teacher cache hold the precision it resolved to. int8 is the default on the CPU because it scores in about 0.55–0.6 of the float32 teacher's CPU time and stays closer to it than q8 (on the distill demo's trained teacher: mean |Δ log p| 0.0055, max 0.035, every one of the top 16 kept; docs/distill.md) — a smaller change than the bfloat16 teacher TRL loads by default. q8 and q4 quantize every linear weight of the teacher (its output head included; both models of an AlignDistil pair, whose joined head stays float32) once, when its scorer is opened, into blocks of teacher_block_size values by ggml's Q8_0 / Q4_0 rules, and its top-K forward multiplies through ONNX Runtime's MatMulNBits with int8 activations, as rollout_dtype's generation graphs do (src/models/quantize.ts); embeddings, norms and biases stay float32. int8 (W8A8) quantizes each projection's weight once per output channel (symmetric int8, one float32 scale a channel) and, at run time, each row of a product's input per token (8 bits, one scale a token: max|x|/127), and multiplies in integers through ONNX Runtime's integer GEMM (MatMulIntegerToFloat, src/models/quantize-int8.ts); its output head stays float32 (quantized too, it saved about 7 % of the scoring's CPU time and raised the gap to the float32 teacher by half: docs/distill.md), as do embeddings, norms and biases; teacher_block_size is not read. The targets change beyond float32 rounding (docs/distill.md, \"The teacher's precision\", has the measured gap), so the teacher cache records the precision and a cache made at another is refused. seq_kd's generations are not quantized (refused with seq_kd); f16 is refused (ONNX Runtime's CPU provider has no fast float16 product), as is any device but the CPU, and int8 on a CPU not known to have VNNI.",
  },
  teacher_block_size: { type: 'int', default: 32, min: 16, max: 256, group: GROUP, doc: 'values per quantization block of teacher_dtype q8/q4 (a power of two, 16–256; refused with f32 and int8, which have no blocks)' },
  lmbda: {
    type: 'number', default: 0, min: 0, max: 1, group: ON_POLICY, trl: 'lmbda',
    doc: "the chance that a micro-batch is the student's own samples for its rows' prompts, scored by the teacher's top K fresh (0: the data's responses only; 1 with beta=1: on-policy distillation)",
  },
  max_completion_length: {
    type: 'int', default: 128, min: 1, max: 1 << 20, group: ON_POLICY, trl: 'max_new_tokens',
    doc: "the most tokens sampled for a prompt (the student's at lmbda > 0, the teacher's with seq_kd; a stop id ends it sooner); TRL GKD's default is 128",
  },
  sampling_temperature: {
    type: 'number', default: 1, min: 0, max: 100, group: ON_POLICY, trl: 'temperature',
    doc: "the sampling temperature of the student (lmbda > 0) and of the teacher (seq_kd) (0: greedy): TRL GKD's `temperature`; here `temperature` is gkd's loss τ",
  },
  top_p: { type: 'number', default: 1, min: 0, minOpen: true, max: 1, group: ON_POLICY, trl: 'top_p', doc: "samples (the student's, the teacher's with seq_kd) drawn from the smallest set of tokens reaching probability p (1: all)" },
  top_k: { type: 'int', default: 0, min: 0, max: 1 << 24, group: ON_POLICY, trl: 'top_k', doc: "samples (the student's, the teacher's with seq_kd) drawn among the k most likely tokens (0: all)" },
  ...AGENT_SETTINGS,
});

/** The settings read only when something is sampled: lmbda > 0 or seq_kd (refused otherwise). */
const SAMPLING_KEYS = ['max_completion_length', 'sampling_temperature', 'top_p', 'top_k'] as const;

export type DistillSettings = SettingsOf<typeof DISTILL_SETTINGS>;

/**
 * What distill honours: the loop's settings but the device's (the CPU only, for now), and train's
 * data settings. The loss's `beta` and `temperature` are gkd's parameters.
 */
export const DISTILL_HONOURS = [
  ...ONLINE_LOOP_SETTINGS.filter((k) => k !== 'device' && k !== 'compute_dtype'),
  ...ROLLOUT,
  'max_length', 'max_prompt_length', 'truncation', 'max_samples',
] as const;

declareCommand('distill', { honours: DISTILL_HONOURS, own: DISTILL_SETTINGS, lossParams: 'gkd' });

export interface DistillOptions extends OnlineOptions {
  /** The teacher's model folder: any architecture with the student's tokenizer. */
  teacher: string;
  /** AlignDistil: the DPO model `teacher`'s reference; the teacher's logits are z_ref + teacher_weight·(z_dpo − z_ref). */
  teacherRef?: string;
  /** Any data `train` reads. */
  data: string;
  /** Settings and gkd's parameters by name, typed (after `params`). */
  settings?: Readonly<Record<string, unknown>>;
  /**
   * Called with each on-policy micro-batch once it is sampled and scored (lmbda > 0): the step it
   * feeds, its data rows (indices in data order), their prompts' ids and the ids the student sampled.
   */
  onSamples?: (s: { step: number; rows: readonly number[]; promptIds: readonly (readonly number[])[]; ids: readonly (readonly number[])[]; masks?: readonly (readonly number[])[] }) => void;
  /**
   * Multi-turn on-policy micro-batches (`--tools`, `--mcp`, `--mcp-config`, `--env`): GRPO's agent
   * rollout, brought from src/online (online/distill-agents.ts), the layer above this one.
   */
  multiTurn?: MultiTurn;
}

/**
 * A multi-turn on-policy row: its prompt as the rollout rendered it (the tools offered), then
 * everything after it — the student's turns and the bridges that answered them (tool results,
 * environment messages) — with a mask that is 1 on the tokens the student sampled.
 */
export interface Conversation {
  promptIds: number[];
  ids: number[];
  mask: number[];
}

/** Multi-turn rollouts, given with the flag that names them in messages; `open` loads their sources (modules, not servers) with the run's settings. */
export interface MultiTurn {
  flag: string;
  open(s: DistillSettings): Promise<MultiTurnRun>;
}

export interface MultiTurnRun {
  /** What config.json records of the sources. */
  record: Record<string, unknown>;
  /** Starts servers and programs with the run; `resumeFrom`: the first step a resumed run re-collects (its tool calls replayed from the journal). */
  start(ctx: OnlineContext, resumeFrom: number | undefined): Promise<void>;
  /**
   * One conversation per prompt, prompt j drawn from the sampling stream (seed, j, 0); `step` keys the
   * tool journal and the episode seeds. `metrics`: the round's tool metrics (turns, tool calls, failures, stop reasons).
   */
  rollout(policy: Decoder, tok: LoadedTokenizer, req: { prompts: { prompt: Text; at: string }[]; seed: number; step: number }): Promise<{ conversations: Conversation[]; metrics: Record<string, number> }>;
  close(): Promise<void>;
}

export interface DistillResult {
  finalDir: string;
  steps: number;
  seconds: number;
  last: Record<string, number>;
  /** Whether the teacher's targets were read from the run's cache (else computed; false at lmbda = 1, which has none). */
  cached: boolean;
  /**
   * With lmbda > 0: the micro-batches this invocation trained, how many of them were the student's
   * own samples, and the seconds spent sampling them and scoring them with the teacher (wall clock:
   * kept out of metrics.jsonl, whose one clock field is tokens/s).
   */
  onPolicy?: { lmbda: number; microBatches: number; sampled: number; sampleSeconds: number; teacherSeconds: number };
  /** With seq_kd: whether the teacher's generations were read from the run's cache, the seconds they took (or their reading), their mean length in tokens. */
  seqKd?: { cached: boolean; seconds: number; meanLength: number };
}

export async function distill(o: DistillOptions): Promise<DistillResult> {
  const { config, lossParams, own, named } = resolveConfig({ configFile: o.configFile, params: o.params, settings: o.settings, base: o.base, command: 'distill' });
  const loss = resolveLoss('gkd', lossParams);
  const s = own as unknown as DistillSettings;
  const K = s.distill_topk;
  const { sampling, generation } = samplingSettings(s, named);
  const { quant: teacherQuant, dtype: teacherDtype } = teacherPrecision(s, named, runtimeOf(config).ep ?? 'cpu');
  // Refused before the run folder is made: a teacher that is no folder, or reads other token ids.
  const teacher = TeacherSpec.of(o.teacher, o.teacherRef, named.has('teacher_weight') ? s.teacher_weight : undefined);
  teacher.checkTokenizer(o.model, loadTokenizer(o.model));
  const multi = await openMultiTurn(o.multiTurn, s);
  const method = new Distillation(o, config, loss, K, sampling, s.seq_kd ? generation : null, teacher, multi, teacherQuant);
  let r: Awaited<ReturnType<typeof runOnline>>;
  try {
    r = await runOnline(o, (x) => method.load(x), method, {
      config,
      record: () => ({
        teacher: o.teacher, data: o.data, kind: method.kind, loss: 'gkd', loss_params: loss.terms[0].params, distill_topk: K,
        ...(teacherQuant ? { teacher_dtype: teacherDtype, ...('int8' in teacherQuant ? {} : { teacher_block_size: s.teacher_block_size }) } : {}),
        ...(o.teacherRef !== undefined ? { teacher_ref: o.teacherRef, teacher_weight: teacher.weight } : {}),
        ...(generation ? { seq_kd: s.seq_kd, lmbda: s.lmbda, ...Object.fromEntries(SAMPLING_KEYS.map((k) => [k, s[k]])) } : {}),
        ...(multi ? { agent: multi.record, ...Object.fromEntries(Object.keys(AGENT_SETTINGS).map((k) => [k, (s as unknown as Record<string, unknown>)[k]])) } : {}),
      }),
      inputs: [
        { key: 'teacher', now: o.teacher, flag: '--teacher' },
        { key: 'teacher_ref', now: o.teacherRef ?? null, flag: '--teacher-ref', optional: true },
        { key: 'data', now: o.data, flag: '--data' },
      ],
    });
  } finally {
    await multi?.close();
  }
  return {
    finalDir: r.finalDir, steps: r.steps, seconds: r.seconds, last: r.last, cached: method.cached,
    ...(sampling ? { onPolicy: { lmbda: sampling.lmbda, microBatches: method.microBatchCount, sampled: method.sampledCount, sampleSeconds: round2(method.sampleMs / 1000), teacherSeconds: round2(method.teacherMs / 1000) } } : {}),
    ...(method.seqKd ? { seqKd: method.seqKd } : {}),
  };
}

const round2 = (x: number) => Math.round(x * 100) / 100;

/**
 * The teacher's products under teacher_dtype: null (f32), q8/q4 blocks of teacher_block_size, or
 * int8's W8A8 products; refused in one line: f16, a block size that is no power of two, a device other
 * than the CPU (teacherQuant's refusals), teacher_block_size at f32 or int8 (nothing reads it), and seq_kd (its teacher
 * generates through the decoder, whose weights are baked in float32).
 */
function teacherPrecision(s: DistillSettings, named: ReadonlySet<string>, ep: string): { quant: TeacherQuant | null; dtype: string } {
  const dtype = resolveTeacherDtype(s.teacher_dtype, ep, s.seq_kd);
  const quant = teacherQuant(dtype, s.teacher_block_size, ep, { dtype: 'teacher_dtype', block: 'teacher_block_size' });
  const is = s.teacher_dtype === dtype ? dtype : `${s.teacher_dtype} (${dtype} here)`;
  if ((!quant || 'int8' in quant) && named.has('teacher_block_size')) throw new UserError(`teacher_block_size=${s.teacher_block_size}: read by teacher_dtype q8/q4 only, and teacher_dtype is ${is}; set teacher_dtype=q8 or q4, or leave teacher_block_size out`, { setting: 'teacher_block_size' });
  if (quant && s.seq_kd) throw new UserError(`teacher_dtype=${s.teacher_dtype} with seq_kd: the quantized teacher is its top-K scorer only, and seq_kd's generations would come from the float32 teacher; leave teacher_dtype at auto or f32 with seq_kd`, { setting: 'teacher_dtype' });
  return { quant, dtype };
}

/**
 * The multi-turn sources of a run, loaded, or null without them — then an agent setting away from
 * its default is refused (nothing reads it). They need something sampled: lmbda > 0 (at lmbda = 0
 * no micro-batch is the student's), and seq_kd's teacher generations are one turn per prompt.
 */
async function openMultiTurn(m: MultiTurn | undefined, s: DistillSettings): Promise<MultiTurnRun | null> {
  if (!m) {
    refuseAgentSettings('distill', s as unknown as Record<string, unknown>);
    return null;
  }
  if (s.lmbda === 0) throw new UserError(`${m.flag} with lmbda=0: multi-turn rollouts are the student's on-policy micro-batches, and at lmbda=0 the student samples none; set lmbda > 0 or leave ${m.flag} out`, { setting: 'lmbda' });
  if (s.seq_kd) throw new UserError(`${m.flag} with seq_kd: the teacher's generations are one turn per prompt, not multi-turn rollouts; leave seq_kd out (the multi-turn micro-batches are the student's, lmbda > 0)`, { setting: 'seq_kd' });
  return m.open(s);
}

/** What on-policy micro-batches sample with (lmbda > 0). */
export interface OnPolicy {
  lmbda: number;
  maxNewTokens: number;
  temperature: number;
  topK: number;
  topP: number;
}

/**
 * The sampling settings: `sampling`, the student's on-policy ones (null at lmbda = 0), and
 * `generation`, what anything samples with (the student at lmbda > 0, the teacher with seq_kd; null
 * when neither, and a sampling setting given then is refused, as it would be read by nothing).
 * `temperature` is gkd's loss τ here; TRL's GKD `temperature` is the sampling one, so a run that
 * samples and names `temperature` without `sampling_temperature` is refused as ambiguous. seq_kd with
 * lmbda = 1 is refused: every micro-batch is then the student's, the teacher's generations unread.
 */
function samplingSettings(s: DistillSettings, named: ReadonlySet<string>): { sampling: OnPolicy | null; generation: Omit<OnPolicy, 'lmbda'> | null } {
  if (s.lmbda === 0) {
    const rollout = ROLLOUT.filter((k) => named.has(k));
    if (rollout.length) throw new UserError(`${rollout.join(', ')}: read by on-policy distillation only (the student's own samples), and lmbda is 0 (the student samples nothing); set lmbda > 0 or leave ${rollout.length > 1 ? 'them' : 'it'} out`);
  }
  if (s.seq_kd && s.lmbda >= 1) throw new UserError("seq_kd with lmbda=1: every micro-batch is the student's own samples, so the teacher's generations would never be trained on; lower lmbda or leave seq_kd out", { setting: 'seq_kd' });
  if (s.lmbda === 0 && !s.seq_kd) {
    const unread = SAMPLING_KEYS.filter((k) => named.has(k));
    if (unread.length) throw new UserError(`${unread.join(', ')}: read only when something is sampled (lmbda > 0: the student; seq_kd: the teacher), and lmbda is 0 without seq_kd; set lmbda > 0 or seq_kd=true, or leave ${unread.length > 1 ? 'them' : 'it'} out`);
    return { sampling: null, generation: null };
  }
  if (named.has('temperature') && !named.has('sampling_temperature')) {
    const what = s.lmbda > 0 ? `lmbda=${s.lmbda}` : 'seq_kd';
    throw new UserError(`temperature with ${what} is ambiguous: in distill it is gkd's loss τ, in TRL's GKD the sampling temperature; give sampling_temperature for the sampling (and temperature only for the loss τ)`);
  }
  const generation = { maxNewTokens: s.max_completion_length, temperature: s.sampling_temperature, topK: s.top_k, topP: s.top_p };
  return { sampling: s.lmbda > 0 ? { lmbda: s.lmbda, ...generation } : null, generation };
}

/**
 * Which micro-batches of a round are on-policy, and their sample seeds, drawn from the run's random
 * stream `rng` (saved in every checkpoint): per micro-batch in order, a uniform u (only when
 * 0 < lmbda < 1; the micro-batch is on-policy when u < lmbda) and, when on-policy, its seed
 * `rng.int(2³¹)`; row j of the micro-batch then samples from `sampleRandom(seed, j, 0)`.
 */
export function onPolicyDraws(rng: SeededRandom, lmbda: number, microBatches: number): (number | null)[] {
  return Array.from({ length: microBatches }, () => {
    const on = lmbda >= 1 || (lmbda > 0 && rng.next() < lmbda);
    return on ? rng.int(2 ** 31) : null;
  });
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

/** The targets of an on-policy micro-batch as plain numbers (a round is JSON: the loop may save it). */
interface PlainTargets {
  ids: number[];
  logps: number[];
  rest: number[];
}

/**
 * One micro-batch of a round: its data rows, and when on-policy the student's samples for their
 * prompts and the teacher's top K on them. A multi-turn sample carries its own prompt ids (the tools
 * rendered into it) and its mask (1 on the student's tokens); the round's first on-policy batch, the
 * rollout's tool metrics.
 */
interface Batch {
  rows: number[];
  sampled?: { ids: number[][]; targets: PlainTargets[]; promptIds?: number[][]; masks?: number[][]; agent?: Record<string, number> };
}

/** A round: its micro-batches. */
type Round = Batch[];

/**
 * Distillation as a method of the training loop: items are row indices; `load` reads the data and
 * the teacher's targets (cached, or computed and cached; not at lmbda = 1, where no data response is
 * trained); a round is gradient_accumulation_steps micro-batches of batch_size rows, as train's. With
 * lmbda > 0 a micro-batch may be on-policy (`onPolicyDraws`): the live student samples a response to
 * each of its rows' prompts and the teacher's top K on those samples is computed then (never cached).
 */
class Distillation implements OnlineMethod<number, Round> {
  readonly name = 'distill';
  readonly partialRounds = true;
  kind = '';
  cached = false;
  /** Micro-batches collected, and of them on-policy ones, by this invocation. */
  microBatchCount = 0;
  sampledCount = 0;
  /** Milliseconds spent sampling on-policy micro-batches and scoring them with the teacher. */
  sampleMs = 0;
  teacherMs = 0;
  /**
   * Each sampled round's wall-clock and process CPU seconds (every thread's, ONNX Runtime's included)
   * of sampling and of the teacher's scoring, for its metrics row: kept beside the round, never in it
   * (a round may be saved in a checkpoint, which repeats to the bit).
   */
  private readonly clocks = new WeakMap<Round, { sample: number; teacher: number; sampleCpu: number; teacherCpu: number }>();
  /** With seq_kd: how the teacher's generations were had. */
  seqKd: DistillResult['seqKd'] | null = null;
  private rows: TokenizedExample[] = [];
  private targets: TeacherRow[] = [];
  private tok!: LoadedTokenizer;
  private student!: ModelConfig;
  private scorer: TeacherTopK | null = null;
  /** The positions of the teacher (and of its AlignDistil reference): a multi-turn conversation longer than them is refused. */
  private teacherPositions = Infinity;

  constructor(
    private readonly o: DistillOptions,
    private readonly config: TrainConfig,
    private readonly loss: BoundLoss,
    private readonly K: number,
    private readonly sampling: OnPolicy | null,
    /** seq_kd's sampling settings (null without seq_kd). */
    private readonly teacherGen: Omit<OnPolicy, 'lmbda'> | null,
    private readonly teacher: TeacherSpec,
    /** Multi-turn rollouts (tools, MCP, an environment) for the on-policy micro-batches, or null. */
    private readonly multi: MultiTurnRun | null = null,
    /** teacher_dtype q8/q4/int8: the teacher's products quantized (null: float32). */
    private readonly teacherQuant: TeacherQuant | null = null,
  ) {}

  /** The data stage (train's reading and tokenization) and the teacher stage (its cache). */
  async load(x: { run: string; tok: LoadedTokenizer; info: (line: string) => void; model: ModelConfig }): Promise<number[]> {
    const { config, o, sampling } = this;
    this.tok = x.tok;
    this.student = x.model;
    const data = await loadData(o.data, join(x.run, 'data'), { seed: config.seed, maxRows: config.max_samples });
    if (data.kind === 'listwise') throw new UserError(`${o.data}: is listwise data; distill trains on one response per row (single rows, the chosen side of pairs, or conversations)`);
    this.kind = data.kind;
    const t = tokenizeExamples(data.examples, x.tok, config, data.tokens);
    this.rows = t.rows.map(oneResponse);
    const masked = this.rows.filter((r) => r.responseMasks).length;
    x.info(`data: ${this.rows.length} ${data.kind} rows from ${o.data}${this.teacherGen ? " (their prompts: seq_kd trains on the teacher's responses)" : data.kind === 'pairwise' ? ' (the chosen responses)' : ''}${masked ? `, ${masked} with tool calls or several turns (only the assistant's own tokens distilled)` : ''}${t.truncated ? `, ${t.truncated} truncated to max_length ${config.max_length} / max_prompt_length ${config.max_prompt_length}` : ''}`);
    const generation = sampling ?? this.teacherGen;
    if (generation) this.checkPrompts(generation.maxNewTokens);
    if (sampling && sampling.lmbda >= 1) {
      x.info(`on-policy: lmbda=1, every micro-batch the student's samples (at most ${sampling.maxNewTokens} tokens, temperature ${sampling.temperature}) for its rows' prompts, scored by the teacher's top ${this.K}; the data's responses are not read`);
      return this.rows.map((_, i) => i);
    }
    if (this.teacherGen) this.rows = await this.teacherResponses(x.run, x.info, this.teacherGen);
    if (this.rows.some((r) => r.responseIds[0].length === 0)) {
      throw new UserError(`${o.data}: a response is empty after tokenization and truncation (max_length ${config.max_length} leaves no room); raise max_length or lower max_prompt_length`);
    }
    this.targets = await this.teacherStage(x.run, x.model, x.info);
    if (sampling) x.info(`on-policy: lmbda=${sampling.lmbda}, each micro-batch the student's samples (at most ${sampling.maxNewTokens} tokens, temperature ${sampling.temperature}) with probability ${sampling.lmbda}, else ${this.teacherGen ? "the teacher's generations" : "the data's responses"}`);
    return this.rows.map((_, i) => i);
  }

  /** Every row has a prompt to sample after, and prompt + max_completion_length fits both models' positions. */
  private checkPrompts(maxNewTokens: number): void {
    const empty = this.rows.findIndex((r) => r.promptIds.length === 0);
    if (empty >= 0) throw new UserError(`${this.o.data}: row ${empty} has no prompt; ${this.teacherGen ? "seq_kd samples the teacher's" : "lmbda > 0 samples the student's"} response to each row's prompt`);
    const longest = Math.max(...this.rows.map((r) => r.promptIds.length));
    const configOf = (dir: string) => parseConfig(JSON.parse(readFileSync(join(dir, 'config.json'), 'utf8')) as Record<string, unknown>);
    const models = [['the student', this.student], ['the teacher', configOf(this.teacher.dir)], ...(this.teacher.ref !== null ? [['the teacher\'s reference', configOf(this.teacher.ref)] as const] : [])] as const;
    for (const [who, c] of models) {
      const n = maxPositions(c);
      if (who !== 'the student') this.teacherPositions = Math.min(this.teacherPositions, n);
      if (longest + maxNewTokens > n) throw new UserError(`max_completion_length=${maxNewTokens}: a prompt of ${longest} tokens plus it exceeds ${who}'s ${n} positions; lower max_completion_length or max_prompt_length`);
    }
  }

  /** The teacher's top K of every row: the run's cache when it was made by this teacher on these rows, else computed and cached. */
  private async teacherStage(run: string, student: ModelConfig, info: (line: string) => void): Promise<TeacherRow[]> {
    const { config, o, K } = this;
    const identity = teacherCacheIdentity({ teacher: o.teacher, pair: this.teacher.ref !== null ? { ref: this.teacher.ref, weight: this.teacher.weight } : undefined, dataFiles: [o.data], truncation: config, rows: this.rows, topk: K, quant: this.teacherQuant });
    const cached = await readTeacherCache(run, identity);
    let rows: TeacherRow[];
    if (cached) {
      rows = cached;
      this.cached = true;
      info(`teacher: top-${K} targets read from ${join(run, 'data', 'teacher.parquet')}`);
    } else {
      const t0 = Date.now();
      const scorer = await this.openTeacher(student, info);
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

  /**
   * seq_kd: the rows with the teacher's generations for their prompts as their responses (the data's
   * are not read; a conversation's later turns and masks go with them), read from the run's cache or
   * generated and cached (seq-kd.ts).
   */
  private async teacherResponses(run: string, info: (line: string) => void, s: Omit<OnPolicy, 'lmbda'>): Promise<TokenizedExample[]> {
    const { config, o } = this;
    const identity = seqKdIdentity({ teacher: this.teacher, dataFiles: [o.data], truncation: config, rows: this.rows, seed: config.seed, sampling: s });
    const g = await teacherGenerations({ run, rows: this.rows, identity, tok: this.tok, sample: sampleStudent, open: () => this.teacher.load().decoders(runtimeOf(config, this.student)) });
    const meanLength = g.ids.reduce((a, x) => a + x.length, 0) / Math.max(1, g.ids.length);
    this.seqKd = { cached: g.cached, seconds: round2(g.seconds), meanLength: round2(meanLength) };
    const file = seqKdFiles(run).file;
    info(g.cached
      ? `seq_kd: the teacher's generations of ${g.ids.length} rows read from ${file}`
      : `seq_kd: the teacher generated ${g.ids.length} responses (at most ${s.maxNewTokens} tokens, temperature ${s.temperature}; mean ${this.seqKd.meanLength} tokens) in ${g.seconds.toFixed(1)}s, cached in ${file}; the data's responses are not read`);
    return this.rows.map((r, i) => ({ promptIds: r.promptIds, responseIds: [g.ids[i]], src: r.src }));
  }

  /** The teacher's top-K scorer over the ids it shares with the student. */
  private async openTeacher(student: ModelConfig, info: (line: string) => void): Promise<TeacherTopK> {
    const { config, K } = this;
    const teacher = this.teacher.load();
    // A teacher with more embedding rows than the student (padded past the shared tokenizer) has
    // ids the student cannot score: its distribution is taken over the ids both have.
    const limit = Math.min(teacher.config.vocab_size, student.vocab_size);
    if (limit < teacher.config.vocab_size) info(`teacher: ${teacher.config.vocab_size} embedding rows, the student ${student.vocab_size}; its distribution is taken over the first ${limit} ids`);
    if (K > limit) throw new UserError(`distill_topk=${K}: more than the ${limit} token ids the teacher and student share`);
    return TeacherTopK.create(teacher, { K, limit, runtime: scoringRuntime(runtimeOf(config)), padId: this.tok.padId ?? 0, quant: this.teacherQuant });
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

  async open(ctx: OnlineContext): Promise<void> {
    if (this.sampling) this.scorer = await this.openTeacher(this.student, ctx.info);
    await this.multi?.start(ctx, this.o.resume ? ctx.art.step + 1 : undefined);
  }

  async close(): Promise<void> {
    await this.scorer?.release();
    this.scorer = null;
  }

  async collect(ctx: OnlineContext, idx: readonly number[], info: RoundInfo): Promise<Round> {
    const batches: Round = splitDraws(idx, info).map((rows) => ({ rows }));
    if (!this.sampling) return batches;
    const seeds = onPolicyDraws(ctx.rng, this.sampling.lmbda, batches.length);
    const on = batches.filter((_, b) => seeds[b] !== null);
    this.microBatchCount += batches.length;
    this.sampledCount += on.length;
    if (on.length === 0) return batches;
    const cpuSince = (c0: NodeJS.CpuUsage) => {
      const c = process.cpuUsage(c0);
      return (c.user + c.system) / 1e6;
    };
    let t0 = performance.now();
    let c0 = process.cpuUsage();
    const sampledRows = this.multi ? await this.multiTurn(ctx, on, seeds.find((x) => x !== null)!, info.step) : await this.oneTurn(ctx, batches, seeds);
    const sampleMs = performance.now() - t0;
    const sampleCpu = cpuSince(c0);
    this.sampleMs += sampleMs;
    t0 = performance.now();
    c0 = process.cpuUsage();
    const targets = await this.scorer!.score(sampledRows, { batchSize: this.config.batch_size * 2, padTo: this.config.pad_to_multiple_of });
    const teacherMs = performance.now() - t0;
    const teacherCpu = cpuSince(c0);
    this.teacherMs += teacherMs;
    this.clocks.set(batches, { sample: sampleMs / 1000, teacher: teacherMs / 1000, sampleCpu, teacherCpu });
    let r = 0;
    for (const b of on) {
      b.sampled!.targets = b.rows.map(() => {
        const t = targets[r++];
        return { ids: Array.from(t.ids), logps: Array.from(t.logps), rest: Array.from(t.rest) };
      });
      const x = b.sampled!;
      this.o.onSamples?.({ step: info.step, rows: b.rows, promptIds: x.promptIds ?? b.rows.map((i) => this.rows[i].promptIds), ids: x.ids, ...(x.masks ? { masks: x.masks } : {}) });
    }
    return batches;
  }

  /**
   * Every on-policy micro-batch of the round sampled together from the live weights, row j of
   * micro-batch b from its own stream (seed_b, j): what it draws never depends on the others. Sets
   * each batch's `sampled` and returns the rows the teacher scores.
   */
  private async oneTurn(ctx: OnlineContext, batches: Round, seeds: readonly (number | null)[]): Promise<TokenizedExample[]> {
    const reqs = batches.flatMap((b, k) => (seeds[k] === null ? [] : b.rows.map((i, j) => ({ promptIds: this.rows[i].promptIds, rng: sampleRandom(seeds[k]!, j, 0) }))));
    const samples = await sampleStudent(await ctx.policy(), this.tok, reqs, this.sampling!);
    const sampledRows: TokenizedExample[] = [];
    let r = 0;
    batches.forEach((b, k) => {
      if (seeds[k] === null) return;
      const ids = b.rows.map(() => samples[r++]);
      b.sampled = { ids, targets: [] };
      b.rows.forEach((i, j) => sampledRows.push({ promptIds: this.rows[i].promptIds, responseIds: [ids[j]], src: this.rows[i].src }));
    });
    return sampledRows;
  }

  /**
   * The round's on-policy micro-batches as multi-turn rollouts: one rollout over all their rows (so
   * the tool journal's and the episodes' keys — step, place in the round — are unique), seeded by the
   * first on-policy micro-batch's seed, row k of the round's on-policy rows from stream (seed, k, 0).
   * Returns the conversations as the rows the teacher scores, their bridges masked.
   */
  private async multiTurn(ctx: OnlineContext, on: Round, seed: number, step: number): Promise<TokenizedExample[]> {
    const prompts = on.flatMap((b) => b.rows.map((i) => ({ prompt: this.rows[i].src.prompt, at: `${this.o.data} row ${i + 1}` })));
    const r = await this.multi!.rollout(await ctx.policy(), this.tok, { prompts, seed, step });
    const teacherMax = this.teacherPositions;
    const sampledRows: TokenizedExample[] = [];
    let k = 0;
    on.forEach((b, n) => {
      const convs = b.rows.map(() => r.conversations[k++]);
      b.sampled = { ids: convs.map((c) => c.ids), targets: [], promptIds: convs.map((c) => c.promptIds), masks: convs.map((c) => c.mask), ...(n === 0 ? { agent: r.metrics } : {}) };
      convs.forEach((c, j) => {
        const i = b.rows[j];
        if (c.promptIds.length + c.ids.length > teacherMax) throw new UserError(`${prompts[k - convs.length + j].at}: its conversation (${c.promptIds.length} prompt tokens with the tools, ${c.ids.length} after) passes the teacher's ${teacherMax} positions; lower max_completion_length or max_prompt_length`);
        sampledRows.push({ promptIds: c.promptIds, responseIds: [c.ids], responseMasks: [c.mask], src: this.rows[i].src });
      });
    });
    return sampledRows;
  }

  async microBatches(_ctx: OnlineContext, round: Round): Promise<MicroBatch[]> {
    return round.map((b) => {
      if (!b.sampled) return this.microBatch(b.rows.map((i) => this.rows[i]), b.rows.map((i) => this.targets[i]));
      const x = b.sampled;
      const rows = b.rows.map((i, j) => ({ promptIds: x.promptIds?.[j] ?? this.rows[i].promptIds, responseIds: [x.ids[j]], ...(x.masks ? { responseMasks: [x.masks[j]] } : {}), src: this.rows[i].src }));
      const targets = b.sampled.targets.map((t) => ({ ids: Int32Array.from(t.ids), logps: Float32Array.from(t.logps), rest: Float32Array.from(t.rest) }));
      return this.microBatch(rows, targets);
    });
  }

  /**
   * The step's share of on-policy micro-batches and their mean sample length (lmbda > 0 only: an
   * offline run's rows are as before); on a step that sampled, the wall-clock and process CPU seconds
   * of sampling and of the teacher's scoring (clock fields, as tokens/s: not repeated by a rerun, not
   * in checkpoints).
   */
  metrics(round: Round): Record<string, number> {
    if (!this.sampling) return {};
    const on = round.filter((b) => b.sampled);
    // The student's own tokens: a multi-turn sample's bridges are not counted.
    const lengths = on.flatMap((b) => b.sampled!.ids.map((x, j) => (b.sampled!.masks ? b.sampled!.masks[j].reduce((a, m) => a + m, 0) : x.length)));
    const clock = this.clocks.get(round);
    return {
      ...on[0]?.sampled!.agent,
      'distill/on_policy': on.length / round.length,
      ...(lengths.length ? { 'distill/completion_length': lengths.reduce((a, v) => a + v, 0) / lengths.length } : {}),
      ...(clock ? { 'distill/sample_seconds': clock.sample, 'distill/teacher_seconds': clock.teacher, 'distill/sample_cpu_seconds': clock.sampleCpu, 'distill/teacher_cpu_seconds': clock.teacherCpu } : {}),
    };
  }

  /** Rows collated as train's single rows, the counted positions listed, the teacher's targets at them in the same order. */
  private microBatch(rows: readonly TokenizedExample[], targets: readonly TeacherRow[]): MicroBatch {
    const K = this.K;
    const c = collate([...rows], { kind: 'single', padTo: this.config.pad_to_multiple_of, padId: this.tok.padId ?? 0, dtype: 'float32' });
    const index = scoreIndex(c.feeds.loss_mask.data as Float32Array, rows.length, c.length);
    const M = index.length;
    const ids = new BigInt64Array(M * K);
    const logps = new Float32Array(M * K);
    const rest = new Float32Array(M);
    let m = 0;
    for (const t of targets) {
      t.ids.forEach((id, j) => (ids[m * K + j] = BigInt(id)));
      logps.set(t.logps, m * K);
      rest.set(t.rest, m);
      m += t.rest.length;
    }
    if (m !== M) throw new Error(`distill: ${M} counted positions in the batch, ${m} targets`);
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

/**
 * The student's samples (one per request, in order) from `decoder` (the live weights; or a mixture's
 * parts: seq_kd's teacher, seq-kd.ts): stop at the
 * tokenizer's stop ids (kept as the sample's last token, trained as GRPO trains them) or at
 * max_completion_length tokens, ids below the tokenizer's vocabulary only.
 */
export async function sampleStudent(decoder: Decoder | MixturePart[], tok: LoadedTokenizer, reqs: GenerateRequest[], s: Omit<OnPolicy, 'lmbda'>): Promise<number[][]> {
  const stopIds = tok.stopIds.length ? tok.stopIds : tok.eosId !== null ? [tok.eosId] : [];
  const out = await generateIds(Array.isArray(decoder) ? decoder : [{ decoder, weight: 1 }], reqs, {
    temperature: s.temperature, topK: s.topK, topP: s.topP, maxNewTokens: s.maxNewTokens,
    stopIds, padId: tok.padId ?? tok.eosId ?? 0, vocabLimit: tok.vocabSize,
  });
  return out.map((g) => g.ids);
}
