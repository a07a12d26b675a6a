/** Element types the graph builder knows, with their ONNX TensorProto codes and JS storage. */
export type DType =
  | 'float32'
  | 'float64'
  | 'float16'
  | 'bfloat16'
  | 'int64'
  | 'int32'
  | 'int8'
  | 'uint8'
  | 'bool';

export const ONNX_DTYPE: Record<DType, number> = {
  float32: 1,
  uint8: 2,
  int8: 3,
  int32: 6,
  int64: 7,
  bool: 9,
  float16: 10,
  float64: 11,
  bfloat16: 16,
};

const FROM_ONNX = new Map<number, DType>(Object.entries(ONNX_DTYPE).map(([k, v]) => [v, k as DType]));

export function dtypeFromOnnx(code: number): DType {
  const d = FROM_ONNX.get(code);
  if (!d) throw new Error(`unsupported ONNX element type ${code}`);
  return d;
}

export const BYTES_PER_ELEMENT: Record<DType, number> = {
  float32: 4,
  float64: 8,
  float16: 2,
  bfloat16: 2,
  int64: 8,
  int32: 4,
  int8: 1,
  uint8: 1,
  bool: 1,
};

export function isFloat(d: DType): boolean {
  return d === 'float32' || d === 'float64' || d === 'float16' || d === 'bfloat16';
}

/** Typed arrays used to hold tensor data in JS; half types are kept as raw uint16 bit patterns. */
export type TypedArray =
  | Float32Array
  | Float64Array
  | BigInt64Array
  | Int32Array
  | Int8Array
  | Uint8Array
  | Uint16Array;

/** Makes a typed array of dtype `d` from plain numbers (bool: 0/1). */
export function typedArrayFrom(d: DType, values: ArrayLike<number> | number[]): TypedArray {
  switch (d) {
    case 'float32':
      return Float32Array.from(values);
    case 'float64':
      return Float64Array.from(values);
    case 'int64':
      return BigInt64Array.from(Array.from(values, (v) => BigInt(Math.trunc(v))));
    case 'int32':
      return Int32Array.from(values);
    case 'int8':
      return Int8Array.from(values);
    case 'uint8':
    case 'bool':
      return Uint8Array.from(values, (v) => (d === 'bool' ? (v ? 1 : 0) : v));
    case 'float16':
    case 'bfloat16':
      throw new Error(`typedArrayFrom: ${d} constants must be given as raw bits`);
  }
}

/** Reads element i of a typed array as a JS number. */
export function elementAsNumber(a: TypedArray, i: number): number {
  const v = a[i];
  return typeof v === 'bigint' ? Number(v) : (v as number);
}
