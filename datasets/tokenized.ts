/**
 * Model-ready token columns (DATA.md): `prompt_ids` and `chosen_ids`/`rejected_ids` (pairwise),
 * `responses_ids` (listwise, one list per response) or `response_ids` (single), all List<Int32>,
 * built straight into Arrow offset/value buffers. Reading them back lets the trainer skip
 * tokenization for a file `prefzoo tokenize` wrote.
 */
import * as arrow from 'apache-arrow';
import type { Kind } from './schema.ts';

export interface TokenRow {
  promptIds: number[];
  responseIds: number[][];
}

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
  const names = tokenColumnNames(kind);
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
  const out: TokenRow[] = [];
  for (let i = 0; i < table.numRows; i++) {
    const promptIds = ids(cols[0]!.get(i));
    const responseIds =
      kind === 'listwise'
        ? Array.from((cols[1]!.get(i) as { toArray(): unknown[] }).toArray(), ids)
        : cols.slice(1).map((c) => ids(c!.get(i)));
    out.push({ promptIds, responseIds });
  }
  return out;
}
