/**
 * The teacher cache of a distillation run: `RUN/data/teacher.parquet`, beside the reference cache,
 * one row per training row in data order with the teacher's targets at each counted response token
 * (teacher-topk.ts): `topk_ids` List<Int32> (n·K), `topk_logps` List<Float16> (n·K) and `rest_logp`
 * List<Float16> (n: the log of the teacher's mass outside the K ids, kept because 1 − Σ of K float16
 * probabilities is known only to about 1e-3). Log-masses are clamped to float16's range (−65504:
 * a mass of 0 either way). `RUN/data/teacher.json` records what made it (`TeacherCacheIdentity`);
 * a cache made by anything else is refused in one line naming what differs, as the reference cache is.
 */
import { createHash } from 'node:crypto';
import { existsSync, readFileSync, rmSync } from 'node:fs';
import { join, resolve } from 'node:path';
import * as arrow from '../../datasets/arrow.ts';
import { UserError } from '../errors.ts';
import { writeFileAtomic } from '../io/atomic.ts';
import { f16BitsToFloat, float32ToF16 } from '../models/safetensors.ts';
import type { TokenizedExample, TruncationConfig } from '../../datasets/examples.ts';
import { identityDiff, modelStamps, readIdentity, stamp, tokenDigest, writeIdentity, type FileStamp } from './identity.ts';
import type { TeacherRow } from './teacher-topk.ts';

export interface TeacherCacheIdentity {
  /** Which weights made it: `model:DIR`. */
  teacher: string;
  /** Files of the teacher's folder: config, weights, tokenizer. */
  teacher_files: FileStamp[];
  /** An AlignDistil teacher's reference (`model:DIR`), its files and the weight (absent for one model). */
  teacher_ref?: string;
  teacher_ref_files?: FileStamp[];
  teacher_weight?: number;
  /** The data file(s) as given. */
  data: FileStamp[];
  tokenization: TruncationConfig;
  /** SHA-256 of every row's token ids and response masks, in data order. */
  tokens: string;
  /** K of the top K (distill_topk). */
  topk: number;
  /** teacher_dtype q8/q4 and its block size (absent for the float32 teacher). */
  teacher_dtype?: string;
}

const FIELD_NAMES: Record<keyof TeacherCacheIdentity, string> = {
  teacher: 'teacher',
  teacher_files: 'teacher files',
  teacher_ref: 'teacher reference',
  teacher_ref_files: 'teacher reference files',
  teacher_weight: 'teacher_weight',
  data: 'data file',
  tokenization: 'tokenization settings',
  tokens: 'token ids',
  topk: 'distill_topk',
  teacher_dtype: 'teacher_dtype',
};

export function teacherCacheIdentity(o: { teacher: string; pair?: { ref: string; weight: number }; dataFiles: readonly string[]; truncation: TruncationConfig; rows: readonly TokenizedExample[]; topk: number; quant?: { bits: number; block: number } | null }): TeacherCacheIdentity {
  const h = createHash('sha256').update(tokenDigest(o.rows));
  // Which tokens count (tool results and other turns masked out) decides which positions are cached.
  for (const r of o.rows) h.update(r.responseMasks ? Uint8Array.from(r.responseMasks[0]) : Uint8Array.of(2));
  return {
    teacher: `model:${resolve(o.teacher)}`,
    teacher_files: modelStamps(o.teacher),
    ...(o.pair ? { teacher_ref: `model:${resolve(o.pair.ref)}`, teacher_ref_files: modelStamps(o.pair.ref), teacher_weight: o.pair.weight } : {}),
    data: o.dataFiles.map(stamp),
    tokenization: { max_length: o.truncation.max_length, max_prompt_length: o.truncation.max_prompt_length, truncation: o.truncation.truncation },
    tokens: h.digest('hex'),
    topk: o.topk,
    // Absent at float32, so caches made before the setting existed still match a float32 teacher.
    ...(o.quant ? { teacher_dtype: `q${o.quant.bits}/${o.quant.block}` } : {}),
  };
}

/** The cache's files in a run folder. */
export function teacherCacheFiles(run: string): { file: string; idFile: string } {
  return { file: join(run, 'data', 'teacher.parquet'), idFile: join(run, 'data', 'teacher.json') };
}

/** float16 bits of log-masses, clamped to float16's finite range. */
function halfLogs(x: Float32Array): Uint16Array {
  return float32ToF16(Float32Array.from(x, (v) => Math.max(v, -65504)));
}

/** An Arrow List<T> column of `lengths.length` rows over the flat `values` (the caches' list columns). */
export function listData<T extends arrow.Int32 | arrow.Float16>(type: T, lengths: readonly number[], values: Int32Array | Uint16Array): arrow.Data<arrow.List<T>> {
  const offsets = new Int32Array(lengths.length + 1);
  lengths.forEach((n, i) => (offsets[i + 1] = offsets[i] + n));
  const child = arrow.makeData({ type, length: values.length, nullCount: 0, data: values } as never) as unknown as arrow.Data<T>;
  return arrow.makeData({ type: new arrow.List(new arrow.Field('item', type, false)), length: lengths.length, nullCount: 0, valueOffsets: offsets, child });
}

function concat<A extends Int32Array | Uint16Array>(make: (n: number) => A, parts: readonly A[]): A {
  const out = make(parts.reduce((n, p) => n + p.length, 0));
  let at = 0;
  for (const p of parts) {
    out.set(p, at);
    at += p.length;
  }
  return out;
}

/**
 * Writes a cache's table as Parquet (temporary name, then rename) and then its record `idFile`; a run
 * stopped between the two has no record, so the cache is made again. Shared with seq-kd.ts.
 */
export async function writeRecordedParquet(file: string, idFile: string, table: arrow.Table, identity: object): Promise<void> {
  rmSync(idFile, { force: true });
  const pw = await import('parquet-wasm');
  writeFileAtomic(file, pw.writeParquet(pw.Table.fromIPCStream(arrow.tableToIPC(table, 'stream'))));
  writeIdentity(idFile, identity);
}

/**
 * A cache's table when `file` exists with a record equal to `identity`; null when there is none (or
 * no record: the run stopped before writing it). A record that differs is refused in one line,
 * `refusal` given the human names of the fields that differ.
 */
export async function readRecordedParquet<T extends object>(file: string, idFile: string, identity: T, names: Record<keyof T, string>, refusal: (diff: string[]) => string): Promise<arrow.Table | null> {
  if (!existsSync(file)) return null;
  const cached = readIdentity<T>(idFile);
  if (!cached) return null;
  const diff = identityDiff(cached, identity, names);
  if (diff.length) throw new UserError(`${file}: ${refusal(diff)}`);
  const pw = await import('parquet-wasm');
  try {
    return arrow.tableFromIPC(pw.readParquet(readFileSync(file)).intoIPCStream());
  } catch (e) {
    throw new UserError(`${file}: not a readable Parquet file (${String((e as Error).message ?? e).split('\n')[0]}); start again with --overwrite`);
  }
}

/**
 * Writes the cache and then its record (writeRecordedParquet). Returns the rows as the cache holds
 * them (float16 log-masses), so a run trains on the same targets whether it computed them or a
 * resumed run read them.
 */
export async function writeTeacherCache(run: string, rows: readonly TeacherRow[], identity: TeacherCacheIdentity): Promise<TeacherRow[]> {
  const { file, idFile } = teacherCacheFiles(run);
  const table = new arrow.Table({
    topk_ids: arrow.makeVector(listData(new arrow.Int32(), rows.map((r) => r.ids.length), concat((n) => new Int32Array(n), rows.map((r) => r.ids)))),
    topk_logps: arrow.makeVector(listData(new arrow.Float16(), rows.map((r) => r.logps.length), concat((n) => new Uint16Array(n), rows.map((r) => halfLogs(r.logps))))),
    rest_logp: arrow.makeVector(listData(new arrow.Float16(), rows.map((r) => r.rest.length), concat((n) => new Uint16Array(n), rows.map((r) => halfLogs(r.rest))))),
  });
  await writeRecordedParquet(file, idFile, table, identity);
  const widen = (x: Float32Array) => Float32Array.from(halfLogs(x), f16BitsToFloat);
  return rows.map((r) => ({ ids: r.ids, logps: widen(r.logps), rest: widen(r.rest) }));
}

/**
 * The cached rows when the run folder holds a cache made by exactly `identity`; null when there is
 * none (or no record: the run stopped before writing it). A cache made by anything else is refused.
 */
export async function readTeacherCache(run: string, identity: TeacherCacheIdentity): Promise<TeacherRow[] | null> {
  const { file, idFile } = teacherCacheFiles(run);
  const t = await readRecordedParquet(file, idFile, identity, FIELD_NAMES, (diff) => `cached by a run with different ${diff.join(', ')}; a run keeps its teacher's targets: resume with the inputs it was started with, or start again with --overwrite`);
  if (!t) return null;
  const [ids, logps, rest] = ['topk_ids', 'topk_logps', 'rest_logp'].map((n) => t.getChild(n));
  if (!ids || !logps || !rest) throw new UserError(`${file}: lacks the columns topk_ids, topk_logps, rest_logp; start again with --overwrite`);
  const out: TeacherRow[] = [];
  const K = identity.topk;
  for (let i = 0; i < t.numRows; i++) {
    const a = (ids.get(i) as arrow.Vector).toArray() as Int32Array;
    const b = (logps.get(i) as arrow.Vector).toArray() as Uint16Array;
    const c = (rest.get(i) as arrow.Vector).toArray() as Uint16Array;
    if (a.length !== b.length || a.length !== c.length * K) throw new UserError(`${file}: row ${i} holds ${a.length} ids, ${b.length} log-probs and ${c.length} rest masses, not K = ${K} of each per token; start again with --overwrite`);
    out.push({ ids: Int32Array.from(a), logps: Float32Array.from(b, f16BitsToFloat), rest: Float32Array.from(c, f16BitsToFloat) });
  }
  return out;
}
