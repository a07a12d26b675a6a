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

/**
 * Moves tensors between host memory and the device (WebGPU): `toDevice` returns a GPU-buffer copy of
 * a host tensor, `toHost` a host copy of a GPU-buffer tensor. See src/runtime/transfer.ts.
 */
export interface DeviceTransfer {
  toDevice(t: ort.Tensor): Promise<ort.Tensor>;
  toHost(t: ort.Tensor): Promise<ort.Tensor>;
}

const onDevice = (t: ort.Tensor) => t.location === 'gpu-buffer';

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
  /** Host copies of device entries, valid until the entry is next replaced (see `toHost`). */
  private hostCopies = new Map<string, ort.Tensor>();

  /** `device`: entries live on the device between runs (WebGPU); host copies only on request. */
  constructor(
    readonly mode: OutputMode = 'adopt',
    readonly device: DeviceTransfer | null = null,
  ) {
    if (device && mode !== 'adopt') throw new Error('tensor store: device tensors are adopted from outputs, not preallocated');
  }

  /** Copies every host entry to the device (parameters as loaded, values written with `write`). */
  async toDevice(): Promise<void> {
    if (!this.device) return;
    for (const e of this.entries.values()) {
      if (onDevice(e.front)) continue;
      e.front = await this.device.toDevice(e.front);
    }
  }

  /** Makes `data()` valid for every device entry by copying it to the host (for checkpoints). */
  async toHost(): Promise<void> {
    if (!this.device) return;
    for (const [name, e] of this.entries) {
      if (onDevice(e.front) && !this.hostCopies.has(name)) this.hostCopies.set(name, await this.device.toHost(e.front));
    }
  }

  /** Whether `name` currently lives on the device. */
  onDevice(name: string): boolean {
    return onDevice(this.entry(name).front);
  }

  /** Replaces an entry's value, freeing the device buffer it held. */
  private replace(name: string, e: Entry, t: ort.Tensor): void {
    if (onDevice(e.front) && e.front !== t) e.front.dispose();
    e.front = t;
    this.hostCopies.delete(name);
  }

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

  /**
   * The current values (a live view: do not keep it across runs that update the entry). A device
   * entry needs `await toHost()` first, and its view is a copy: `write` to change it.
   */
  data(name: string): TypedArray {
    const e = this.entry(name);
    if (!onDevice(e.front)) return e.front.data as TypedArray;
    const copy = this.hostCopies.get(name);
    if (!copy) throw new Error(`tensor store: ${name} is on the device; await toHost() before reading it`);
    return copy.data as TypedArray;
  }

  dims(name: string): number[] {
    return this.entry(name).dims;
  }

  dtype(name: string): DType {
    return this.entry(name).dtype;
  }

  /** Overwrites the current values (in place on the host; a device entry moves to the host until `toDevice`). */
  write(name: string, values: ArrayLike<number> | TypedArray): void {
    const e = this.entry(name);
    if (onDevice(e.front)) this.replace(name, e, toOrt(e.dtype, alloc(e.dtype, numel(e.dims)), e.dims));
    const d = e.front.data as TypedArray;
    if (values.length !== d.length) throw new Error(`tensor store: ${name} has ${d.length} elements, got ${values.length} values`);
    (d as Float32Array).set(values as ArrayLike<number>);
  }

  /**
   * Lets go of a host entry's values: the entry gets a new zero array (pages the system hands out only
   * when written; in 'adopt' mode the next run replaces it) and the old buffer is left to the garbage
   * collector. For gradients once the optimizer has read them, so that they are not alive next to
   * the next run's own.
   */
  drop(name: string): void {
    const e = this.entry(name);
    if (onDevice(e.front) || e.back) return;
    e.front = toOrt(e.dtype, alloc(e.dtype, numel(e.dims)), e.dims);
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
    if (accept && !accept(result)) {
      for (const [out] of updates) if (onDevice(result[out])) result[out].dispose();
      return result;
    }
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
        this.replace(name, e, r);
      }
    }
    return result;
  }
}
