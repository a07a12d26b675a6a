/**
 * Readers written from the file formats' specifications, sharing no code with prefzoo's writers or
 * with parquet-wasm / apache-arrow, for checking what Python's readers (pyarrow under
 * `datasets.load_dataset("parquet")`, safetensors under transformers and PEFT) will see.
 *
 * Parquet: a file ends with the footer, a Thrift compact-protocol FileMetaData, then its length as
 * a little-endian uint32, then "PAR1". FileMetaData: 1 version i32, 2 schema list<SchemaElement>,
 * 3 num_rows i64, 4 row_groups, 5 key_value_metadata list<KeyValue{1 key, 2 value}>, 6 created_by.
 * SchemaElement: 1 type i32, 3 repetition_type i32, 4 name, 5 num_children i32, 6 converted_type
 * i32, 10 logicalType (a union struct: 1 STRING, 3 LIST, …).
 * safetensors: a little-endian uint64 N, an N-byte JSON header {name: {dtype, shape, data_offsets}}
 * plus an optional "__metadata__" string map, then the tensor bytes.
 */
import { readFileSync } from 'node:fs';

/** Thrift compact protocol, the subset FileMetaData needs (unknown fields are skipped). */
class Compact {
  i = 0;
  constructor(private readonly b: Buffer) {}

  varint(): bigint {
    let v = 0n;
    let shift = 0n;
    for (;;) {
      const x = this.b[this.i++];
      v |= BigInt(x & 0x7f) << shift;
      if (!(x & 0x80)) return v;
      shift += 7n;
    }
  }

  zigzag(): number {
    const v = this.varint();
    return Number((v >> 1n) ^ -(v & 1n));
  }

  binary(): Buffer {
    const n = Number(this.varint());
    const out = this.b.subarray(this.i, this.i + n);
    this.i += n;
    return out;
  }

  /** Reads a struct: field id → value, via `onField` for the fields it wants (others skipped). */
  struct(onField: (id: number, type: number) => boolean): void {
    let last = 0;
    for (;;) {
      const h = this.b[this.i++];
      if (h === 0) return;
      const delta = h >> 4;
      const type = h & 0x0f;
      const id = delta ? last + delta : this.zigzag();
      last = id;
      if (!onField(id, type)) this.skipValue(type);
    }
  }

  list<T>(read: (elemType: number) => T): T[] {
    const h = this.b[this.i++];
    let n = h >> 4;
    const type = h & 0x0f;
    if (n === 15) n = Number(this.varint());
    return Array.from({ length: n }, () => read(type));
  }

  skipValue(type: number): void {
    if (type === 1 || type === 2) return; // booleans live in the header
    if (type === 3) this.i++;
    else if (type === 4 || type === 5 || type === 6) this.varint();
    else if (type === 7) this.i += 8;
    else if (type === 8) this.binary();
    else if (type === 9 || type === 10) this.list((t) => this.skipValue(t));
    else if (type === 11) {
      const n = Number(this.varint());
      if (n > 0) {
        const kv = this.b[this.i++];
        for (let k = 0; k < n; k++) {
          this.skipValue(kv >> 4);
          this.skipValue(kv & 0x0f);
        }
      }
    } else if (type === 12) this.struct(() => false);
    else throw new Error(`thrift compact: unknown type ${type} at byte ${this.i}`);
  }
}

export interface ParquetSchemaNode {
  name: string;
  /** Physical type: 0 BOOLEAN, 1 INT32, 2 INT64, 4 FLOAT, 5 DOUBLE, 6 BYTE_ARRAY (leaves only). */
  type?: number;
  /** 0 REQUIRED, 1 OPTIONAL, 2 REPEATED. */
  repetition?: number;
  /** 0 UTF8, 3 LIST, … */
  convertedType?: number;
  /** The set member of the LogicalType union: 1 STRING, 3 LIST, … */
  logicalType?: number;
  children: ParquetSchemaNode[];
}

export interface ParquetFooter {
  numRows: number;
  schema: ParquetSchemaNode;
  keyValue: Map<string, string>;
}

export function readParquetFooter(file: string): ParquetFooter {
  const b = readFileSync(file);
  if (b.subarray(0, 4).toString('latin1') !== 'PAR1' || b.subarray(-4).toString('latin1') !== 'PAR1') throw new Error(`${file}: no PAR1 magic`);
  const len = b.readUInt32LE(b.length - 8);
  const t = new Compact(b.subarray(b.length - 8 - len, b.length - 8));
  const flat: (Omit<ParquetSchemaNode, 'children'> & { numChildren: number })[] = [];
  let numRows = 0;
  const keyValue = new Map<string, string>();
  t.struct((id) => {
    if (id === 2) {
      t.list(() => {
        const e: Omit<ParquetSchemaNode, 'children'> & { numChildren: number } = { name: '', numChildren: 0 };
        t.struct((f, type) => {
          if (f === 1) e.type = t.zigzag();
          else if (f === 3) e.repetition = t.zigzag();
          else if (f === 4) e.name = t.binary().toString('utf8');
          else if (f === 5) e.numChildren = t.zigzag();
          else if (f === 6) e.convertedType = t.zigzag();
          else if (f === 10 && type === 12) t.struct((member) => ((e.logicalType = member), false));
          else return false;
          return true;
        });
        flat.push(e);
      });
      return true;
    }
    if (id === 3) {
      numRows = Number(t.varint() >> 1n);
      return true;
    }
    if (id === 5) {
      t.list(() => {
        let k = '';
        let v = '';
        t.struct((f) => {
          if (f === 1) k = t.binary().toString('utf8');
          else if (f === 2) v = t.binary().toString('utf8');
          else return false;
          return true;
        });
        keyValue.set(k, v);
      });
      return true;
    }
    return false;
  });
  // The schema is a depth-first list; each group says how many children follow it.
  let at = 0;
  const build = (): ParquetSchemaNode => {
    const { numChildren, ...e } = flat[at++];
    return { ...e, children: Array.from({ length: numChildren }, build) };
  };
  return { numRows, schema: build(), keyValue };
}

export interface SafetensorsHeader {
  tensors: Map<string, { dtype: string; shape: number[]; begin: number; end: number }>;
  metadata: Record<string, string> | null;
  /** Bytes after the header; the tensors must tile them exactly. */
  dataBytes: number;
}

export function readSafetensorsHeader(file: string): SafetensorsHeader {
  const b = readFileSync(file);
  const n = Number(b.readBigUInt64LE(0));
  const header = JSON.parse(b.subarray(8, 8 + n).toString('utf8')) as Record<string, unknown>;
  const tensors = new Map<string, { dtype: string; shape: number[]; begin: number; end: number }>();
  let metadata: Record<string, string> | null = null;
  for (const [k, v] of Object.entries(header)) {
    if (k === '__metadata__') metadata = v as Record<string, string>;
    else {
      const t = v as { dtype: string; shape: number[]; data_offsets: [number, number] };
      tensors.set(k, { dtype: t.dtype, shape: t.shape, begin: t.data_offsets[0], end: t.data_offsets[1] });
    }
  }
  return { tensors, metadata, dataBytes: b.length - 8 - n };
}
