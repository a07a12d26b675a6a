/**
 * Export to one GGUF v3 file that llama.cpp (node-llama-cpp, Ollama, LM Studio) loads: the family's
 * architecture metadata and tensor names (src/export/families.ts), the tokenizer and chat template
 * (gguf-tokenizer.ts), the weights as F32, F16, Q8_0 or Q4_0. As llama.cpp's converter does, vectors
 * (norms, biases) stay F32 in every file, and a matrix whose rows are not whole blocks of 32 is
 * written F16 in a Q8_0 or Q4_0 file. A Q4_0 file is pure, as `llama-quantize --pure` writes it:
 * every other matrix is Q4_0, the token embedding and the output head included (llama.cpp's own Q4_0
 * mix keeps the head, or a tied embedding, at Q6_K, a type this writer does not produce).
 */
import path from 'node:path';
import { UserError } from '../errors.ts';
import { checkOutputFolder, fileError, writeFileAtomic } from '../io/atomic.ts';
import type { FloatTensor } from '../models/checkpoint.ts';
import { type GgufNames, type GgufValue, type ModelConfig, ggufValue as meta } from '../models/family.ts';
import { ARCHES, familyFor, familyOf } from '../models/families.ts';
import { FILE_TYPE, type GgmlType, type GgufTensor, QUANT_BLOCK, encodeGguf } from './gguf-file.ts';
import { ggufTokenizer } from './gguf-tokenizer.ts';
import { type ExportSource, readJsonIfAny } from './source.ts';

export const GGUF_DTYPES = ['f32', 'f16', 'q8_0', 'q4_0'] as const;
export type GgufDtype = (typeof GGUF_DTYPES)[number];
const TYPE_OF: Record<GgufDtype, GgmlType> = { f32: 'F32', f16: 'F16', q8_0: 'Q8_0', q4_0: 'Q4_0' };
const QUANTIZED: readonly GgufDtype[] = ['q8_0', 'q4_0'];

/** The family's GGUF names (its file's `gguf` slot), or a one-line refusal of the model. */
export function ggufNames(c: ModelConfig): GgufNames {
  const names = familyFor(c).gguf as GgufNames | undefined;
  if (!names) {
    const supported = ARCHES.filter((a) => familyOf(a).gguf);
    throw new UserError(`--format gguf: ${c.model_type} is not exported to GGUF (supported: ${supported.join(', ')})`);
  }
  names.check?.(c);
  return names;
}

/** The tensors of the file: GGUF names, llama.cpp's layouts, each in the type `dtype` gives it. */
export function ggufTensors(c: ModelConfig, weights: Map<string, FloatTensor>, names: GgufNames, dtype: GgufDtype): GgufTensor[] {
  const out: GgufTensor[] = [];
  const typeFor = (shape: number[]): GgmlType => {
    if (shape.length < 2 || dtype === 'f32') return 'F32';
    if (QUANTIZED.includes(dtype) && shape[shape.length - 1] % QUANT_BLOCK !== 0) return 'F16';
    return TYPE_OF[dtype];
  };
  for (const [hf, shape] of familyFor(c).parameterShapes(c)) {
    const name = names.tensorName(hf);
    if (name === null) continue;
    const w = weights.get(hf);
    if (!w) throw new Error(`gguf: weight ${hf} is missing`);
    const t = names.tensorData ? names.tensorData(c, hf, shape, w.data) : { shape, data: w.data };
    out.push({ name, shape: t.shape, type: typeFor(t.shape), data: t.data });
  }
  return out;
}

/**
 * `general.name`: the folder's name. llama.cpp takes a name containing "phi3" or "phi-3" for
 * Microsoft's Phi-3 and looks up its special tokens by text (a missing one aborts the load), so such
 * a name is written as "phi 3" when the vocabulary lacks them.
 */
function modelName(src: ExportSource): string {
  const name = path.basename(path.resolve(src.adapter ?? src.dir));
  if (!/phi-?3/i.test(name)) return name;
  const tj = readJsonIfAny(src.dir, 'tokenizer.json');
  const model = (tj?.model ?? {}) as { vocab?: unknown };
  const vocab = new Set<string>(Array.isArray(model.vocab) ? (model.vocab as [string, number][]).map((v) => v[0]) : Object.keys(model.vocab ?? {}));
  for (const a of (tj?.added_tokens ?? []) as { content: string }[]) vocab.add(a.content);
  return ['</s>', '<unk>', '<s>', '<|endoftext|>'].every((t) => vocab.has(t)) ? name : name.replace(/phi-?3/gi, 'phi 3');
}

/** Every metadata key of the file, in the order llama.cpp's converter writes them. */
export function ggufMetadata(src: ExportSource, names: GgufNames, dtype: GgufDtype): Map<string, GgufValue> {
  const m = new Map<string, GgufValue>();
  m.set('general.architecture', meta.str(names.arch));
  m.set('general.type', meta.str('model'));
  m.set('general.name', meta.str(modelName(src)));
  for (const [k, v] of Object.entries(names.metadata(src.config))) m.set(`${names.arch}.${k}`, v);
  m.set('general.file_type', meta.u32(FILE_TYPE[TYPE_OF[dtype]]));
  if (QUANTIZED.includes(dtype)) m.set('general.quantization_version', meta.u32(2));
  for (const [k, v] of ggufTokenizer(src.dir, src.config)) m.set(k, v);
  return m;
}

/** Writes `out` (one .gguf file, atomically). Returns its size in bytes. */
export function exportGguf(src: ExportSource, out: string, dtype: GgufDtype = 'f32'): number {
  if (!(GGUF_DTYPES as readonly string[]).includes(dtype)) throw new UserError(`--dtype: "${dtype}" is not one of ${GGUF_DTYPES.join(', ')} for --format gguf`);
  const names = ggufNames(src.config);
  checkOutputFolder(out, '-o');
  const chunks = encodeGguf(ggufMetadata(src, names, dtype), ggufTensors(src.config, src.weights, names, dtype));
  try {
    writeFileAtomic(out, chunks);
  } catch (e) {
    throw fileError(e, out);
  }
  return chunks.reduce((a, c) => a + c.byteLength, 0);
}
