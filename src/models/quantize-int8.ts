/**
 * W8A8 products on ONNX Runtime's integer GEMM (MLAS's u8×s8 QGemm): a weight quantized once to int8
 * per output channel (symmetric: s_n = max_k |W[n,k]|/127, q = round(W/s_n), halves away from zero),
 * stored `[K, N]` as the integer products read it, and the activations quantized to 8 bits at run time
 * **per token** (per row of the product: s_m = max_k |x[m,k]|/127, u = 128 + round(x·127/max), halves to
 * even, as ONNX's QuantizeLinear rounds), so
 *
 *   y[m, n] = s_m · s_n · Σ_k (u[m,k] − 128) · q[k,n]
 *
 * with the integer sum exact in int32. `MatMulIntegerToFloat` (com.microsoft) takes a per-tensor
 * activation scale only, so it runs with a_scale = 1 and the weight's column scales, and the row
 * scales multiply its float32 output after. Per-tensor activations (`DynamicQuantizeMatMul`: one
 * scale for the whole [M, K] input) are kept for comparison (`act: 'tensor'`); real models' activations
 * have outlier tokens, which a per-tensor scale lets flatten every other row (docs/distill.md).
 */
import type { Graph, Tensor } from '../onnx/graph.ts';
import { readFileSync } from 'node:fs';
import { rewriteFedProducts } from './quantize.ts';

let vnni: boolean | undefined;

/**
 * Whether this machine is known to multiply uint8 × int8 without saturating: an x86-64 CPU whose
 * /proc/cpuinfo flags name VNNI (avx512_vnni, avx_vnni) or AMX-INT8, where ONNX Runtime's u8×s8
 * kernels add four products straight into 32 bits. Without VNNI they add pairs of products in 16
 * bits first (vpmaddubsw), which saturates for activations near 255 against weights near ±127 (why
 * ONNX Runtime's own quantizer offers 7-bit weights, reduce_range, for such CPUs). Other machines
 * (arm64, or x86-64 where no flags can be read) answer false: not known, so not assumed.
 */
export function int8ExactHere(): boolean {
  if (vnni === undefined) {
    let flags = '';
    try {
      if (process.arch === 'x64' && process.platform === 'linux') flags = readFileSync('/proc/cpuinfo', 'utf8').match(/^flags\s*:(.*)$/m)?.[1] ?? '';
    } catch {
      flags = '';
    }
    vnni = /\b(avx512_vnni|avx_vnni|amx_int8)\b/.test(flags);
  }
  return vnni;
}

/** An `[N, K]` weight as int8 `[K, N]` (row-major) with one float32 scale per output column n. */
export interface Int8Weight {
  N: number;
  K: number;
  /** `[K, N]` */
  q: Int8Array;
  /** `[N]` */
  scales: Float32Array;
}

/**
 * `W` `[N, K]` (nn.Linear's `[out, in]`; with `transposed`, `W` is `[K, N]`, GPT-2's Conv1D, read in
 * place) quantized per output channel n: s_n = max|W[n,·]|/127 in float32, q = round(W/s_n) with
 * halves away from zero (|q| ≤ 127; a zero channel has s_n = 0 and q = 0).
 */
export function quantizeInt8Columns(W: Float32Array, N: number, K: number, transposed = false): Int8Weight {
  if (W.length !== N * K) throw new Error(`quantizeInt8Columns: ${W.length} values are not [${N}, ${K}]`);
  // Value k of channel n is W[n·rowStep + k·colStep].
  const rowStep = transposed ? 1 : K;
  const colStep = transposed ? N : 1;
  const q = new Int8Array(K * N);
  const scales = new Float32Array(N);
  for (let n = 0; n < N; n++) {
    let amax = 0;
    for (let k = 0, p = n * rowStep; k < K; k++, p += colStep) amax = Math.max(amax, Math.abs(W[p]));
    const s = Math.fround(amax / 127);
    scales[n] = s;
    const inv = s === 0 ? 0 : 1 / s;
    for (let k = 0, p = n * rowStep; k < K; k++, p += colStep) {
      const v = W[p] * inv;
      q[k * N + n] = Math.max(-127, Math.min(127, Math.sign(v) * Math.round(Math.abs(v))));
    }
  }
  return { N, K, q, scales };
}

/** How the activations are quantized: per row of the product (per token), or one scale for the whole input. */
export type ActivationQuant = 'token' | 'tensor';

export interface Int8Product {
  /** `[M, N]` float32. */
  y: Tensor;
  /** Per token: the uint8 activations `[M, K]` (zero point 128) and their row scales `[M, 1]`, for a caller to check the product against. */
  u?: Tensor;
  rowScale?: Tensor;
}

/**
 * y = x·Wᵀ `[M, N]` for a 2-D `x` `[M, K]` and W the int8 weight `w` stands for (`q` `[K, N]` int8, `scales`
 * `[N]`), the activations quantized per token (`act: 'token'`, the default) or per tensor.
 */
export function matmulInt8(g: Graph, x: Tensor, w: { q: Tensor; scales: Tensor }, o: { N: number; act?: ActivationQuant }): Int8Product {
  const M = x.shape?.[0] ?? 'M';
  const out = [{ dtype: 'float32' as const, shape: [M, o.N] }];
  if (o.act === 'tensor') return { y: g.op('DynamicQuantizeMatMul', [x, w.q, w.scales], {}, out, undefined, 'com.microsoft')[0] };
  // max|x| per row, kept ≥ 1e-30 so an all-zero row (padding) reads 0 and not NaN.
  const amax = g.max(g.reduceMax(g.abs(x), [1], true), 1e-30); // [M, 1]
  const u = g.op('QuantizeLinear', [g.mul(x, g.div(127, amax)), g.scalar(1), g.constant(128, 'uint8')], {}, [{ dtype: 'uint8', shape: x.shape }])[0];
  const rowScale = g.div(amax, 127);
  const z = g.op('MatMulIntegerToFloat', [u, w.q, g.scalar(1), w.scales, g.constant(128, 'uint8')], {}, out, undefined, 'com.microsoft')[0];
  return { y: g.mul(z, rowScale), u, rowScale };
}

/**
 * The same product as {@link matmulInt8}'s per-token one through ONNX's `MatMulInteger` (int32 out),
 * a Cast and the two scales multiplied after: the form without com.microsoft's fused output
 * scaling, kept for scripts/bench/teacher-int8-ops.ts's comparison.
 */
export function matmulInt8Unfused(g: Graph, x: Tensor, w: { q: Tensor; scales: Tensor }, o: { N: number }): Tensor {
  const M = x.shape?.[0] ?? 'M';
  const amax = g.max(g.reduceMax(g.abs(x), [1], true), 1e-30);
  const u = g.op('QuantizeLinear', [g.mul(x, g.div(127, amax)), g.scalar(1), g.constant(128, 'uint8')], {}, [{ dtype: 'uint8', shape: x.shape }])[0];
  const acc = g.op('MatMulInteger', [u, w.q, g.constant(128, 'uint8')], {}, [{ dtype: 'int32', shape: [M, o.N] }])[0];
  return g.mul(g.mul(g.cast(acc, 'float32'), w.scales), g.div(amax, 127));
}

/** The graph's initializers of an int8 weight, named `<name>.q8c` and `<name>.scales8c` (shared if present). */
export function int8Initializers(g: Graph, name: string, w: Int8Weight): { q: Tensor; scales: Tensor } {
  const q = g.values.has(`${name}.q8c`) ? g.tensor(`${name}.q8c`) : g.initializer(`${name}.q8c`, { dtype: 'int8', dims: [w.K, w.N], data: w.q });
  const scales = g.values.has(`${name}.scales8c`) ? g.tensor(`${name}.scales8c`) : g.initializer(`${name}.scales8c`, { dtype: 'float32', dims: [w.N], data: w.scales });
  return { q, scales };
}

/**
 * Rewrites every plain `Gemm(x, W[, C])` of `g` whose W is a fed 2-D weight that `quantized` answers for
 * as {@link matmulInt8} over that weight's int8 columns, baked in as initializers (W is `[N, K]` under
 * `transB`, nn.Linear, or `[K, N]` without, GPT-2's Conv1D: `quantized` is then asked for its transpose);
 * C (the bias) is added after. Fed weights no node reads any more leave the graph's inputs (a tied
 * embedding stays: its Gather still reads the float32 table). Returns the names quantized.
 */
export function int8Products(g: Graph, act: ActivationQuant, quantized: (name: string, transposed: boolean) => Int8Weight | null): string[] {
  return rewriteFedProducts(g, quantized, (x, w, q) => matmulInt8(g, x, int8Initializers(g, w, q), { N: q.N, act }).y);
}
