/**
 * Column builders that write values straight into Arrow buffers: UTF-8 bytes plus Int32 offsets,
 * Float64Array, bitmaps. apache-arrow's generic builders cost a virtual call chain per value, which
 * made conversion ~13x slower than parsing; these cost one Buffer.write per string.
 */
import * as arrow from './arrow.ts';
import { COLUMN_CLASS, type Message, type Text, type TextMode, columnType, hasToolFields, messageType } from './schema.ts';

/** Validity bitmap, allocated only once a null appears (most columns never have one). */
class Validity {
  bits: Uint8Array | null = null;
  nullCount = 0;

  set(index: number, valid: boolean): void {
    if (valid && this.bits === null) return;
    if (this.bits === null) {
      this.bits = new Uint8Array(Math.max(64, (index >> 3) * 2 + 1)).fill(0xff);
    } else if ((index >> 3) >= this.bits.length) {
      const grown = new Uint8Array(this.bits.length * 2 + 1).fill(0xff);
      grown.set(this.bits);
      this.bits = grown;
    }
    if (valid) return;
    this.bits[index >> 3] &= ~(1 << (index & 7));
    this.nullCount++;
  }

  /** The bitmap for `length` rows (undefined when there are no nulls), then resets. */
  take(length: number): Uint8Array | undefined {
    const out = this.bits ? this.bits.subarray(0, (length + 7) >> 3) : undefined;
    this.bits = null;
    this.nullCount = 0;
    return out;
  }
}

function growInt32(a: Int32Array, need: number): Int32Array {
  const b = new Int32Array(Math.max(need, a.length * 2));
  b.set(a);
  return b;
}

export interface ColumnBuilder<T> {
  readonly type: arrow.DataType;
  /** Rows pushed since the last finish(). */
  readonly length: number;
  /** Bytes held so far: how flushes decide a batch is big enough. */
  readonly byteSize: number;
  push(value: T | null): void;
  /**
   * The Arrow data of the rows pushed so far; the builder starts empty afterwards. `type` is the
   * schema's type where a builder can write more than one (messages with or without tool fields).
   */
  finish(type?: arrow.DataType): arrow.Data;
}

export class Utf8Builder implements ColumnBuilder<string> {
  readonly type = new arrow.Utf8();
  length = 0;
  private bytes: Buffer = Buffer.allocUnsafe(1 << 16);
  private pos = 0;
  private offsets: Int32Array = new Int32Array(1024);
  private validity = new Validity();

  get byteSize(): number {
    return this.pos + 4 * this.length;
  }

  push(s: string | null): void {
    const i = this.length;
    if (i + 2 > this.offsets.length) this.offsets = growInt32(this.offsets, i + 2);
    if (s === null) {
      this.validity.set(i, false);
    } else {
      this.validity.set(i, true);
      // A UTF-16 code unit never needs more than 3 UTF-8 bytes, so this bound makes the write whole.
      const need = this.pos + s.length * 3;
      if (need > this.bytes.length) {
        const grown = Buffer.allocUnsafe(Math.max(need, this.bytes.length * 2));
        this.bytes.copy(grown, 0, 0, this.pos);
        this.bytes = grown;
      }
      this.pos += this.bytes.write(s, this.pos);
    }
    this.offsets[i + 1] = this.pos;
    this.length = i + 1;
  }

  finish(): arrow.Data<arrow.Utf8> {
    const length = this.length;
    const nullCount = this.validity.nullCount;
    const data = arrow.makeData({
      type: this.type,
      length,
      nullCount,
      nullBitmap: this.validity.take(length),
      valueOffsets: this.offsets.subarray(0, length + 1),
      data: new Uint8Array(this.bytes.buffer, this.bytes.byteOffset, this.pos),
    });
    this.bytes = Buffer.allocUnsafe(Math.max(1 << 16, this.pos));
    this.offsets = new Int32Array(Math.max(1024, length + 1));
    this.pos = 0;
    this.length = 0;
    return data;
  }
}

/**
 * List<Struct<role, content>>, or with tool fields List<Struct<role, content, tool_calls,
 * tool_call_id, name>> (datasets/schema.ts): one conversation per row. It keeps all five and
 * writes the struct `finish` is asked for.
 */
export class MessagesBuilder implements ColumnBuilder<Message[]> {
  readonly type = new arrow.List(new arrow.Field('item', messageType(), false));
  /** Whether a message pushed since the builder was made has tool calls, a tool_call_id or a name. */
  sawToolFields = false;
  length = 0;
  private offsets: Int32Array = new Int32Array(1024);
  private count = 0;
  private roles = new Utf8Builder();
  private contents = new Utf8Builder();
  private toolCalls = new Utf8Builder();
  private toolCallIds = new Utf8Builder();
  private names = new Utf8Builder();
  private validity = new Validity();

  get byteSize(): number {
    return this.roles.byteSize + this.contents.byteSize + this.toolCalls.byteSize + this.toolCallIds.byteSize + this.names.byteSize + 4 * this.length;
  }

  push(msgs: Message[] | null): void {
    const i = this.length;
    if (i + 2 > this.offsets.length) this.offsets = growInt32(this.offsets, i + 2);
    this.validity.set(i, msgs !== null);
    if (msgs !== null) {
      for (const m of msgs) {
        this.roles.push(m.role);
        this.contents.push(m.content);
        this.toolCalls.push(m.tool_calls && m.tool_calls.length > 0 ? JSON.stringify(m.tool_calls) : null);
        this.toolCallIds.push(m.tool_call_id ?? null);
        this.names.push(m.name ?? null);
        if (!this.sawToolFields && hasToolFields(m)) this.sawToolFields = true;
      }
      this.count += msgs.length;
    }
    this.offsets[i + 1] = this.count;
    this.length = i + 1;
  }

  finish(type?: arrow.DataType): arrow.Data {
    const length = this.length;
    const items = this.count;
    const toolFields = type !== undefined && arrow.DataType.isList(type) && (type.children[0].type as arrow.Struct).children.length > 2;
    const children = [this.roles.finish(), this.contents.finish()];
    const extra = [this.toolCalls.finish(), this.toolCallIds.finish(), this.names.finish()];
    if (toolFields) children.push(...extra);
    const struct = arrow.makeData({ type: messageType(toolFields), length: items, nullCount: 0, children });
    const nullCount = this.validity.nullCount;
    const data = arrow.makeData({
      type: new arrow.List(new arrow.Field('item', struct.type, false)),
      length,
      nullCount,
      nullBitmap: this.validity.take(length),
      valueOffsets: this.offsets.subarray(0, length + 1),
      child: struct,
    });
    this.offsets = new Int32Array(Math.max(1024, length + 1));
    this.count = 0;
    this.length = 0;
    return data;
  }
}

/** List<T> over any child builder (responses, scores, win_probs). */
export class ListBuilder<T> implements ColumnBuilder<T[]> {
  readonly type: arrow.List;
  length = 0;
  private offsets: Int32Array = new Int32Array(1024);
  private count = 0;
  private validity = new Validity();

  constructor(readonly child: ColumnBuilder<T>) {
    this.type = new arrow.List(new arrow.Field('item', child.type, false));
  }

  get byteSize(): number {
    return this.child.byteSize + 4 * this.length;
  }

  push(values: T[] | null): void {
    const i = this.length;
    if (i + 2 > this.offsets.length) this.offsets = growInt32(this.offsets, i + 2);
    this.validity.set(i, values !== null);
    if (values !== null) {
      for (const v of values) this.child.push(v);
      this.count += values.length;
    }
    this.offsets[i + 1] = this.count;
    this.length = i + 1;
  }

  finish(type?: arrow.DataType): arrow.Data {
    const length = this.length;
    const nullCount = this.validity.nullCount;
    const child = this.child.finish(type && arrow.DataType.isList(type) ? type.children[0].type : undefined);
    const data = arrow.makeData({
      type: new arrow.List(new arrow.Field('item', child.type, false)),
      length,
      nullCount,
      nullBitmap: this.validity.take(length),
      valueOffsets: this.offsets.subarray(0, length + 1),
      child,
    });
    this.offsets = new Int32Array(Math.max(1024, length + 1));
    this.count = 0;
    this.length = 0;
    return data;
  }
}

export class Float64Builder implements ColumnBuilder<number> {
  readonly type = new arrow.Float64();
  length = 0;
  private values = new Float64Array(1024);
  private validity = new Validity();

  get byteSize(): number {
    return 8 * this.length;
  }

  push(v: number | null): void {
    const i = this.length;
    if (i >= this.values.length) {
      const grown = new Float64Array(this.values.length * 2);
      grown.set(this.values);
      this.values = grown;
    }
    this.validity.set(i, v !== null);
    this.values[i] = v ?? 0;
    this.length = i + 1;
  }

  finish(): arrow.Data<arrow.Float64> {
    const length = this.length;
    const nullCount = this.validity.nullCount;
    const data = arrow.makeData({
      type: this.type,
      length,
      nullCount,
      nullBitmap: this.validity.take(length),
      data: this.values.subarray(0, length),
    });
    this.values = new Float64Array(Math.max(1024, length));
    this.length = 0;
    return data;
  }
}

export class BoolBuilder implements ColumnBuilder<boolean> {
  readonly type = new arrow.Bool();
  length = 0;
  private bits = new Uint8Array(128);
  private validity = new Validity();

  get byteSize(): number {
    return this.length >> 3;
  }

  push(v: boolean | null): void {
    const i = this.length;
    if ((i >> 3) >= this.bits.length) {
      const grown = new Uint8Array(this.bits.length * 2);
      grown.set(this.bits);
      this.bits = grown;
    }
    this.validity.set(i, v !== null);
    if (v) this.bits[i >> 3] |= 1 << (i & 7);
    else this.bits[i >> 3] &= ~(1 << (i & 7));
    this.length = i + 1;
  }

  finish(): arrow.Data<arrow.Bool> {
    const length = this.length;
    const nullCount = this.validity.nullCount;
    const data = arrow.makeData({
      type: this.type,
      length,
      nullCount,
      nullBitmap: this.validity.take(length),
      data: this.bits.subarray(0, (length + 7) >> 3),
    });
    this.bits = new Uint8Array(Math.max(128, (length + 7) >> 3));
    this.length = 0;
    return data;
  }
}

function textBuilder(text: TextMode): ColumnBuilder<Text> {
  return (text === 'plain' ? new Utf8Builder() : new MessagesBuilder()) as ColumnBuilder<Text>;
}

/** A builder for canonical column `name`. */
export function columnBuilder(name: string, text: TextMode): ColumnBuilder<unknown> {
  let b: ColumnBuilder<never>;
  switch (COLUMN_CLASS[name]) {
    case 'text':
      b = textBuilder(text);
      break;
    case 'texts':
      b = new ListBuilder(textBuilder(text));
      break;
    case 'float':
      b = new Float64Builder();
      break;
    case 'floats':
      b = new ListBuilder(new Float64Builder());
      break;
    case 'bool':
      b = new BoolBuilder();
      break;
    case 'string':
      b = new Utf8Builder();
      break;
    default:
      throw new Error(`unknown canonical column ${name}`);
  }
  // The builders' types must be the schema's types, or the batch and schema would disagree.
  if (!arrow.util.compareTypes(b.type, columnType(name, text))) throw new Error(`builder type mismatch for ${name}`);
  return b as ColumnBuilder<unknown>;
}

/**
 * Rows → one Arrow RecordBatch, column by column. Columns not present in a row are pushed as null, so
 * a column that first appears mid-batch is back-filled via `addColumn`.
 */
export class BatchBuilder {
  private readonly builders = new Map<string, ColumnBuilder<unknown>>();
  length = 0;

  constructor(
    private readonly text: TextMode,
    columns: readonly string[],
  ) {
    for (const c of columns) this.builders.set(c, columnBuilder(c, text));
  }

  get columns(): string[] {
    return [...this.builders.keys()];
  }

  /** Whether any message pushed so far carries tool fields (so the schema needs the wider struct). */
  get sawToolFields(): boolean {
    for (const b of this.builders.values()) {
      const m = b instanceof ListBuilder ? b.child : b;
      if (m instanceof MessagesBuilder && m.sawToolFields) return true;
    }
    return false;
  }

  has(column: string): boolean {
    return this.builders.has(column);
  }

  /** Adds an optional column, null for the rows already pushed. */
  addColumn(column: string): void {
    const b = columnBuilder(column, this.text);
    for (let i = 0; i < this.length; i++) b.push(null);
    this.builders.set(column, b);
  }

  get byteSize(): number {
    let n = 0;
    for (const b of this.builders.values()) n += b.byteSize;
    return n;
  }

  push(row: Readonly<Record<string, unknown>>): void {
    for (const [name, b] of this.builders) {
      const v = row[name];
      b.push(v === undefined ? null : v);
    }
    this.length++;
  }

  /** The batch in `schema`'s column order; the builder starts empty afterwards. */
  finish(schema: arrow.Schema): arrow.RecordBatch {
    const children = schema.fields.map((f) => {
      const b = this.builders.get(f.name);
      if (!b) throw new Error(`no builder for column ${f.name}`);
      return b.finish(f.type);
    });
    const length = this.length;
    this.length = 0;
    const data = arrow.makeData({ type: new arrow.Struct(schema.fields), length, nullCount: 0, children });
    return new arrow.RecordBatch(schema, data);
  }
}
