/**
 * Weights of a Hugging Face model folder: `model.safetensors`, or shards
 * `model-00001-of-0000N.safetensors` listed by `model.safetensors.index.json` (`weight_map`).
 * Everything is loaded as float32; saving writes float32 or bfloat16, sharded past a size limit.
 */
import fs from 'node:fs';
import path from 'node:path';
import { UserError } from '../errors.ts';
import {
  DTYPE_SIZES,
  FLOAT_DTYPES,
  numel,
  readSafetensors,
  tensorToFloat32,
  writeSafetensors,
  type Dtype,
  type TensorToWrite,
} from './safetensors.ts';
import { writeFileAtomic } from '../io/atomic.ts';
import { writeConfig, type ModelConfig } from './config.ts';

export const SINGLE_FILE = 'model.safetensors';
export const INDEX_FILE = 'model.safetensors.index.json';
const SHARD_RE = /^model-\d{5}-of-\d{5}\.safetensors$/;

/** A float32 tensor, row-major, `data.length === product(shape)`. */
export interface FloatTensor {
  shape: number[];
  data: Float32Array;
}

/** Tensors of a model folder by HF name, remembering which file each came from for error messages. */
export class Checkpoint extends Map<string, FloatTensor> {
  /** File each tensor was read from. */
  readonly files = new Map<string, string>();
  /** dtype each tensor was stored as. */
  readonly dtypes = new Map<string, Dtype>();

  constructor(readonly dir: string) {
    super();
  }

  /** The tensor `name`, or a UserError naming the checkpoint files; checks the shape when given. */
  require(name: string, shape?: readonly number[]): FloatTensor {
    const t = this.get(name);
    if (!t) {
      const where = [...new Set(this.files.values())].map((f) => path.basename(f)).join(', ') || 'no files';
      throw new UserError(`${this.dir}: tensor "${name}" not found in the checkpoint (${where})`);
    }
    if (shape && (shape.length !== t.shape.length || shape.some((d, i) => d !== t.shape[i]))) {
      throw new UserError(`${this.files.get(name)}: tensor "${name}" has shape [${t.shape.join(', ')}], expected [${shape.join(', ')}]`);
    }
    return t;
  }
}

function readJson(file: string): unknown {
  let text: string;
  try {
    text = fs.readFileSync(file, 'utf8');
  } catch (e) {
    throw new UserError(`${file}: cannot read (${(e as Error).message})`);
  }
  try {
    return JSON.parse(text);
  } catch (e) {
    throw new UserError(`${file}: invalid JSON (${(e as Error).message})`);
  }
}

/** Reads `model.safetensors.index.json` → tensor name → shard file name. */
function readIndex(file: string): Map<string, string> {
  const raw = readJson(file) as { weight_map?: unknown } | null;
  const wm = raw && typeof raw === 'object' ? raw.weight_map : undefined;
  if (!wm || typeof wm !== 'object' || Array.isArray(wm)) throw new UserError(`${file}: missing "weight_map" object`);
  const map = new Map<string, string>();
  for (const [name, shard] of Object.entries(wm as Record<string, unknown>)) {
    if (typeof shard !== 'string' || shard.includes('/') || shard.includes('\\') || shard.startsWith('.')) {
      throw new UserError(`${file}: weight_map entry "${name}" must name a shard file in the same folder, got ${JSON.stringify(shard)}`);
    }
    map.set(name, shard);
  }
  if (map.size === 0) throw new UserError(`${file}: "weight_map" is empty`);
  return map;
}

/** Which safetensors files hold the weights of `dir` (single file preferred, as HF does). */
export function checkpointFiles(dir: string): string[] {
  if (!fs.existsSync(dir)) throw new UserError(`${dir}: no such model folder`);
  if (!fs.statSync(dir).isDirectory()) throw new UserError(`${dir}: not a folder (expected a Hugging Face model folder)`);
  const single = path.join(dir, SINGLE_FILE);
  if (fs.existsSync(single)) return [single];
  const index = path.join(dir, INDEX_FILE);
  if (fs.existsSync(index)) return [...new Set(readIndex(index).values())].sort().map((f) => path.join(dir, f));
  const hasBin = fs.existsSync(path.join(dir, 'pytorch_model.bin')) || fs.existsSync(path.join(dir, 'pytorch_model.bin.index.json'));
  throw new UserError(
    `${dir}: no ${SINGLE_FILE} or ${INDEX_FILE}` +
      (hasBin ? ' (pytorch_model.bin is not supported: convert the model to safetensors first)' : ''),
  );
}

/**
 * Loads every weight of a model folder as float32 (F16/BF16 widened exactly, F64 rounded).
 * With an index, each tensor must be in the shard the index names and appear in only one shard.
 */
export function loadCheckpoint(dir: string): Checkpoint {
  const files = checkpointFiles(dir);
  const ckpt = new Checkpoint(dir);
  const indexFile = path.join(dir, INDEX_FILE);
  const weightMap = files.length === 1 && path.basename(files[0]) === SINGLE_FILE ? null : readIndex(indexFile);
  for (const file of files) {
    if (!fs.existsSync(file)) throw new UserError(`${indexFile}: shard ${path.basename(file)} is listed in weight_map but does not exist`);
    const { tensors } = readSafetensors(file);
    for (const [name, raw] of tensors) {
      if (ckpt.has(name)) throw new UserError(`${file}: tensor "${name}" is also stored in ${ckpt.files.get(name)}`);
      if (!(FLOAT_DTYPES as readonly string[]).includes(raw.dtype)) {
        throw new UserError(`${file}: tensor "${name}" has dtype ${raw.dtype}; model weights must be F32, F16, BF16 or F64`);
      }
      ckpt.set(name, { shape: raw.shape, data: tensorToFloat32(raw) });
      ckpt.files.set(name, file);
      ckpt.dtypes.set(name, raw.dtype);
    }
  }
  if (weightMap) {
    for (const [name, shard] of weightMap) {
      const got = ckpt.files.get(name);
      if (!got) throw new UserError(`${path.join(dir, shard)}: tensor "${name}" is listed in ${INDEX_FILE} but missing from the shard`);
      if (path.basename(got) !== shard) throw new UserError(`${got}: tensor "${name}" is listed in ${INDEX_FILE} under ${shard}`);
    }
  }
  return ckpt;
}

export interface SaveOptions {
  /** Storage dtype of the weights (default F32; BF16 rounds to nearest even). */
  dtype?: 'F32' | 'BF16' | 'F16';
  /** Shard when the weights exceed this many bytes (default: never). */
  maxShardBytes?: number;
  /** Written as config.json (with torch_dtype set to match `dtype`). */
  config?: ModelConfig;
}

const TORCH_DTYPE: Record<'F32' | 'BF16' | 'F16', string> = { F32: 'float32', BF16: 'bfloat16', F16: 'float16' };

/**
 * Saves weights in HF layout: one `model.safetensors`, or shards plus an index when the total exceeds
 * `maxShardBytes` (tensors packed greedily in name order; a tensor larger than the limit gets a shard
 * of its own). Every file goes to a temp name first and is renamed into place, the index last; weight
 * files of an earlier save that the new layout does not use are removed afterwards.
 */
export function saveCheckpoint(
  dir: string,
  tensors: Map<string, FloatTensor> | Record<string, FloatTensor>,
  opts: SaveOptions = {},
): string[] {
  const dtype = opts.dtype ?? 'F32';
  if (!(dtype in TORCH_DTYPE)) throw new UserError(`--dtype: "${dtype}" is not one of F32, BF16, F16`);
  const entries = (tensors instanceof Map ? [...tensors.entries()] : Object.entries(tensors)).sort((a, b) =>
    a[0] < b[0] ? -1 : a[0] > b[0] ? 1 : 0,
  );
  for (const [name, t] of entries) {
    let n: number;
    try {
      n = numel(t.shape);
    } catch (e) {
      throw new UserError(`${dir}: tensor "${name}": ${(e as Error).message}`);
    }
    if (!(t.data instanceof Float32Array) || t.data.length !== n) {
      throw new UserError(`${dir}: tensor "${name}" needs ${n} float32 values for shape [${t.shape.join(', ')}], got ${t.data?.length}`);
    }
  }
  fs.mkdirSync(dir, { recursive: true });
  const bytesOf = (t: FloatTensor) => t.data.length * DTYPE_SIZES[dtype];
  const limit = opts.maxShardBytes ?? Infinity;
  if (!(limit > 0)) throw new UserError(`maxShardBytes must be positive, got ${opts.maxShardBytes}`);
  const shards: Array<Array<[string, FloatTensor]>> = [[]];
  let size = 0;
  for (const e of entries) {
    const b = bytesOf(e[1]);
    if (size > 0 && size + b > limit) {
      shards.push([]);
      size = 0;
    }
    shards[shards.length - 1].push(e);
    size += b;
  }
  const metadata = { format: 'pt' };
  const toWrite = (group: Array<[string, FloatTensor]>) =>
    new Map<string, TensorToWrite>(group.map(([name, t]) => [name, { dtype, shape: t.shape, data: t.data }]));

  if (opts.config) writeConfig(dir, { ...opts.config, torch_dtype: TORCH_DTYPE[dtype] });
  const written: string[] = [];
  if (shards.length === 1) {
    const file = path.join(dir, SINGLE_FILE);
    writeSafetensors(file, toWrite(shards[0]), metadata);
    written.push(file);
  } else {
    const total = shards.length;
    const weightMap: Record<string, string> = {};
    let totalSize = 0;
    shards.forEach((group, i) => {
      const name = `model-${String(i + 1).padStart(5, '0')}-of-${String(total).padStart(5, '0')}.safetensors`;
      writeSafetensors(path.join(dir, name), toWrite(group), metadata);
      written.push(path.join(dir, name));
      for (const [tname, t] of group) {
        weightMap[tname] = name;
        totalSize += bytesOf(t);
      }
    });
    const index = { metadata: { total_size: totalSize }, weight_map: weightMap };
    const indexFile = path.join(dir, INDEX_FILE);
    writeFileAtomic(indexFile, [Buffer.from(JSON.stringify(index, null, 2) + '\n', 'utf8')]);
    written.push(indexFile);
  }
  // A stale index or shard set from an earlier save would otherwise shadow or confuse the new one.
  const keep = new Set(written.map((f) => path.basename(f)));
  for (const f of fs.readdirSync(dir)) {
    if (keep.has(f)) continue;
    if (f === SINGLE_FILE || f === INDEX_FILE || SHARD_RE.test(f)) fs.rmSync(path.join(dir, f), { force: true });
  }
  return written;
}
