/**
 * A distillation step's cost (`prefzoo bench --distill`): the student (`--preset`, the init-model
 * llama) and a teacher of about 4× its parameters with the same tokenizer (the preset widened 2×,
 * its depth chosen to bring the count nearest 4×), both random, written to a temporary folder; then
 * `distill` itself, on-policy (lmbda = 1, beta = 1: every micro-batch the student's samples of
 * `--new` tokens for `--rows` prompts of `--prompt` tokens, scored by the teacher's top K), for
 * `--warmup` untimed and `--steps` timed steps. Each timed step is split as the run's own metrics
 * rows split it (`distill/sample_seconds`, `distill/teacher_seconds`, and their process CPU seconds
 * `distill/sample_cpu_seconds`, `distill/teacher_cpu_seconds`), the rest of the step (from one
 * step's progress to the next) being the update: the training graph's forward, backward and AdamW,
 * with the micro-batch's collation. Prints the medians, the ratio teacher scoring ÷ sampling (the
 * issue's target: ≤ 1.5), and the size of the offline top-K cache at K = `--topk`: the teacher's
 * targets of the same prompts with `--new`-token responses written by the cache's own writer to
 * `data/teacher.parquet`, its bytes per counted token against V × 4 bytes of full float32 logits
 * (target: ≤ 1/20).
 *
 *   prefzoo bench --distill [--preset small] [--rows 8] [--prompt 32] [--new 64] [--steps 2] [--warmup 1] [--topk 32] [--teacher-dtype f32,q8,q4]
 *
 * With several --teacher-dtype precisions each gets its own timed run on the same models and prompts,
 * and each after the first is compared with the first's top K on the cache's rows (`topkGap`).
 */
import { mkdirSync, mkdtempSync, readFileSync, rmSync, statSync, writeFileSync } from 'node:fs';
import os from 'node:os';
import { join } from 'node:path';
import { countParameters, presetConfig, type ModelConfig, type Preset } from '../../src/models/config.ts';
import { initModelFolder, type ShapeField } from '../../src/models/init.ts';
import { distill } from '../../src/train/distill.ts';
import { DEFAULT_CONFIG } from '../../src/train/config.ts';
import { teacherCacheFiles, teacherCacheIdentity, writeTeacherCache } from '../../src/train/teacher-cache.ts';
import { scoringRuntime, TeacherTopK, type TeacherRow } from '../../src/train/teacher-topk.ts';
import { productQuant } from '../../src/models/quantize.ts';
import { TeacherSpec } from '../../src/train/teacher-model.ts';
import { loadTokenizer } from '../../src/tokenize/index.ts';
import { loadData, tokenizeExamples } from '../../datasets/examples.ts';
import { reporterOf } from '../../src/progress.ts';
import { SeededRandom } from '../../src/random.ts';
import type { RuntimeOptions } from '../../src/runtime/session.ts';

export interface DistillBenchOptions {
  preset: Preset;
  rows: number;
  prompt: number;
  newTokens: number;
  steps: number;
  warmup: number;
  topk: number;
  threads?: number;
  /** The teacher's precisions (teacher_dtype), each timed by its own run on the same models and prompts, in this order (default: f32 alone). */
  teacherDtypes?: string[];
  log?: (line: string) => void;
}

/** One teacher_dtype's timed run. */
export interface DistillBenchVariant {
  teacher_dtype: string;
  sample_s: number;
  teacher_s: number;
  update_s: number;
  step_s: number;
  step_seconds: { sample: number; teacher: number; update: number; sample_cpu: number; teacher_cpu: number }[];
  teacher_over_sampling: number;
  /** Medians of the process CPU seconds (every thread's) of the same phases, and their ratio: less disturbed by other work on the machine than the wall clock. */
  sample_cpu_s: number;
  teacher_cpu_s: number;
  teacher_over_sampling_cpu: number;
  mean_completion_length: number;
  /**
   * Beside the first precision: its top K on the cache's rows (the teacher's targets of the same
   * prompts with `--new`-token responses) against the first's: mean and max |Δ log p| at the ids both
   * hold, and the share of the first's K ids it holds.
   */
  gap?: { mean_abs_logp: number; max_abs_logp: number; topk_agreement: number };
}

/** The first precision's figures (medians over the timed steps, seconds; teacher_over_sampling's target ≤ 1.5), then the setup's and the cache's. */
export interface DistillBenchResult extends Omit<DistillBenchVariant, 'teacher_dtype' | 'gap'> {
  preset: string;
  student_params: number;
  teacher_params: number;
  teacher_shape: Record<string, number>;
  rows: number;
  prompt_tokens: number;
  max_new_tokens: number;
  topk: number;
  cache: { file_bytes: number; tokens: number; bytes_per_token: number; full_logits_bytes_per_token: number; fraction: number };
  load_average: number;
  /** Every precision timed (the figures above are the first's). */
  variants: DistillBenchVariant[];
}

const median = (xs: number[]) => [...xs].sort((a, b) => a - b)[xs.length >> 1];
const r3 = (x: number) => Math.round(x * 1000) / 1000;

/**
 * The teacher's shape: the student's preset with hidden size, FFN and head counts doubled (head_dim
 * kept), and the depth whose parameter count is nearest 4× the student's.
 */
export function teacherShape(student: ModelConfig, arch: string, preset: Preset, vocabSize?: number): { shape: Partial<Record<ShapeField, number>>; params: number } {
  const s = student as unknown as Record<string, number>;
  const wide = {
    hidden_size: 2 * s.hidden_size,
    intermediate_size: 2 * s.intermediate_size,
    num_attention_heads: 2 * s.num_attention_heads,
    num_key_value_heads: 2 * s.num_key_value_heads,
    head_dim: s.head_dim,
  };
  const want = 4 * countParameters(student);
  let best: { shape: Partial<Record<ShapeField, number>>; params: number } | null = null;
  for (let layers = 1; layers <= 4 * s.num_hidden_layers; layers++) {
    const shape = { ...wide, num_hidden_layers: layers };
    const params = countParameters({ ...presetConfig(arch, preset, { vocabSize }), ...shape } as ModelConfig);
    if (!best || Math.abs(params - want) < Math.abs(best.params - want)) best = { shape, params };
  }
  return best!;
}

/** Text of about `n` tokens of the generated tokenizer: seeded words. */
function words(rng: SeededRandom, n: number): string {
  const vocab = ['the', 'model', 'student', 'teacher', 'samples', 'a', 'token', 'of', 'and', 'prompt', 'cache', 'step', 'logits', 'seven', 'blue', 'river'];
  return Array.from({ length: n }, () => vocab[rng.int(vocab.length)]).join(' ');
}

export async function runDistillBench(o: DistillBenchOptions): Promise<DistillBenchResult> {
  const log = o.log ?? (() => {});
  const dir = mkdtempSync(join(os.tmpdir(), 'prefzoo-bench-distill-'));
  try {
    const arch = 'llama';
    log(`writing the student (${o.preset}) and a teacher of about 4× its parameters to ${dir}`);
    const student = join(dir, 'student');
    const s = initModelFolder(student, arch, o.preset, 0);
    const vocabSize = o.preset === 'tiny' ? loadTokenizer(student).vocabSize : undefined;
    const t = teacherShape(s.config, arch, o.preset, vocabSize);
    const teacher = join(dir, 'teacher');
    initModelFolder(teacher, arch, o.preset, 1, {}, t.shape);
    log(`student ${s.parameters.toLocaleString('en-US')} parameters, teacher ${t.params.toLocaleString('en-US')} (${(t.params / s.parameters).toFixed(2)}×: ${JSON.stringify(t.shape)})`);

    // Prompts cut to `prompt` tokens (the text is longer), responses (the cache's rows) to `new`.
    const rng = new SeededRandom(7);
    const data = join(dir, 'data.jsonl');
    const n = o.rows * (o.warmup + o.steps);
    writeFileSync(data, Array.from({ length: n }, () => JSON.stringify({ prompt: words(rng, o.prompt), chosen: words(rng, o.newTokens), rejected: 'no' })).join('\n') + '\n');
    const truncation = { max_prompt_length: o.prompt, max_length: o.prompt + o.newTokens, truncation: 'keep_start' as const };

    // The timed runs, one per precision: every step on-policy; the step's clock from one progress update to the next.
    const dtypes = o.teacherDtypes?.length ? o.teacherDtypes : ['f32'];
    const variants: DistillBenchVariant[] = [];
    for (const dtype of dtypes) {
      const marks: number[] = [];
      const reporter = reporterOf({ progress: (label) => ({ update: () => label === 'distill' && marks.push(performance.now()), stop() {} }), info: (line) => log(line) });
      const out = join(dir, `run-${dtype}`);
      const params = [
        `max_steps=${o.warmup + o.steps}`, `batch_size=${o.rows}`, 'logging_steps=1', `save_steps=${o.warmup + o.steps + 1}`, 'learning_rate=1e-5', `distill_topk=${o.topk}`,
        'lmbda=1', 'beta=1', `max_completion_length=${o.newTokens}`, `max_prompt_length=${truncation.max_prompt_length}`, `max_length=${truncation.max_length}`,
        `truncation=${truncation.truncation}`, ...(o.threads ? [`threads=${o.threads}`] : []), `teacher_dtype=${dtype}`,
      ];
      log(`distill (teacher_dtype=${dtype}): ${o.warmup} untimed + ${o.steps} timed on-policy steps of ${o.rows} prompts × ${o.newTokens} new tokens`);
      const t0 = performance.now();
      await distill({ teacher, model: student, data, out, params, reporter });
      log(`distill ran in ${((performance.now() - t0) / 1000).toFixed(1)} s`);
      const rows = readFileSync(join(out, 'metrics.jsonl'), 'utf8').trim().split('\n').map((l) => JSON.parse(l) as Record<string, number>);
      const steps: DistillBenchVariant['step_seconds'] = [];
      const lengths: number[] = [];
      for (let i = o.warmup; i < o.warmup + o.steps; i++) {
        const row = rows[i];
        const step = (marks[i] - marks[i - 1]) / 1000;
        const sample = row['distill/sample_seconds'];
        const teacherS = row['distill/teacher_seconds'];
        steps.push({ sample: r3(sample), teacher: r3(teacherS), update: r3(step - sample - teacherS), sample_cpu: r3(row['distill/sample_cpu_seconds']), teacher_cpu: r3(row['distill/teacher_cpu_seconds']) });
        lengths.push(row['distill/completion_length']);
      }
      const sample_s = median(steps.map((x) => x.sample));
      const teacher_s = median(steps.map((x) => x.teacher));
      const sample_cpu_s = median(steps.map((x) => x.sample_cpu));
      const teacher_cpu_s = median(steps.map((x) => x.teacher_cpu));
      variants.push({
        teacher_dtype: dtype, sample_s, teacher_s, update_s: median(steps.map((x) => x.update)),
        step_s: r3(median(steps.map((x) => x.sample + x.teacher + x.update))), step_seconds: steps,
        teacher_over_sampling: Math.round((teacher_s / sample_s) * 100) / 100,
        sample_cpu_s, teacher_cpu_s, teacher_over_sampling_cpu: Math.round((teacher_cpu_s / sample_cpu_s) * 100) / 100,
        mean_completion_length: r3(lengths.reduce((a, v) => a + v, 0) / lengths.length),
      });
    }

    // The offline cache at K = topk: the teacher's targets of the data's responses, written by the cache's writer.
    log(`the top-${o.topk} cache of ${n} rows (${o.newTokens}-token responses)`);
    const tok = loadTokenizer(student);
    const loaded = await loadData(data, join(dir, 'cache-work'), { seed: 0 });
    const examples = tokenizeExamples(loaded.examples, tok, { ...DEFAULT_CONFIG, ...truncation }, loaded.tokens).rows;
    const tm = TeacherSpec.of(teacher, undefined, undefined).load();
    const limit = Math.min(tm.config.vocab_size, s.config.vocab_size);
    const scoreAt = async (dtype: string) => {
      const quant = productQuant(dtype, 32, 'cpu', { dtype: '--teacher-dtype', block: 'teacher_block_size' });
      const scorer = await TeacherTopK.create(tm, { K: o.topk, limit, runtime: scoringRuntime({ threads: o.threads }), padId: tok.padId ?? 0, quant });
      try {
        return await scorer.score(examples, { batchSize: 2 * o.rows, padTo: 1 });
      } finally {
        await scorer.release();
      }
    };
    const first = await scoreAt(dtypes[0]);
    for (const v of variants.slice(1)) v.gap = topkGap(first, await scoreAt(v.teacher_dtype), o.topk);
    const cacheRun = join(dir, 'cache');
    mkdirSync(join(cacheRun, 'data'), { recursive: true });
    const written = await writeTeacherCache(cacheRun, first, teacherCacheIdentity({ teacher, dataFiles: [data], truncation: { ...DEFAULT_CONFIG, ...truncation }, rows: examples, topk: o.topk }));
    const tokens = written.reduce((a, r) => a + r.rest.length, 0);
    const fileBytes = statSync(teacherCacheFiles(cacheRun).file).size;
    const full = s.config.vocab_size * 4;
    return {
      preset: o.preset,
      student_params: s.parameters,
      teacher_params: t.params,
      teacher_shape: t.shape as Record<string, number>,
      rows: o.rows,
      prompt_tokens: o.prompt,
      max_new_tokens: o.newTokens,
      mean_completion_length: variants[0].mean_completion_length,
      topk: o.topk,
      sample_s: variants[0].sample_s,
      teacher_s: variants[0].teacher_s,
      update_s: variants[0].update_s,
      step_s: variants[0].step_s,
      step_seconds: variants[0].step_seconds,
      teacher_over_sampling: variants[0].teacher_over_sampling,
      sample_cpu_s: variants[0].sample_cpu_s,
      teacher_cpu_s: variants[0].teacher_cpu_s,
      teacher_over_sampling_cpu: variants[0].teacher_over_sampling_cpu,
      cache: { file_bytes: fileBytes, tokens, bytes_per_token: Math.round((fileBytes / tokens) * 10) / 10, full_logits_bytes_per_token: full, fraction: Math.round((fileBytes / tokens / full) * 1e5) / 1e5 },
      load_average: Math.round(os.loadavg()[0] * 100) / 100,
      variants,
    };
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
}

/** `b`'s top K against `a`'s, token by token: |Δ log p| at the ids both hold, and the share of `a`'s ids `b` holds. */
export function topkGap(a: readonly TeacherRow[], b: readonly TeacherRow[], K: number): { mean_abs_logp: number; max_abs_logp: number; topk_agreement: number } {
  let sum = 0;
  let max = 0;
  let both = 0;
  let all = 0;
  a.forEach((ra, i) => {
    const rb = b[i];
    for (let t = 0; t < ra.rest.length; t++) {
      const at = new Map<number, number>();
      for (let j = 0; j < K; j++) at.set(rb.ids[t * K + j], rb.logps[t * K + j]);
      for (let j = 0; j < K; j++) {
        const lb = at.get(ra.ids[t * K + j]);
        all++;
        if (lb === undefined) continue;
        const d = Math.abs(lb - ra.logps[t * K + j]);
        sum += d;
        max = Math.max(max, d);
        both++;
      }
    }
  });
  return { mean_abs_logp: Math.round((sum / Math.max(1, both)) * 1e5) / 1e5, max_abs_logp: Math.round(max * 1e5) / 1e5, topk_agreement: Math.round((both / Math.max(1, all)) * 1e4) / 1e4 };
}

export function formatDistillBench(r: DistillBenchResult): string {
  const lines: [string, string][] = [
    ['models', `student ${r.preset} (${r.student_params.toLocaleString('en-US')} parameters), teacher ${r.teacher_params.toLocaleString('en-US')} (${(r.teacher_params / r.student_params).toFixed(2)}×; hidden ${r.teacher_shape.hidden_size}, ${r.teacher_shape.num_hidden_layers} layers), random weights, CPU`],
    ['step', `${r.rows} prompts of ${r.prompt_tokens} tokens, up to ${r.max_new_tokens} new (mean ${r.mean_completion_length}), lmbda=1, top ${r.topk}`],
    ['sampling_s', `${r.sample_s} (the student's generation)`],
    ['teacher_s', `${r.teacher_s} (the teacher's top ${r.topk} on prompt + samples)`],
    ['update_s', `${r.update_s} (forward, backward, AdamW)`],
    ['step_s', `${r.step_s} (medians of ${r.step_seconds.length} steps: ${r.step_seconds.map((x) => `${x.sample}+${x.teacher}+${x.update}`).join(', ')})`],
    ['teacher/sampling', `${r.teacher_over_sampling}× (target ≤ 1.5)`],
    ['cpu_s', `sampling ${r.sample_cpu_s}, teacher ${r.teacher_cpu_s}: ${r.teacher_over_sampling_cpu}× (process CPU seconds, every thread's; medians)`],
    ...r.variants.slice(r.variants.length > 1 ? 0 : 1).map((v): [string, string] => [`teacher_dtype=${v.teacher_dtype}`, `sampling ${v.sample_s}, teacher ${v.teacher_s}, update ${v.update_s}: teacher/sampling ${v.teacher_over_sampling}× (CPU s ${v.sample_cpu_s}, ${v.teacher_cpu_s}: ${v.teacher_over_sampling_cpu}×)${v.gap ? `; top ${r.topk} against ${r.variants[0].teacher_dtype}'s: |Δ log p| mean ${v.gap.mean_abs_logp}, max ${v.gap.max_abs_logp}, ids agree ${v.gap.topk_agreement}` : ''}`]),
    ['topk_cache', `${r.cache.bytes_per_token} bytes per token (${r.cache.file_bytes.toLocaleString('en-US')} bytes, ${r.cache.tokens} tokens) against ${r.cache.full_logits_bytes_per_token.toLocaleString('en-US')} of float32 logits: 1/${Math.round(1 / r.cache.fraction)} (target ≤ 1/20)`],
    ['load_average', `${r.load_average} (other work on the machine slows every figure)`],
  ];
  const w = Math.max(...lines.map(([k]) => k.length));
  return lines.map(([k, v]) => `${k.padEnd(w)}  ${v}`).join('\n') + '\n';
}
