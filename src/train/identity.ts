/**
 * What made a run's reference log-prob cache (`RUN/data/reference.parquet`), recorded beside it in
 * `RUN/data/reference.json`. The cache is reused only when every field of the record is equal;
 * otherwise the run stops with one line naming what differs (a run's reference must not change
 * under it). Adding what a cache depends on is one field here and one line in `refCacheIdentity`.
 */
import { createHash } from 'node:crypto';
import { existsSync, readdirSync, readFileSync, statSync } from 'node:fs';
import { join, resolve } from 'node:path';
import type { Kind } from '../../datasets/schema.ts';
import type { TruncationConfig, TokenizedExample } from '../../datasets/examples.ts';
import { writeJsonAtomic } from '../io/atomic.ts';

/** A file as it was: absolute path, size and modification time (a rewritten file changes one of them). */
export interface FileStamp {
  path: string;
  size: number;
  mtime_ms: number;
}

export interface RefCacheIdentity {
  /** Which weights score the reference (reference.ts): `model:DIR`, or `model:DIR+adapter:DIR`. */
  reference: string;
  /** Files of the starting (policy) model folder: config, weights, tokenizer. */
  model: FileStamp[];
  /** Files of a separate reference model folder (`train --ref`), or null when the reference is the starting model. */
  ref_model: FileStamp[] | null;
  /** Files of the PEFT adapter folder the run starts from (`train --adapter`), or null. */
  adapter: FileStamp[] | null;
  /** The data file(s) as given (null stamp fields when rows came from memory). */
  data: FileStamp[];
  /** Tokenization settings the rows were cut with. */
  tokenization: TruncationConfig;
  /** SHA-256 of every row's prompt and response token ids, in data order: content, tokenizer and template in one value. */
  tokens: string;
  /** Loss name, data kind, and whether KTO's mismatched (KL) pairs are cached too. */
  loss: string;
  kind: Kind;
  kl: boolean;
}

/** Human names of the fields, for the one-line refusal. */
const FIELD_NAMES: Record<keyof RefCacheIdentity, string> = {
  reference: 'reference',
  model: 'model files',
  ref_model: 'reference model files',
  adapter: 'adapter files',
  data: 'data file',
  tokenization: 'tokenization settings',
  tokens: 'token ids',
  loss: 'loss',
  kind: 'data kind',
  kl: 'KL pairs',
};

/** A file's stamp (size -1 when it does not exist). */
export function stamp(file: string): FileStamp {
  const p = resolve(file);
  if (!existsSync(p)) return { path: p, size: -1, mtime_ms: -1 };
  const s = statSync(p);
  return { path: p, size: s.size, mtime_ms: Math.round(s.mtimeMs) };
}

/** The files of a model folder that define it (config, weights, tokenizer and template), sorted. */
export function modelStamps(dir: string): FileStamp[] {
  const keep = /^(config\.json|adapter_config\.json|.*\.safetensors(\.index\.json)?|tokenizer.*\.json|special_tokens_map\.json|chat_template\.jinja|vocab\.json|merges\.txt)$/;
  return readdirSync(dir).filter((f) => keep.test(f)).sort().map((f) => stamp(join(dir, f)));
}

/** One hash over all rows' token ids (lengths included, so [1,2][3] and [1][2,3] differ). */
export function tokenDigest(rows: readonly TokenizedExample[]): string {
  const h = createHash('sha256');
  const put = (ids: readonly number[]) => {
    h.update(Int32Array.of(ids.length));
    h.update(Int32Array.from(ids));
  };
  for (const r of rows) {
    put(r.promptIds);
    h.update(Int32Array.of(r.responseIds.length));
    for (const ids of r.responseIds) put(ids);
    if (r.klResponseIds) put(r.klResponseIds);
  }
  return h.digest('hex');
}

export function refCacheIdentity(o: {
  reference: string;
  model: string;
  refModel?: string;
  adapter?: string;
  data: string;
  dataFiles?: readonly string[];
  truncation: TruncationConfig;
  rows: readonly TokenizedExample[];
  loss: string;
  kind: Kind;
  kl: boolean;
}): RefCacheIdentity {
  const files = o.dataFiles?.length ? o.dataFiles : [o.data];
  return {
    reference: o.reference,
    model: modelStamps(o.model),
    ref_model: o.refModel ? modelStamps(o.refModel) : null,
    adapter: o.adapter ? modelStamps(o.adapter) : null,
    data: files.map(stamp),
    tokenization: { max_length: o.truncation.max_length, max_prompt_length: o.truncation.max_prompt_length, truncation: o.truncation.truncation },
    tokens: tokenDigest(o.rows),
    loss: o.loss.trim(),
    kind: o.kind,
    kl: o.kl,
  };
}

/** The fields where two records differ (by their human names: the reference cache's, or `names`), empty when equal. */
export function identityDiff<T extends object = RefCacheIdentity>(a: T, b: T, names: Partial<Record<keyof T, string>> = FIELD_NAMES as Partial<Record<keyof T, string>>): string[] {
  const keys = new Set([...Object.keys(a), ...Object.keys(b)]) as Set<keyof T>;
  return [...keys].filter((k) => JSON.stringify(a[k]) !== JSON.stringify(b[k])).map((k) => names[k] ?? String(k));
}

export function readIdentity<T extends object = RefCacheIdentity>(file: string): T | null {
  try {
    return JSON.parse(readFileSync(file, 'utf8')) as T;
  } catch {
    return null;
  }
}

export function writeIdentity(file: string, id: object): void {
  writeJsonAtomic(file, id);
}
