/**
 * Export to the layout transformers.js loads (the one Optimum writes for decoder-only models):
 *
 *   OUT/config.json, generation_config.json, tokenizer.json, tokenizer_config.json (chat template kept)
 *   OUT/onnx/model.onnx             float32
 *   OUT/onnx/model_fp16.onnx        float16 weights, widened to float32 where used (optional)
 *   OUT/onnx/model_quantized.onnx   int8 matrices with a float32 scale per row (optional)
 *
 * One graph serves the prompt and every later step: inputs `input_ids [batch_size, sequence_length]`,
 * `attention_mask [batch_size, past_sequence_length + sequence_length]`, `position_ids`,
 * `past_key_values.N.key|value [batch_size, kv_heads, past_sequence_length, head_dim]` (empty on the
 * first call); outputs `logits [batch_size, sequence_length, vocab]` and `present.N.key|value` (the
 * cache extended by the new positions). The layers are the family's own KV-cached decode
 * (src/models), the same code prefzoo samples with, with the weights as initializers.
 */
import fs from 'node:fs';
import path from 'node:path';
import { UserError } from '../errors.ts';
import { fileError, releaseTemp, removeTemp, tempPath, writeJsonAtomic } from '../io/atomic.ts';
import { Graph, attr, type Tensor } from '../onnx/graph.ts';
import { saveModel } from '../onnx/proto.ts';
import type { FloatTensor } from '../models/checkpoint.ts';
import type { ModelConfig } from '../models/family.ts';
import { familyFor } from '../models/families.ts';
import { decodeIndex, pastName, reshapeRt } from '../models/layers.ts';
import { Params } from '../models/params.ts';
import { float32ToF16 } from '../models/safetensors.ts';
import { type ExportSource, TOKENIZER_FILES, readJsonIfAny } from './source.ts';

/** Weight precisions of the ONNX export and the file each goes to (transformers.js's `dtype` names). */
export const ONNX_DTYPES = { fp32: 'model.onnx', fp16: 'model_fp16.onnx', q8: 'model_quantized.onnx' } as const;
export type OnnxDtype = keyof typeof ONNX_DTYPES;

export const pastKeyValuesName = (layer: number, kv: 'key' | 'value') => `past_key_values.${layer}.${kv}`;

/**
 * Weights as initializers in the chosen precision, returned as the float32 tensors the layers read:
 * fp16 tensors are widened by `Params`, int8 ones pass through DequantizeLinear (per-row scale).
 */
function weightTensors(g: Graph, weights: Map<string, FloatTensor>, names: Iterable<string>, dtype: OnnxDtype): Map<string, Tensor> {
  const out = new Map<string, Tensor>();
  for (const name of names) {
    const w = weights.get(name);
    if (!w) throw new Error(`no weight named ${name}`);
    if (dtype === 'fp16') {
      out.set(name, g.initializer(name, { dtype: 'float16', dims: w.shape, data: float32ToF16(w.data) }));
    } else if (dtype === 'q8' && w.shape.length === 2) {
      const { q, scale } = quantizeRows(w.data, w.shape[0], w.shape[1]);
      const x = g.initializer(name + '_quantized', { dtype: 'int8', dims: w.shape, data: q });
      const s = g.initializer(name + '_scale', { dtype: 'float32', dims: [w.shape[0]], data: scale });
      out.set(name, g.op('DequantizeLinear', [x, s], { axis: attr.int(0) }, [{ dtype: 'float32', shape: w.shape }], name)[0]);
    } else {
      out.set(name, g.initializer(name, { dtype: 'float32', dims: w.shape, data: w.data }));
    }
  }
  return out;
}

/** Symmetric int8 per row: scale = max|x| / 127, q = round(x / scale). */
export function quantizeRows(data: Float32Array, rows: number, cols: number): { q: Int8Array; scale: Float32Array } {
  const q = new Int8Array(rows * cols);
  const scale = new Float32Array(rows);
  for (let r = 0; r < rows; r++) {
    let amax = 0;
    for (let i = r * cols; i < (r + 1) * cols; i++) amax = Math.max(amax, Math.abs(data[i]));
    const d = amax / 127;
    scale[r] = d === 0 ? 1 : d;
    const inv = d === 0 ? 0 : 1 / d;
    for (let i = r * cols; i < (r + 1) * cols; i++) q[i] = Math.round(data[i] * inv);
  }
  return { q, scale };
}

/** The decoder graph transformers.js runs (see the file comment for its inputs and outputs). */
export function buildOnnxExportGraph(c: ModelConfig, weights: Map<string, FloatTensor>, dtype: OnnxDtype = 'fp32'): Graph {
  const fam = familyFor(c);
  if (!fam.onnx) throw new UserError(`--format onnx: ${c.model_type} has no ONNX export names (its family file's onnx slot)`);
  const g = new Graph('prefzoo_export');
  const ids = g.input('input_ids', 'int64', ['batch_size', 'sequence_length']);
  const attn = g.input('attention_mask', 'int64', ['batch_size', 'total_sequence_length']);
  const positions = fam.onnx.extraInputs.includes('position_ids') ? g.input('position_ids', 'int64', ['batch_size', 'sequence_length']) : null;
  const { layers, kvHeads, headDim } = fam.cacheShape(c);
  const past = new Map<string, Tensor>();
  for (let i = 0; i < layers; i++) {
    for (const kv of ['key', 'value'] as const) {
      past.set(pastName(i, kv), g.input(pastKeyValuesName(i, kv), 'float32', ['batch_size', kvHeads, 'past_sequence_length', headDim]));
    }
  }
  const names = [...weights.keys()];
  const P = new Params(weightTensors(g, weights, names, dtype), c);
  // The mask (causal, padding, sliding window) from the attention mask; the rotary or learned
  // positions from position_ids when Optimum names them, as the HF models take them (equal to the
  // mask's count for every real token).
  const ix0 = decodeIndex(g, ids, attn, fam.window(c));
  const ix = positions ? { ...ix0, positions } : ix0;
  const hidden = fam.decode(g, c, P, ix, past); // [B·S, D]
  const head = fam.headWeight(c, P);
  const V = head.shape![0] as number;
  const flat = g.gemm(hidden, head, null, { transB: true }); // [B·S, V]
  g.output(reshapeRt(g, flat, g.concat([ix.shapeBS, g.ints([V])], 0), ['batch_size', 'sequence_length', V]), 'logits');
  return g;
}

export interface OnnxExportOptions {
  /** Which files to write (default: fp32 only). */
  dtypes?: readonly OnnxDtype[];
}

/**
 * Writes the transformers.js folder `out` from `src`, through a temporary folder renamed at the end
 * (an existing `out` is replaced only once everything is written). Returns the files written.
 */
export function exportOnnx(src: ExportSource, out: string, o: OnnxExportOptions = {}): string[] {
  const dtypes = o.dtypes ?? ['fp32'];
  if (fs.existsSync(out) && !fs.statSync(out).isDirectory()) throw new UserError(`-o ${out}: exists and is not a folder`);
  const parent = path.dirname(path.resolve(out));
  if (!fs.existsSync(parent)) throw new UserError(`-o ${out}: folder ${path.dirname(out)} does not exist; create it first`);
  if (!fs.existsSync(path.join(src.dir, 'tokenizer.json'))) throw new UserError(`${src.dir}: no tokenizer.json; transformers.js needs the fast tokenizer file`);
  const tmp = tempPath(out);
  const written: string[] = [];
  try {
    fs.mkdirSync(path.join(tmp, 'onnx'), { recursive: true });
    for (const f of fs.readdirSync(src.dir)) if (TOKENIZER_FILES.test(f)) fs.copyFileSync(path.join(src.dir, f), path.join(tmp, f));
    writeJsonAtomic(path.join(tmp, 'config.json'), { ...src.config, torch_dtype: 'float32' });
    if (!fs.existsSync(path.join(tmp, 'generation_config.json'))) writeJsonAtomic(path.join(tmp, 'generation_config.json'), generationConfig(src));
    for (const d of dtypes) {
      const g = buildOnnxExportGraph(src.config, src.weights, d);
      saveModel(g, path.join(tmp, 'onnx', ONNX_DTYPES[d]), { producer: 'prefzoo', docString: `prefzoo export (${d}) of ${src.config.model_type}` });
    }
    const cfg = readJsonIfAny(tmp, 'tokenizer_config.json');
    if (cfg && typeof cfg.chat_template !== 'string' && fs.existsSync(path.join(src.dir, 'chat_template.jinja'))) {
      // transformers.js reads the template from tokenizer_config.json only.
      writeJsonAtomic(path.join(tmp, 'tokenizer_config.json'), { ...cfg, chat_template: fs.readFileSync(path.join(src.dir, 'chat_template.jinja'), 'utf8') });
    }
    for (const f of walk(tmp)) written.push(path.join(out, path.relative(tmp, f)));
    fs.rmSync(out, { recursive: true, force: true });
    fs.renameSync(tmp, out);
    releaseTemp(tmp);
  } catch (e) {
    removeTemp(tmp);
    throw fileError(e, out);
  }
  return written.sort();
}

function generationConfig(src: ExportSource): Record<string, unknown> {
  const c = src.config;
  const g: Record<string, unknown> = {};
  for (const k of ['bos_token_id', 'eos_token_id', 'pad_token_id'] as const) if (c[k] != null) g[k] = c[k];
  return g;
}

function walk(dir: string): string[] {
  const out: string[] = [];
  for (const e of fs.readdirSync(dir, { withFileTypes: true })) {
    const p = path.join(dir, e.name);
    if (e.isDirectory()) out.push(...walk(p));
    else out.push(p);
  }
  return out;
}
