/**
 * Named tensors that live across steps (parameters, optimizer state, gradients), fed to sessions as
 * ort.Tensors and replaced by graph outputs without a JS-side copy.
 *
 * Two ways of taking a graph's output as an entry's next value:
 * - 'adopt' (default): the output tensor ONNX Runtime returns becomes the entry; the binding
 *   allocates it natively, nothing is allocated or copied in JS, and the previous buffer is left
 *   to the garbage collector.
 * - 'preallocated': every entry owns two buffers; the back one is passed as a pre-allocated fetch
 *   and swapped to the front after the run, so the entry's storage never changes. onnxruntime-node
 *   1.30 fills such a fetch by copying ORT's own output into it and still returns that output as a
 *   separate buffer, so this mode adds a copy per output and holds twice the memory: equal speed at
 *   1M floats, ~1.3x slower at 5M (scripts/bench/output-buffers.ts). It exists for callers that need
 *   stable storage (views into one slab, buffers shared with other code).
 */
import type { DType, TypedArray } from '../onnx/dtype.ts';
import { BYTES_PER_ELEMENT } from '../onnx/dtype.ts';
import { type Feeds, type Session, ort, toOrt } from './session.ts';

export type OutputMode = 'adopt' | 'preallocated';

interface Entry {
  dtype: DType;
  dims: number[];
  front: ort.Tensor;
  back: ort.Tensor | null;
}

function alloc(dtype: DType, n: number): TypedArray {
  switch (dtype) {
    case 'float32':
      return new Float32Array(n);
    case 'float64':
      return new Float64Array(n);
    case 'int64':
      return new BigInt64Array(n);
    case 'int32':
      return new Int32Array(n);
    case 'int8':
      return new Int8Array(n);
    case 'uint8':
    case 'bool':
      return new Uint8Array(n);
    case 'float16':
    case 'bfloat16':
      return new Uint16Array(n);
  }
}

const numel = (dims: readonly number[]) => dims.reduce((a, b) => a * b, 1);

export class TensorStore {
  private entries = new Map<string, Entry>();

  constructor(readonly mode: OutputMode = 'adopt') {}

  /**
   * Declares an entry of zeros (or a copy of `init`). `storage`: an array the entry lives in instead
   * of a new one (in 'adopt' mode it is replaced by the first run that updates the entry).
   */
  define(name: string, dtype: DType, dims: readonly number[], init?: ArrayLike<number> | TypedArray, storage?: TypedArray): void {
    if (this.entries.has(name)) throw new Error(`tensor store: ${name} is defined twice`);
    const n = numel(dims);
    if (storage && storage.length !== n) throw new Error(`tensor store: ${name} has ${n} elements, its storage ${storage.length}`);
    const front = storage ?? alloc(dtype, n);
    if (init) {
      if (init.length !== n) throw new Error(`tensor store: ${name} has ${n} elements, got ${init.length} values`);
      (front as Float32Array).set(init as ArrayLike<number>);
    }
    this.entries.set(name, {
      dtype,
      dims: [...dims],
      front: toOrt(dtype, front, dims),
      back: this.mode === 'preallocated' ? toOrt(dtype, alloc(dtype, n), dims) : null,
    });
  }

  has(name: string): boolean {
    return this.entries.has(name);
  }

  names(): string[] {
    return [...this.entries.keys()];
  }

  private entry(name: string): Entry {
    const e = this.entries.get(name);
    if (!e) throw new Error(`tensor store: no tensor named ${name}`);
    return e;
  }

  /** The current value as an ort.Tensor (valid until the next run that updates it). */
  tensor(name: string): ort.Tensor {
    return this.entry(name).front;
  }

  /** The current values (a live view: do not keep it across runs that update the entry). */
  data(name: string): TypedArray {
    return this.entry(name).front.data as TypedArray;
  }

  dims(name: string): number[] {
    return this.entry(name).dims;
  }

  dtype(name: string): DType {
    return this.entry(name).dtype;
  }

  /** Overwrites the current values in place. */
  write(name: string, values: ArrayLike<number> | TypedArray): void {
    const d = this.data(name);
    if (values.length !== d.length) throw new Error(`tensor store: ${name} has ${d.length} elements, got ${values.length} values`);
    (d as Float32Array).set(values as ArrayLike<number>);
  }

  /** Sets every element to zero. */
  zero(name: string): void {
    const d = this.data(name);
    if (d instanceof BigInt64Array) d.fill(0n);
    else d.fill(0);
  }

  /** Bytes held by the store (both buffers in 'preallocated' mode). */
  get byteSize(): number {
    let n = 0;
    for (const e of this.entries.values()) n += numel(e.dims) * BYTES_PER_ELEMENT[e.dtype] * (e.back ? 2 : 1);
    return n;
  }

  /**
   * Runs `session` on `feeds`. Each `[output, entry]` of `updates` becomes the entry's next value;
   * the outputs listed in `fetch` are returned. Entries are only replaced after the run succeeds, and
   * only if `accept` (given the outputs) says so.
   */
  async run(
    session: Session,
    feeds: Feeds,
    updates: readonly (readonly [string, string])[],
    fetch: readonly string[],
    accept?: (outputs: Record<string, ort.Tensor>) => boolean,
  ): Promise<Record<string, ort.Tensor>> {
    const fetches: Record<string, ort.Tensor | null> = {};
    for (const name of fetch) fetches[name] = null;
    for (const [out, name] of updates) {
      const e = this.entry(name);
      fetches[out] = e.back; // null in 'adopt' mode: ORT allocates
    }
    const result = await session.run(feeds, fetches);
    if (accept && !accept(result)) return result;
    for (const [out, name] of updates) {
      const e = this.entry(name);
      if (e.back) {
        const t = e.front;
        e.front = e.back;
        e.back = t;
      } else {
        const r = result[out];
        if (r.type !== e.front.type || r.dims.length !== e.dims.length || r.dims.some((d, i) => d !== e.dims[i])) {
          throw new Error(`tensor store: output ${out} is ${r.type}[${r.dims}], entry ${name} is ${e.front.type}[${e.dims}]`);
        }
        e.front = r;
      }
    }
    return result;
  }
}
