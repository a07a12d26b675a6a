/**
 * ggml's K-quants used by a q4_K_M file, both ways: super-blocks of QK_K = 256 consecutive values of
 * a row (llama.cpp's ggml-common.h layouts; the decode is ggml's `dequantize_row_q4_K/q6_K` in the
 * same float32 arithmetic).
 *
 *   Q4_K (144 bytes): f16 d · f16 dmin · 12 bytes of eight 6-bit scales sc and mins m · 128 bytes of
 *        4-bit q. Sub-block j (32 values) decodes as x = (d·sc_j)·q − dmin·m_j. Scale bytes 0–3 hold
 *        sc_0..3 in their low 6 bits, bytes 4–7 m_0..3; bytes 8–11 hold sc_4..7 (low nibble) and
 *        m_4..7 (high nibble), whose top 2 bits sit in the top 2 bits of bytes 0–3 (sc) and 4–7 (m).
 *        The quants go 64 values to 32 bytes: value l of the pair's first sub-block in byte l's low
 *        nibble, value l of its second in the high one.
 *   Q6_K (210 bytes): 128 bytes ql (low 4 bits) · 64 bytes qh (high 2 bits) · 16 int8 scales · f16
 *        d. Sub-block i (16 values) decodes as x = d·sc_i·(q − 32). Per half of 128 values, value l
 *        (l < 32) of each 32-value quarter k takes ql[l + 32·(k & 1)]'s low (k < 2) or high nibble and
 *        bits 2k, 2k+1 of qh[l].
 *
 * The scales are chosen by a simple covering rule, not ggml's reference search (make_qkx2_quants /
 * make_qx_quants, a weighted least-squares scan): every sub-block's grid spans all its values, so no
 * value is clipped and each decodes to its nearest grid point, within half a step of its sub-block.
 *   Q4_K: m_j = ⌈(−min(0, min x))/dmin⌉ and sc_j = ⌈(max x + dmin·m_j)/(15·d)⌉, where dmin and d are
 *         the super-block's largest wanted min and step over 63, rounded up to float16 (so both ≤ 63).
 *   Q6_K: sc_i = ⌈(max|x|/31)/d⌉ with d = max over the super-block of max|x|/31 over 127, rounded up
 *         to float16; q − 32 = round(x/(d·sc_i)) ∈ [−31, 31].
 * An all-zero (sub-)block gets zero scales and decodes to zeros.
 */
import { f16BitsToFloat, floatToF16Bits } from '../models/safetensors.ts';

/** Values per K-quant super-block. */
export const QK_K = 256;
export const Q4_K_BYTES = 144;
export const Q6_K_BYTES = 210;

/** The float16 bits of the smallest float16 ≥ v (v ≥ 0, finite in float16). */
function f16Up(v: number): number {
  let bits = floatToF16Bits(v);
  if (f16BitsToFloat(bits) < v) bits += 1;
  return bits;
}

function superBlocks(type: string, data: Float32Array): number {
  if (data.length % QK_K !== 0) throw new Error(`${type}: ${data.length} values are not whole blocks of ${QK_K}`);
  return data.length / QK_K;
}

/** Q4_K super-blocks of `data` (its length a multiple of 256; blocks run along rows). */
export function quantizeQ4_K(data: Float32Array): Uint8Array {
  const blocks = superBlocks('Q4_K', data);
  const out = new Uint8Array(blocks * Q4_K_BYTES);
  const view = new DataView(out.buffer);
  const mins = new Float64Array(8);
  const highs = new Float64Array(8);
  const sc = new Uint8Array(8);
  const m = new Uint8Array(8);
  for (let b = 0; b < blocks; b++) {
    const at = b * QK_K;
    let maxMin = 0;
    for (let j = 0; j < 8; j++) {
      let lo = 0;
      let hi = -Infinity;
      for (let l = 0; l < 32; l++) {
        const x = data[at + 32 * j + l];
        if (x < lo) lo = x;
        if (x > hi) hi = x;
      }
      mins[j] = -lo;
      highs[j] = hi;
      maxMin = Math.max(maxMin, -lo);
    }
    const dminBits = f16Up(maxMin / 63);
    const dmin = f16BitsToFloat(dminBits);
    let maxStep = 0;
    for (let j = 0; j < 8; j++) {
      m[j] = dmin > 0 ? Math.min(63, Math.ceil(mins[j] / dmin)) : 0;
      maxStep = Math.max(maxStep, (highs[j] + dmin * m[j]) / 15);
    }
    const dBits = f16Up(maxStep / 63);
    const d = f16BitsToFloat(dBits);
    for (let j = 0; j < 8; j++) sc[j] = d > 0 ? Math.min(63, Math.ceil((highs[j] + dmin * m[j]) / 15 / d)) : 0;

    const o = b * Q4_K_BYTES;
    view.setUint16(o, dBits, true);
    view.setUint16(o + 2, dminBits, true);
    for (let j = 0; j < 4; j++) {
      out[o + 4 + j] = sc[j] | ((sc[j + 4] >> 4) << 6);
      out[o + 8 + j] = m[j] | ((m[j + 4] >> 4) << 6);
      out[o + 12 + j] = (sc[j + 4] & 15) | ((m[j + 4] & 15) << 4);
    }
    for (let j = 0; j < 8; j++) {
      const step = d * sc[j];
      const shift = dmin * m[j];
      const byte = o + 16 + 32 * (j >> 1);
      for (let l = 0; l < 32; l++) {
        const q = step > 0 ? Math.max(0, Math.min(15, Math.round((data[at + 32 * j + l] + shift) / step))) : 0;
        out[byte + l] |= j & 1 ? q << 4 : q;
      }
    }
  }
  return out;
}

/** The 6-bit scale and min of Q4_K sub-block j from the 12 scale bytes at `s`. */
function scaleMin(bytes: Uint8Array, s: number, j: number): [number, number] {
  if (j < 4) return [bytes[s + j] & 63, bytes[s + j + 4] & 63];
  return [(bytes[s + j + 4] & 15) | ((bytes[s + j - 4] >> 6) << 4), (bytes[s + j + 4] >> 4) | ((bytes[s + j] >> 6) << 4)];
}

/** `n` values of Q4_K super-blocks, as ggml decodes them (float32: (d·sc)·q − dmin·m). */
export function dequantizeQ4_K(bytes: Uint8Array, n: number): Float32Array {
  const out = new Float32Array(n);
  const view = new DataView(bytes.buffer, bytes.byteOffset, bytes.byteLength);
  const f = Math.fround;
  for (let b = 0; b < n / QK_K; b++) {
    const o = b * Q4_K_BYTES;
    const d = f16BitsToFloat(view.getUint16(o, true));
    const dmin = f16BitsToFloat(view.getUint16(o + 2, true));
    for (let j = 0; j < 8; j++) {
      const [sc, m] = scaleMin(bytes, o + 4, j);
      const step = f(d * sc);
      const shift = f(dmin * m);
      const byte = o + 16 + 32 * (j >> 1);
      for (let l = 0; l < 32; l++) {
        const q = j & 1 ? bytes[byte + l] >> 4 : bytes[byte + l] & 15;
        out[b * QK_K + 32 * j + l] = f(step * q) - shift;
      }
    }
  }
  return out;
}

/** Q6_K super-blocks of `data` (its length a multiple of 256; blocks run along rows). */
export function quantizeQ6_K(data: Float32Array): Uint8Array {
  const blocks = superBlocks('Q6_K', data);
  const out = new Uint8Array(blocks * Q6_K_BYTES);
  const view = new DataView(out.buffer);
  const steps = new Float64Array(16);
  const q = new Uint8Array(QK_K);
  for (let b = 0; b < blocks; b++) {
    const at = b * QK_K;
    let maxStep = 0;
    for (let i = 0; i < 16; i++) {
      let amax = 0;
      for (let l = 0; l < 16; l++) amax = Math.max(amax, Math.abs(data[at + 16 * i + l]));
      steps[i] = amax / 31;
      maxStep = Math.max(maxStep, steps[i]);
    }
    const dBits = f16Up(maxStep / 127);
    const d = f16BitsToFloat(dBits);
    const o = b * Q6_K_BYTES;
    for (let i = 0; i < 16; i++) {
      const sc = d > 0 ? Math.min(127, Math.ceil(steps[i] / d)) : 0;
      out[o + 192 + i] = sc;
      const step = d * sc;
      for (let l = 0; l < 16; l++) q[16 * i + l] = 32 + (step > 0 ? Math.max(-32, Math.min(31, Math.round(data[at + 16 * i + l] / step))) : 0);
    }
    view.setUint16(o + 208, dBits, true);
    for (let h = 0; h < 2; h++) {
      const ql = o + 64 * h;
      const qh = o + 128 + 32 * h;
      for (let l = 0; l < 32; l++) {
        const v = (k: number) => q[128 * h + 32 * k + l];
        out[ql + l] = (v(0) & 15) | ((v(2) & 15) << 4);
        out[ql + 32 + l] = (v(1) & 15) | ((v(3) & 15) << 4);
        out[qh + l] = (v(0) >> 4) | ((v(1) >> 4) << 2) | ((v(2) >> 4) << 4) | ((v(3) >> 4) << 6);
      }
    }
  }
  return out;
}

/** `n` values of Q6_K super-blocks, as ggml decodes them (float32: d·sc·(q − 32), exact). */
export function dequantizeQ6_K(bytes: Uint8Array, n: number): Float32Array {
  const out = new Float32Array(n);
  const view = new DataView(bytes.buffer, bytes.byteOffset, bytes.byteLength);
  for (let b = 0; b < n / QK_K; b++) {
    const o = b * Q6_K_BYTES;
    const d = f16BitsToFloat(view.getUint16(o + 208, true));
    for (let h = 0; h < 2; h++) {
      const ql = o + 64 * h;
      const qh = o + 128 + 32 * h;
      for (let l = 0; l < 32; l++) {
        for (let k = 0; k < 4; k++) {
          const low = k & 2 ? bytes[ql + 32 * (k & 1) + l] >> 4 : bytes[ql + 32 * (k & 1) + l] & 15;
          const q = (low | (((bytes[qh + l] >> (2 * k)) & 3) << 4)) - 32;
          const i = 128 * h + 32 * k + l;
          out[b * QK_K + i] = d * view.getInt8(o + 192 + (i >> 4)) * q;
        }
      }
    }
  }
  return out;
}
