/**
 * The canonical preference-data schemas (docs/data.md): three kinds, each a set of named columns
 * whose Arrow types depend only on the column name and on whether text is plain or conversational.
 */
import * as arrow from 'apache-arrow';

import { type Kind, KINDS, type Message, ROLES, type Role, type Text } from './names.ts';

export { type Kind, KINDS, type Message, ROLES, type Role, type Text };

/** `plain`: text columns are Utf8; `messages`: List<Struct<role, content>>. */
export type TextMode = 'plain' | 'messages';

export const SCHEMA_VERSION = 1;

/**
 * The JSON stored under the Parquet key-value metadata key `prefzoo`. Later stages may add their own
 * keys (e.g. which tokenizer made the id columns); they survive a read and rewrite.
 */
export interface PrefzooMeta {
  kind: Kind;
  text: TextMode;
  schema_version: number;
  source_format: string;
  created_by: string;
  [key: string]: unknown;
}

export const META_KEY = 'prefzoo';

/** How a column's values look, independent of kind. */
export type ColumnClass = 'text' | 'texts' | 'float' | 'floats' | 'bool' | 'string';

export const COLUMN_CLASS: Readonly<Record<string, ColumnClass>> = {
  prompt: 'text',
  chosen: 'text',
  rejected: 'text',
  response: 'text',
  responses: 'texts',
  scores: 'floats',
  win_probs: 'floats',
  reward: 'float',
  label: 'bool',
  chosen_score: 'float',
  rejected_score: 'float',
  chosen_prob: 'float',
  rejected_prob: 'float',
  weight: 'float',
  id: 'string',
  source: 'string',
  // Free text explaining why chosen beats rejected ("Data-Centric Human Preference Optimization with
  // Rationales", 2024); null on rows that have none.
  rationale: 'string',
};

export interface KindSpec {
  /** Columns every row has, in file order. */
  required: readonly string[];
  /** Columns a dataset may carry, in file order after the required ones. */
  optional: readonly string[];
}

export const KIND_SPECS: Readonly<Record<Kind, KindSpec>> = {
  pairwise: {
    required: ['prompt', 'chosen', 'rejected'],
    optional: ['id', 'chosen_score', 'rejected_score', 'chosen_prob', 'rejected_prob', 'weight', 'source', 'rationale'],
  },
  listwise: { required: ['prompt', 'responses', 'scores'], optional: ['id', 'win_probs', 'source'] },
  // `reward` or `label` (at least one) is checked by validation, so both sit in optional here.
  single: { required: ['prompt', 'response'], optional: ['reward', 'label', 'id', 'source'] },
};

/** Columns of `kind` in canonical file order, keeping only the optional ones in `present`. */
export function orderColumns(kind: Kind, present: Iterable<string>): string[] {
  const have = new Set(present);
  const spec = KIND_SPECS[kind];
  return [...spec.required, ...spec.optional.filter((c) => have.has(c))];
}

export function messageType(): arrow.Struct {
  return new arrow.Struct([
    new arrow.Field('role', new arrow.Utf8(), false),
    new arrow.Field('content', new arrow.Utf8(), false),
  ]);
}

export function textType(text: TextMode): arrow.DataType {
  return text === 'plain' ? new arrow.Utf8() : new arrow.List(new arrow.Field('item', messageType(), false));
}

/** Arrow type of a canonical column. */
export function columnType(name: string, text: TextMode): arrow.DataType {
  const cls = COLUMN_CLASS[name];
  switch (cls) {
    case 'text':
      return textType(text);
    case 'texts':
      return new arrow.List(new arrow.Field('item', textType(text), false));
    case 'float':
      return new arrow.Float64();
    case 'floats':
      return new arrow.List(new arrow.Field('item', new arrow.Float64(), false));
    case 'bool':
      return new arrow.Bool();
    case 'string':
      return new arrow.Utf8();
    default:
      throw new Error(`unknown canonical column ${name}`);
  }
}

/** The Arrow schema of a canonical dataset; required columns are non-nullable. */
export function canonicalSchema(kind: Kind, text: TextMode, columns: readonly string[], meta?: PrefzooMeta): arrow.Schema {
  const required = new Set(KIND_SPECS[kind].required);
  const fields = columns.map((c) => new arrow.Field(c, columnType(c, text), !required.has(c)));
  const md = meta ? new Map([[META_KEY, JSON.stringify(meta)]]) : undefined;
  return new arrow.Schema(fields, md);
}

/** Parses and checks the `prefzoo` metadata value; returns null when absent. */
export function parseMeta(raw: string | undefined | null): PrefzooMeta | null {
  if (raw == null) return null;
  let m: unknown;
  try {
    m = JSON.parse(raw);
  } catch {
    throw new Error(`"${META_KEY}" metadata is not JSON`);
  }
  const o = m as Partial<PrefzooMeta>;
  if (!o || typeof o !== 'object' || !KINDS.includes(o.kind as Kind) || (o.text !== 'plain' && o.text !== 'messages')) {
    throw new Error(`"${META_KEY}" metadata lacks a valid kind/text: ${raw.slice(0, 200)}`);
  }
  return {
    ...o,
    kind: o.kind as Kind,
    text: o.text,
    schema_version: typeof o.schema_version === 'number' ? o.schema_version : SCHEMA_VERSION,
    source_format: typeof o.source_format === 'string' ? o.source_format : 'unknown',
    created_by: typeof o.created_by === 'string' ? o.created_by : 'unknown',
  };
}

export function makeMeta(kind: Kind, text: TextMode, sourceFormat: string): PrefzooMeta {
  return { kind, text, schema_version: SCHEMA_VERSION, source_format: sourceFormat, created_by: 'prefzoo 0.1.0' };
}

/**
 * Checks that an Arrow schema is a canonical one for `meta`: every required column present with the
 * canonical type. Extra columns (e.g. token ids added by `tokenize`) are allowed. Returns problems.
 */
export function schemaProblems(schema: arrow.Schema, meta: PrefzooMeta): string[] {
  const problems: string[] = [];
  const byName = new Map(schema.fields.map((f) => [f.name, f]));
  for (const c of KIND_SPECS[meta.kind].required) {
    const f = byName.get(c);
    if (!f) problems.push(`missing column "${c}"`);
    else if (!sameShape(f.type, columnType(c, meta.text))) {
      problems.push(`column "${c}" is ${f.type}, expected ${columnType(c, meta.text)}`);
    }
  }
  if (meta.kind === 'single' && !byName.has('reward') && !byName.has('label')) {
    problems.push('a single-trajectory dataset needs a "reward" or "label" column');
  }
  return problems;
}

/** Type equality that ignores list item names and nullability, which other writers choose freely. */
export function sameShape(a: arrow.DataType, b: arrow.DataType): boolean {
  if (a.typeId !== b.typeId) return false;
  if (arrow.DataType.isFloat(a) && arrow.DataType.isFloat(b)) return a.precision === b.precision;
  const ac = a.children ?? [];
  const bc = b.children ?? [];
  if (ac.length !== bc.length) return false;
  const named = arrow.DataType.isStruct(a);
  return ac.every((f, i) => (!named || f.name === bc[i].name) && sameShape(f.type, bc[i].type));
}
