/**
 * The canonical preference-data schemas (docs/data.md): three kinds, each a set of named columns
 * whose Arrow types depend only on the column name and on whether text is plain or conversational.
 */
import * as arrow from './arrow.ts';

import { type Kind, KINDS, type Message, ROLES, type Role, type Text, type ToolCall, type ToolSpec } from './names.ts';

export { type Kind, KINDS, type Message, ROLES, type Role, type Text, type ToolCall, type ToolSpec };

/**
 * `plain`: text columns are Utf8; `messages`: List<Struct<role, content, tool_calls, tool_call_id,
 * name>> (the last three nullable; files written before tool calls have only role and content).
 */
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
  // The tools a row offers, as JSON text of a list of {type: "function", function: {name,
  // description, parameters}} (what chat templates take as `tools`); null on rows that offer none.
  tools: 'string',
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
    optional: ['id', 'chosen_score', 'rejected_score', 'chosen_prob', 'rejected_prob', 'weight', 'source', 'rationale', 'tools'],
  },
  listwise: { required: ['prompt', 'responses', 'scores'], optional: ['id', 'win_probs', 'source', 'tools'] },
  // With `reward` or `label` a row is a scored trajectory (KTO, DRO); with neither, a conversation
  // to fine-tune on (SFT): its prompt is the turns before the first assistant turn.
  single: { required: ['prompt', 'response'], optional: ['reward', 'label', 'id', 'source', 'tools'] },
};

/** Columns of `kind` in canonical file order, keeping only the optional ones in `present`. */
export function orderColumns(kind: Kind, present: Iterable<string>): string[] {
  const have = new Set(present);
  const spec = KIND_SPECS[kind];
  return [...spec.required, ...spec.optional.filter((c) => have.has(c))];
}

/**
 * One message: `role` and `content`, and in datasets with tool calls (`toolFields`) also
 * `tool_calls` (JSON text of the assistant's calls, `[{id?, type: "function", function: {name,
 * arguments: {...}}}]`: arguments are free-form JSON, which no fixed Arrow type holds, and
 * pyarrow/DuckDB read JSON text as readily), `tool_call_id` and `name`, all nullable. Datasets
 * without tool calls keep the two-field struct they always had.
 */
export function messageType(toolFields = false): arrow.Struct {
  const fields = [new arrow.Field('role', new arrow.Utf8(), false), new arrow.Field('content', new arrow.Utf8(), false)];
  if (toolFields) {
    fields.push(new arrow.Field('tool_calls', new arrow.Utf8(), true), new arrow.Field('tool_call_id', new arrow.Utf8(), true), new arrow.Field('name', new arrow.Utf8(), true));
  }
  return new arrow.Struct(fields);
}

export function textType(text: TextMode, toolFields = false): arrow.DataType {
  return text === 'plain' ? new arrow.Utf8() : new arrow.List(new arrow.Field('item', messageType(toolFields), false));
}

/** Whether a message carries a field only the tool-call struct holds. */
export function hasToolFields(m: Message): boolean {
  return (m.tool_calls !== undefined && m.tool_calls.length > 0) || m.tool_call_id !== undefined || m.name !== undefined;
}

/** Arrow type of a canonical column (`toolFields`: messages carry tool calls, see messageType). */
export function columnType(name: string, text: TextMode, toolFields = false): arrow.DataType {
  const cls = COLUMN_CLASS[name];
  switch (cls) {
    case 'text':
      return textType(text, toolFields);
    case 'texts':
      return new arrow.List(new arrow.Field('item', textType(text, toolFields), false));
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
export function canonicalSchema(kind: Kind, text: TextMode, columns: readonly string[], meta?: PrefzooMeta, toolFields = false): arrow.Schema {
  const required = new Set(KIND_SPECS[kind].required);
  const fields = columns.map((c) => new arrow.Field(c, columnType(c, text, toolFields), !required.has(c)));
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
    else if (!sameShape(f.type, columnType(c, meta.text)) && !(meta.text === 'messages' && sameShape(f.type, columnType(c, meta.text, true)))) {
      problems.push(`column "${c}" is ${f.type}, expected ${columnType(c, meta.text)}`);
    }
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
