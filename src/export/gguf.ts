/**
 * Export to one GGUF v3 file that llama.cpp (node-llama-cpp, Ollama, LM Studio) loads: the family's
 * architecture metadata and tensor names (src/export/families.ts), the tokenizer and chat template
 * (gguf-tokenizer.ts), the weights as F32, F16, Q8_0, Q4_0 or llama.cpp's Q4_K_M mix. As llama.cpp's
 * converter does, vectors (norms, biases) stay F32 in every file, and a matrix whose rows are not
 * whole blocks of 32 is written F16 in a Q8_0 or Q4_0 file. A Q4_0 file is pure, as
 * `llama-quantize --pure` writes it: every other matrix is Q4_0, the token embedding and the output
 * head included. A q4_k_m file gives each matrix the type `llama-quantize … Q4_K_M` does (q4kmType).
 */
import path from 'node:path';
import { UserError } from '../errors.ts';
import { checkOutputFolder, fileError, writeFileAtomic } from '../io/atomic.ts';
import type { FloatTensor } from '../models/checkpoint.ts';
import { type GgufNames, type GgufValue, type ModelConfig, ggufValue as meta } from '../models/family.ts';
import { ARCHES, familyFor, familyOf } from '../models/families.ts';
import { BLOCK_VALUES, type GgmlType, type GgufTensor, QUANT_BLOCK, encodeGguf } from './gguf-file.ts';
import { ggufTokenizer } from './gguf-tokenizer.ts';
import { type ExportSource, readJsonIfAny } from './source.ts';

export const GGUF_DTYPES = ['f32', 'f16', 'q8_0', 'q4_0', 'q4_k_m'] as const;
export type GgufDtype = (typeof GGUF_DTYPES)[number];
const TYPE_OF: Record<Exclude<GgufDtype, 'q4_k_m'>, GgmlType> = { f32: 'F32', f16: 'F16', q8_0: 'Q8_0', q4_0: 'Q4_0' };
/** `general.file_type` (llama.h `llama_ftype`: ALL_F32, MOSTLY_F16, MOSTLY_Q8_0, MOSTLY_Q4_0, MOSTLY_Q4_K_M). */
const FILE_TYPE: Record<GgufDtype, number> = { f32: 0, f16: 1, q8_0: 7, q4_0: 2, q4_k_m: 15 };
const QUANTIZED: readonly GgufDtype[] = ['q8_0', 'q4_0', 'q4_k_m'];

/** llama.cpp's `use_more_bits`: the layers whose attn_v and ffn_down Q4_K_M raises to Q6_K. */
function useMoreBits(layer: number, layers: number): boolean {
  const eighth = Math.floor(layers / 8);
  return layer < eighth || layer >= Math.floor((7 * layers) / 8) || (layer - eighth) % 3 === 2;
}

/**
 * The type `llama-quantize` (llama-quant.cpp's `llama_tensor_get_type`, no importance matrix) gives
 * a matrix of a Q4_K_M file, `ne0` its row length: the output head — or the token embedding when
 * the head is tied to it — Q6_K (Q8_0 when rows are not whole super-blocks); attn_v (attn_qkv too)
 * and ffn_down Q6_K in the layers `useMoreBits` picks; every other matrix Q4_K; then the fallback
 * for rows that are not whole super-blocks of 256: Q4_K → Q5_0, Q6_K → Q8_0, and F16 where rows are
 * not whole blocks of 32 either.
 */
export function q4kmType(name: string, ne0: number, layers: number, tied: boolean): GgmlType {
  const layer = Number(/^blk\.(\d+)\./.exec(name)?.[1] ?? -1);
  let type: GgmlType = 'Q4_K';
  if (name === 'output.weight' || (tied && name === 'token_embd.weight')) type = ne0 % BLOCK_VALUES.Q6_K === 0 ? 'Q6_K' : 'Q8_0';
  else if (/\.attn_(v|qkv)\.weight$/.test(name) || /\.ffn_down\.weight$/.test(name)) type = useMoreBits(layer, layers) ? 'Q6_K' : 'Q4_K';
  if ((type === 'Q4_K' || type === 'Q6_K') && ne0 % BLOCK_VALUES[type] !== 0) type = type === 'Q4_K' ? 'Q5_0' : 'Q8_0';
  return ne0 % QUANT_BLOCK === 0 ? type : 'F16';
}

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
  const shapes = familyFor(c).parameterShapes(c);
  const ggufNames = [...shapes.keys()].map((hf) => names.tensorName(hf));
  const tied = !ggufNames.includes('output.weight');
  const layers = new Set(ggufNames.map((n) => /^blk\.(\d+)\./.exec(n ?? '')?.[1]).filter((l) => l !== undefined)).size;
  // llama.cpp classes an 80-layer llama or qwen2 model as 70B and gives its attn_v Q5_K, a type not written here.
  if (dtype === 'q4_k_m' && names.seventyBLayers !== undefined && layers === names.seventyBLayers) {
    throw new UserError(`--dtype q4_k_m: llama.cpp's mix gives an 80-layer ${names.arch} model's attn_v Q5_K, which this writer does not produce; use q8_0 or q4_0`);
  }
  const typeFor = (name: string, shape: number[]): GgmlType => {
    if (shape.length < 2 || dtype === 'f32') return 'F32';
    const ne0 = shape[shape.length - 1];
    if (dtype === 'q4_k_m') return name === 'position_embd.weight' ? 'F32' : q4kmType(name, ne0, layers, tied);
    if (QUANTIZED.includes(dtype) && ne0 % QUANT_BLOCK !== 0) return 'F16';
    return TYPE_OF[dtype];
  };
  const out: GgufTensor[] = [];
  for (const [hf, shape] of shapes) {
    const name = names.tensorName(hf);
    if (name === null) continue;
    const w = weights.get(hf);
    if (!w) throw new Error(`gguf: weight ${hf} is missing`);
    const t = names.tensorData ? names.tensorData(c, hf, shape, w.data) : { shape, data: w.data };
    out.push({ name, shape: t.shape, type: typeFor(name, t.shape), data: t.data });
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
  m.set('general.file_type', meta.u32(FILE_TYPE[dtype]));
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
