/**
 * `prefzoo inspect`: what a data file holds — schema, kind, rows, and how long its text fields are.
 * Columnar inputs are measured from Arrow offsets (no string decoding); record inputs from the strings.
 */
import * as arrow from './arrow.ts';
import { UserError } from '../src/errors.ts';
import { detectFormat } from './formats/index.ts';
import { parquetFooter, readParquetBatches } from './parquet.ts';
import { openSource } from './readers.ts';
import * as readers from './readers.ts';
import { META_KEY, type PrefzooMeta, parseMeta } from './schema.ts';
import { describe, isObject } from './values.ts';

export interface LengthStats {
  /** Rows with a value (nulls excluded). */
  count: number;
  nulls: number;
  min: number;
  mean: number;
  p50: number;
  p95: number;
  max: number;
}

export interface InspectReport {
  path: string;
  format: readers.InputFormat;
  /** Readable records (rows of columnar files). */
  rows: number;
  /** Records that could not be read (invalid JSON, not an object), by file:line or row, with the reason: counted, never dropped silently. */
  invalid: Array<{ where: string; reason: string }>;
  /** `name: type` per column (Arrow types; for JSON/CSV the value types seen). */
  schema: Array<{ name: string; type: string }>;
  /** Canonical metadata, when the file is a prefzoo dataset. */
  prefzoo: PrefzooMeta | null;
  /** The kind the data is, or would become when converted; null when it is not preference data. */
  kind: string | null;
  /** The input format the records look like (for files not yet converted). */
  detectedFormat: string | null;
  /** What lengths count: UTF-8 bytes (columnar inputs) or characters (record inputs). */
  lengthUnit: 'bytes' | 'chars';
  lengths: Record<string, LengthStats>;
}

function stats(values: number[], nulls: number): LengthStats {
  const n = values.length;
  if (n === 0) return { count: 0, nulls, min: 0, mean: 0, p50: 0, p95: 0, max: 0 };
  const sorted = Float64Array.from(values).sort();
  let sum = 0;
  for (const v of sorted) sum += v;
  // Nearest-rank percentiles: always a length that occurs in the data.
  const rank = (p: number) => sorted[Math.min(n - 1, Math.max(0, Math.ceil(p * n) - 1))];
  return { count: n, nulls, min: sorted[0], mean: sum / n, p50: rank(0.5), p95: rank(0.95), max: sorted[n - 1] };
}

/**
 * Per-row text bytes of one Arrow column chunk: string leaves summed through lists and structs
 * (a chat message counts its content, not its role). Null when the type holds no text.
 */
export function textBytes(data: arrow.Data): Float64Array | null {
  const t = data.type;
  const n = data.length;
  if (arrow.DataType.isUtf8(t) || arrow.DataType.isBinary(t) || arrow.DataType.isLargeUtf8(t) || arrow.DataType.isLargeBinary(t)) {
    const off = data.valueOffsets as ArrayLike<number | bigint>;
    const out = new Float64Array(n);
    for (let i = 0; i < n; i++) out[i] = Number(off[data.offset + i + 1]) - Number(off[data.offset + i]);
    return out;
  }
  if (arrow.DataType.isList(t)) {
    const inner = textBytes(data.children[0]);
    if (!inner) return null;
    const off = data.valueOffsets as Int32Array;
    const out = new Float64Array(n);
    for (let i = 0; i < n; i++) {
      let s = 0;
      for (let j = off[data.offset + i]; j < off[data.offset + i + 1]; j++) s += inner[j];
      out[i] = s;
    }
    return out;
  }
  if (arrow.DataType.isStruct(t)) {
    const names = t.children.map((f) => f.name);
    const useOnly = names.includes('content') && names.includes('role') ? names.indexOf('content') : -1;
    let out: Float64Array | null = null;
    t.children.forEach((_, k) => {
      if (useOnly >= 0 && k !== useOnly) return;
      const c = textBytes(data.children[k]);
      if (!c) return;
      out ??= new Float64Array(n);
      for (let i = 0; i < n; i++) out[i] += c[data.offset + i];
    });
    return out;
  }
  return null;
}

async function inspectColumnar(path: string, format: readers.InputFormat, batches: AsyncGenerator<arrow.RecordBatch>): Promise<InspectReport> {
  let schema: arrow.Schema | null = null;
  let rows = 0;
  const lengths = new Map<string, number[]>();
  const nulls = new Map<string, number>();
  for await (const b of batches) {
    schema ??= b.schema;
    rows += b.numRows;
    b.schema.fields.forEach((f, j) => {
      const data = b.data.children[j];
      const bytes = textBytes(data);
      if (!bytes) return;
      const list = lengths.get(f.name) ?? [];
      let nc = nulls.get(f.name) ?? 0;
      for (let i = 0; i < data.length; i++) {
        if (data.getValid(i)) list.push(bytes[i]);
        else nc++;
      }
      lengths.set(f.name, list);
      nulls.set(f.name, nc);
    });
  }
  let metadata = schema?.metadata ?? new Map<string, string>();
  if (format === 'parquet') {
    const footer = await parquetFooter(path);
    metadata = footer.metadata;
    if (!schema) rows = footer.rows;
  }
  let prefzoo: PrefzooMeta | null = null;
  try {
    prefzoo = parseMeta(metadata.get(META_KEY));
  } catch {
    prefzoo = null;
  }
  const fields = schema?.fields ?? [];
  const probe = Object.fromEntries(fields.map((f) => [f.name, placeholder(f.type)]));
  const detected = prefzoo ? null : detectFormat(probe);
  const lengthStats: Record<string, LengthStats> = {};
  for (const [name, list] of lengths) lengthStats[name] = stats(list, nulls.get(name) ?? 0);
  return {
    path,
    format,
    rows,
    invalid: [],
    schema: fields.map((f) => ({ name: f.name, type: String(f.type) })),
    prefzoo,
    kind: prefzoo ? prefzoo.kind : (detected?.kind ?? null),
    detectedFormat: prefzoo ? prefzoo.source_format : (detected?.name ?? null),
    lengthUnit: 'bytes',
    lengths: lengthStats,
  };
}

/** A stand-in value of an Arrow type, enough for format detection by column names and shapes. */
function placeholder(t: arrow.DataType): unknown {
  if (arrow.DataType.isUtf8(t)) return '';
  if (arrow.DataType.isList(t)) return [];
  if (arrow.DataType.isStruct(t)) return {};
  if (arrow.DataType.isBool(t)) return false;
  return 0;
}

function typeOf(v: unknown): string {
  if (v === null) return 'null';
  if (Array.isArray(v)) return v.length > 0 && isObject(v[0]) ? 'list<object>' : 'list';
  return typeof v;
}

/** String length of a record field: a string, or the contents of a message list. */
function recordTextLength(v: unknown): number | null {
  if (typeof v === 'string') return v.length;
  if (Array.isArray(v) && v.length > 0 && v.every((m) => isObject(m) && (typeof m.content === 'string' || typeof m.value === 'string'))) {
    return v.reduce((s: number, m) => s + String((m as Record<string, unknown>).content ?? (m as Record<string, unknown>).value).length, 0);
  }
  if (isObject(v) && (typeof v.content === 'string' || typeof v.value === 'string')) return String(v.content ?? v.value).length;
  return null;
}

async function inspectRecords(src: readers.Source): Promise<InspectReport> {
  let rows = 0;
  let first: Record<string, unknown> | null = null;
  const types = new Map<string, Set<string>>();
  const lengths = new Map<string, number[]>();
  const nulls = new Map<string, number>();
  const invalid: InspectReport['invalid'] = [];
  for await (const items of src.items()) {
    for (const item of items) {
      if (item.error !== undefined || !isObject(item.value)) {
        invalid.push({ where: readers.where(src, item.pos), reason: item.error ?? `expected a record object, found ${describe(item.value)}` });
        continue;
      }
      rows++;
      const rec = item.value;
      first ??= rec;
      for (const k in rec) {
        const v = rec[k];
        let ts = types.get(k);
        if (!ts) types.set(k, (ts = new Set()));
        ts.add(typeOf(v));
        const len = recordTextLength(v);
        if (len !== null) {
          let l = lengths.get(k);
          if (!l) lengths.set(k, (l = []));
          l.push(len);
        } else if (v === null) nulls.set(k, (nulls.get(k) ?? 0) + 1);
      }
    }
  }
  if (rows === 0 && invalid.length > 0) throw new UserError(`${src.path}: no readable records (${invalid.length} unreadable; first ${invalid[0].where}: ${invalid[0].reason})`);
  const detected = first ? detectFormat(first) : null;
  const lengthStats: Record<string, LengthStats> = {};
  for (const [name, list] of lengths) lengthStats[name] = stats(list, nulls.get(name) ?? 0);
  return {
    path: src.path,
    format: src.format,
    rows,
    invalid,
    schema: [...types].map(([name, ts]) => ({ name, type: [...ts].join(' | ') })),
    prefzoo: null,
    kind: detected?.kind ?? null,
    detectedFormat: detected?.name ?? null,
    lengthUnit: 'chars',
    lengths: lengthStats,
  };
}

/** Inspects any supported data file. */
export async function inspectFile(path: string): Promise<InspectReport> {
  const src = await openSource(path);
  if (src.format === 'parquet') return inspectColumnar(path, 'parquet', readParquetBatches(path));
  if (src.format === 'arrow') return inspectColumnar(path, 'arrow', readers.readArrowBatches(src));
  return inspectRecords(src);
}

function fmt(n: number): string {
  return Number.isInteger(n) ? String(n) : n.toFixed(1);
}

/** The human-readable form of a report. */
export function formatReport(r: InspectReport): string {
  const lines: string[] = [];
  lines.push(`file:   ${r.path} (${r.format})`);
  if (r.prefzoo) {
    lines.push(`kind:   ${r.prefzoo.kind}, ${r.prefzoo.text} text (prefzoo schema v${r.prefzoo.schema_version}, from ${r.prefzoo.source_format})`);
  } else if (r.kind) {
    lines.push(`kind:   ${r.kind} once converted (looks like ${r.detectedFormat}; not a prefzoo dataset yet)`);
  } else {
    lines.push('kind:   none (not preference data)');
  }
  if (r.invalid.length === 0) lines.push(`rows:   ${r.rows}`);
  else {
    lines.push(`rows:   ${r.rows} readable of ${r.rows + r.invalid.length} records; ${r.invalid.length} invalid (\`prefzoo convert\` stops at the first, or skips and lists them with --on-invalid skip):`);
    for (const b of r.invalid.slice(0, 10)) lines.push(`  ${b.where}: ${b.reason}`);
    if (r.invalid.length > 10) lines.push(`  … and ${r.invalid.length - 10} more (--json lists all)`);
  }
  lines.push('schema:');
  const w = Math.max(...r.schema.map((f) => f.name.length), 4);
  for (const f of r.schema) lines.push(`  ${f.name.padEnd(w)}  ${f.type}`);
  const names = Object.keys(r.lengths);
  if (names.length) {
    lines.push(`text lengths (${r.lengthUnit === 'bytes' ? 'UTF-8 bytes' : 'characters'} per row):`);
    const cw = Math.max(...names.map((n) => n.length), 6);
    const head = ['rows', 'nulls', 'min', 'mean', 'p50', 'p95', 'max'];
    lines.push(`  ${'column'.padEnd(cw)}  ${head.map((h) => h.padStart(9)).join(' ')}`);
    for (const n of names) {
      const s = r.lengths[n];
      const cells = [s.count, s.nulls, s.min, s.mean, s.p50, s.p95, s.max].map((x) => fmt(x).padStart(9));
      lines.push(`  ${n.padEnd(cw)}  ${cells.join(' ')}`);
    }
  } else {
    lines.push('text lengths: no text columns');
  }
  return lines.join('\n');
}
