/**
 * The measurements behind `prefzoo bench` (src/cli/commands/bench.ts) and the scripts beside this
 * file: throughput of one DPO training step (forward, backward, AdamW) of the init-model llama
 * through the training artifacts, against the machine's MatMul peak through the same runtime.
 *
 * FLOPs follow the PaLM paper's count (Chowdhery et al. 2022, appendix B): 6·N per token for the
 * N matmul parameters (every weight except the input embedding table, which is a gather), plus
 * 12·L·H·hd·T per token for the attention scores and context, computed densely as the runtime does.
 */
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { buildArtifacts } from '../../src/artifacts/build.ts';
import { TrainingArtifacts } from '../../src/artifacts/training.ts';
import { type LlamaConfig, type Preset, countParameters, parameterShapes, presetArch, presetConfig } from '../../src/models/config.ts';
import { initLora } from '../../src/models/lora.ts';
import { initTensors } from '../../src/models/init.ts';
import { type BaseTensor, checkBlock, quantizedWeights, quantizeQ4 } from '../../src/models/quantize-base.ts';
import { measureMatmulPeak } from '../../src/runtime/peak.ts';
import { checkDevice, type RuntimeOptions } from '../../src/runtime/session.ts';
import { describePlacement, placement } from '../../src/runtime/placement.ts';
import { readManifest, type ArtifactTarget } from '../../src/artifacts/manifest.ts';
import { batchShapeOf, collate } from '../../src/models/batch.ts';
import type { TokenizedExample } from '../../datasets/examples.ts';
import { problemOf, problemSpec } from '../../src/train/problem.ts';
import { DEFAULT_CONFIG, type TrainConfig } from '../../src/train/config.ts';
import { artifactsOf, loraOf, LOW_MEMORY_RUNTIME, lowMemoryFor } from '../../src/train/run.ts';
import { mallocAdvice, mmapThreshold } from '../../src/runtime/malloc.ts';
import { collectGarbage } from '../../src/runtime/gc.ts';
import { resolveLoss } from '../../losses/index.ts';
import { writeTokenizer } from '../../src/tokenize/test-tokenizer.ts';
import type { TypedArray } from '../../src/onnx/dtype.ts';
import { type ProgressFactory, startProgress } from '../../src/progress.ts';

export interface BenchOptions {
  /** tiny/small (the init-model llama) or a released model's shape (qwen2.5-0.5b, …; random weights). */
  preset: Preset;
  /** LoRA rank on every projection (alpha = 2·rank); 0 or absent: full fine-tune. */
  loraRank?: number;
  /** Activation recomputation (TrainConfig.gradient_checkpointing). */
  gradientCheckpointing?: boolean;
  /** LoRA's frozen base weights in float16 (TrainConfig.base_dtype). */
  baseDtype?: 'float32' | 'float16';
  /** QLoRA: the frozen projection weights in 4-bit blocks of this many values (TrainConfig.load_in_4bit, quant_block_size). */
  quantBlock?: number;
  /** Timed training steps (after `warmup` untimed ones). */
  steps: number;
  warmup: number;
  pairs: number;
  seqLen: number;
  runtime: RuntimeOptions;
  /** Skip the MatMul peak measurement (mfu is then null). */
  skipPeak?: boolean;
  /** Run each pair's prompt once for both responses (the trainer's default); false: one sequence per response. */
  sharePrompt?: boolean;
  /** Where the AdamW update runs (TrainingArtifacts' LoadOptions.update); default auto. */
  update?: 'auto' | 'graph' | 'host';
  /** Precision of the matrix products (src/onnx/half.ts); float16 is for the GPU. */
  computeDtype?: 'float32' | 'float16';
  /** Draws the steps (the CLI passes plain lines on stderr); none without it. */
  progress?: ProgressFactory;
  /** Where the stage lines go; none without it. */
  log?: (line: string) => void;
}

/** Per graph: nodes per execution provider and the op types that fell back to the CPU. */
export type BenchPlacement = Record<string, { nodes: Record<string, number>; cpu_fallbacks: number; fallback_ops: Record<string, number> }>;

export interface BenchResult {
  preset: string;
  arch: string;
  lora_rank: number | null;
  gradient_checkpointing: boolean;
  /** Sessions without the CPU arena and memory pattern (recomputation, or a model of LOW_MEMORY_PARAMS or more). */
  low_memory_runtime: boolean;
  /** glibc's fixed mmap threshold from MALLOC_MMAP_THRESHOLD_ (65536 advised under recomputation), or null: adaptive (src/runtime/malloc.ts). */
  malloc_mmap_threshold: number | null;
  base_dtype: 'float32' | 'float16';
  /** QLoRA's block size (load_in_4bit), or null: a float base. */
  quant_block: number | null;
  /** Parameters the optimizer updates (all, or the adapters). */
  trainable_params: number;
  /** Execution provider the steps ran on. */
  device: string;
  compute_dtype: 'float32' | 'float16';
  /** Where each training graph's nodes run (device runs only; null on the CPU). */
  placement: BenchPlacement | null;
  params: number;
  matmul_params: number;
  tokens_per_step: number;
  /** Whether each pair's prompt ran once for both responses (false: once per response, as TRL does). */
  share_prompt: boolean;
  /** Tokens the model ran over per step: tokens_per_step less the repeated prompts when shared. */
  computed_tokens_per_step: number;
  /** 'host': AdamW in place in this process (src/optim/host.ts); 'graph': inside the fused step graph. */
  optimizer_update: 'graph' | 'host';
  threads: number | null;
  tokens_per_s: number;
  seconds_per_step: number;
  step_seconds: number[];
  model_gflop_per_step: number;
  achieved_gflops: number;
  matmul_peak_gflops: number | null;
  mfu: number | null;
  /** FLOPs the step actually executes: matmuls over the computed rows (padding included), the head over the scored positions only, dense attention per row. */
  executed_gflop_per_step: number;
  /** executed_gflop_per_step ÷ seconds_per_step ÷ matmul_peak_gflops: the hardware's utilisation. */
  hfu: number | null;
  eval_tokens_per_s: number;
  peak_rss_mb: number;
  /** Process CPU seconds (all threads) per timed step: above threads × seconds_per_step means spinning, below means waiting for a core. */
  cpu_seconds_per_step: number;
  /** 1-minute load average when the timed steps began: other work on the machine slows every figure. */
  load_average: number;
}

const median = (xs: number[]) => {
  const s = [...xs].sort((a, b) => a - b);
  return s.length % 2 ? s[(s.length - 1) / 2] : (s[s.length / 2 - 1] + s[s.length / 2]) / 2;
};

/** 6·N per token plus dense attention (12·L·H·hd·T per token), per the PaLM appendix B count. */
export function stepFlops(c: LlamaConfig, tokens: number, seqLen: number): { flops: number; matmulParams: number } {
  const matmulParams = matmulParameters(c);
  return { flops: tokens * (6 * matmulParams + attentionFlopsPerToken(c, seqLen)), matmulParams };
}

/** Weights that take part in matmuls: all but the input embedding (a gather), which a tied head counts once. */
function matmulParameters(c: LlamaConfig): number {
  return countParameters(c) - (c.tie_word_embeddings ? 0 : c.vocab_size * c.hidden_size);
}

/** Dense attention, forward and backward, per query token of a row of length T: 12·L·H·hd·T. */
function attentionFlopsPerToken(c: LlamaConfig, T: number): number {
  return 12 * c.num_hidden_layers * c.num_attention_heads * c.head_dim * T;
}

/**
 * FLOPs a step executes over a collated batch: 6 per matmul weight per computed row position (the
 * padded rows × length), the output head only over the S scored positions, and dense attention
 * (12·L·H·hd·T² per row of length T) — what the runtime runs, unlike the nominal count above.
 */
export function executedFlops(c: LlamaConfig, rows: number, length: number, scored: number): number {
  const head = c.vocab_size * c.hidden_size;
  const layers = matmulParameters(c) - head;
  return 6 * layers * rows * length + 6 * head * scored + attentionFlopsPerToken(c, length) * length * rows;
}

/** Positions whose next token is counted: the rows the output head runs over. */
function scoredPositions(feeds: Record<string, { dims: readonly number[]; data: unknown }>): number {
  if (feeds.score_index) return feeds.score_index.dims[0];
  const [B, T] = feeds.loss_mask.dims;
  const mask = feeds.loss_mask.data as Float32Array;
  let n = 0;
  for (let b = 0; b < B; b++) for (let t = 1; t < T; t++) n += mask[b * T + t] ? 1 : 0;
  return n;
}

/** `pairs` preference pairs of seeded random tokens: a prompt of half the length, two completions of the rest. */
export function benchPairs(vocab: number, pairs: number, seqLen: number, seed = 1): TokenizedExample[] {
  let s = seed >>> 0;
  // Tokens from 16 upwards keep the generated tokenizer's special ids out of the data.
  const tok = () => {
    s = (Math.imul(s, 1664525) + 1013904223) >>> 0;
    return 16 + (s % (vocab - 16));
  };
  const half = seqLen / 2;
  return Array.from({ length: pairs }, () => ({
    promptIds: Array.from({ length: half }, tok),
    responseIds: [Array.from({ length: seqLen - half }, tok), Array.from({ length: seqLen - half }, tok)],
    src: { prompt: '', responses: ['', ''] },
  }));
}

/** Peak resident memory of the process so far, MB. */
function rssMb(): number {
  return process.resourceUsage().maxRSS / 1024;
}

/** Resident memory now, MB. */
function currentRss(): number {
  return process.memoryUsage.rss() / 2 ** 20;
}

const gb = (mb: number) => (mb / 1024).toFixed(1);

export async function runBench(o: BenchOptions): Promise<BenchResult> {
  const log = o.log ?? (() => {});
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'prefzoo-bench-'));
  try {
    return await benchIn(dir, o, log);
  } finally {
    fs.rmSync(dir, { recursive: true, force: true });
  }
}

export interface BenchSetup {
  config: LlamaConfig;
  params: number;
  trainableParams: number;
  /** The artifacts folder (no checkpoint: `initial` holds the starting weights). */
  artDir: string;
  initial: Map<string, TypedArray>;
  rows: TokenizedExample[];
  padId: number;
  /** The artifacts take packed batches (collate with `packed: true`). */
  packed: boolean;
}

/** The bench's model, batch rows and DPO training artifacts, written under `dir`. */
export interface BenchModelOptions {
  loraRank?: number;
  gradientCheckpointing?: boolean;
  baseDtype?: 'float32' | 'float16';
  quantBlock?: number;
  /** Keep only this many decoder layers of the preset (a cheap proxy of a released shape for profiling). */
  layers?: number;
}

/**
 * The trainer's settings a bench run stands for: train's defaults (AdamW, β 0.9/0.999, ε 1e-8, no
 * decay, clip 1, one micro-batch per step) with the bench's LoRA (alpha = 2·rank on every
 * projection), recomputation, base dtype, prompt sharing and device.
 */
export function benchSettings(m: BenchModelOptions & { sharePrompt?: boolean; target?: ArtifactTarget; computeDtype?: 'float32' | 'float16' }): TrainConfig {
  return {
    ...DEFAULT_CONFIG,
    lora_r: m.loraRank ?? 0,
    lora_alpha: 2 * (m.loraRank ?? 0),
    lora_target_modules: 'all-linear',
    gradient_checkpointing: m.gradientCheckpointing ?? false,
    base_dtype: m.baseDtype ?? 'float32',
    load_in_4bit: !!m.quantBlock,
    quant_block_size: m.quantBlock ?? DEFAULT_CONFIG.quant_block_size,
    share_prompt: m.sharePrompt ?? true,
    device: m.target === 'webgpu' ? 'webgpu' : 'cpu',
    compute_dtype: m.computeDtype ?? 'float32',
    gradient_accumulation_steps: 1,
  };
}

export function prepareBench(dir: string, preset: Preset, pairs: number, seqLen: number, sharePrompt = true, target: ArtifactTarget = 'cpu', computeDtype: 'float32' | 'float16' = 'float32', m: BenchModelOptions = {}): BenchSetup {
  // The model init-model writes (same tokenizer, config and seed), kept in memory.
  const tok = writeTokenizer(path.join(dir, 'tokenizer'));
  const arch = presetArch(preset) ?? 'llama';
  const config = presetConfig(arch, preset, { vocabSize: preset === 'tiny' ? tok.vocabSize : undefined, bosTokenId: tok.bosId, eosTokenId: tok.eosId, padTokenId: tok.padId }) as LlamaConfig;
  if (m.layers !== undefined) config.num_hidden_layers = m.layers;
  const settings = benchSettings({ ...m, sharePrompt, target, computeDtype });
  // A 4-bit base is quantized tensor by tensor as it is made, so no float32 copy of the model is ever whole.
  if (settings.load_in_4bit) checkBlock(config, parameterShapes(config), settings.quant_block_size);
  const quantized = new Set(settings.load_in_4bit ? quantizedWeights(config) : []);
  const weights = new Map<string, BaseTensor>();
  for (const [k, t] of initTensors(config, 0)) weights.set(k, quantized.has(k) ? quantizeQ4(t, settings.quant_block_size) : t);
  const lora = loraOf(settings);
  if (lora) for (const [k, v] of initLora(config, lora, 0)) weights.set(k, v);
  // The problem train and artifacts build from the same settings (src/train/problem.ts), for the
  // batch the bench feeds (its chunking, under recomputation, is sized to it).
  const rows = benchPairs(config.vocab_size, pairs, seqLen);
  const longest = batchShapeOf(collate(rows, benchCollate(tok.padId, sharePrompt)));
  const problem = problemOf(settings, { model: config, kind: 'pairwise', loss: resolveLoss('dpo'), lora, dataKeys: new Set(), longest });
  const spec = problemSpec(problem, weights, settings);
  weights.clear();
  const trainableParams = spec.params.filter((p) => p.trainable).reduce((n, p) => n + p.shape.reduce((a, b) => a * b, 1), 0);
  // No initial checkpoint on disk: the weights go straight into the runner's store.
  const initial = new Map(spec.params.map((p) => [p.name, p.data!]));
  spec.params = spec.params.map((p) => ({ ...p, data: undefined }));
  const artDir = path.join(dir, 'artifacts');
  // The bench never accumulates micro-batches, as the trainer at gradient_accumulation_steps=1.
  buildArtifacts(spec, artDir, artifactsOf(settings));
  return { config, params: countParameters(config), trainableParams, artDir, initial, rows, padId: tok.padId, packed: !!problem.packed };
}

/** How the bench collates its pairs. */
function benchCollate(padId: number, packed: boolean) {
  return { kind: 'pairwise' as const, padTo: 64, padId, dtype: 'float32' as const, packed };
}

async function benchIn(dir: string, o: BenchOptions, log: (line: string) => void): Promise<BenchResult> {
  log(`${o.preset}: building the model and its training artifacts`);
  const sharePrompt = o.sharePrompt ?? true;
  const device = o.runtime.ep ?? 'cpu';
  const computeDtype = o.computeDtype ?? 'float32';
  await checkDevice(o.runtime, { float16: computeDtype === 'float16' });
  const { config, params, trainableParams, artDir, initial, rows, padId } = prepareBench(dir, o.preset, o.pairs, o.seqLen, sharePrompt, device === 'webgpu' ? 'webgpu' : 'cpu', computeDtype, o);
  let where: BenchPlacement | null = null;
  if (device !== 'cpu') {
    where = {};
    const m = readManifest(artDir);
    for (const [name, g] of Object.entries({ step: m.step, training: m.training, eval: m.eval, optimizer: m.optimizer })) {
      if (!g) continue;
      const p = await placement(path.join(artDir, g.file), o.runtime);
      const ops: Record<string, number> = {};
      for (const f of p.fallbacks) ops[f.op] = (ops[f.op] ?? 0) + 1;
      where[name] = { nodes: p.nodes, cpu_fallbacks: p.fallbacks.length, fallback_ops: ops };
      log(`${name} graph: ${describePlacement(p)}`);
    }
  }
  // As the trainer's runtimeOf: recomputation, or a large model, means the memory-saving session settings.
  const lowMemory = lowMemoryFor(o.gradientCheckpointing ?? false, params);
  const runtime = lowMemory ? { ...o.runtime, ...LOW_MEMORY_RUNTIME } : o.runtime;
  const art = await TrainingArtifacts.load(artDir, runtime, { checkpoint: false, update: o.update });
  for (const [name, data] of initial) art.setParam(name, data);
  initial.clear();
  // The starting weights are garbage now (a parameter-sized copy): collected before the steps, as the trainer does.
  if (lowMemory) collectGarbage();
  const advice = mallocAdvice(o.gradientCheckpointing ?? false, device);
  if (advice) log(advice);

  const collateOpts = benchCollate(padId, sharePrompt);
  const c0 = collate(rows, collateOpts);
  const evalRuns = Math.max(1, Math.min(o.steps, 5));
  const evalTimes: number[] = [];
  let ref: Float32Array | null = null;
  // One untimed warm-up evaluation first, unless no warm-up was asked for (at 1.5B one takes minutes).
  const first = o.warmup > 0 ? 0 : 1;
  for (let i = first; i <= evalRuns; i++) {
    const t0 = performance.now();
    const out = await art.evaluate(c0.feeds);
    if (i > 0) evalTimes.push((performance.now() - t0) / 1000);
    ref = out.logp.data as Float32Array;
  }
  // Reference log-probs = the starting policy's, in collate's response-major layout.
  const batch = collate(rows, { ...collateOpts, refLogps: (_, i) => [ref![i], ref![o.pairs + i]] });
  const tokens = batch.tokens;
  const layout = sharePrompt ? `${o.pairs} rows of prompt + 2 responses (${batch.computed} tokens computed)` : `${batch.sequences}×${batch.length} tokens`;
  log(`${params.toLocaleString('en-US')} parameters; eval ${(tokens / median(evalTimes)).toFixed(0)} tokens/s; resident ${gb(currentRss())} GB (peak ${gb(rssMb())} GB); ${o.warmup} warm-up + ${o.steps} timed steps of ${tokens} tokens: ${layout}`);

  const progress = startProgress(o.progress, 'bench', o.warmup + o.steps);
  const stepTimes: number[] = [];
  let cpu0 = process.cpuUsage();
  const load = os.loadavg()[0];
  for (let i = 0; i < o.warmup + o.steps; i++) {
    if (i === o.warmup) cpu0 = process.cpuUsage();
    const t0 = performance.now();
    const m = await art.trainStep(batch.feeds, { lr: 1e-5 });
    const dt = (performance.now() - t0) / 1000;
    if (!Number.isFinite(m.loss)) throw new Error(`bench: loss is ${m.loss} at step ${i + 1}`);
    if (i >= o.warmup) stepTimes.push(dt);
    progress.update(i + 1, { 's/step': dt, loss: m.loss });
  }
  progress.stop();
  log(`steps done: resident ${gb(currentRss())} GB, peak ${gb(rssMb())} GB`);
  const cpu = process.cpuUsage(cpu0);
  const updater = art.updater;
  await art.release();

  const perStep = median(stepTimes);
  // The nominal count of the step as one sequence per response: the same for both layouts and engines.
  const { flops, matmulParams } = stepFlops(config, tokens, o.seqLen);
  let peak: number | null = null;
  if (!o.skipPeak) {
    log('measuring the MatMul peak');
    peak = (await measureMatmulPeak(o.runtime)).gflops;
  }
  const achieved = flops / perStep / 1e9;
  const [rowsRun, lengthRun] = batch.feeds.input_ids.dims;
  const executed = executedFlops(config, rowsRun, lengthRun, scoredPositions(batch.feeds));
  return {
    preset: o.preset,
    arch: config.model_type,
    lora_rank: o.loraRank || null,
    gradient_checkpointing: o.gradientCheckpointing ?? false,
    low_memory_runtime: lowMemory,
    malloc_mmap_threshold: mmapThreshold(),
    base_dtype: o.baseDtype ?? 'float32',
    quant_block: o.quantBlock ?? null,
    trainable_params: trainableParams,
    device,
    compute_dtype: computeDtype,
    placement: where,
    params,
    matmul_params: matmulParams,
    tokens_per_step: tokens,
    share_prompt: sharePrompt,
    computed_tokens_per_step: batch.computed,
    optimizer_update: updater,
    threads: o.runtime.threads ?? null,
    tokens_per_s: round(tokens / perStep, 1),
    seconds_per_step: round(perStep, 3),
    step_seconds: stepTimes.map((t) => round(t, 3)),
    model_gflop_per_step: round(flops / 1e9, 1),
    achieved_gflops: round(achieved, 1),
    matmul_peak_gflops: peak === null ? null : round(peak, 1),
    mfu: peak === null ? null : round(achieved / peak, 3),
    executed_gflop_per_step: round(executed / 1e9, 1),
    hfu: peak === null ? null : round(executed / perStep / 1e9 / peak, 3),
    eval_tokens_per_s: round(tokens / median(evalTimes), 1),
    peak_rss_mb: round(rssMb(), 0),
    cpu_seconds_per_step: round((cpu.user + cpu.system) / 1e6 / o.steps, 3),
    load_average: round(load, 2),
  };
}

function round(x: number, digits: number): number {
  const f = 10 ** digits;
  return Math.round(x * f) / f;
}
