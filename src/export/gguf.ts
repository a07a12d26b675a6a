/**
 * Export to one GGUF v3 file that llama.cpp (node-llama-cpp, Ollama, LM Studio) loads: the family's
 * architecture metadata and tensor names (src/export/families.ts), the tokenizer and chat template
 * (gguf-tokenizer.ts), the weights as F32, F16 or Q8_0. As llama.cpp's converter does, vectors
 * (norms, biases) stay F32 in every file, and a matrix whose rows are not whole Q8_0 blocks is
 * written F16 in a Q8_0 file.
 */
import path from 'node:path';
import { UserError } from '../errors.ts';
import { checkOutputFolder, fileError, writeFileAtomic } from '../io/atomic.ts';
import type { FloatTensor } from '../models/checkpoint.ts';
import type { LlamaConfig, ModelConfig } from '../models/config.ts';
import { parameterShapes } from '../models/config.ts';
import { FILE_TYPE, type GgmlType, type GgufTensor, type MetaValue, Q8_0_BLOCK, encodeGguf, meta } from './gguf-file.ts';
import { GGUF_FAMILIES, type GgufNames, mlpActivation } from './families.ts';
import { ggufTokenizer } from './gguf-tokenizer.ts';
import { type ExportSource, readJsonIfAny } from './source.ts';

export const GGUF_DTYPES = ['f32', 'f16', 'q8_0'] as const;
export type GgufDtype = (typeof GGUF_DTYPES)[number];
const TYPE_OF: Record<GgufDtype, GgmlType> = { f32: 'F32', f16: 'F16', q8_0: 'Q8_0' };

/** The family's GGUF names, or a one-line refusal of the model. */
export function ggufNames(c: ModelConfig): GgufNames {
  const names = GGUF_FAMILIES[c.model_type] as GgufNames | undefined;
  if (!names) throw new UserError(`--format gguf: ${c.model_type} is not exported to GGUF (supported: ${Object.keys(GGUF_FAMILIES).join(', ')})`);
  const act = mlpActivation(c);
  if (!names.activations.includes(act)) throw new UserError(`config.json: activation "${act}" is not exported to GGUF for ${c.model_type} (llama.cpp's ${names.arch} uses ${names.activations[0]})`);
  names.check?.(c);
  return names;
}

/**
 * HF's rotate-half q/k rows → llama.cpp's adjacent pairs, per head: row j·hd/2 + i of a head
 * (half j, index i) moves to row 2i + j. `rows` is heads·hd; the trailing size is `cols`.
 */
export function permuteRotary(data: Float32Array, heads: number, cols: number): Float32Array {
  const hd = data.length / cols / heads;
  const half = hd / 2;
  const out = new Float32Array(data.length);
  for (let h = 0; h < heads; h++) {
    for (let j = 0; j < 2; j++) {
      for (let i = 0; i < half; i++) {
        const from = (h * hd + j * half + i) * cols;
        const to = (h * hd + 2 * i + j) * cols;
        out.set(data.subarray(from, from + cols), to);
      }
    }
  }
  return out;
}

function transpose(data: Float32Array, rows: number, cols: number): Float32Array {
  const out = new Float32Array(data.length);
  for (let r = 0; r < rows; r++) for (let c = 0; c < cols; c++) out[c * rows + r] = data[r * cols + c];
  return out;
}

/** The tensors of the file: GGUF names, llama.cpp's layouts, each in the type `dtype` gives it. */
export function ggufTensors(c: ModelConfig, weights: Map<string, FloatTensor>, names: GgufNames, dtype: GgufDtype): GgufTensor[] {
  const out: GgufTensor[] = [];
  const typeFor = (shape: number[]): GgmlType => {
    if (shape.length < 2 || dtype === 'f32') return 'F32';
    if (dtype === 'q8_0' && shape[shape.length - 1] % Q8_0_BLOCK !== 0) return 'F16';
    return TYPE_OF[dtype];
  };
  const add = (name: string, shape: number[], data: Float32Array) => out.push({ name, shape, type: typeFor(shape), data });
  const nameOf = (hf: string): string => {
    if (hf.startsWith(names.layerPrefix)) {
      const m = /^(\d+)\.(.+)$/.exec(hf.slice(names.layerPrefix.length));
      const to = m ? names.layer[m[2]] : undefined;
      if (m && to) return `blk.${m[1]}.${to}`;
    } else if (names.global[hf]) return names.global[hf];
    throw new Error(`gguf: no GGUF name for ${c.model_type} tensor ${hf}`);
  };
  for (const [hf, shape] of parameterShapes(c)) {
    const w = weights.get(hf);
    if (!w) throw new Error(`gguf: weight ${hf} is missing`);
    let data = w.data;
    let s = shape;
    if (names.transposed?.test(hf)) {
      data = transpose(data, shape[0], shape[1]);
      s = [shape[1], shape[0]];
    }
    if (names.permuteQK) {
      const lc = c as LlamaConfig;
      const heads = /self_attn\.q_proj\./.test(hf) ? lc.num_attention_heads : /self_attn\.k_proj\./.test(hf) ? lc.num_key_value_heads : 0;
      if (heads) data = permuteRotary(data, heads, s.length === 2 ? s[1] : 1);
    }
    if (names.normPlusOne && /norm\.weight$/.test(hf)) data = data.map((x) => x + 1);
    add(nameOf(hf), s, data);
  }
  const tied = c.tie_word_embeddings;
  if (tied && names.tiedOutput === 'copy') {
    const embed = out.find((t) => t.name === 'token_embd.weight')!;
    add('output.weight', embed.shape, embed.data);
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
export function ggufMetadata(src: ExportSource, names: GgufNames, dtype: GgufDtype): Map<string, MetaValue> {
  const m = new Map<string, MetaValue>();
  m.set('general.architecture', meta.str(names.arch));
  m.set('general.type', meta.str('model'));
  m.set('general.name', meta.str(modelName(src)));
  for (const [k, v] of Object.entries(names.metadata(src.config as never))) m.set(`${names.arch}.${k}`, v);
  m.set('general.file_type', meta.u32(FILE_TYPE[TYPE_OF[dtype]]));
  if (dtype === 'q8_0') m.set('general.quantization_version', meta.u32(2));
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
