/**
 * The safetensors file format: an 8-byte little-endian header length N, N bytes of JSON header
 * `{name: {dtype, shape, data_offsets: [begin, end]}, "__metadata__": {str: str}}` padded with spaces,
 * then the tensor bytes (offsets are relative to the end of the header, little-endian, row-major).
 *
 * Reading validates everything the reference implementation validates (and says which file and
 * tensor was wrong); writing is deterministic (sorted names, metadata first) and atomic.
 */
import fs from 'node:fs';
import os from 'node:os';
import { DamagedFileError, UserError } from '../errors.ts';
import { writeFileAtomic } from '../io/atomic.ts';

// Typed-array views below reinterpret bytes in host order; the format is little-endian.
if (os.endianness() !== 'LE') throw new Error('prefzoo safetensors I/O needs a little-endian host');

/** Element size in bytes of every dtype prefzoo reads and writes. */
export const DTYPE_SIZES = {
  F64: 8,
  F32: 4,
  F16: 2,
  BF16: 2,
  I64: 8,
  I32: 4,
  I16: 2,
  I8: 1,
  U8: 1,
  BOOL: 1,
} as const;

export type Dtype = keyof typeof DTYPE_SIZES;

export const FLOAT_DTYPES: readonly Dtype[] = ['F64', 'F32', 'F16', 'BF16'];

/** Largest header accepted; the reference implementation uses the same bound against hostile files. */
export const MAX_HEADER_BYTES = 100_000_000;

/** One tensor as stored: raw little-endian bytes, `data.byteLength === product(shape) * DTYPE_SIZES[dtype]`. */
export interface RawTensor {
  dtype: Dtype;
  shape: number[];
  data: Uint8Array;
}

export interface SafetensorsFile {
  tensors: Map<string, RawTensor>;
  metadata: Record<string, string>;
}

/** Header entry of one tensor, with offsets relative to the start of the data section. */
export interface TensorInfo {
  dtype: Dtype;
  shape: number[];
  begin: number;
  end: number;
}

export interface SafetensorsHeader {
  tensors: Map<string, TensorInfo>;
  metadata: Record<string, string>;
  /** File offset of the data section (8 + header length). */
  dataStart: number;
  fileSize: number;
}

/**
 * Tensor data accepted by the writer. Float32Array/Float64Array hold *values* and are converted to
 * the requested float dtype (F32, F64, F16 or BF16, rounding to nearest even); Uint16Array holds raw
 * F16/BF16 bit patterns; Int32Array/BigInt64Array/Int16Array/Int8Array hold I32/I64/I16/I8; Uint8Array
 * holds raw bytes of any dtype (U8 and BOOL in particular).
 */
export type TensorData =
  | Float32Array
  | Float64Array
  | Uint16Array
  | Int32Array
  | BigInt64Array
  | Int16Array
  | Int8Array
  | Uint8Array;

export interface TensorToWrite {
  dtype: Dtype;
  shape: readonly number[];
  data: TensorData;
}

function isDtype(s: unknown): s is Dtype {
  return typeof s === 'string' && Object.prototype.hasOwnProperty.call(DTYPE_SIZES, s);
}

/** Number of elements of `shape`; throws (plain Error) on a shape that is not a list of non-negative integers. */
export function numel(shape: readonly number[]): number {
  let n = 1;
  for (const d of shape) {
    if (!Number.isSafeInteger(d) || d < 0) throw new Error(`invalid dimension ${d} in shape [${shape.join(', ')}]`);
    n *= d;
  }
  return n;
}

function fmtShape(shape: readonly unknown[]): string {
  return `[${shape.join(', ')}]`;
}

function readExactly(fd: number, buf: Uint8Array, position: number, file: string, what: string): void {
  let done = 0;
  while (done < buf.byteLength) {
    const n = fs.readSync(fd, buf, done, buf.byteLength - done, position + done);
    if (n === 0) throw new DamagedFileError(`${file}: file truncated while reading ${what}`, { file });
    done += n;
  }
}

function openForRead(file: string): number {
  try {
    return fs.openSync(file, 'r');
  } catch (e) {
    const code = (e as NodeJS.ErrnoException).code;
    if (code === 'ENOENT') throw new UserError(`${file}: no such file`);
    if (code === 'EISDIR') throw new UserError(`${file}: is a directory, expected a .safetensors file`);
    throw new UserError(`${file}: cannot open (${(e as Error).message})`);
  }
}

/** Parses and validates the header of an open safetensors file. */
function readHeaderFd(fd: number, file: string): SafetensorsHeader {
  const fileSize = fs.fstatSync(fd).size;
  if (fileSize < 8) throw new DamagedFileError(`${file}: file truncated: ${fileSize} bytes, a safetensors file starts with an 8-byte header length`, { file });
  const lenBuf = new Uint8Array(8);
  readExactly(fd, lenBuf, 0, file, 'the header length');
  const headerLen64 = new DataView(lenBuf.buffer).getBigUint64(0, true);
  if (headerLen64 > BigInt(MAX_HEADER_BYTES)) {
    throw new DamagedFileError(`${file}: header length ${headerLen64} exceeds the ${MAX_HEADER_BYTES}-byte limit (not a safetensors file, or corrupt)`, { file });
  }
  const headerLen = Number(headerLen64);
  if (headerLen < 2) throw new DamagedFileError(`${file}: header length ${headerLen} is too small for a JSON object`, { file });
  if (8 + headerLen > fileSize) {
    throw new DamagedFileError(`${file}: file truncated: header length ${headerLen} runs past the end of the ${fileSize}-byte file`, { file });
  }
  const headerBytes = new Uint8Array(headerLen);
  readExactly(fd, headerBytes, 8, file, 'the header');
  let text: string;
  try {
    text = new TextDecoder('utf-8', { fatal: true }).decode(headerBytes);
  } catch {
    throw new DamagedFileError(`${file}: header is not valid UTF-8`, { file });
  }
  let json: unknown;
  try {
    json = JSON.parse(text);
  } catch (e) {
    throw new DamagedFileError(`${file}: header is not valid JSON (${(e as Error).message})`, { file });
  }
  if (json === null || typeof json !== 'object' || Array.isArray(json)) {
    throw new DamagedFileError(`${file}: header must be a JSON object`, { file });
  }
  const dataStart = 8 + headerLen;
  const dataSize = fileSize - dataStart;
  const metadata: Record<string, string> = {};
  const tensors = new Map<string, TensorInfo>();
  for (const [name, entry] of Object.entries(json as Record<string, unknown>)) {
    if (name === '__metadata__') {
      if (entry === null || typeof entry !== 'object' || Array.isArray(entry)) {
        throw new DamagedFileError(`${file}: "__metadata__" must be an object of strings`, { file });
      }
      for (const [k, v] of Object.entries(entry as Record<string, unknown>)) {
        if (typeof v !== 'string') throw new DamagedFileError(`${file}: "__metadata__" value of "${k}" must be a string, got ${JSON.stringify(v)}`, { file });
        metadata[k] = v;
      }
      continue;
    }
    const where = `${file}: tensor "${name}"`;
    if (entry === null || typeof entry !== 'object' || Array.isArray(entry)) throw new DamagedFileError(`${where}: header entry must be an object`, { file });
    const { dtype, shape, data_offsets: offsets } = entry as Record<string, unknown>;
    if (!isDtype(dtype)) {
      throw new DamagedFileError(`${where}: unknown dtype ${JSON.stringify(dtype)} (supported: ${Object.keys(DTYPE_SIZES).join(', ')})`, { file });
    }
    if (!Array.isArray(shape) || !shape.every((d) => Number.isSafeInteger(d) && d >= 0)) {
      throw new DamagedFileError(`${where}: shape must be a list of non-negative integers, got ${JSON.stringify(shape)}`, { file });
    }
    if (!Array.isArray(offsets) || offsets.length !== 2 || !offsets.every((o) => Number.isSafeInteger(o) && o >= 0)) {
      throw new DamagedFileError(`${where}: data_offsets must be [begin, end] non-negative integers, got ${JSON.stringify(offsets)}`, { file });
    }
    const [begin, end] = offsets as [number, number];
    if (end < begin) throw new DamagedFileError(`${where}: data_offsets [${begin}, ${end}] end before they begin`, { file });
    if (end > dataSize) {
      throw new DamagedFileError(`${where}: data_offsets [${begin}, ${end}] lie outside the ${dataSize}-byte data section (file truncated?)`, { file });
    }
    const expected = numel(shape as number[]) * DTYPE_SIZES[dtype];
    if (end - begin !== expected) {
      throw new DamagedFileError(`${where}: shape ${fmtShape(shape)} of ${dtype} needs ${expected} bytes but data_offsets [${begin}, ${end}] span ${end - begin}`, { file });
    }
    tensors.set(name, { dtype, shape: shape as number[], begin, end });
  }
  // The data section must be exactly tiled by the tensors: no overlap, no hole, nothing after.
  const sorted = [...tensors.entries()].sort((a, b) => a[1].begin - b[1].begin || a[1].end - b[1].end);
  let cursor = 0;
  let previous = '';
  for (const [name, t] of sorted) {
    if (t.begin < cursor) {
      throw new DamagedFileError(`${file}: tensor "${name}" data_offsets [${t.begin}, ${t.end}] overlap tensor "${previous}" (which ends at ${cursor})`, { file });
    }
    if (t.begin > cursor) {
      throw new DamagedFileError(`${file}: tensor "${name}" starts at ${t.begin} but the previous data ends at ${cursor}: unreferenced bytes in the data section`, { file });
    }
    cursor = t.end;
    previous = name;
  }
  if (cursor !== dataSize) {
    throw new DamagedFileError(`${file}: tensors cover ${cursor} bytes of a ${dataSize}-byte data section (trailing garbage or corrupt header)`, { file });
  }
  return { tensors, metadata, dataStart, fileSize };
}

/** Reads and validates only the header (names, dtypes, shapes, offsets, metadata) of a safetensors file. */
export function readSafetensorsHeader(file: string): SafetensorsHeader {
  const fd = openForRead(file);
  try {
    return readHeaderFd(fd, file);
  } finally {
    fs.closeSync(fd);
  }
}

/** Where `readSafetensors` puts a tensor's bytes: a buffer of exactly its byte length, or undefined for a fresh one. */
export type SafetensorsSink = (name: string, info: TensorInfo, file: string) => Uint8Array | undefined;

/**
 * Reads a safetensors file. Each tensor gets its own freshly allocated buffer (byteOffset 0), so
 * typed-array views of it are aligned. `names` restricts loading to those tensors (all must exist).
 * `into` reads a tensor straight into memory the caller already holds (no file-sized copy).
 */
export function readSafetensors(file: string, opts: { names?: readonly string[]; into?: SafetensorsSink } = {}): SafetensorsFile {
  const fd = openForRead(file);
  try {
    const header = readHeaderFd(fd, file);
    const wanted = opts.names ?? [...header.tensors.keys()];
    const tensors = new Map<string, RawTensor>();
    for (const name of wanted) {
      const info = header.tensors.get(name);
      if (!info) throw new UserError(`${file}: no tensor named "${name}"`);
      const data = opts.into?.(name, info, file) ?? new Uint8Array(info.end - info.begin);
      if (data.byteLength !== info.end - info.begin) throw new Error(`readSafetensors: the buffer for "${name}" holds ${data.byteLength} bytes, the tensor ${info.end - info.begin}`);
      readExactly(fd, data, header.dataStart + info.begin, file, `tensor "${name}"`);
      tensors.set(name, { dtype: info.dtype, shape: info.shape, data });
    }
    return { tensors, metadata: header.metadata };
  } finally {
    fs.closeSync(fd);
  }
}

// ---------------------------------------------------------------------------------------------
// Float conversions (IEEE 754 binary16 and bfloat16 <-> binary32), round to nearest, ties to even.

const f32 = new Float32Array(1);
const u32 = new Uint32Array(f32.buffer);

/** bfloat16 bit pattern → float32 value (exact: bfloat16 is the top half of a float32). */
export function bf16BitsToFloat(bits: number): number {
  u32[0] = (bits & 0xffff) << 16;
  return f32[0];
}

/** float32 value → bfloat16 bit pattern, rounding to nearest even; NaN stays a NaN (its top mantissa bit set). */
export function floatToBf16Bits(value: number): number {
  f32[0] = value;
  const x = u32[0];
  if ((x & 0x7fffffff) > 0x7f800000) return ((x >>> 16) | 0x0040) & 0xffff;
  // Adding 0x7fff plus the lowest kept bit rounds ties toward the even neighbour.
  return ((x + 0x7fff + ((x >>> 16) & 1)) >>> 16) & 0xffff;
}

/** IEEE binary16 bit pattern → float32 value (exact, including subnormals, infinities and NaN). */
export function f16BitsToFloat(bits: number): number {
  const sign = bits & 0x8000 ? -1 : 1;
  const exp = (bits >>> 10) & 0x1f;
  const mant = bits & 0x3ff;
  if (exp === 0) return sign * mant * 2 ** -24;
  if (exp === 0x1f) return mant ? NaN : sign * Infinity;
  return sign * (1024 + mant) * 2 ** (exp - 25);
}

/** float32 value → IEEE binary16 bit pattern, rounding to nearest even; overflow gives ±Infinity. */
export function floatToF16Bits(value: number): number {
  f32[0] = value;
  const x = u32[0];
  const sign = (x >>> 16) & 0x8000;
  const exp = (x >>> 23) & 0xff;
  const mant = x & 0x7fffff;
  if (exp === 0xff) return sign | 0x7c00 | (mant ? 0x200 : 0);
  const e = exp - 127 + 15;
  if (e >= 0x1f) return sign | 0x7c00;
  if (e <= 0) {
    // Subnormal (or zero) result: shift the full significand (with its implicit 1) into place.
    if (e < -10) return sign;
    const full = mant | 0x800000;
    const shift = 14 - e;
    const kept = full >>> shift;
    const rest = full & ((1 << shift) - 1);
    const half = 1 << (shift - 1);
    const rounded = kept + (rest > half || (rest === half && (kept & 1)) ? 1 : 0);
    return sign | rounded;
  }
  const kept = (e << 10) | (mant >>> 13);
  const rest = mant & 0x1fff;
  // A carry out of the mantissa correctly bumps the exponent (up to infinity).
  const rounded = kept + (rest > 0x1000 || (rest === 0x1000 && (kept & 1)) ? 1 : 0);
  return sign | rounded;
}

/** Float32 values → bfloat16 bit patterns (round to nearest even). */
export function float32ToBf16(values: ArrayLike<number>): Uint16Array {
  const out = new Uint16Array(values.length);
  for (let i = 0; i < values.length; i++) out[i] = floatToBf16Bits(values[i]);
  return out;
}

/** Float32 values → IEEE binary16 bit patterns (round to nearest even). */
export function float32ToF16(values: ArrayLike<number>): Uint16Array {
  const out = new Uint16Array(values.length);
  for (let i = 0; i < values.length; i++) out[i] = floatToF16Bits(values[i]);
  return out;
}

function bytesAs<T>(data: Uint8Array, size: number, make: (buf: ArrayBuffer, off: number, n: number) => T): T {
  // Views need an aligned offset; otherwise copy into a fresh buffer first.
  if (data.byteOffset % size === 0) return make(data.buffer as ArrayBuffer, data.byteOffset, data.byteLength / size);
  return make(data.slice().buffer as ArrayBuffer, 0, data.byteLength / size);
}

/**
 * Values of a tensor as a new Float32Array. F16/BF16 are widened exactly, F64 is rounded to the
 * nearest float32, integer and BOOL tensors are converted value by value.
 */
export function tensorToFloat32(t: RawTensor): Float32Array {
  const n = t.data.byteLength / DTYPE_SIZES[t.dtype];
  switch (t.dtype) {
    case 'F32':
      return bytesAs(t.data, 4, (b, o, k) => new Float32Array(b, o, k)).slice();
    case 'F64':
      return Float32Array.from(bytesAs(t.data, 8, (b, o, k) => new Float64Array(b, o, k)));
    case 'BF16': {
      const bits = bytesAs(t.data, 2, (b, o, k) => new Uint16Array(b, o, k));
      const out = new Float32Array(n);
      const outBits = new Uint32Array(out.buffer);
      for (let i = 0; i < n; i++) outBits[i] = bits[i] << 16;
      return out;
    }
    case 'F16': {
      const bits = bytesAs(t.data, 2, (b, o, k) => new Uint16Array(b, o, k));
      const out = new Float32Array(n);
      for (let i = 0; i < n; i++) out[i] = f16BitsToFloat(bits[i]);
      return out;
    }
    default:
      return Float32Array.from(tensorToFloat64(t));
  }
}

/** Values of a tensor as a new Float64Array (exact for every float dtype and for integers below 2^53). */
export function tensorToFloat64(t: RawTensor): Float64Array {
  switch (t.dtype) {
    case 'F64':
      return bytesAs(t.data, 8, (b, o, k) => new Float64Array(b, o, k)).slice();
    case 'F32':
    case 'F16':
    case 'BF16':
      return Float64Array.from(tensorToFloat32(t));
    case 'I64':
      return Float64Array.from(bytesAs(t.data, 8, (b, o, k) => new BigInt64Array(b, o, k)), (v) => Number(v));
    case 'I32':
      return Float64Array.from(bytesAs(t.data, 4, (b, o, k) => new Int32Array(b, o, k)));
    case 'I16':
      return Float64Array.from(bytesAs(t.data, 2, (b, o, k) => new Int16Array(b, o, k)));
    case 'I8':
      return Float64Array.from(new Int8Array(t.data.buffer, t.data.byteOffset, t.data.byteLength));
    case 'U8':
    case 'BOOL':
      return Float64Array.from(t.data);
  }
}

/** Encodes the data of a tensor to its stored bytes (see {@link TensorData} for what each array type means). */
export function encodeTensorData(dtype: Dtype, data: TensorData, where: string): Uint8Array {
  const asBytes = (a: ArrayBufferView) => new Uint8Array(a.buffer, a.byteOffset, a.byteLength);
  if (data instanceof Uint8Array) return data;
  if (data instanceof Float32Array || data instanceof Float64Array) {
    switch (dtype) {
      case 'F32':
        return asBytes(data instanceof Float32Array ? data : Float32Array.from(data));
      case 'F64':
        return asBytes(data instanceof Float64Array ? data : Float64Array.from(data));
      case 'BF16':
        return asBytes(float32ToBf16(data instanceof Float32Array ? data : Float32Array.from(data)));
      case 'F16':
        return asBytes(float32ToF16(data instanceof Float32Array ? data : Float32Array.from(data)));
      default:
        throw new UserError(`${where}: float values cannot be stored as ${dtype}`);
    }
  }
  const ok =
    (data instanceof Uint16Array && (dtype === 'F16' || dtype === 'BF16')) ||
    (data instanceof Int32Array && dtype === 'I32') ||
    (data instanceof BigInt64Array && dtype === 'I64') ||
    (data instanceof Int16Array && dtype === 'I16') ||
    (data instanceof Int8Array && dtype === 'I8');
  if (!ok) throw new UserError(`${where}: a ${data.constructor.name} cannot hold ${dtype} data`);
  return asBytes(data);
}

/**
 * Writes a safetensors file atomically (temp file in the same folder, then rename). Tensors are laid
 * out in sorted name order and the header is padded with spaces to a multiple of 8 bytes, so the same
 * input always gives the same bytes. `metadata` values must be strings.
 */
export function writeSafetensors(
  file: string,
  tensors: Record<string, TensorToWrite> | Map<string, TensorToWrite>,
  metadata?: Record<string, string>,
): void {
  const entries = tensors instanceof Map ? [...tensors.entries()] : Object.entries(tensors);
  entries.sort((a, b) => (a[0] < b[0] ? -1 : a[0] > b[0] ? 1 : 0));
  const header: Record<string, unknown> = {};
  if (metadata && Object.keys(metadata).length > 0) {
    for (const [k, v] of Object.entries(metadata)) {
      if (typeof v !== 'string') throw new UserError(`${file}: metadata value of "${k}" must be a string`);
    }
    header.__metadata__ = Object.fromEntries(Object.entries(metadata).sort((a, b) => (a[0] < b[0] ? -1 : 1)));
  }
  const blobs: Uint8Array[] = [];
  let offset = 0;
  for (const [name, t] of entries) {
    const where = `${file}: tensor "${name}"`;
    if (name === '__metadata__') throw new UserError(`${where}: the name is reserved`);
    if (!isDtype(t.dtype)) throw new UserError(`${where}: unknown dtype ${JSON.stringify(t.dtype)}`);
    let n: number;
    try {
      n = numel(t.shape);
    } catch (e) {
      throw new UserError(`${where}: ${(e as Error).message}`);
    }
    const bytes = encodeTensorData(t.dtype, t.data, where);
    if (bytes.byteLength !== n * DTYPE_SIZES[t.dtype]) {
      throw new UserError(`${where}: shape ${fmtShape(t.shape)} of ${t.dtype} needs ${n * DTYPE_SIZES[t.dtype]} bytes, data has ${bytes.byteLength}`);
    }
    header[name] = { dtype: t.dtype, shape: [...t.shape], data_offsets: [offset, offset + bytes.byteLength] };
    offset += bytes.byteLength;
    blobs.push(bytes);
  }
  const json = Buffer.from(JSON.stringify(header), 'utf8');
  const padded = Math.ceil(json.byteLength / 8) * 8;
  const headerBuf = Buffer.alloc(8 + padded, 0x20);
  headerBuf.writeBigUInt64LE(BigInt(padded), 0);
  json.copy(headerBuf, 8);
  writeFileAtomic(file, [headerBuf, ...blobs]);
}
