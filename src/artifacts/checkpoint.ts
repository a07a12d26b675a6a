/**
 * The checkpoint folder of a training run:
 *
 *   params.safetensors     every parameter (trainable and frozen), by its own name
 *   optimizer.safetensors  optimizer state, named `<slot>.<param>` (m.w, v.w, momentum.w)
 *   state.json             { step, epoch, rng, dataCursor, config, ... } — the trainer's own state
 *
 * A checkpoint is written to a temporary `.step-N.tmp-PID-RAND` and renamed into place (the previous one is moved aside to
 * `<dir>.old` first and removed last), so a crash leaves either the old or the new checkpoint whole.
 */
import fs from 'node:fs';
import path from 'node:path';
import { UserError } from '../errors.ts';
import type { DType, TypedArray } from '../onnx/dtype.ts';
import { type Dtype, type RawTensor, type SafetensorsSink, type TensorData, readSafetensors, writeSafetensors } from '../models/safetensors.ts';
import { fileError, releaseTemp, removeTemp, tempPath, writeFileAtomic } from '../io/atomic.ts';

export const CHECKPOINT_FILES = { params: 'params.safetensors', optimizer: 'optimizer.safetensors', state: 'state.json' } as const;

/** What the trainer stores besides tensors; `step` counts optimizer updates applied. */
export interface CheckpointState {
  step: number;
  epoch?: number;
  /** Any JSON-serialisable RNG state (e.g. the seed words of the batch shuffler). */
  rng?: unknown;
  /** Position in the data stream (e.g. { epoch, index }). */
  dataCursor?: unknown;
  config?: unknown;
  [key: string]: unknown;
}

export interface CheckpointTensor {
  dtype: DType;
  shape: readonly number[];
  data: TypedArray;
}

const TO_SAFETENSORS: Partial<Record<DType, Dtype>> = {
  float32: 'F32',
  float64: 'F64',
  float16: 'F16',
  bfloat16: 'BF16',
  int64: 'I64',
  int32: 'I32',
  int8: 'I8',
  uint8: 'U8',
  bool: 'BOOL',
};

export function safetensorsDtype(d: DType): Dtype {
  const s = TO_SAFETENSORS[d];
  if (!s) throw new Error(`dtype ${d} has no safetensors equivalent`);
  return s;
}

function toWrite(tensors: Map<string, CheckpointTensor>) {
  const out = new Map<string, { dtype: Dtype; shape: readonly number[]; data: TensorData }>();
  for (const [name, t] of tensors) {
    const dtype = safetensorsDtype(t.dtype);
    // Raw bytes keep every dtype bit-exact (F16/BF16 bit patterns included).
    const data = new Uint8Array(t.data.buffer, t.data.byteOffset, t.data.byteLength);
    out.set(name, { dtype, shape: t.shape, data });
  }
  return out;
}

/**
 * Writes a checkpoint folder atomically (see the module comment). `files` adds more safetensors files
 * to the same folder (by file name), e.g. the trainer's moving reference model under TR-DPO.
 */
export function writeCheckpoint(
  dir: string,
  params: Map<string, CheckpointTensor>,
  optimizer: Map<string, CheckpointTensor>,
  state: CheckpointState,
  files: Record<string, Map<string, CheckpointTensor>> = {},
): void {
  const target = path.resolve(dir);
  const tmp = tempPath(target);
  const old = `${target}.old`;
  try {
    fs.mkdirSync(tmp, { recursive: true });
    writeSafetensors(path.join(tmp, CHECKPOINT_FILES.params), toWrite(params), { format: 'pt' });
    writeSafetensors(path.join(tmp, CHECKPOINT_FILES.optimizer), toWrite(optimizer));
    for (const [name, tensors] of Object.entries(files)) writeSafetensors(path.join(tmp, name), toWrite(tensors), { format: 'pt' });
    writeFileAtomic(path.join(tmp, CHECKPOINT_FILES.state), [Buffer.from(JSON.stringify(state, null, 2) + '\n')]);
  } catch (e) {
    removeTemp(tmp);
    throw fileError(e, target);
  }
  fs.rmSync(old, { recursive: true, force: true });
  if (fs.existsSync(target)) fs.renameSync(target, old);
  fs.renameSync(tmp, target);
  releaseTemp(tmp);
  fs.rmSync(old, { recursive: true, force: true });
}

export interface LoadedCheckpoint {
  dir: string;
  params: Map<string, RawTensor>;
  optimizer: Map<string, RawTensor>;
  state: CheckpointState;
}

/**
 * Reads a checkpoint folder (falling back to `<dir>.old` if a crash interrupted the final rename).
 * `into` reads each tensor straight into memory the caller holds (see readSafetensors).
 */
export function readCheckpoint(dir: string, into?: SafetensorsSink): LoadedCheckpoint {
  let d = path.resolve(dir);
  if (!fs.existsSync(d) && fs.existsSync(`${d}.old`)) d = `${d}.old`;
  if (!fs.existsSync(d)) throw new UserError(`${dir}: checkpoint folder not found`);
  for (const f of Object.values(CHECKPOINT_FILES)) {
    if (!fs.existsSync(path.join(d, f))) throw new UserError(`${path.join(d, f)}: missing from the checkpoint`);
  }
  const stateFile = path.join(d, CHECKPOINT_FILES.state);
  let state: CheckpointState;
  try {
    state = JSON.parse(fs.readFileSync(stateFile, 'utf8'));
  } catch (e) {
    throw new UserError(`${stateFile}: not valid JSON (${(e as Error).message})`);
  }
  if (typeof state !== 'object' || state === null || !Number.isInteger(state.step) || state.step < 0) {
    throw new UserError(`${stateFile}: "step" must be an integer ≥ 0`);
  }
  return {
    dir: d,
    params: readSafetensors(path.join(d, CHECKPOINT_FILES.params), { into }).tensors,
    optimizer: readSafetensors(path.join(d, CHECKPOINT_FILES.optimizer), { into }).tensors,
    state,
  };
}
