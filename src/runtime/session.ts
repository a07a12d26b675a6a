/**
 * ONNX Runtime sessions: execution provider, threads and optimisation level in one place, and
 * conversions between JS typed arrays and ort.Tensor.
 */
import ort from 'onnxruntime-node';
import { UserError } from '../cli/errors.ts';
import { existsSync } from 'node:fs';
import { createRequire } from 'node:module';
import { dirname, join } from 'node:path';
import type { DType, TypedArray } from '../onnx/dtype.ts';

export type ExecutionProvider = 'cpu' | 'cuda';
export type OptLevel = 'disabled' | 'basic' | 'extended' | 'all';

export interface RuntimeOptions {
  /** Execution provider; 'cuda' needs the CUDA build of onnxruntime-node. */
  ep?: ExecutionProvider;
  /** Intra-op threads (default: ONNX Runtime's choice, one per core). */
  threads?: number;
  /** Graph optimisation level (default 'extended': measured faster than 'all' for training graphs). */
  optLevel?: OptLevel;
  /**
   * Let idle intra-op threads spin (ONNX Runtime's default, true): faster hand-offs on an idle machine,
   * cycles taken from other processes (and from this session's own busy threads) on a loaded one.
   */
  spin?: boolean;
  /** ONNX Runtime's CPU memory arena (default true): reuses freed activation memory across runs. */
  arena?: boolean;
  /** Write ONNX Runtime's per-node profile (Chrome trace JSON) to `<prefix>_<date>.json`; see `Session.endProfiling`. */
  profilePrefix?: string;
}

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
 * Whether CUDA can start: the binding lists it, and its provider libraries were installed beside it
 * (the default install skips them; without them ONNX Runtime logs its own error before failing).
 */
export function cudaAvailable(): boolean {
  if (!ort.listSupportedBackends().some((b) => b.name === 'cuda')) return false;
  const binding = createRequire(import.meta.url).resolve('onnxruntime-node');
  const binDir = join(dirname(binding), '..', 'bin', 'napi-v6', process.platform, process.arch);
  return !existsSync(binDir) || existsSync(join(binDir, process.platform === 'win32' ? 'onnxruntime_providers_cuda.dll' : 'libonnxruntime_providers_cuda.so'));
}

function sessionOptions(o: RuntimeOptions): ort.InferenceSession.SessionOptions {
  const ep = o.ep ?? 'cpu';
  if (ep === 'cuda' && !cudaAvailable()) {
    throw new UserError(
      'execution provider "cuda" is not available: this onnxruntime-node install has no CUDA libraries. ' +
        'Reinstall it with CUDA binaries: ONNXRUNTIME_NODE_INSTALL=cuda12 npm install onnxruntime-node',
    );
  }
  if (ep !== 'cpu' && ep !== 'cuda') throw new UserError(`--device must be cpu or cuda, got "${ep}"`);
  const opts: ort.InferenceSession.SessionOptions = {
    executionProviders: [ep],
    graphOptimizationLevel: o.optLevel ?? 'extended',
    logSeverityLevel: 3,
  };
  if (o.arena === false) opts.enableCpuMemArena = false;
  if (o.spin === false) {
    opts.extra = { session: { intra_op: { allow_spinning: '0' }, inter_op: { allow_spinning: '0' } } };
  }
  if (o.profilePrefix !== undefined) {
    opts.enableProfiling = true;
    opts.profileFilePrefix = o.profilePrefix;
  }
  if (o.threads !== undefined) {
    if (!Number.isInteger(o.threads) || o.threads < 1) throw new UserError(`--threads must be a positive integer, got ${o.threads}`);
    opts.intraOpNumThreads = o.threads;
    opts.interOpNumThreads = 1;
  }
  return opts;
}

/** A session plus names; `run` accepts pre-allocated outputs so a step can reuse its buffers. */
export class Session {
  private constructor(readonly inner: ort.InferenceSession) {}

  static async create(model: Uint8Array | string, o: RuntimeOptions = {}): Promise<Session> {
    const opts = sessionOptions(o);
    try {
      const s = typeof model === 'string' ? await ort.InferenceSession.create(model, opts) : await ort.InferenceSession.create(model, opts);
      return new Session(s);
    } catch (e) {
      // The binding lists CUDA, but its libraries (or a GPU) are missing: the user's setup, one line.
      const ep = o.ep ?? 'cpu';
      if (ep !== 'cpu' && /shared library|cuda|provider/i.test(String((e as Error)?.message))) {
        throw new UserError(
          `execution provider "${ep}" could not start (${String((e as Error).message).split('\n')[0]}); ` +
            'use device=cpu, or install the CUDA build: ONNXRUNTIME_NODE_INSTALL=cuda12 npm install onnxruntime-node',
        );
      }
      throw e;
    }
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

export { ort };
