/**
 * Model-ready token columns (docs/data.md): `prompt_ids` and `chosen_ids`/`rejected_ids` (pairwise),
 * `responses_ids` (listwise, one list per response) or `response_ids` (single), all List<Int32>,
 * built straight into Arrow offset/value buffers. Reading them back lets the trainer skip
 * tokenization for a file `prefzoo tokenize` wrote.
 */
import * as arrow from './arrow.ts';
import { readFileSync } from 'node:fs';
import { writeFileAtomic } from '../src/io/atomic.ts';
import type { Kind } from './schema.ts';

export interface TokenRow {
  promptIds: number[];
  responseIds: number[][];
  /** Whether `tokenize` cut the row to its max_length / max_prompt_length (column `tokens_truncated`). */
  truncated?: boolean;
}

/** Bool column `tokenize` writes beside the ids: the row was cut, so later counts of truncated rows include it. */
export const TRUNCATED_COLUMN = 'tokens_truncated';

const INT_LIST = new arrow.List(new arrow.Field('item', new arrow.Int32(), false));
const INT_LIST_LIST = new arrow.List(new arrow.Field('item', INT_LIST, false));

/** The token columns of a kind, by name. */
export function tokenColumnNames(kind: Kind): string[] {
  return kind === 'pairwise' ? ['prompt_ids', 'chosen_ids', 'rejected_ids'] : kind === 'listwise' ? ['prompt_ids', 'responses_ids'] : ['prompt_ids', 'response_ids'];
}

/** A List<Int32> column from one id list per row. */
function intLists(lists: readonly number[][]): arrow.Data<arrow.List<arrow.Int32>> {
  const offsets = new Int32Array(lists.length + 1);
  let n = 0;
  lists.forEach((l, i) => {
    n += l.length;
    offsets[i + 1] = n;
  });
  const values = new Int32Array(n);
  let at = 0;
  for (const l of lists) {
    values.set(l, at);
    at += l.length;
  }
  const child = arrow.makeData({ type: new arrow.Int32(), length: n, nullCount: 0, data: values });
  return arrow.makeData({ type: INT_LIST, length: lists.length, nullCount: 0, valueOffsets: offsets, child });
}

/** A List<List<Int32>> column from a list of id lists per row. */
function intListLists(rows: readonly number[][][]): arrow.Data<arrow.List<arrow.List<arrow.Int32>>> {
  const offsets = new Int32Array(rows.length + 1);
  rows.forEach((r, i) => (offsets[i + 1] = offsets[i] + r.length));
  const child = intLists(rows.flat());
  return arrow.makeData({ type: INT_LIST_LIST, length: rows.length, nullCount: 0, valueOffsets: offsets, child });
}

/** The table with its token columns added (replacing earlier ones of the same names). */
export function withTokenColumns(table: arrow.Table, kind: Kind, rows: readonly TokenRow[]): arrow.Table {
  if (rows.length !== table.numRows) throw new Error(`withTokenColumns: ${rows.length} token rows for ${table.numRows} table rows`);
  const names = [...tokenColumnNames(kind), TRUNCATED_COLUMN];
  const cols: Record<string, arrow.Vector> = {};
  for (const f of table.schema.fields) if (!names.includes(f.name)) cols[f.name] = table.getChild(f.name)!;
  cols.prompt_ids = arrow.makeVector(intLists(rows.map((r) => r.promptIds)));
  if (kind === 'pairwise') {
    cols.chosen_ids = arrow.makeVector(intLists(rows.map((r) => r.responseIds[0])));
    cols.rejected_ids = arrow.makeVector(intLists(rows.map((r) => r.responseIds[1])));
  } else if (kind === 'listwise') {
    cols.responses_ids = arrow.makeVector(intListLists(rows.map((r) => r.responseIds)));
  } else {
    cols.response_ids = arrow.makeVector(intLists(rows.map((r) => r.responseIds[0])));
  }
  cols[TRUNCATED_COLUMN] = arrow.vectorFromArray(rows.map((r) => !!r.truncated), new arrow.Bool());
  const t = new arrow.Table(cols);
  const schema = new arrow.Schema(t.schema.fields, table.schema.metadata);
  return new arrow.Table(schema, t.batches.map((b) => new arrow.RecordBatch(schema, b.data)));
}

function ids(v: unknown): number[] {
  return Array.from((v as { toArray(): ArrayLike<number> }).toArray(), Number);
}

/** Token rows stored in a table, or null when it has no token columns. */
export function readTokenColumns(table: arrow.Table, kind: Kind): TokenRow[] | null {
  const names = tokenColumnNames(kind);
  const cols = names.map((n) => table.getChild(n));
  if (cols.some((c) => !c)) return null;
  const cut = table.getChild(TRUNCATED_COLUMN);
  const out: TokenRow[] = [];
  for (let i = 0; i < table.numRows; i++) {
    const promptIds = ids(cols[0]!.get(i));
    const responseIds =
      kind === 'listwise'
        ? Array.from((cols[1]!.get(i) as { toArray(): unknown[] }).toArray(), ids)
        : cols.slice(1).map((c) => ids(c!.get(i)));
    out.push({ promptIds, responseIds, truncated: cut ? !!cut.get(i) : false });
  }
  return out;
}

/**
 * Reference log-prob columns (docs/data.md: computed once per dataset, not once per epoch): pairwise
 * `ref_chosen_logp`, `ref_rejected_logp`; listwise `ref_logps` (List<Float64>); single `ref_logp`.
 */
export function refColumnNames(kind: Kind): string[] {
  return kind === 'pairwise' ? ['ref_chosen_logp', 'ref_rejected_logp'] : kind === 'listwise' ? ['ref_logps'] : ['ref_logp'];
}

function refTable(kind: Kind, ref: readonly number[][]): arrow.Table {
  const f64 = (xs: number[]) => arrow.makeVector(Float64Array.from(xs));
  if (kind === 'pairwise') return new arrow.Table({ ref_chosen_logp: f64(ref.map((r) => r[0])), ref_rejected_logp: f64(ref.map((r) => r[1])) });
  if (kind === 'single') {
    // KTO's runs also cache the reference log-prob of each row's mismatched (KL) sequence.
    if (ref.every((r) => r.length === 2)) return new arrow.Table({ ref_logp: f64(ref.map((r) => r[0])), ref_kl_logp: f64(ref.map((r) => r[1])) });
    return new arrow.Table({ ref_logp: f64(ref.map((r) => r[0])) });
  }
  const type = new arrow.List(new arrow.Field('item', new arrow.Float64(), false));
  const offsets = new Int32Array(ref.length + 1);
  ref.forEach((r, i) => (offsets[i + 1] = offsets[i] + r.length));
  const child = arrow.makeData({ type: new arrow.Float64(), length: offsets[ref.length], nullCount: 0, data: Float64Array.from(ref.flat()) });
  return new arrow.Table({ ref_logps: arrow.makeVector(arrow.makeData({ type, length: ref.length, nullCount: 0, valueOffsets: offsets, child })) });
}

/** Writes the reference columns as a Parquet file (temp name, then rename). */
export async function writeRefColumns(path: string, kind: Kind, ref: readonly number[][]): Promise<void> {
  const pw = await import('parquet-wasm');
  const bytes = pw.writeParquet(pw.Table.fromIPCStream(arrow.tableToIPC(refTable(kind, ref), 'stream')));
  writeFileAtomic(path, bytes);
}

/** Reads reference columns back (one array per row), or null when the file lacks them. */
export async function readRefColumns(path: string, kind: Kind): Promise<number[][] | null> {
  const pw = await import('parquet-wasm');
  const t = arrow.tableFromIPC(pw.readParquet(readFileSync(path)).intoIPCStream());
  const cols = refColumnNames(kind).map((n) => t.getChild(n));
  if (cols.some((c) => !c)) return null;
  const out: number[][] = [];
  const klCol = kind === 'single' ? t.getChild('ref_kl_logp') : null;
  for (let i = 0; i < t.numRows; i++) {
    const row = kind === 'listwise' ? ids(cols[0]!.get(i)) : cols.map((c) => Number(c!.get(i)));
    if (klCol) row.push(Number(klCol.get(i)));
    out.push(row);
  }
  return out;
}
