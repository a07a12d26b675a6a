/**
 * The GGUF container, version 3 (llama.cpp's gguf.h / gguf-py): a little-endian header
 *
 *   "GGUF" · u32 version 3 · u64 tensor count · u64 metadata count
 *   metadata: key (u64 length + UTF-8) · u32 value type · value (strings as u64 length + bytes;
 *             arrays as u32 element type · u64 count · elements)
 *   tensor infos: name · u32 n_dims · u64 ne[0..n) (ne[0] the fastest-varying axis, so the reverse of
 *             a row-major shape) · u32 ggml type · u64 offset in the data section
 *
 * then zero padding to `general.alignment` (32), then the tensor data, each tensor starting at a
 * multiple of the alignment. Tensor types written here: F32, F16, three block types whose blocks
 * hold 32 consecutive values of a row behind an f16 scale d:
 *   Q8_0: d = max|x|/127, then 32 int8 q = round(x/d); 34 bytes a block.
 *   Q4_0: d = m/−8 for m the block's value of largest magnitude (sign kept), then 16 bytes of 4-bit
 *         q = min(15, ⌊x/d + 8.5⌋) holding x ≈ (q − 8)·d: byte j's low nibble is value j, its high
 *         nibble value 16 + j; 18 bytes a block.
 *   Q5_0: d = m/−16, q = min(31, ⌊x/d + 16.5⌋) holding x ≈ (q − 16)·d: a little-endian u32 of the
 *         32 fifth bits (bit j for value j), then the low nibbles as Q4_0's; 22 bytes a block.
 * and the K-quants Q4_K and Q6_K over super-blocks of 256 (gguf-kquant.ts).
 */
import type { GgufValue } from '../models/family.ts';
import { f16BitsToFloat, float32ToF16, floatToF16Bits } from '../models/safetensors.ts';
import { QK_K, Q4_K_BYTES, Q6_K_BYTES, dequantizeQ4_K, dequantizeQ6_K, quantizeQ4_K, quantizeQ6_K } from './gguf-kquant.ts';

export const GGUF_VERSION = 3;
export const GGUF_ALIGNMENT = 32;

/** Metadata value types (gguf.h `gguf_type`). */
export const GT = { u8: 0, i8: 1, u16: 2, i16: 3, u32: 4, i32: 5, f32: 6, bool: 7, string: 8, array: 9, u64: 10, i64: 11, f64: 12 } as const;

/** Tensor element types (ggml.h `ggml_type`) this writer produces. */
export const GGML_TYPE = { F32: 0, F16: 1, Q4_0: 2, Q5_0: 6, Q8_0: 8, Q4_K: 12, Q6_K: 14 } as const;
export type GgmlType = keyof typeof GGML_TYPE;
export type BlockType = Exclude<GgmlType, 'F32' | 'F16'>;

/** Values per block of Q4_0, Q5_0 and Q8_0: a row of a matrix in these types is whole blocks. */
export const QUANT_BLOCK = 32;
/** Values per block of each block type (a row in that type is whole blocks of it). */
export const BLOCK_VALUES: Record<BlockType, number> = { Q4_0: QUANT_BLOCK, Q5_0: QUANT_BLOCK, Q8_0: QUANT_BLOCK, Q4_K: QK_K, Q6_K: QK_K };
/** Bytes per block: the f16 scale, then the block's quants (and Q5_0's fifth bits; the K-quants' scales). */
export const BLOCK_BYTES: Record<BlockType, number> = { Q4_0: 2 + QUANT_BLOCK / 2, Q5_0: 6 + QUANT_BLOCK / 2, Q8_0: 2 + QUANT_BLOCK, Q4_K: Q4_K_BYTES, Q6_K: Q6_K_BYTES };

export interface GgufTensor {
  name: string;
  /** Row-major shape as HF stores it (`[out, in]`); written reversed as ggml's ne. */
  shape: number[];
  type: GgmlType;
  data: Float32Array;
}

/** Bytes of a tensor of `n` values in `type` (a block type needs rows that are whole blocks). */
export function tensorBytes(type: GgmlType, n: number): number {
  if (type === 'F32') return 4 * n;
  if (type === 'F16') return 2 * n;
  return (n / BLOCK_VALUES[type]) * BLOCK_BYTES[type];
}

/** The number of blocks in `data`, or a one-line refusal when it is not whole blocks. */
function wholeBlocks(type: 'Q4_0' | 'Q5_0' | 'Q8_0', data: Float32Array): number {
  if (data.length % QUANT_BLOCK !== 0) throw new Error(`${type}: ${data.length} values are not whole blocks of ${QUANT_BLOCK}`);
  return data.length / QUANT_BLOCK;
}

/** Q8_0 blocks of `data` (its length a multiple of 32; blocks run along rows). */
export function quantizeQ8_0(data: Float32Array): Uint8Array {
  const blocks = wholeBlocks('Q8_0', data);
  const out = new Uint8Array(blocks * BLOCK_BYTES.Q8_0);
  const view = new DataView(out.buffer);
  const scale = new Float32Array(1);
  for (let b = 0; b < blocks; b++) {
    const at = b * QUANT_BLOCK;
    let amax = 0;
    for (let i = 0; i < QUANT_BLOCK; i++) amax = Math.max(amax, Math.abs(data[at + i]));
    const d = amax / 127;
    scale[0] = d;
    const o = b * BLOCK_BYTES.Q8_0;
    view.setUint16(o, float32ToF16(scale)[0], true);
    const inv = d === 0 ? 0 : 1 / d;
    // round half away from zero, as llama.cpp's reference quantizer (roundf) does
    for (let i = 0; i < QUANT_BLOCK; i++) {
      const x = data[at + i] * inv;
      view.setInt8(o + 2 + i, Math.sign(x) * Math.round(Math.abs(x)));
    }
  }
  return out;
}

/**
 * Q4_0 blocks of `data` (its length a multiple of 32; blocks run along rows), by ggml's reference
 * rule and in its float32 arithmetic, so that the bytes are those llama.cpp's quantizer writes: m is
 * the first value of largest magnitude in the block, d = m/−8 (stored as f16; an all-zero block has
 * d = −0 and every q 8), and q = min(15, ⌊x·(1/d) + 8.5⌋): nearest, halves rounded up, the value m
 * itself at q = 0 and values of m's opposite sign beyond 7.5·|d| clipped to q = 15.
 */
export function quantizeQ4_0(data: Float32Array): Uint8Array {
  return quantizeSymmetric('Q4_0', data);
}

/**
 * Q5_0 blocks of `data` by ggml's reference rule, Q4_0's with 5 bits: d = m/−16 and
 * q = min(31, ⌊x·(1/d) + 16.5⌋), the fifth bits gathered into a u32 after d.
 */
export function quantizeQ5_0(data: Float32Array): Uint8Array {
  return quantizeSymmetric('Q5_0', data);
}

/** Q4_0 or Q5_0: d = m/−2^(bits−1) for m the block's first value of largest magnitude. */
function quantizeSymmetric(type: 'Q4_0' | 'Q5_0', data: Float32Array): Uint8Array {
  const blocks = wholeBlocks(type, data);
  const f = Math.fround;
  const half = QUANT_BLOCK / 2;
  const zero = type === 'Q4_0' ? 8 : 16;
  const top = 2 * zero - 1;
  const nibbles = type === 'Q4_0' ? 2 : 6;
  const out = new Uint8Array(blocks * BLOCK_BYTES[type]);
  const view = new DataView(out.buffer);
  for (let b = 0; b < blocks; b++) {
    const at = b * QUANT_BLOCK;
    let amax = 0;
    let m = 0;
    for (let i = 0; i < QUANT_BLOCK; i++) {
      const a = Math.abs(data[at + i]);
      if (a > amax) {
        amax = a;
        m = data[at + i];
      }
    }
    const d = f(m / -zero);
    const inv = d === 0 ? 0 : f(1 / d);
    const o = b * BLOCK_BYTES[type];
    view.setUint16(o, floatToF16Bits(d), true);
    const offset = zero + 0.5;
    const q = (x: number): number => Math.min(top, Math.floor(f(f(x * inv) + offset)));
    let high = 0;
    for (let j = 0; j < half; j++) {
      const lo = q(data[at + j]);
      const hi = q(data[at + half + j]);
      out[o + nibbles + j] = (lo & 15) | ((hi & 15) << 4);
      high |= ((lo >> 4) << j) | ((hi >> 4) << (j + half));
    }
    if (type === 'Q5_0') view.setUint32(o + 2, high >>> 0, true);
  }
  return out;
}

/** Q4_0 or Q5_0 blocks decoded as ggml does: (q − 2^(bits−1))·d, exact in float32. */
function dequantizeSymmetric(type: 'Q4_0' | 'Q5_0', bytes: Uint8Array, n: number): Float32Array {
  const out = new Float32Array(n);
  const view = new DataView(bytes.buffer, bytes.byteOffset, bytes.byteLength);
  const half = QUANT_BLOCK / 2;
  const q5 = type === 'Q5_0';
  for (let b = 0; b < n / QUANT_BLOCK; b++) {
    const o = b * BLOCK_BYTES[type];
    const d = f16BitsToFloat(view.getUint16(o, true));
    const high = q5 ? view.getUint32(o + 2, true) : 0;
    const qs = o + (q5 ? 6 : 2);
    for (let j = 0; j < half; j++) {
      const lo = (bytes[qs + j] & 15) | (((high >>> j) & 1) << 4);
      const hi = (bytes[qs + j] >> 4) | (((high >>> (j + half)) & 1) << 4);
      out[b * QUANT_BLOCK + j] = (lo - (q5 ? 16 : 8)) * d;
      out[b * QUANT_BLOCK + half + j] = (hi - (q5 ? 16 : 8)) * d;
    }
  }
  return out;
}

const QUANTIZE: Record<BlockType, (data: Float32Array) => Uint8Array> = { Q4_0: quantizeQ4_0, Q5_0: quantizeQ5_0, Q8_0: quantizeQ8_0, Q4_K: quantizeQ4_K, Q6_K: quantizeQ6_K };

/** A tensor's data section bytes in its type. */
export function encodeTensor(t: GgufTensor): Uint8Array {
  if (t.type === 'F32') return new Uint8Array(t.data.buffer, t.data.byteOffset, t.data.byteLength);
  if (t.type === 'F16') {
    const h = float32ToF16(t.data);
    return new Uint8Array(h.buffer, h.byteOffset, h.byteLength);
  }
  return QUANTIZE[t.type](t.data);
}

/**
 * `n` values of a tensor's data in `type`, decoded to float32 as ggml's `to_float` does: what
 * llama.cpp reads back from the file (the quantization round trip of encodeTensor).
 */
export function decodeTensor(type: GgmlType, bytes: Uint8Array, n: number): Float32Array {
  const view = new DataView(bytes.buffer, bytes.byteOffset, bytes.byteLength);
  switch (type) {
    case 'F32':
      return Float32Array.from({ length: n }, (_, i) => view.getFloat32(4 * i, true));
    case 'F16':
      return Float32Array.from({ length: n }, (_, i) => f16BitsToFloat(view.getUint16(2 * i, true)));
    case 'Q8_0': {
      const out = new Float32Array(n);
      for (let b = 0; b < n / QUANT_BLOCK; b++) {
        const d = f16BitsToFloat(view.getUint16(b * BLOCK_BYTES.Q8_0, true));
        for (let i = 0; i < QUANT_BLOCK; i++) out[b * QUANT_BLOCK + i] = view.getInt8(b * BLOCK_BYTES.Q8_0 + 2 + i) * d;
      }
      return out;
    }
    case 'Q4_0':
    case 'Q5_0':
      return dequantizeSymmetric(type, bytes, n);
    case 'Q4_K':
      return dequantizeQ4_K(bytes, n);
    case 'Q6_K':
      return dequantizeQ6_K(bytes, n);
  }
}

/** A growable little-endian byte buffer. */
class Bytes {
  private buf = new Uint8Array(1 << 16);
  private view = new DataView(this.buf.buffer);
  length = 0;

  private room(n: number): void {
    if (this.length + n <= this.buf.length) return;
    let size = this.buf.length * 2;
    while (size < this.length + n) size *= 2;
    const next = new Uint8Array(size);
    next.set(this.buf.subarray(0, this.length));
    this.buf = next;
    this.view = new DataView(next.buffer);
  }

  u8(v: number): void {
    this.room(1);
    this.view.setUint8(this.length, v);
    this.length += 1;
  }
  i8(v: number): void {
    this.room(1);
    this.view.setInt8(this.length, v);
    this.length += 1;
  }
  u32(v: number): void {
    this.room(4);
    this.view.setUint32(this.length, v, true);
    this.length += 4;
  }
  i32(v: number): void {
    this.room(4);
    this.view.setInt32(this.length, v, true);
    this.length += 4;
  }
  f32(v: number): void {
    this.room(4);
    this.view.setFloat32(this.length, v, true);
    this.length += 4;
  }
  u64(v: number): void {
    this.room(8);
    this.view.setBigUint64(this.length, BigInt(v), true);
    this.length += 8;
  }
  str(s: string): void {
    const b = Buffer.from(s, 'utf8');
    this.u64(b.length);
    this.room(b.length);
    this.buf.set(b, this.length);
    this.length += b.length;
  }
  pad(alignment: number): void {
    while (this.length % alignment !== 0) this.u8(0);
  }
  bytes(): Uint8Array {
    return this.buf.subarray(0, this.length);
  }
}

function writeValue(b: Bytes, v: GgufValue): void {
  switch (v.type) {
    case 'u8':
      return b.u8(v.value);
    case 'u32':
      return b.u32(v.value);
    case 'i32':
      return b.i32(v.value);
    case 'f32':
      return b.f32(v.value);
    case 'u64':
      return b.u64(v.value);
    case 'bool':
      return b.u8(v.value ? 1 : 0);
    case 'string':
      return b.str(v.value);
    case 'array': {
      b.u32(GT[v.of]);
      b.u64(v.value.length);
      if (v.of === 'string') for (const s of v.value as string[]) b.str(s);
      else for (let i = 0; i < v.value.length; i++) (v.of === 'f32' ? b.f32 : v.of === 'i32' ? b.i32 : b.u32).call(b, (v.value as ArrayLike<number>)[i]);
    }
  }
}

/**
 * The whole file as chunks (header, then each tensor's bytes with its padding), ready for an atomic
 * write. Metadata keys are written in the given order; `general.alignment` is left at its default.
 */
export function encodeGguf(metadata: Map<string, GgufValue>, tensors: readonly GgufTensor[]): Uint8Array[] {
  const head = new Bytes();
  head.u8(0x47); // G
  head.u8(0x47); // G
  head.u8(0x55); // U
  head.u8(0x46); // F
  head.u32(GGUF_VERSION);
  head.u64(tensors.length);
  head.u64(metadata.size);
  for (const [key, v] of metadata) {
    head.str(key);
    head.u32(GT[v.type]);
    writeValue(head, v);
  }
  const datas = tensors.map(encodeTensor);
  let offset = 0;
  tensors.forEach((t, i) => {
    head.str(t.name);
    head.u32(t.shape.length);
    for (let d = t.shape.length - 1; d >= 0; d--) head.u64(t.shape[d]);
    head.u32(GGML_TYPE[t.type]);
    head.u64(offset);
    offset += datas[i].byteLength;
    offset += (GGUF_ALIGNMENT - (offset % GGUF_ALIGNMENT)) % GGUF_ALIGNMENT;
  });
  head.pad(GGUF_ALIGNMENT);
  const chunks: Uint8Array[] = [head.bytes()];
  for (const d of datas) {
    chunks.push(d);
    const pad = (GGUF_ALIGNMENT - (d.byteLength % GGUF_ALIGNMENT)) % GGUF_ALIGNMENT;
    if (pad) chunks.push(new Uint8Array(pad));
  }
  return chunks;
}
