/**
 * QLoRA's frozen base ("QLoRA: Efficient Finetuning of Quantized LLMs", Dettmers et al. 2023): the
 * projection weights held block-quantized in 4 bits, dequantized to float32 where a layer uses them.
 *
 * Format: MatMulNBits' int4 (ONNX Runtime, com.microsoft), not bitsandbytes' NF4. A weight `[R, C]`
 * (as the checkpoint stores it: nn.Linear `[out, in]`, GPT-2's Conv1D `[in, out]`) is cut along each
 * row into blocks of `block` values; a block holds one float32 scale d and 16 levels q ∈ 0..15 read
 * back as (q − 8)·d, the zero point MatMulNBits and GatherBlockQuantized assume when none is fed.
 * d = m/−8 for m the block's first value of largest magnitude (sign kept), q = min(15, ⌊x/d + 8.5⌋):
 * ggml's Q4_0 rule (as the GGUF export's, there with a float16 scale), so m itself is exact (q = 0)
 * and every other value is within d/2. Why int4 and not NF4: ONNX Runtime dequantizes this layout in
 * one kernel (`GatherBlockQuantized`) and multiplies by it in another (`MatMulNBits`); NF4's 16 levels
 * are a table lookup that would take a Gather and four elementwise passes over every weight.
 *
 * Layout: `packed` `[R, C/2]` bytes, value 2j of a row in the low nibble of byte j and value 2j + 1
 * in its high nibble (MatMulNBits' `[R, blocks, block/2]` read as one row); `scales` `[R, C/block]`.
 * C must be a multiple of `block` (no padded blocks).
 */
import { UserError } from '../errors.ts';
import { attr, type Graph, type Tensor } from '../onnx/graph.ts';
import type { FloatTensor } from './checkpoint.ts';
import type { ModelConfig } from './config.ts';
import { projectionModules } from './lora.ts';
import { dequantizeBlocks, quantizeBlocks } from './quantize.ts';

/** A 4-bit weight `shape` `[R, C]`: `packed` `[R, C/2]`, `scales` `[R, C/block]`. */
export interface Q4Tensor {
  shape: number[];
  block: number;
  packed: Uint8Array;
  scales: Float32Array;
}

/** A base weight as the artifacts take it: float32, or already quantized (to spare a float32 copy of the model). */
export type BaseTensor = FloatTensor | Q4Tensor;

export function isQ4(t: BaseTensor): t is Q4Tensor {
  return 'packed' in t;
}

/** Graph/checkpoint names of a quantized weight `name` (`….weight`): its packed nibbles and its scales. */
export const q4Names = (name: string) => ({ packed: `${name}_q4`, scales: `${name}_q4_scale` });

/** The block sizes offered: powers of two that MatMulNBits and GatherBlockQuantized take. */
export const Q4_BLOCKS = [16, 32, 64, 128, 256] as const;

/** Names of the weights a 4-bit base quantizes: every projection's (LoRA's candidates); embeddings, the head, norms and biases stay float. */
export function quantizedWeights(c: ModelConfig): string[] {
  return projectionModules(c).map((m) => `${m.name}.weight`);
}

/** Refuses, in one line naming the setting, a block size that does not divide every quantized row. */
export function checkBlock(c: ModelConfig, shapes: Map<string, number[]>, block: number): void {
  if (!(Q4_BLOCKS as readonly number[]).includes(block)) throw new UserError(`quant_block_size=${block}: must be one of ${Q4_BLOCKS.join(', ')}`);
  for (const name of quantizedWeights(c)) {
    const cols = shapes.get(name)?.[1];
    if (cols === undefined) throw new Error(`quantizedWeights: no shape for ${name}`);
    if (cols % block !== 0) throw new UserError(`quant_block_size=${block}: ${name} has rows of ${cols} values, not a multiple of ${block}; choose a block size that divides it`);
  }
}

/**
 * Quantizes a row-major float32 `[R, C]` weight (see the module comment): quantize.ts's 4-bit blocks,
 * whose `[R, C/block, block/2]` packing is this `[R, C/2]` when no block is padded.
 */
export function quantizeQ4(t: FloatTensor, block: number): Q4Tensor {
  const [R, C] = t.shape;
  if (t.shape.length !== 2 || C % block !== 0) throw new Error(`quantizeQ4: [${t.shape}] is not [rows, a multiple of ${block}]`);
  const q = quantizeBlocks(t.data, R, C, 4, block);
  return { shape: [R, C], block, packed: q.packed, scales: q.scales };
}

/** The float32 weight a quantized one stands for: (q − 8)·d, exact in float32 (|q − 8| ≤ 8). */
export function dequantizeQ4(q: Q4Tensor): FloatTensor {
  const [R, C] = q.shape;
  return { shape: [R, C], data: dequantizeBlocks({ N: R, K: C, bits: 4, block: q.block, packed: q.packed, scales: q.scales, packedShape: [R, C / q.block, q.block / 2] }) };
}

/** Weights with every quantized weight replaced by its dequantized value (what a 4-bit base computes with; other tensors shared). */
export function dequantizedBase(c: ModelConfig, weights: ReadonlyMap<string, BaseTensor>, block: number): Map<string, FloatTensor> {
  const names = new Set(quantizedWeights(c));
  const out = new Map<string, FloatTensor>();
  for (const [name, t] of weights) {
    if (isQ4(t)) out.set(name, dequantizeQ4(t));
    else out.set(name, names.has(name) ? dequantizeQ4(quantizeQ4(t, block)) : t);
  }
  return out;
}

/**
 * The weight `[R, C]` of `packed` `[R, C/2]` uint8 and `scales` `[R, C/block]` float32, in the graph:
 * one GatherBlockQuantized over every row (com.microsoft; ONNX's blocked DequantizeLinear needs
 * opset 21, and prefzoo's graphs are opset 17).
 */
export function dequantizeNode(g: Graph, packed: Tensor, scales: Tensor): Tensor {
  const [R, half] = packed.staticShape ?? [];
  const nb = scales.staticShape?.[1];
  if (R === undefined || half === undefined || nb === undefined) throw new Error(`dequantizeNode: ${packed.name} and ${scales.name} need static shapes`);
  const C = 2 * half;
  const rows = g.range(0, R, 1, 'int64');
  const attrs = { bits: attr.int(4), block_size: attr.int(C / nb), gather_axis: attr.int(0), quantize_axis: attr.int(1) };
  return g.op('GatherBlockQuantized', [packed, rows, scales], attrs, [{ dtype: 'float32', shape: [R, C] }], undefined, 'com.microsoft')[0];
}
