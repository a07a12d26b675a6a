/**
 * ONNX Runtime sessions: execution provider, threads and optimisation level in one place, and
 * conversions between JS typed arrays and ort.Tensor.
 */
import ort from 'onnxruntime-node';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { spawnSync } from 'node:child_process';
import { createRequire } from 'node:module';
import { fileURLToPath } from 'node:url';
import { DeviceUnavailableError, UserError } from '../errors.ts';
import type { DType, TypedArray } from '../onnx/dtype.ts';
import { Graph } from '../onnx/graph.ts';
import { loadModel, serializeModel } from '../onnx/proto.ts';
import { lowerForWebGpu } from '../onnx/lower.ts';

export type ExecutionProvider = 'cpu' | 'webgpu' | 'cuda';
export const EXECUTION_PROVIDERS: readonly ExecutionProvider[] = ['cpu', 'webgpu', 'cuda'];
export type OptLevel = 'disabled' | 'basic' | 'extended' | 'all';

export interface RuntimeOptions {
  /**
   * Execution provider. 'webgpu' is bundled with onnxruntime-node (any Vulkan GPU on Linux, nothing to
   * install); 'cuda' needs the CUDA build of onnxruntime-node.
   */
  ep?: ExecutionProvider;
  /**
   * Intra-op threads. Default on the CPU (`defaultCpuThreads`): `PREFZOO_THREADS` if set, else one per
   * core this process may use, set explicitly because ONNX Runtime's own default (intra_op_num_threads 0)
   * ran a 2-core machine's products on one core (bench --generate --batch 16: 781 decode tokens/s
   * against 1,223 with 2 set, side by side).
   */
  threads?: number;
  /** Graph optimisation level (default 'extended': measured faster than 'all' for training graphs). */
  optLevel?: OptLevel;
  /**
   * Let idle intra-op threads spin (ONNX Runtime's default, true): faster hand-offs on an idle machine,
   * cycles taken from other processes (and from this session's own busy threads) on a loaded one.
   */
  spin?: boolean;
  /** Stop the intra-op threads' spinning when a run returns (ONNX Runtime's `session.force_spinning_stop`): they spin within a run only. */
  spinStop?: boolean;
  /** ONNX Runtime's CPU memory arena (default true): reuses freed activation memory across runs. */
  arena?: boolean;
  /**
   * ONNX Runtime's memory pattern (ONNX Runtime's default true; training artifacts and decoders set
   * false unless given): after the first run it plans every intermediate
   * tensor into one block sized for the run. For graphs whose intermediates dwarf their inputs (a
   * 0.5B model's step at 1,024 tokens) that block comes on top of what the arena already holds.
   */
  memPattern?: boolean;
  /** Write ONNX Runtime's per-node profile (Chrome trace JSON) to `<prefix>_<date>.json`; see `Session.endProfiling`. */
  profilePrefix?: string;
}

/**
 * A forward-only session's runtime (an eval graph, a scorer) from a run's: ONNX Runtime's CPU arena
 * kept where the run's training step goes without it (`arena: false`, train/run.ts LOW_MEMORY_RUNTIME).
 * Without the arena every tensor over glibc's 32 MiB mmap ceiling is a fresh mapping zero-filled on
 * every run, past 256 positions at the 0.5B shape (its 2-layer proxy's eval: 1.47 CPU ms per token at
 * 1,024 tokens with the arena, 9.2 at 512 without); a forward holds no gradients, so what its arena
 * keeps is small beside a step's peak (docs/performance.md, "Real sequence lengths"). The gradient
 * sessions of a forward built in pieces take it too (artifacts/training.ts): no piece passes the
 * ceiling, so the arena's regions are reused from piece to piece.
 */
export function forwardRuntime(r: RuntimeOptions): RuntimeOptions {
  const { arena: _, ...kept } = r;
  return kept;
}

/** Where a session leaves an output: in host memory ('cpu') or on the device ('gpu-buffer', webgpu). */
export type OutputLocation = 'cpu' | 'gpu-buffer';

export type OrtTensor = ort.Tensor;
export type Feeds = Record<string, ort.Tensor>;

const ORT_TYPE: Partial<Record<DType, ort.Tensor.Type>> = {
  float32: 'float32',
  float64: 'float64',
  int64: 'int64',
  int32: 'int32',
  int8: 'int8',
  uint8: 'uint8',
  bool: 'bool',
  float16: 'float16',
};

/** Wraps a typed array as an ort.Tensor without copying. */
export function toOrt(dtype: DType, data: TypedArray, dims: readonly number[]): ort.Tensor {
  const t = ORT_TYPE[dtype];
  if (!t) throw new Error(`dtype ${dtype} cannot be fed to ONNX Runtime`);
  return new ort.Tensor(t, data as never, dims);
}

/**
 * Whether ONNX Runtime's CUDA provider library is installed beside the binding: the CPU build lists
 * 'cuda' among its backends (not bundled) but lacks the library, and would fail deep in session creation.
 */
export function cudaAvailable(): boolean {
  if (!ort.listSupportedBackends().some((b) => b.name === 'cuda')) return false;
  const root = path.dirname(createRequire(import.meta.url).resolve('onnxruntime-node/package.json'));
  const bin = path.join(root, 'bin');
  if (!fs.existsSync(bin)) return false;
  return fs.readdirSync(bin).some((napi) => fs.existsSync(path.join(bin, napi, process.platform, process.arch, 'libonnxruntime_providers_cuda.so')));
}

/** The message for a provider that cannot run here, with what to do about it. */
function unavailable(ep: ExecutionProvider, detail: string): DeviceUnavailableError {
  if (ep === 'cuda') {
    return new DeviceUnavailableError(
      'execution provider "cuda" is not available: this onnxruntime-node build is CPU-only. ' +
        'Reinstall it with CUDA binaries (ONNXRUNTIME_NODE_INSTALL=cuda12 npm install onnxruntime-node), or use --device webgpu, which needs no install',
      'cuda',
    );
  }
  return new DeviceUnavailableError(
    `execution provider "webgpu" found no usable GPU adapter (${detail}). It needs a Vulkan driver for the GPU ` +
      '(libvulkan1 and the vendor\'s ICD); without a GPU, Debian\'s chromium package ships SwiftShader: ' +
      'VK_ICD_FILENAMES=/usr/lib/chromium/vk_swiftshader_icd.json. Run `prefzoo doctor` to check',
    'webgpu',
  );
}

/** ONNX Runtime's message for a failed WebGPU start, mapped to a UserError; other errors pass. */
export function explainRuntimeError(e: unknown, ep: ExecutionProvider | undefined): unknown {
  const msg = String((e as Error)?.message ?? e);
  if (ep === 'webgpu' && /WebGPU adapter|WebGpuContext|Dawn|Vulkan|webgpu_context/i.test(msg)) {
    const detail = /Failed to get a WebGPU adapter: ?([^\n]*)/.exec(msg)?.[1]?.trim() || msg.split('\n')[0].slice(0, 160);
    return unavailable('webgpu', detail);
  }
  return e;
}

export function sessionOptions(o: RuntimeOptions, outputs?: Record<string, OutputLocation>): ort.InferenceSession.SessionOptions {
  const ep = o.ep ?? 'cpu';
  if (!EXECUTION_PROVIDERS.includes(ep)) throw new UserError(`--device must be ${EXECUTION_PROVIDERS.join(', ')}; got "${ep}"`);
  if (ep === 'cuda' && !cudaAvailable()) throw unavailable('cuda', 'not installed');
  const opts: ort.InferenceSession.SessionOptions = {
    executionProviders: [ep],
    graphOptimizationLevel: o.optLevel ?? 'extended',
    logSeverityLevel: 3,
  };
  if (ep === 'webgpu') {
    // The transpose optimizer rewrites Shape(Transpose(x)) as a Gather over x's int64 shape, which
    // WebGPU has no kernel for (a CPU fallback per attention gradient); our graphs need none of its
    // layout changes.
    opts.extra = { ...opts.extra, optimization: { disable_specified_optimizers: 'TransposeOptimizer' } };
  }
  if (ep === 'webgpu' && outputs) {
    // Outputs that are fed back (parameters, optimizer state, gradients) stay in GPU buffers.
    (opts as { preferredOutputLocation?: Record<string, OutputLocation> }).preferredOutputLocation = outputs;
  }
  if (o.arena === false) opts.enableCpuMemArena = false;
  if (o.memPattern === false) opts.enableMemPattern = false;
  if (o.spin === false) {
    opts.extra = { ...opts.extra, session: { intra_op: { allow_spinning: '0' }, inter_op: { allow_spinning: '0' } } };
  } else if (o.spinStop) {
    opts.extra = { ...opts.extra, session: { force_spinning_stop: '1' } };
  }
  if (o.profilePrefix !== undefined) {
    opts.enableProfiling = true;
    opts.profileFilePrefix = o.profilePrefix;
  }
  const threads = o.threads ?? (ep === 'cpu' ? defaultCpuThreads() : undefined);
  if (threads !== undefined) {
    if (!Number.isInteger(threads) || threads < 1) throw new UserError(`--threads must be a positive integer, got ${threads}`);
    opts.intraOpNumThreads = threads;
    opts.interOpNumThreads = 1;
  }
  return opts;
}

/**
 * The CPU's intra-op threads when none are named: `PREFZOO_THREADS` if set (a positive integer; for a
 * machine shared by several processes, as the test suite's two workers share two cores), else one per
 * core this process may use.
 */
export function defaultCpuThreads(): number {
  const env = process.env.PREFZOO_THREADS;
  if (env === undefined || env === '') return os.availableParallelism();
  const n = Number(env);
  if (!Number.isInteger(n) || n < 1) throw new UserError(`PREFZOO_THREADS must be a positive integer, got "${env}"`, { setting: 'PREFZOO_THREADS' });
  return n;
}

/**
 * The nodes ONNX Runtime runs for graph `g` under `o` (its graph after the session's optimisations and
 * fusions, saved by the session and read back): on the CPU each is one kernel call per run. null
 * where the provider cannot save its optimised graph.
 */
export async function optimizedNodeCount(g: Graph, o: RuntimeOptions = {}): Promise<number | null> {
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'prefzoo-nodes-'));
  try {
    const file = path.join(dir, 'optimized.onnx');
    const opts = { ...sessionOptions(o), optimizedModelFilePath: file };
    if (o.ep === 'webgpu') lowerForWebGpu(g);
    const s = await ort.InferenceSession.create(serializeModel(g), opts).catch(() => null);
    if (!s) return null;
    await s.release();
    return fs.existsSync(file) ? loadModel(file).graph.nodes.length : null;
  } finally {
    fs.rmSync(dir, { recursive: true, force: true });
  }
}

/** A session plus names; `run` accepts pre-allocated outputs so a step can reuse its buffers. */
export class Session {
  /** Inputs the graph takes as int32 (lowered for WebGPU): int64 feeds are narrowed for them. */
  private readonly int32Inputs: Set<string>;

  private constructor(
    readonly inner: ort.InferenceSession,
    readonly ep: ExecutionProvider,
  ) {
    const meta = (inner as unknown as { inputMetadata?: { name: string; isTensor: boolean; type?: string }[] }).inputMetadata ?? [];
    this.int32Inputs = new Set(meta.filter((m) => m.isTensor && m.type === 'int32').map((m) => m.name));
  }

  /** `outputs`: per output, where it is left (webgpu only; default: host memory). */
  static async create(model: Uint8Array | string, o: RuntimeOptions = {}, outputs?: Record<string, OutputLocation>): Promise<Session> {
    const opts = sessionOptions(o, outputs);
    // The adapter is first looked for in a child process (once): Dawn's own warnings stay out of the terminal.
    if (o.ep === 'webgpu') await checkDevice(o);
    try {
      const s = typeof model === 'string' ? await ort.InferenceSession.create(model, opts) : await ort.InferenceSession.create(model, opts);
      return new Session(s, o.ep ?? 'cpu');
    } catch (e) {
      throw explainRuntimeError(e, o.ep);
    }
  }

  /** A session for a graph built in this process, lowered first when it runs on WebGPU (src/onnx/lower.ts). */
  static fromGraph(g: Graph, o: RuntimeOptions = {}, outputs?: Record<string, OutputLocation>): Promise<Session> {
    if (o.ep === 'webgpu') lowerForWebGpu(g);
    return Session.create(serializeModel(g), o, outputs);
  }

  get inputNames(): readonly string[] {
    return this.inner.inputNames;
  }

  get outputNames(): readonly string[] {
    return this.inner.outputNames;
  }

  /**
   * Runs the graph. `fetches` lists the outputs wanted (all by default) or maps names to
   * pre-allocated tensors that ONNX Runtime writes into.
   */
  async run(feeds: Feeds, fetches?: readonly string[] | Record<string, ort.Tensor | null>): Promise<Record<string, ort.Tensor>> {
    if (this.int32Inputs.size) feeds = narrowInt64(feeds, this.int32Inputs);
    if (fetches === undefined) return this.inner.run(feeds);
    return this.inner.run(feeds, fetches as never);
  }

  /** Stops profiling (sessions created with `profilePrefix`) and writes the trace file. */
  endProfiling(): void {
    this.inner.endProfiling();
  }

  async release(): Promise<void> {
    await this.inner.release();
  }
}

const webgpuChecks = new Map<string, Promise<void>>();

/**
 * Opens (and with `run`, runs on a one-element input `x`) the graph `g` on WebGPU in a child process:
 * Dawn prints its adapter search to the native stderr, which would bury the one line this check gives.
 */
async function probeWebGpu(g: Graph, run: boolean): Promise<string | null> {
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'prefzoo-probe-'));
  try {
    const file = path.join(dir, 'probe.onnx');
    fs.writeFileSync(file, serializeModel(g));
    const probe = fileURLToPath(new URL('./placement-probe.mjs', import.meta.url));
    const r = spawnSync(process.execPath, [probe, file, JSON.stringify(sessionOptions({ ep: 'webgpu' })), run ? 'run' : 'open'], { encoding: 'utf8' });
    const err = (r.stderr ?? '').split('\n').find((l) => l.startsWith('placement-probe-error: '));
    return err ? err.slice('placement-probe-error: '.length) : r.status !== 0 ? `exit ${r.status}` : null;
  } finally {
    fs.rmSync(dir, { recursive: true, force: true });
  }
}

/**
 * Fails early, with the one-line explanation, when the device cannot run here: no CUDA build, no
 * WebGPU adapter, or (`float16`) an adapter without 16-bit float shaders. Checked once per process.
 * A no-op for the CPU.
 */
export async function checkDevice(o: RuntimeOptions, need: { float16?: boolean } = {}): Promise<void> {
  const ep = o.ep ?? 'cpu';
  if (ep === 'cpu') return;
  if (ep === 'cuda') {
    sessionOptions(o);
    return;
  }
  const check = (key: string, make: () => Promise<void>) => {
    let p = webgpuChecks.get(key);
    if (!p) {
      p = make().catch((e) => {
        webgpuChecks.delete(key);
        throw e;
      });
      webgpuChecks.set(key, p);
    }
    return p;
  };
  await check('adapter', async () => {
    const g = new Graph('probe');
    g.output(g.identity(g.input('x', 'float32', [1])), 'y');
    const err = await probeWebGpu(g, false);
    if (err) throw explainRuntimeError(new Error(err), 'webgpu');
  });
  if (need.float16) {
    await check('float16', async () => {
      const g = new Graph('probe16');
      g.output(g.cast(g.cast(g.input('x', 'float32', [1]), 'float16'), 'float32'), 'y');
      const err = await probeWebGpu(g, true);
      if (err) {
        throw new DeviceUnavailableError(
          `this WebGPU adapter cannot run float16 shaders (it lacks the shader-f16 feature${/f16/.test(err) ? '' : `: ${err.slice(0, 120)}`}), which compute_dtype=float16 needs; use compute_dtype=float32`,
          'webgpu',
        );
      }
    });
  }
}

/** int64 host feeds of the inputs `int32` narrowed to int32 (ids, positions, indices: all < 2³¹). */
function narrowInt64(feeds: Feeds, int32: Set<string>): Feeds {
  let out: Feeds | null = null;
  for (const name of int32) {
    const t = feeds[name];
    if (!t || t.type !== 'int64' || t.location !== 'cpu') continue;
    out ??= { ...feeds };
    const src = t.data as BigInt64Array;
    const dst = new Int32Array(src.length);
    for (let i = 0; i < src.length; i++) dst[i] = Number(src[i]);
    out[name] = new ort.Tensor('int32', dst, t.dims);
  }
  return out ?? feeds;
}

export { ort };
