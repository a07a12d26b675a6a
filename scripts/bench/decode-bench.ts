/**
 * Generation throughput (`prefzoo bench --generate`, scripts/bench/decode): batched KV-cache
 * sampling of a random-initialised preset, every row decoding exactly `--new` tokens (no stop ids),
 * multinomial sampling at temperature 1. The weights are fed to the graphs as inputs, as the online
 * loops feed their live policy (`--baked` bakes them in, as `prefzoo generate` does). Reports prefill
 * time, decode tokens/s and ms per step (the median of `--runs` generations, timed after the prefill),
 * peak RSS (of the generation, before the probes below), and the two lower bounds of a step: its matrix-product FLOPs at this machine's MatMul
 * peak, and reading its matrix weights once at this machine's memory bandwidth.
 *
 *   scripts/bench/decode [--arch llama] [--preset small] [--batch 8] [--prompt 32] [--new 64] [--runs 3] [--baked] [--json]
 */
import os, { tmpdir } from 'node:os';
import { mkdtempSync, rmSync } from 'node:fs';
import { join } from 'node:path';
import { writeTokenizer } from '../../src/tokenize/test-tokenizer.ts';
import { type Arch, type ModelConfig, type Preset, countParameters, presetArch, presetConfig } from '../../src/models/config.ts';
import { initWeights } from '../../src/models/init.ts';
import type { FloatTensor } from '../../src/models/checkpoint.ts';
import { Decoder, generateIds, setGenerateTimer, type GenerateRequest } from '../../src/models/generate.ts';
import { sampleRandom } from '../../src/models/sampling.ts';
import { familyFor } from '../../src/models/families.ts';
import { measureMatmulPeak } from '../../src/runtime/peak.ts';
import type { RuntimeOptions } from '../../src/runtime/session.ts';
import { deviceTraffic, resetDeviceTraffic } from '../../src/models/generate-device.ts';
import type { ProductQuant } from '../../src/models/quantize.ts';

export interface GenerateBenchOptions {
  arch?: Arch;
  preset: Preset;
  batch: number;
  prompt: number;
  newTokens: number;
  /** Timed generations (the median counts). */
  runs?: number;
  /** Bake the weights into the graphs instead of feeding them. */
  baked?: boolean;
  /** Products over block-quantized weights (q8/q4, MatMulNBits; `prefzoo bench --generate --dtype`); default f32. */
  quant?: ProductQuant | null;
  /** The host decode graphs with ONNX Runtime's fused ops (Decoder's `fused`; default: on the CPU); false: `bench --generate --unfused`. */
  fused?: boolean;
  runtime?: RuntimeOptions;
  skipPeak?: boolean;
  /** A model's config and weights instead of the preset's random ones (`bench --serve --model`); `preset` then names it. */
  model?: { config: ModelConfig; weights: Map<string, FloatTensor> };
  log?: (line: string) => void;
}

export interface GenerateBenchResult {
  engine: string;
  arch: string;
  preset: string;
  params: number;
  /** Whether the weights are inputs of the graphs or baked into them (always baked when quantized: MatMulNBits is prepacked only from initializers). */
  weights: 'fed' | 'baked';
  /** Whether the decode graphs use ONNX Runtime's fused ops (docs/performance.md, "Fused decoding"). */
  fused: boolean;
  /** Nodes of one decode step's graph: as built, and as ONNX Runtime runs it (one kernel call each on the CPU; null where not read). */
  nodes_per_step: { graph: number; runtime: number | null };
  /** f32, or q8/q4 with its block size. */
  dtype: string;
  /** Intra-op threads of the step session (CPU; a q8/q4 step of one or two rows of a model of at most 100M parameters runs on one unless `--threads` names a count). */
  step_threads: number | null;
  /**
   * q8/q4: the milliseconds a weight update adds to the next generation (quantizing the weights and
   * making its sessions, measured as a two-token generation after `setWeights` less one without),
   * and of those, quantizing.
   */
  update_ms?: number;
  quantize_ms?: number;
  /** Of `update_ms`: building the graphs and making their sessions (serializing, ONNX Runtime's load and prepacking). */
  session_ms?: number;
  /** `update_ms` as process CPU time (every thread): steadier than the wall on a shared machine. */
  update_cpu_ms?: number;
  device: string;
  batch: number;
  prompt_tokens: number;
  new_tokens: number;
  prefill_ms: number;
  decode_tokens_per_s: number;
  /** The comparison figure of scripts/bench/compare --generate: decode_tokens_per_s. */
  tokens_per_s: number;
  ms_per_step: number;
  step_ms_runs: number[];
  gflop_per_step: number;
  matmul_peak_gflops: number | null;
  flop_bound_ms: number | null;
  weight_mb_per_step: number;
  memory_gb_per_s: number;
  bandwidth_bound_ms: number;
  /**
   * On a device (WebGPU), the host↔device copies of the last timed generation per step (prefill
   * included), counted from the tensors fed and returned (src/models/generate-device.ts), and the
   * weight bytes uploaded in it (0 once a decoder's fed weights are on the device).
   */
  device_copies?: { to_device_per_step: number; to_device_bytes_per_step: number; to_host_per_step: number; to_host_bytes_per_step: number; weight_upload_bytes: number };
  peak_rss_mb: number;
  load_average: number;
}

export function generatedVocabSize(): number {
  const dir = mkdtempSync(join(tmpdir(), 'prefzoo-generate-bench-'));
  try {
    return writeTokenizer(dir).vocabSize;
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
}

/** Matrix-product parameters a decode step reads: every weight but the embedding tables (unless tied: then the token table is the head). */
export function matmulParams(c: ModelConfig): number {
  const fam = familyFor(c);
  const D = fam.hiddenSize(c);
  const embeds = c.vocab_size * D + (fam.learnedPositions ? fam.maxPositions(c) * D : 0);
  return countParameters(c) - embeds + (c.tie_word_embeddings ? c.vocab_size * D : 0);
}

/** Memory read bandwidth, GB/s: the fastest of a few sums over 256 MB through a copy (read + write counted). */
function memoryBandwidth(): number {
  const n = 64 * 2 ** 20;
  const a = new Float32Array(n).fill(1);
  const b = new Float32Array(n);
  let best = 0;
  for (let r = 0; r < 4; r++) {
    const t0 = performance.now();
    b.set(a);
    const s = (performance.now() - t0) / 1000;
    best = Math.max(best, (2 * n * 4) / s / 1e9);
  }
  return best;
}

/**
 * FLOPs of one decode step of B rows over a cache of L positions: 2 per matmul weight per row, and
 * q·k plus p·v over the query width, taken as the hidden size (exact for llama's and gpt2's presets;
 * a model with wider heads, such as qwen3's, counts less attention than it does).
 */
export function decodeStepFlops(c: ModelConfig, B: number, L: number): number {
  const fam = familyFor(c);
  return 2 * B * matmulParams(c) + 4 * B * fam.numLayers(c) * fam.hiddenSize(c) * L;
}

function median(xs: number[]): number {
  const s = [...xs].sort((a, b) => a - b);
  const m = s.length >> 1;
  return s.length % 2 ? s[m] : (s[m - 1] + s[m]) / 2;
}

const round = (x: number, d = 1) => Math.round(x * 10 ** d) / 10 ** d;
/** Four significant digits (the tiny preset's figures are small). */
const sig = (x: number) => Number(x.toPrecision(4));

export async function runGenerateBench(o: GenerateBenchOptions): Promise<GenerateBenchResult> {
  const log = o.log ?? (() => {});
  const arch = o.model ? o.model.config.model_type : (o.arch ?? presetArch(o.preset) ?? 'llama');
  // tiny takes its vocabulary from the generated tokenizer, as init-model does.
  const config = o.model?.config ?? presetConfig(arch, o.preset, o.preset === 'tiny' ? { vocabSize: generatedVocabSize() } : {});
  const weights = o.model?.weights ?? initWeights(config, 0);
  const { batch: B, prompt: P, newTokens: N } = o;
  const runs = o.runs ?? 3;
  const dec = await Decoder.create(config, weights, { ...(o.quant ? { quant: o.quant } : { bake: o.baked ?? false }), runtime: o.runtime, fused: o.fused });
  // The bench samples at temperature 1: the step graph's head is `sample-t1` (the logits on WebGPU).
  const nodes = await dec.stepNodes(B, 'sample-t1');
  const stepThreads = dec.stepThreads(B);
  const V = config.vocab_size;
  const reqs = (seed: number): GenerateRequest[] =>
    Array.from({ length: B }, (_, i) => ({ promptIds: Array.from({ length: P }, (_, t) => 16 + ((i * 7919 + t * 104729) % (Math.min(V, 4096) - 16))), rng: sampleRandom(seed, i, 0) }));
  // The generation's own spans: the prefill, and everything after it (each step's run, pick, bookkeeping).
  const gen = async (seed: number, n: number) => {
    let decode = 0;
    setGenerateTimer((label, ms) => {
      if (label !== 'prefill') decode += ms;
    });
    const t0 = performance.now();
    try {
      await generateIds([{ decoder: dec, weight: 1 }], reqs(seed), { temperature: 1, maxNewTokens: n, stopIds: [], padId: 0, batchSize: B });
    } finally {
      setGenerateTimer(null);
    }
    return { total: performance.now() - t0, decode };
  };
  log(`${arch} ${o.preset}, batch ${B}, prompt ${P}, ${N} new tokens: warming up`);
  await gen(1, Math.min(N, 4));
  const prefills: number[] = [];
  const steps: number[] = [];
  for (let r = 0; r < runs; r++) {
    const prefill = (await gen(10 + r, 1)).total;
    resetDeviceTraffic();
    const { decode } = await gen(20 + r, N);
    prefills.push(prefill);
    steps.push(decode / Math.max(1, N - 1));
    log(`run ${r + 1}/${runs}: prefill ${prefill.toFixed(1)} ms, ${steps[r].toFixed(2)} ms/step`);
  }
  const t = deviceTraffic();
  let update: { update_ms: number; update_cpu_ms: number; quantize_ms: number; session_ms: number } | null = null;
  if (o.quant) {
    const q0 = dec.quantizeMs;
    const s0 = dec.sessionMs;
    const cpuMs = (c: NodeJS.CpuUsage) => (c.user + c.system) / 1000;
    const t0 = performance.now();
    const c0 = process.cpuUsage();
    dec.setWeights((name) => weights.get(name)?.data);
    await gen(30, 2);
    const t1 = performance.now();
    const c1 = process.cpuUsage();
    await gen(31, 2);
    const after = cpuMs(process.cpuUsage(c1));
    update = { update_ms: round(t1 - t0 - (performance.now() - t1)), update_cpu_ms: round(cpuMs(process.cpuUsage(c0)) - after - after), quantize_ms: round(dec.quantizeMs - q0), session_ms: round(dec.sessionMs - s0) };
    log(`a weight update: ${update.update_ms} ms on the next generation (${update.update_cpu_ms} ms of process CPU), ${update.quantize_ms} ms of it quantizing, ${update.session_ms} ms making sessions`);
  }
  const fused = dec.fused;
  await dec.release();
  // Before the MatMul peak and bandwidth probes, which allocate their own buffers.
  const rss = Math.round(process.resourceUsage().maxRSS / 1024);
  const msStep = median(steps);
  const flops = decodeStepFlops(config, B, P + N / 2);
  const peak = o.skipPeak ? null : (await measureMatmulPeak(o.runtime)).gflops;
  const bw = memoryBandwidth();
  // q8/q4: every matrix weight is read as its blocks (bits a value and a float32 scale a block; a short last block's padding left out).
  const weightBytes = matmulParams(config) * (o.quant ? (o.quant.bits + 32 / o.quant.block) / 8 : 4);
  return {
    engine: 'prefzoo',
    arch,
    preset: o.preset,
    params: countParameters(config),
    weights: o.baked || o.quant ? 'baked' : 'fed',
    fused,
    nodes_per_step: nodes,
    dtype: o.quant ? `q${o.quant.bits} (block ${o.quant.block})` : 'f32',
    step_threads: stepThreads,
    ...(update ?? {}),
    device: o.runtime?.ep ?? 'cpu',
    batch: B,
    prompt_tokens: P,
    new_tokens: N,
    prefill_ms: round(median(prefills)),
    decode_tokens_per_s: round(B / (msStep / 1000)),
    tokens_per_s: round(B / (msStep / 1000)),
    ms_per_step: sig(msStep),
    step_ms_runs: steps.map(sig),
    gflop_per_step: sig(flops / 1e9),
    matmul_peak_gflops: peak === null ? null : round(peak),
    flop_bound_ms: peak === null ? null : sig(flops / peak / 1e6),
    weight_mb_per_step: sig(weightBytes / 1e6),
    memory_gb_per_s: round(bw),
    bandwidth_bound_ms: sig((weightBytes / (bw * 1e9)) * 1000),
    peak_rss_mb: rss,
    load_average: round(os.loadavg()[0], 2),
    ...(dec.device && t.steps > 0
      ? {
          device_copies: {
            to_device_per_step: round(t.uploads / t.steps, 2),
            to_device_bytes_per_step: Math.round((t.uploadBytes - t.weightUploadBytes) / t.steps),
            to_host_per_step: round(t.downloads / t.steps, 2),
            to_host_bytes_per_step: Math.round(t.downloadBytes / t.steps),
            weight_upload_bytes: t.weightUploadBytes,
          },
        }
      : {}),
  };
}

/** One line per figure, for the terminal. */
export function formatGenerateBench(r: GenerateBenchResult): string {
  const lines: [string, string][] = [
    ['model', `${r.arch} ${r.preset}, ${r.params.toLocaleString('en-US')} parameters, weights ${r.weights}, ${r.dtype}, ${r.device}, ${r.fused ? 'fused' : 'unfused'} graphs`],
    ['nodes_per_step', `${r.nodes_per_step.graph} built, ${r.nodes_per_step.runtime ?? 'not read'} after ONNX Runtime's optimisations${r.step_threads === null ? '' : `; ${r.step_threads} intra-op thread${r.step_threads === 1 ? '' : 's'}`}`],
    ...(r.update_ms !== undefined ? ([['update_ms', `${r.update_ms} (a weight update's cost to the next generation, ${r.update_cpu_ms} ms of process CPU; quantizing ${r.quantize_ms}, making sessions ${r.session_ms})`]] as [string, string][]) : []),
    ['shape', `batch ${r.batch}, prompt ${r.prompt_tokens}, ${r.new_tokens} new tokens, multinomial sampling`],
    ['prefill_ms', String(r.prefill_ms)],
    ['decode_tokens_per_s', String(r.decode_tokens_per_s)],
    ['ms_per_step', `${r.ms_per_step} (median of ${r.step_ms_runs.join(', ')})`],
    ['gflop_per_step', String(r.gflop_per_step)],
    ['flop_bound_ms', r.flop_bound_ms === null ? 'not measured' : `${r.flop_bound_ms} (at the MatMul peak, ${r.matmul_peak_gflops} GFLOP/s)`],
    ['bandwidth_bound_ms', `${r.bandwidth_bound_ms} (${r.weight_mb_per_step} MB of matrix weights at ${r.memory_gb_per_s} GB/s)`],
    ['peak_rss_mb', String(r.peak_rss_mb)],
    ['load_average', `${r.load_average} (other work on the machine slows every figure)`],
    ...(r.device_copies
      ? ([['device_copies', `per step ${r.device_copies.to_device_per_step} to the device (${r.device_copies.to_device_bytes_per_step} bytes), ${r.device_copies.to_host_per_step} back (${r.device_copies.to_host_bytes_per_step} bytes); weights uploaded in the run: ${r.device_copies.weight_upload_bytes} bytes`]] as [string, string][])
      : []),
  ];
  const w = Math.max(...lines.map(([k]) => k.length));
  return lines.map(([k, v]) => `${k.padEnd(w)}  ${v}`).join('\n') + '\n';
}
