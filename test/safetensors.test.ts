import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { afterAll, describe, expect, it } from 'vitest';
import { UserError } from '../src/errors.ts';
import {
  bf16BitsToFloat,
  f16BitsToFloat,
  float32ToBf16,
  float32ToF16,
  floatToBf16Bits,
  floatToF16Bits,
  readSafetensors,
  readSafetensorsHeader,
  tensorToFloat32,
  tensorToFloat64,
  writeSafetensors,
  type TensorToWrite,
} from '../src/models/safetensors.ts';

const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'prefzoo-st-'));
afterAll(() => fs.rmSync(dir, { recursive: true, force: true }));
let counter = 0;
const tmp = (name = 'x.safetensors') => path.join(dir, `${counter++}-${name}`);

/** Builds a file by hand: 8-byte length, header text, data; `declaredLen` overrides the length field. */
function rawFile(header: unknown, data: Uint8Array, declaredLen?: bigint): string {
  const file = tmp();
  const text = Buffer.from(typeof header === 'string' ? header : JSON.stringify(header), 'utf8');
  const len = Buffer.alloc(8);
  len.writeBigUInt64LE(declaredLen ?? BigInt(text.byteLength));
  fs.writeFileSync(file, Buffer.concat([len, text, data]));
  return file;
}

function expectUserError(fn: () => unknown, file: string, pattern: RegExp): void {
  let caught: unknown;
  try {
    fn();
  } catch (e) {
    caught = e;
  }
  expect(caught).toBeInstanceOf(UserError);
  const msg = (caught as Error).message;
  expect(msg).toContain(file);
  expect(msg).toMatch(pattern);
  expect(msg).not.toContain('\n');
}

describe('float conversions against hand-computed bit patterns', () => {
  it('decodes binary16', () => {
    expect(f16BitsToFloat(0x3c00)).toBe(1);
    expect(f16BitsToFloat(0xc000)).toBe(-2);
    expect(f16BitsToFloat(0x7bff)).toBe(65504); // largest finite half
    expect(f16BitsToFloat(0x0400)).toBe(2 ** -14); // smallest normal
    expect(f16BitsToFloat(0x0001)).toBe(2 ** -24); // smallest subnormal
    expect(f16BitsToFloat(0x03ff)).toBe(1023 * 2 ** -24); // largest subnormal
    expect(f16BitsToFloat(0x3555)).toBe(1 / 4 + 0x155 / 1024 / 4); // nearest half to 1/3
    expect(f16BitsToFloat(0x7c00)).toBe(Infinity);
    expect(f16BitsToFloat(0xfc00)).toBe(-Infinity);
    expect(Object.is(f16BitsToFloat(0x8000), -0)).toBe(true);
    expect(Number.isNaN(f16BitsToFloat(0x7e00))).toBe(true);
  });

  it('encodes binary16 rounding to nearest even', () => {
    expect(floatToF16Bits(1)).toBe(0x3c00);
    expect(floatToF16Bits(-2)).toBe(0xc000);
    expect(floatToF16Bits(65504)).toBe(0x7bff);
    expect(floatToF16Bits(65520)).toBe(0x7c00); // halfway to 2^16 rounds to even = overflow
    expect(floatToF16Bits(65519)).toBe(0x7bff);
    expect(floatToF16Bits(1e10)).toBe(0x7c00);
    expect(floatToF16Bits(1 / 3)).toBe(0x3555);
    expect(floatToF16Bits(1 + 2 ** -11)).toBe(0x3c00); // tie, 0x3c00 is even
    expect(floatToF16Bits(1 + 3 * 2 ** -11)).toBe(0x3c02); // tie, rounds up to even 0x3c02
    expect(floatToF16Bits(1 + 2 ** -11 + 2 ** -20)).toBe(0x3c01); // just above the tie
    expect(floatToF16Bits(2 ** -24)).toBe(0x0001);
    expect(floatToF16Bits(2 ** -25)).toBe(0x0000); // tie between 0 and the smallest subnormal → 0
    expect(floatToF16Bits(1.5 * 2 ** -25)).toBe(0x0001);
    expect(floatToF16Bits(3 * 2 ** -25)).toBe(0x0002); // tie between 1 and 2 units → 2
    expect(floatToF16Bits(1023.5 * 2 ** -24)).toBe(0x0400); // rounds up into the smallest normal
    expect(floatToF16Bits(-0)).toBe(0x8000);
    expect(floatToF16Bits(-Infinity)).toBe(0xfc00);
    expect(floatToF16Bits(NaN) & 0x7c00).toBe(0x7c00);
    expect(floatToF16Bits(NaN) & 0x03ff).not.toBe(0);
  });

  it('converts bfloat16 both ways, rounding to nearest even', () => {
    expect(bf16BitsToFloat(0x3f80)).toBe(1);
    expect(bf16BitsToFloat(0xc040)).toBe(-3);
    expect(bf16BitsToFloat(0x4049)).toBe(3.140625);
    const fromBits = (b: number) => new Float32Array(new Uint32Array([b]).buffer)[0];
    expect(floatToBf16Bits(Math.PI)).toBe(0x4049); // pi = 0x40490fdb, low half < 0x8000
    expect(floatToBf16Bits(fromBits(0x3f808000))).toBe(0x3f80); // tie, keep even
    expect(floatToBf16Bits(fromBits(0x3f818000))).toBe(0x3f82); // tie, odd → up
    expect(floatToBf16Bits(fromBits(0x3f808001))).toBe(0x3f81); // above tie
    expect(floatToBf16Bits(fromBits(0x7f7fffff))).toBe(0x7f80); // FLT_MAX rounds to +inf
    expect(floatToBf16Bits(-Infinity)).toBe(0xff80);
    expect(floatToBf16Bits(fromBits(0x00000001))).toBe(0x0000); // tiny subnormal → +0
    const nan = floatToBf16Bits(NaN);
    expect(nan & 0x7f80).toBe(0x7f80);
    expect(nan & 0x007f).not.toBe(0);
    // A NaN whose payload lives only in the low half must not turn into infinity.
    expect(floatToBf16Bits(fromBits(0x7f800001)) & 0x7f).not.toBe(0);
  });

  it('every binary16 value survives f16 → f32 → f16', () => {
    const bad: number[] = [];
    for (let b = 0; b < 0x10000; b++) {
      const v = f16BitsToFloat(b);
      if (!Number.isNaN(v) && floatToF16Bits(v) !== b) bad.push(b);
    }
    expect(bad).toEqual([]);
  });
});

describe('round trips', () => {
  it('every dtype survives write → read bit-exactly', () => {
    const f32 = new Float32Array([1.5, -2.25, 3.0e-39, Infinity, -0, 6.5e7]);
    const tensors: Record<string, TensorToWrite> = {
      f64: { dtype: 'F64', shape: [3], data: new Float64Array([Math.PI, -1e300, 5e-324]) },
      f32: { dtype: 'F32', shape: [2, 3], data: f32 },
      f16: { dtype: 'F16', shape: [4], data: new Uint16Array([0x3c00, 0x7bff, 0x0001, 0xfc00]) },
      bf16: { dtype: 'BF16', shape: [2, 2], data: new Uint16Array([0x3f80, 0x4049, 0xc040, 0x0001]) },
      i64: { dtype: 'I64', shape: [2], data: new BigInt64Array([-(2n ** 62n), 123n]) },
      i32: { dtype: 'I32', shape: [3], data: new Int32Array([-7, 0, 2 ** 31 - 1]) },
      i16: { dtype: 'I16', shape: [1], data: new Int16Array([-300]) },
      i8: { dtype: 'I8', shape: [2], data: new Int8Array([-128, 127]) },
      u8: { dtype: 'U8', shape: [2], data: new Uint8Array([0, 255]) },
      bool: { dtype: 'BOOL', shape: [3], data: new Uint8Array([1, 0, 1]) },
      scalar: { dtype: 'F32', shape: [], data: new Float32Array([42]) },
      empty: { dtype: 'F32', shape: [0, 5], data: new Float32Array(0) },
    };
    const file = tmp();
    writeSafetensors(file, tensors, { format: 'pt', note: 'round trip' });
    const back = readSafetensors(file);
    expect(back.metadata).toEqual({ format: 'pt', note: 'round trip' });
    expect([...back.tensors.keys()].sort()).toEqual(Object.keys(tensors).sort());
    for (const [name, t] of Object.entries(tensors)) {
      const got = back.tensors.get(name)!;
      expect(got.dtype).toBe(t.dtype);
      expect(got.shape).toEqual(t.shape);
      const d = t.data as ArrayBufferView;
      expect(Buffer.from(got.data)).toEqual(Buffer.from(d.buffer, d.byteOffset, d.byteLength));
    }
    expect(tensorToFloat64(back.tensors.get('i64')!)).toEqual(new Float64Array([-(2 ** 62), 123]));
    expect(tensorToFloat32(back.tensors.get('f16')!)).toEqual(new Float32Array([1, 65504, 2 ** -24, -Infinity]));
    expect(tensorToFloat32(back.tensors.get('bf16')!)).toEqual(new Float32Array([1, 3.140625, -3, bf16BitsToFloat(1)]));
    expect(tensorToFloat64(back.tensors.get('f32')!)).toEqual(Float64Array.from(f32));
    expect(tensorToFloat32(back.tensors.get('f64')!)).toEqual(new Float32Array([Math.PI, -Infinity, 0]));
    // Saving what was read gives the same bytes again.
    const file2 = tmp();
    writeSafetensors(file2, back.tensors, back.metadata);
    expect(fs.readFileSync(file2)).toEqual(fs.readFileSync(file));
  });

  it('writes a deterministic, 8-byte aligned, space-padded header in sorted order', () => {
    const a = tmp();
    const b = tmp();
    const t1 = { dtype: 'F32' as const, shape: [1], data: new Float32Array([1]) };
    const t2 = { dtype: 'F16' as const, shape: [1], data: new Uint16Array([0x3c00]) };
    writeSafetensors(a, { zeta: t1, alpha: t2 });
    writeSafetensors(b, new Map<string, TensorToWrite>([['alpha', t2], ['zeta', t1]]));
    const bytes = fs.readFileSync(a);
    expect(bytes).toEqual(fs.readFileSync(b));
    const n = Number(bytes.readBigUInt64LE(0));
    expect((8 + n) % 8).toBe(0);
    const text = bytes.subarray(8, 8 + n).toString('utf8');
    expect(text.trimEnd()).toBe(
      '{"alpha":{"dtype":"F16","shape":[1],"data_offsets":[0,2]},"zeta":{"dtype":"F32","shape":[1],"data_offsets":[2,6]}}',
    );
    expect(/^ *$/.test(text.slice(text.trimEnd().length))).toBe(true);
    expect(bytes.byteLength).toBe(8 + n + 6);
  });

  it('converts float values to BF16 and F16 on request', () => {
    const file = tmp();
    const values = new Float32Array([1, Math.PI, -3, 65520]);
    writeSafetensors(file, {
      b: { dtype: 'BF16', shape: [4], data: values },
      h: { dtype: 'F16', shape: [4], data: values },
      d: { dtype: 'F64', shape: [4], data: values },
    });
    const back = readSafetensors(file).tensors;
    expect(new Uint16Array(back.get('b')!.data.buffer)).toEqual(new Uint16Array([0x3f80, 0x4049, 0xc040, 0x4780]));
    expect(new Uint16Array(back.get('h')!.data.buffer)).toEqual(new Uint16Array([0x3c00, 0x4248, 0xc200, 0x7c00]));
    expect(tensorToFloat64(back.get('d')!)).toEqual(Float64Array.from(values));
    expect(float32ToBf16([1, -3])).toEqual(new Uint16Array([0x3f80, 0xc040]));
    expect(float32ToF16([1, -3])).toEqual(new Uint16Array([0x3c00, 0xc200]));
  });

  it('reads only the requested tensors and the header alone', () => {
    const file = tmp();
    writeSafetensors(file, {
      a: { dtype: 'F32', shape: [2], data: new Float32Array([1, 2]) },
      b: { dtype: 'F32', shape: [1], data: new Float32Array([3]) },
    });
    const h = readSafetensorsHeader(file);
    expect(h.tensors.get('b')).toEqual({ dtype: 'F32', shape: [1], begin: 8, end: 12 });
    expect([...readSafetensors(file, { names: ['b'] }).tensors.keys()]).toEqual(['b']);
    expectUserError(() => readSafetensors(file, { names: ['c'] }), file, /no tensor named "c"/);
  });
  it('reads a tensor into memory the caller holds, at any offset, and refuses a buffer of the wrong size', () => {
    const file = tmp();
    writeSafetensors(file, {
      a: { dtype: 'F32', shape: [2], data: new Float32Array([1.5, -2]) },
      b: { dtype: 'F32', shape: [3], data: new Float32Array([3, 4, 5]) },
    });
    const held = new Float32Array(6).fill(9);
    const seen: string[] = [];
    const got = readSafetensors(file, {
      into: (name, info) => {
        seen.push(`${name}:${info.dtype}[${info.shape}]`);
        return name === 'a' ? new Uint8Array(held.buffer, 4, 8) : undefined;
      },
    }).tensors;
    expect(seen.sort()).toEqual(['a:F32[2]', 'b:F32[3]']);
    expect([...held]).toEqual([9, 1.5, -2, 9, 9, 9]);
    expect(got.get('a')!.data.buffer).toBe(held.buffer);
    expect([...tensorToFloat32(got.get('b')!)]).toEqual([3, 4, 5]);
    expect(() => readSafetensors(file, { into: () => new Uint8Array(4) })).toThrow(/holds 4 bytes, the tensor 8/);
  });
});

describe('corrupt files give a one-line UserError naming the file', () => {
  const okHeader = { w: { dtype: 'F32', shape: [2], data_offsets: [0, 8] } };
  const eight = new Uint8Array(8);

  it('accepts the hand-built valid file', () => {
    const file = rawFile(okHeader, eight);
    expect(readSafetensors(file).tensors.get('w')!.shape).toEqual([2]);
  });

  it('file shorter than the length field', () => {
    const file = tmp();
    fs.writeFileSync(file, Buffer.from([1, 2, 3]));
    expectUserError(() => readSafetensors(file), file, /truncated/);
  });

  it('header length beyond the end of the file', () => {
    const file = rawFile(okHeader, eight, 10_000n);
    expectUserError(() => readSafetensors(file), file, /header length 10000 runs past the end/);
  });

  it('huge header length', () => {
    const file = rawFile(okHeader, eight, 2n ** 63n);
    expectUserError(() => readSafetensors(file), file, /exceeds the 100000000-byte limit/);
  });

  it('invalid JSON', () => {
    const file = rawFile('{"w": {"dtype": "F32",', eight);
    expectUserError(() => readSafetensors(file), file, /not valid JSON/);
  });

  it('JSON that is not an object', () => {
    const file = rawFile('[1, 2, 3]', eight);
    expectUserError(() => readSafetensors(file), file, /must be a JSON object/);
  });

  it('unknown dtype', () => {
    const file = rawFile({ w: { dtype: 'F8_E9M9', shape: [2], data_offsets: [0, 8] } }, eight);
    expectUserError(() => readSafetensors(file), file, /tensor "w": unknown dtype "F8_E9M9"/);
  });

  it('overlapping offsets', () => {
    const file = rawFile(
      { a: { dtype: 'F32', shape: [1], data_offsets: [0, 4] }, b: { dtype: 'F32', shape: [2], data_offsets: [2, 10] } },
      new Uint8Array(10),
    );
    expectUserError(() => readSafetensors(file), file, /tensor "b" .*overlap tensor "a"/);
  });

  it('a hole between tensors', () => {
    const file = rawFile(
      { a: { dtype: 'F32', shape: [1], data_offsets: [0, 4] }, b: { dtype: 'F32', shape: [1], data_offsets: [8, 12] } },
      new Uint8Array(12),
    );
    expectUserError(() => readSafetensors(file), file, /tensor "b" starts at 8 .*unreferenced bytes/);
  });

  it('offsets outside the file (truncated data)', () => {
    const file = rawFile({ w: { dtype: 'F32', shape: [4], data_offsets: [0, 16] } }, eight);
    expectUserError(() => readSafetensors(file), file, /tensor "w": data_offsets \[0, 16\] lie outside the 8-byte data section/);
  });

  it('truncated file (last tensor cut off)', () => {
    const good = tmp();
    writeSafetensors(good, { a: { dtype: 'F32', shape: [4], data: new Float32Array(4) } });
    const bytes = fs.readFileSync(good);
    const cut = tmp();
    fs.writeFileSync(cut, bytes.subarray(0, bytes.byteLength - 3));
    expectUserError(() => readSafetensors(cut), cut, /tensor "a".*outside/);
  });

  it('shape and byte size disagree', () => {
    const file = rawFile({ w: { dtype: 'F16', shape: [2, 3], data_offsets: [0, 8] } }, eight);
    expectUserError(() => readSafetensors(file), file, /tensor "w": shape \[2, 3\] of F16 needs 12 bytes but data_offsets \[0, 8\] span 8/);
  });

  it('bad shape and offsets entries', () => {
    const f1 = rawFile({ w: { dtype: 'F32', shape: [-2], data_offsets: [0, 8] } }, eight);
    expectUserError(() => readSafetensors(f1), f1, /shape must be a list of non-negative integers/);
    const f2 = rawFile({ w: { dtype: 'F32', shape: [2], data_offsets: [8, 0] } }, eight);
    expectUserError(() => readSafetensors(f2), f2, /end before they begin/);
    const f3 = rawFile({ w: { dtype: 'F32', shape: [2], data_offsets: [0] } }, eight);
    expectUserError(() => readSafetensors(f3), f3, /data_offsets must be \[begin, end\]/);
  });

  it('trailing bytes after the last tensor', () => {
    const file = rawFile(okHeader, new Uint8Array(12));
    expectUserError(() => readSafetensors(file), file, /cover 8 bytes of a 12-byte data section/);
  });

  it('non-string metadata', () => {
    const file = rawFile({ __metadata__: { step: 3 }, ...okHeader }, eight);
    expectUserError(() => readSafetensors(file), file, /"__metadata__" value of "step" must be a string/);
  });

  it('missing file', () => {
    const file = path.join(dir, 'nope.safetensors');
    expectUserError(() => readSafetensors(file), file, /no such file/);
  });
});

describe('writer validation', () => {
  it('rejects data whose size does not match the shape, leaving no file behind', () => {
    const file = tmp();
    expectUserError(
      () => writeSafetensors(file, { w: { dtype: 'F32', shape: [3], data: new Float32Array(2) } }),
      file,
      /tensor "w": shape \[3\] of F32 needs 12 bytes, data has 8/,
    );
    expect(fs.existsSync(file)).toBe(false);
    expect(fs.readdirSync(dir).filter((f) => f.includes('.tmp-'))).toEqual([]);
  });

  it('rejects an array type that cannot hold the dtype', () => {
    const file = tmp();
    expectUserError(() => writeSafetensors(file, { w: { dtype: 'I32', shape: [1], data: new Float32Array(1) } }), file, /cannot be stored as I32/);
    expectUserError(() => writeSafetensors(file, { w: { dtype: 'F32', shape: [1], data: new Int32Array(1) } }), file, /Int32Array cannot hold F32/);
  });
});
