/**
 * Block quantization of float32 weights into the packed layout of ONNX Runtime's `MatMulNBits`
 * (com.microsoft), and the node that reads it. A weight `W` `[N, K]` (HF's nn.Linear `[out, in]`,
 * the `B` of y = x·Wᵀ) is cut along each row into blocks of `block` values (the last one padded); a
 * block holds one float32 scale d and its values as unsigned integers q, read back as (q − z)·d with
 * the default zero point z = 2^(bits−1) (8 at 4 bits, 128 at 8), which MatMulNBits assumes when no
 * zero points are fed:
 *
 *   q8: d = max|x|/127, q = 128 + round(x/d) (halves away from zero): ggml's Q8_0 rule, symmetric.
 *   q4: d = m/−8 for m the block's first value of largest magnitude (sign kept), q = min(15, ⌊x/d + 8.5⌋):
 *       ggml's Q4_0 rule, so m itself is q = 0 and the 16 levels reach −8·d on m's side.
 *
 * At a block of 32 these are the rules of the GGUF export's Q8_0 / Q4_0 (src/export/gguf-file.ts),
 * there with an f16 scale. `packed` is `[N, blocks, block·bits/8]` bytes: at 8 bits one byte a value,
 * at 4 bits value 2j in the low nibble of byte j of the block and value 2j + 1 in its high nibble.
 * Padding values are the zero point (they read as 0).
 */
import { attr, type Graph, type Tensor } from '../onnx/graph.ts';
import { UserError } from '../errors.ts';

export type QuantBits = 4 | 8;

export interface QuantizedWeight {
  N: number;
  K: number;
  bits: QuantBits;
  block: number;
  /** `[N, blocks, block·bits/8]` */
  packed: Uint8Array;
  /** `[N · blocks]`, row-major over (n, block) */
  scales: Float32Array;
  packedShape: [number, number, number];
}

/** Blocks per row of a `K`-wide weight. */
export function blocksPerRow(K: number, block: number): number {
  return Math.ceil(K / block);
}

/** The packed and scale buffers of an `[N, K]` weight (filled by {@link quantizeInto}). */
export function allocQuantized(N: number, K: number, bits: QuantBits, block: number): QuantizedWeight {
  const nb = blocksPerRow(K, block);
  const blob = (block * bits) / 8;
  return { N, K, bits, block, packed: new Uint8Array(N * nb * blob), scales: new Float32Array(N * nb), packedShape: [N, nb, blob] };
}

/**
 * Quantizes `W` `[N, K]` (row-major float32; with `transposed`, `W` is `[K, N]` and its transpose is
 * quantized, read in place) into `q`'s buffers (allocated for that shape). Allocates nothing: a
 * weight update refills the same buffers (fresh memory is slow to touch, see docs/performance.md).
 */
export function quantizeInto(W: Float32Array, q: QuantizedWeight, transposed = false): void {
  const { N, K, bits, block, packed, scales } = q;
  if (W.length !== N * K) throw new Error(`quantize: ${W.length} values are not [${N}, ${K}]`);
  const nb = blocksPerRow(K, block);
  const blob = (block * bits) / 8;
  // Value i of row n is W[n·rowStep + i·colStep].
  const rowStep = transposed ? 1 : K;
  const colStep = transposed ? N : 1;
  const f = Math.fround;
  for (let n = 0; n < N; n++) {
    for (let b = 0; b < nb; b++) {
      const at = n * rowStep + b * block * colStep;
      const len = Math.min(block, K - b * block);
      const o = (n * nb + b) * blob;
      let amax = 0;
      let m = 0;
      for (let i = 0, p = at; i < len; i++, p += colStep) {
        const v = W[p];
        const a = Math.abs(v);
        if (a > amax) {
          amax = a;
          m = v;
        }
      }
      if (bits === 8) {
        const d = f(amax / 127);
        scales[n * nb + b] = d;
        const inv = d === 0 ? 0 : 1 / d;
        for (let i = 0, p = at; i < len; i++, p += colStep) {
          const x = W[p] * inv;
          packed[o + i] = 128 + Math.sign(x) * Math.round(Math.abs(x));
        }
        if (len < block) packed.fill(128, o + len, o + block);
      } else {
        // In ggml's float32 arithmetic (as the GGUF export), so the quants are Q4_0's: the product of
        // two float32 values is exact in a double, so fround gives float32's rounding of it.
        const d = f(m / -8);
        scales[n * nb + b] = d;
        const inv = d === 0 ? 0 : f(1 / d);
        const pairs = len >> 1;
        let p = at;
        for (let j = 0; j < pairs; j++, p += 2 * colStep) {
          const lo = Math.floor(f(f(W[p] * inv) + 8.5));
          const hi = Math.floor(f(f(W[p + colStep] * inv) + 8.5));
          packed[o + j] = (lo > 15 ? 15 : lo) | ((hi > 15 ? 15 : hi) << 4);
        }
        if (pairs < blob) {
          // A short last block: an odd value out, then the zero point (8) in every padded nibble.
          let j = pairs;
          if (len & 1) {
            const lo = Math.floor(f(f(W[p] * inv) + 8.5));
            packed[o + j++] = (lo > 15 ? 15 : lo) | (8 << 4);
          }
          packed.fill(8 | (8 << 4), o + j, o + blob);
        }
      }
    }
  }
}

/** `W` `[N, K]` (or, `transposed`, `W` `[K, N]` whose transpose is the weight) quantized into new buffers. */
export function quantizeBlocks(W: Float32Array, N: number, K: number, bits: QuantBits, block: number, transposed = false): QuantizedWeight {
  const q = allocQuantized(N, K, bits, block);
  quantizeInto(W, q, transposed);
  return q;
}

/** The weight `[N, K]` a quantized one stands for: each value (q − z)·d, in float32 (exact: |q − z| ≤ 128). */
export function dequantizeBlocks(q: QuantizedWeight): Float32Array {
  const { N, K, bits, block, packed, scales } = q;
  const nb = blocksPerRow(K, block);
  const blob = (block * bits) / 8;
  const z = 2 ** (bits - 1);
  const out = new Float32Array(N * K);
  for (let n = 0; n < N; n++) {
    for (let k = 0; k < K; k++) {
      const b = Math.floor(k / block);
      const i = k - b * block;
      const byte = packed[(n * nb + b) * blob + (bits === 8 ? i : i >> 1)];
      const v = bits === 8 ? byte : i & 1 ? byte >> 4 : byte & 15;
      out[n * K + k] = (v - z) * scales[n * nb + b];
    }
  }
  return out;
}

export interface NBitsOptions {
  N: number;
  K: number;
  bits: QuantBits;
  block: number;
  /**
   * MatMulNBits' `accuracy_level`: 0 (the default) multiplies in float32 by the dequantized weight;
   * 4 quantizes the activations to int8 per block too and multiplies in integers (faster, less exact).
   */
  accuracy?: number;
}

/** y = x·Ŵᵀ `[…, N]` for `x` `[…, K]` and Ŵ the weight `packed`/`scales` stand for (a `MatMulNBits` node). */
export function matmulNBits(g: Graph, x: Tensor, w: { packed: Tensor; scales: Tensor }, o: NBitsOptions): Tensor {
  const shape = x.shape ? [...x.shape.slice(0, -1), o.N] : null;
  const attrs = { K: attr.int(o.K), N: attr.int(o.N), bits: attr.int(o.bits), block_size: attr.int(o.block), accuracy_level: attr.int(o.accuracy ?? 0) };
  return g.op('MatMulNBits', [x, w.packed, w.scales], attrs, [{ dtype: 'float32', shape }], undefined, 'com.microsoft')[0];
}

/** How a decode graph's products read quantized weights (see {@link quantizeProducts}). */
export interface ProductQuant {
  bits: QuantBits;
  block: number;
  /** MatMulNBits' `accuracy_level` (default 4: int8 activations, the CPU's fast prepacked kernel at both widths). */
  accuracy?: number;
}

/**
 * Rewrites every product `Gemm(x, W)` of `g` whose W is a fed weight that `quantized` answers for as
 * a `MatMulNBits` over that weight's quantized blocks, baked in as initializers (`<W>.q`,
 * `<W>.scales`): the CPU provider prepacks those when the session is made, where a fed quantized
 * weight takes a slow unpacked path (scripts/bench/matmul-nbits.ts). W is `[N, K]` under `transB`
 * (nn.Linear) or `[K, N]` without (GPT-2's Conv1D; `quantized` is then asked for its transpose). A
 * Gemm's C (the bias) is added after. Fed weights no node reads any more leave the graph's inputs (a
 * tied embedding stays: its Gather still reads the float32 table). Returns the names quantized.
 */
export function quantizeProducts(g: Graph, o: ProductQuant, quantized: (name: string, transposed: boolean) => QuantizedWeight | null): string[] {
  return rewriteFedProducts(g, quantized, (x, w, q) => {
    const packed = g.values.has(`${w}.q`) ? g.tensor(`${w}.q`) : g.initializer(`${w}.q`, { dtype: 'uint8', dims: q.packedShape, data: q.packed });
    const scales = g.values.has(`${w}.scales`) ? g.tensor(`${w}.scales`) : g.initializer(`${w}.scales`, { dtype: 'float32', dims: [q.scales.length], data: q.scales });
    return matmulNBits(g, x, { packed, scales }, { N: q.N, K: q.K, bits: o.bits, block: o.block, accuracy: o.accuracy ?? 4 });
  });
}

/**
 * The rewrite both quantized product forms share (MatMulNBits here, the W8A8 integer GEMM in
 * quantize-int8.ts): every plain `Gemm(x, W[, C])` of `g` (no transA, alpha or beta) whose W is a fed
 * 2-D weight that `quantized` answers for (asked for W's transpose when the Gemm has no transB: GPT-2's
 * Conv1D `[K, N]`) becomes `emit(x, W's name, its quantized form)`, C added after, the last node
 * written producing the Gemm's output under its name. Fed weights no node reads any more leave the
 * graph's inputs (a tied embedding stays: its Gather still reads the float32 table). Returns the names
 * rewritten.
 */
export function rewriteFedProducts<Q>(g: Graph, quantized: (name: string, transposed: boolean) => Q | null, emit: (x: Tensor, w: string, q: Q) => Tensor): string[] {
  const fed = new Map(g.inputs.map((i) => [i.name, i]));
  const done = new Set<string>();
  const nodes = [...g.nodes];
  g.nodes.length = 0;
  for (const node of nodes) {
    const [x, w, c] = node.inputs;
    const transB = node.attrs.transB?.kind === 'int' && node.attrs.transB.value === 1;
    const plain = node.op === 'Gemm' && node.domain === '' && !node.attrs.transA?.value && node.attrs.alpha === undefined && node.attrs.beta === undefined;
    const q = plain && fed.get(w)?.shape?.length === 2 ? quantized(w, !transB) : null;
    if (!q) {
      g.nodes.push(node);
      continue;
    }
    const y = emit(g.tensor(x), w, q);
    const out = c ? g.add(y, g.tensor(c)) : y;
    const last = g.nodes[g.nodes.length - 1];
    last.outputs = [node.outputs[0]];
    g.producer.set(node.outputs[0], last);
    g.values.delete(out.name);
    done.add(w);
  }
  const read = new Set(g.nodes.flatMap((n) => n.inputs));
  const outputs = new Set(g.outputs.map((v) => v.name));
  for (let i = g.inputs.length - 1; i >= 0; i--) if (!read.has(g.inputs[i].name) && !outputs.has(g.inputs[i].name) && done.has(g.inputs[i].name)) g.inputs.splice(i, 1);
  return [...done];
}

/** The precisions generation takes: f32, f16 (refused on the CPU), q8, q4. */
export const GENERATION_DTYPES = ['f32', 'f16', 'q8', 'q4'] as const;

/**
 * The products of generation graphs in `dtype` with blocks of `block` on device `ep`: null for f32,
 * q8/q4's blocks; f16 (ONNX Runtime's CPU provider has no fast float16 product), a block that is no
 * power of two in 16–256, and a device other than the CPU (MatMulNBits prepacks on the CPU provider
 * only) refused in one line naming `names`' setting.
 */
export function productQuant(dtype: string, block: number, ep: string, names: { dtype: string; block: string }): ProductQuant | null {
  if (!(GENERATION_DTYPES as readonly string[]).includes(dtype)) throw new UserError(`${names.dtype}: "${dtype}" is not one of ${GENERATION_DTYPES.join(', ')}`, { setting: names.dtype });
  if (dtype === 'f32') return null;
  if (dtype === 'f16') throw new UserError(`${names.dtype}=f16: ONNX Runtime's CPU provider has no fast float16 product; use q8 or q4, or f32`, { setting: names.dtype });
  if (!Number.isInteger(block) || block < 16 || block > 256 || (block & (block - 1)) !== 0) throw new UserError(`${names.block}=${block}: MatMulNBits takes a power of two from 16 to 256`, { setting: names.block });
  if (ep !== 'cpu') throw new UserError(`${names.dtype}=${dtype}: the quantized products (MatMulNBits) run prepacked on the CPU provider only; on ${ep} use f32`, { setting: names.dtype });
  return { bits: dtype === 'q8' ? 8 : 4, block };
}
