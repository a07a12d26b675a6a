/**
 * ONNX protobuf I/O for the graph builder: Graph → ModelProto bytes (with external data for large
 * weights, needed past protobuf's 2 GB message limit) and ModelProto bytes → Graph.
 */
import { existsSync, readFileSync } from 'node:fs';
import { writeFileAtomic } from '../io/atomic.ts';
import { basename, dirname, join } from 'node:path';
import { createRequire } from 'node:module';
import type { onnx as OnnxProto } from 'onnx-proto';
import { type DType, ONNX_DTYPE, BYTES_PER_ELEMENT, dtypeFromOnnx, type TypedArray } from './dtype.ts';
import { Graph, OPSET, type Attr, type ConstTensor, type Node, type Shape, type ValueInfo } from './graph.ts';

// required, not imported: importing this 330 kB CommonJS file makes Node scan it for its export
// names first, ~0.1 s of every process's start-up.
const { onnx } = createRequire(import.meta.url)('onnx-proto') as typeof import('onnx-proto');
type IModelProto = OnnxProto.IModelProto;
type ITensorProto = OnnxProto.ITensorProto;
type IValueInfoProto = OnnxProto.IValueInfoProto;
type IAttributeProto = OnnxProto.IAttributeProto;

/** IR version 8 pairs with opset 17 (and is the newest this protobuf schema knows). */
export const IR_VERSION = 8;
/** Above this many bytes of initializers a model is written with external data. */
export const EXTERNAL_DATA_THRESHOLD = 1_900_000_000;

export interface ModelOptions {
  opset?: number;
  producer?: string;
  docString?: string;
  metadata?: Record<string, string>;
}

function toNum(v: unknown): number {
  if (typeof v === 'number') return v;
  if (typeof v === 'bigint') return Number(v);
  if (v && typeof (v as { toNumber?: () => number }).toNumber === 'function') return (v as { toNumber: () => number }).toNumber();
  return Number(v);
}

function bytesOf(data: TypedArray): Uint8Array {
  return new Uint8Array(data.buffer, data.byteOffset, data.byteLength);
}

function valueInfo(v: ValueInfo): IValueInfoProto {
  const tensorType: Record<string, unknown> = { elemType: ONNX_DTYPE[v.dtype] };
  if (v.shape) {
    tensorType.shape = {
      dim: v.shape.map((d) => (typeof d === 'number' ? { dimValue: d } : d === '?' ? {} : { dimParam: d })),
    };
  }
  return { name: v.name, type: { tensorType } };
}

function tensorProto(name: string, t: ConstTensor): ITensorProto {
  return { name, dims: t.dims, dataType: ONNX_DTYPE[t.dtype], rawData: bytesOf(t.data) };
}

function attrProto(name: string, a: Attr): IAttributeProto {
  const T = onnx.AttributeProto.AttributeType;
  switch (a.kind) {
    case 'int':
      return { name, type: T.INT, i: a.value };
    case 'float':
      return { name, type: T.FLOAT, f: a.value };
    case 'ints':
      return { name, type: T.INTS, ints: a.value };
    case 'floats':
      return { name, type: T.FLOATS, floats: a.value };
    case 'string':
      return { name, type: T.STRING, s: new TextEncoder().encode(a.value) };
    case 'strings':
      return { name, type: T.STRINGS, strings: a.value.map((s) => new TextEncoder().encode(s)) };
    case 'tensor':
      return { name, type: T.TENSOR, t: tensorProto('', a.value) };
  }
}

/** Builds the ModelProto of a graph; `external` maps initializer names to their external-data entries. */
export function toModelProto(g: Graph, opts: ModelOptions = {}, external?: Map<string, { location: string; offset: number; length: number }>): IModelProto {
  const initializer: ITensorProto[] = [];
  for (const [name, t] of g.initializers) {
    const ext = external?.get(name);
    if (ext) {
      initializer.push({
        name,
        dims: t.dims,
        dataType: ONNX_DTYPE[t.dtype],
        dataLocation: onnx.TensorProto.DataLocation.EXTERNAL,
        externalData: [
          { key: 'location', value: ext.location },
          { key: 'offset', value: String(ext.offset) },
          { key: 'length', value: String(ext.length) },
        ],
      });
    } else {
      initializer.push(tensorProto(name, t));
    }
  }
  const domains = new Set(g.nodes.map((n) => n.domain).filter((d) => d !== ''));
  return {
    irVersion: IR_VERSION,
    producerName: opts.producer ?? 'prefzoo',
    docString: opts.docString,
    opsetImport: [{ domain: '', version: opts.opset ?? OPSET }, ...[...domains].map((domain) => ({ domain, version: 1 }))],
    metadataProps: Object.entries(opts.metadata ?? {}).map(([key, value]) => ({ key, value })),
    graph: {
      name: g.name,
      node: g.nodes.map((n) => ({
        name: n.name,
        opType: n.op,
        domain: n.domain || undefined,
        input: n.inputs,
        output: n.outputs,
        attribute: Object.entries(n.attrs).map(([k, a]) => attrProto(k, a)),
      })),
      input: g.inputs.map(valueInfo),
      output: g.outputs.map(valueInfo),
      initializer,
    },
  };
}

/** Serialises a graph whose initializers fit in one protobuf message. */
export function serializeModel(g: Graph, opts: ModelOptions = {}): Uint8Array {
  return onnx.ModelProto.encode(onnx.ModelProto.fromObject(toModelProto(g, opts))).finish();
}

/** Initializers of at least this many bytes are written by {@link serializeModelInto} itself. */
const SPLICED_BYTES = 1 << 16;

/** The protobuf varint of `n`'s length in bytes. */
function varintLength(n: number): number {
  let k = 1;
  while (n >= 128) {
    n = Math.floor(n / 128);
    k++;
  }
  return k;
}

function writeVarint(out: Uint8Array, at: number, n: number): number {
  while (n >= 128) {
    out[at++] = (n % 128) | 128;
    n = Math.floor(n / 128);
  }
  out[at++] = n;
  return at;
}

/**
 * The model of {@link serializeModel} (the same ModelProto), written into `reuse` when it is long
 * enough, else into a new buffer (the caller keeps `result.buffer` for the next call): a graph rebuilt
 * over large initializers, as the quantized decoder's after each weight update, then costs no fresh
 * memory, whose first touch is what made protobufjs' copy slow (about 17 ms per MB on the 2-core
 * machine: docs/performance.md). Initializers of 64 KiB and more are written after the others' fields
 * (protobuf merges a message's fields in any order; a repeated field's entries keep their order
 * among themselves), each raw_data copied once.
 */
export function serializeModelInto(g: Graph, reuse: Uint8Array | null, opts: ModelOptions = {}): Uint8Array {
  const big = [...g.initializers].filter(([, t]) => t.data.byteLength >= SPLICED_BYTES);
  const spliced = new Set(big.map(([name]) => name));
  const proto = toModelProto(g, opts);
  const graph = proto.graph!;
  const small = { ...graph, initializer: graph.initializer!.filter((t) => !spliced.has(t.name!)) };
  const head = onnx.ModelProto.encode(onnx.ModelProto.fromObject({ ...proto, graph: undefined })).finish();
  const graphHead = onnx.GraphProto.encode(onnx.GraphProto.fromObject(small)).finish();
  // TensorProto field 9 (raw_data) and GraphProto field 5 (initializer), ModelProto field 7 (graph): wire type 2.
  const tensors = big.map(([name, t]) => {
    const fields = onnx.TensorProto.encode(onnx.TensorProto.fromObject({ name, dims: t.dims, dataType: ONNX_DTYPE[t.dtype] })).finish();
    const n = t.data.byteLength;
    const length = fields.length + 1 + varintLength(n) + n;
    return { fields, data: bytesOf(t.data), length };
  });
  const graphLength = graphHead.length + tensors.reduce((a, t) => a + 1 + varintLength(t.length) + t.length, 0);
  const total = head.length + 1 + varintLength(graphLength) + graphLength;
  // A new buffer has 1/64 to spare, for a slightly larger graph next time (a step's beside a prefill's).
  const out = (reuse && reuse.byteLength >= total ? reuse : new Uint8Array(total + (total >> 6))).subarray(0, total);
  out.set(head, 0);
  let at = head.length;
  out[at++] = (7 << 3) | 2;
  at = writeVarint(out, at, graphLength);
  out.set(graphHead, at);
  at += graphHead.length;
  for (const t of tensors) {
    out[at++] = (5 << 3) | 2;
    at = writeVarint(out, at, t.length);
    out.set(t.fields, at);
    at += t.fields.length;
    out[at++] = (9 << 3) | 2;
    at = writeVarint(out, at, t.data.byteLength);
    out.set(t.data, at);
    at += t.data.byteLength;
  }
  if (at !== total) throw new Error(`serializeModelInto: wrote ${at} bytes of ${total}`);
  return out;
}

function initializerBytes(g: Graph): number {
  let n = 0;
  for (const t of g.initializers.values()) n += t.data.byteLength;
  return n;
}

/**
 * Writes a model atomically. Past `EXTERNAL_DATA_THRESHOLD` bytes of initializers (or when
 * `externalData` is forced) the larger weights go to `<file>.data` beside it, as ONNX external data.
 */
export function saveModel(g: Graph, path: string, opts: ModelOptions & { externalData?: boolean } = {}): void {
  const useExternal = opts.externalData ?? initializerBytes(g) > EXTERNAL_DATA_THRESHOLD;
  let external: Map<string, { location: string; offset: number; length: number }> | undefined;
  if (useExternal) {
    external = new Map();
    const dataName = `${basename(path)}.data`;
    const chunks: Uint8Array[] = [];
    let offset = 0;
    for (const [name, t] of g.initializers) {
      if (t.data.byteLength < 1024) continue;
      const pad = (64 - (offset % 64)) % 64; // align each tensor for memory mapping
      if (pad) chunks.push(new Uint8Array(pad));
      offset += pad;
      chunks.push(bytesOf(t.data));
      external.set(name, { location: dataName, offset, length: t.data.byteLength });
      offset += t.data.byteLength;
    }
    writeFileAtomic(join(dirname(path), dataName), chunks);
  }
  writeFileAtomic(path, onnx.ModelProto.encode(onnx.ModelProto.fromObject(toModelProto(g, opts, external))).finish());
}

function typedFromBytes(dtype: DType, bytes: Uint8Array): TypedArray {
  const copy = new Uint8Array(bytes); // aligned copy
  const n = copy.byteLength / BYTES_PER_ELEMENT[dtype];
  switch (dtype) {
    case 'float32':
      return new Float32Array(copy.buffer, 0, n);
    case 'float64':
      return new Float64Array(copy.buffer, 0, n);
    case 'int64':
      return new BigInt64Array(copy.buffer, 0, n);
    case 'int32':
      return new Int32Array(copy.buffer, 0, n);
    case 'int8':
      return new Int8Array(copy.buffer, 0, n);
    case 'uint8':
    case 'bool':
      return copy;
    case 'float16':
    case 'bfloat16':
      return new Uint16Array(copy.buffer, 0, n);
  }
}

function readTensor(t: ITensorProto, baseDir?: string): ConstTensor {
  const dtype = dtypeFromOnnx(t.dataType ?? 0);
  const dims = (t.dims ?? []).map(toNum);
  const count = dims.reduce((a, b) => a * b, 1);
  if (t.dataLocation === onnx.TensorProto.DataLocation.EXTERNAL) {
    const kv = Object.fromEntries((t.externalData ?? []).map((e) => [e.key, e.value]));
    if (!baseDir) throw new Error(`tensor ${t.name} uses external data but no base directory was given`);
    const file = join(baseDir, String(kv.location));
    if (!existsSync(file)) throw new Error(`${file}: external data of tensor ${t.name} is missing`);
    const all = readFileSync(file);
    const offset = Number(kv.offset ?? 0);
    const length = kv.length !== undefined ? Number(kv.length) : count * BYTES_PER_ELEMENT[dtype];
    if (offset + length > all.byteLength) throw new Error(`${file}: tensor ${t.name} lies beyond the end of the file`);
    return { dtype, dims, data: typedFromBytes(dtype, all.subarray(offset, offset + length)) };
  }
  if (t.rawData && t.rawData.length) return { dtype, dims, data: typedFromBytes(dtype, t.rawData) };
  // Typed fields: ONNX stores small ints (incl. bool, half bits) in int32_data.
  let data: TypedArray;
  switch (dtype) {
    case 'float32':
      data = Float32Array.from(t.floatData ?? []);
      break;
    case 'float64':
      data = Float64Array.from(t.doubleData ?? []);
      break;
    case 'int64':
      data = BigInt64Array.from((t.int64Data ?? []).map((v) => BigInt(toNum(v))));
      break;
    case 'int32':
      data = Int32Array.from(t.int32Data ?? []);
      break;
    case 'int8':
      data = Int8Array.from(t.int32Data ?? []);
      break;
    case 'uint8':
    case 'bool':
      data = Uint8Array.from(t.int32Data ?? []);
      break;
    case 'float16':
    case 'bfloat16':
      data = Uint16Array.from(t.int32Data ?? []);
      break;
  }
  if (data.length !== count) throw new Error(`tensor ${t.name}: ${data.length} values for dims [${dims}]`);
  return { dtype, dims, data };
}

function readAttr(a: IAttributeProto): Attr {
  const T = onnx.AttributeProto.AttributeType;
  switch (a.type) {
    case T.INT:
      return { kind: 'int', value: toNum(a.i) };
    case T.FLOAT:
      return { kind: 'float', value: a.f ?? 0 };
    case T.INTS:
      return { kind: 'ints', value: (a.ints ?? []).map(toNum) };
    case T.FLOATS:
      return { kind: 'floats', value: a.floats ?? [] };
    case T.STRING:
      return { kind: 'string', value: new TextDecoder().decode(a.s ?? new Uint8Array()) };
    case T.STRINGS:
      return { kind: 'strings', value: (a.strings ?? []).map((s) => new TextDecoder().decode(s)) };
    case T.TENSOR:
      return { kind: 'tensor', value: readTensor(a.t!) };
    default:
      throw new Error(`attribute ${a.name}: type ${a.type} (subgraphs, sparse tensors) is not supported`);
  }
}

function readValueInfo(v: IValueInfoProto): ValueInfo {
  const tt = v.type?.tensorType;
  if (!tt) throw new Error(`value ${v.name} is not a tensor`);
  const shape: Shape | null = tt.shape
    ? (tt.shape.dim ?? []).map((d) => (d.dimValue !== undefined && d.dimValue !== null && toNum(d.dimValue) !== 0 ? toNum(d.dimValue) : d.dimParam || (d.dimValue !== undefined && d.dimValue !== null ? toNum(d.dimValue) : '?')))
    : null;
  return { name: v.name ?? '', dtype: dtypeFromOnnx(tt.elemType ?? 0), shape };
}

/** Reads a ModelProto back into a Graph. `baseDir` resolves external data. */
export function parseModel(bytes: Uint8Array, baseDir?: string): { graph: Graph; opset: number; metadata: Record<string, string> } {
  const m = onnx.ModelProto.decode(bytes);
  const gp = m.graph;
  if (!gp) throw new Error('model has no graph');
  const g = new Graph(gp.name || 'model');
  const info = new Map<string, ValueInfo>();
  for (const v of [...(gp.valueInfo ?? []), ...(gp.output ?? [])]) info.set(v.name ?? '', readValueInfo(v));
  const initNames = new Set((gp.initializer ?? []).map((t) => t.name ?? ''));
  for (const t of gp.initializer ?? []) g.initializer(t.name ?? '', readTensor(t, baseDir));
  for (const v of gp.input ?? []) {
    if (initNames.has(v.name ?? '')) continue; // old-style models list initializers as inputs too
    const vi = readValueInfo(v);
    g.input(vi.name, vi.dtype, vi.shape);
  }
  for (const n of gp.node ?? []) {
    const node: Node = {
      op: n.opType ?? '',
      domain: n.domain ?? '',
      name: n.name || g.uniq(n.opType ?? 'node'),
      inputs: n.input ?? [],
      outputs: n.output ?? [],
      attrs: Object.fromEntries((n.attribute ?? []).map((a) => [a.name ?? '', readAttr(a)])),
    };
    g.addNode(node, (name) => info.get(name));
  }
  for (const v of gp.output ?? []) g.outputs.push(readValueInfo(v));
  const opset = toNum((m.opsetImport ?? []).find((o) => !o.domain)?.version ?? OPSET);
  const metadata = Object.fromEntries((m.metadataProps ?? []).map((p) => [p.key ?? '', p.value ?? '']));
  return { graph: g, opset, metadata };
}

export function loadModel(path: string): { graph: Graph; opset: number; metadata: Record<string, string> } {
  return parseModel(readFileSync(path), dirname(path));
}
