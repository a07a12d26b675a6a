/**
 * `prefzoo export --format gguf`, checked by llama.cpp itself (node-llama-cpp's prebuilt CPU binary)
 * and read back by an independent parser (@huggingface/gguf): every family's f32 file loads and its
 * greedy tokens from prefzoo's prompt ids equal prefzoo's for 16 tokens; the q8_0 and f16 files load
 * and generate; the layout (names, ggml shapes, types, tokenizer arrays) is what llama.cpp expects.
 */
import { describe, it, expect, beforeAll, afterAll } from 'vitest';
import { mkdtempSync, readFileSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { gguf } from '@huggingface/gguf';
import { getLlama, type Llama, type Token } from 'node-llama-cpp';
import type { Arch } from '../src/models/config.ts';
import { parameterShapes } from '../src/models/config.ts';
import { loadModel } from '../src/models/load.ts';
import { Decoder, generateIds } from '../src/models/generate.ts';
import { f16BitsToFloat as float16BitsToFloat } from '../src/models/safetensors.ts';
import { SeededRandom } from '../src/random.ts';
import { loadTokenizer } from '../src/tokenize/index.ts';
import type { Message } from '../datasets/names.ts';
import { promptIds } from '../src/online/prompts.ts';
import { readExportSource } from '../src/export/source.ts';
import { exportGguf } from '../src/export/gguf.ts';
import { permuteRotary } from '../src/models/llama.ts';
import { quantizeQ8_0 } from '../src/export/gguf-file.ts';
import { EXPORT_ARCHS, EXPORT_PROMPT, noisyTinyModel } from './helpers/export-fixtures.ts';
import { prefzoo } from './helpers/cli.ts';

const root = mkdtempSync(join(tmpdir(), 'pz-export-gguf-'));
const messages: Message[] = [{ role: 'user', content: EXPORT_PROMPT }];
// llama.cpp runs Mistral and Phi-3 without their sliding window (the export cuts their context to
// it), so the token-by-token comparison uses them without one; the window's context is checked below.
const NO_WINDOW: Partial<Record<Arch, Record<string, unknown>>> = { mistral: { sliding_window: null }, phi3: { sliding_window: null } };

let llama: Llama;

/**
 * llama.cpp's greedy continuation of `ids`: `n` tokens, or those before an end-of-generation token
 * (which it does not yield). One thread: the suite shares two cores with ONNX Runtime.
 */
async function llamaGreedy(file: string, ids: number[], n: number): Promise<number[]> {
  const model = await llama.loadModel({ modelPath: file });
  try {
    const ctx = await model.createContext({ contextSize: 64, threads: 1 });
    try {
      const got: number[] = [];
      for await (const t of ctx.getSequence().evaluate(ids as Token[], { temperature: 0 })) {
        got.push(t);
        if (got.length === n) break;
      }
      return got;
    } finally {
      await ctx.dispose();
    }
  } finally {
    await model.dispose();
  }
}

describe('export --format gguf, loaded by llama.cpp', () => {
  const dirs = new Map<Arch, string>();

  beforeAll(async () => {
    llama = await getLlama({ gpu: false, build: 'never', logLevel: 'error' as never });
    for (const arch of EXPORT_ARCHS) {
      const dir = noisyTinyModel(root, arch, arch, NO_WINDOW[arch]);
      const src = readExportSource(dir);
      exportGguf(src, dir + '.gguf', 'f32');
      exportGguf(src, dir + '-q8_0.gguf', 'q8_0');
      dirs.set(arch, dir);
    }
  });
  afterAll(async () => {
    await llama?.dispose();
    rmSync(root, { recursive: true, force: true });
  });

  it.each(EXPORT_ARCHS)("%s: f32 greedy tokens equal prefzoo's; q8_0 loads and generates", async (arch) => {
    const dir = dirs.get(arch)!;
    const tok = loadTokenizer(dir);
    const ids = promptIds(tok, messages);
    const { config, weights } = loadModel(dir);
    const decoder = await Decoder.create(config, weights, { bake: true });
    // prefzoo stops where llama.cpp does: on the end-of-generation tokens (<|eos|>, <|im_end|>).
    const [ours] = await generateIds([{ decoder, weight: 1 }], [{ promptIds: ids, rng: new SeededRandom(0) }], { maxNewTokens: 16, stopIds: tok.stopIds, padId: 0, temperature: 0 });
    await decoder.release();
    expect(await llamaGreedy(dir + '.gguf', ids, 16)).toEqual(ours.stopped ? ours.ids.slice(0, -1) : ours.ids);
    expect(new Set(ours.ids).size, 'the greedy tokens vary, so the check can tell layouts apart').toBeGreaterThan(2);
    const q8 = await llamaGreedy(dir + '-q8_0.gguf', ids, 16);
    expect(q8.length).toBeGreaterThan(0);
    expect(q8.every((t) => Number.isInteger(t) && t >= 0 && t < config.vocab_size)).toBe(true);
  });

  it('f16 loads and generates what f32 does', async () => {
    const dir = dirs.get('qwen2')!;
    exportGguf(readExportSource(dir), dir + '-f16.gguf', 'f16');
    const ids = promptIds(loadTokenizer(dir), messages);
    expect((await llamaGreedy(dir + '-f16.gguf', ids, 4))).toEqual(await llamaGreedy(dir + '.gguf', ids, 4));
  });

  it('lays out names, ggml shapes, types and the tokenizer as llama.cpp expects (read by @huggingface/gguf)', async () => {
    const dir = dirs.get('llama')!;
    const { config, weights } = loadModel(dir);
    const f = await gguf(dir + '-q8_0.gguf', { allowLocalFile: true });
    const md = f.metadata as Record<string, unknown>;
    expect(md.version).toBe(3);
    expect(md['general.architecture']).toBe('llama');
    expect(md['general.file_type']).toBe(7);
    expect(md['llama.block_count']).toBe(2);
    expect(md['llama.attention.head_count_kv']).toBe(2);
    expect(md['llama.rope.dimension_count']).toBe(16);
    expect(md['tokenizer.ggml.model']).toBe('gpt2');
    expect(md['tokenizer.ggml.pre']).toBe('gpt-2');
    const tokens = md['tokenizer.ggml.tokens'] as string[];
    const types = md['tokenizer.ggml.token_type'] as number[];
    const tok = loadTokenizer(dir);
    expect(tokens).toHaveLength(config.vocab_size);
    expect(tokens[tok.bosId!]).toBe('<|bos|>');
    expect(types[tok.bosId!]).toBe(3); // control
    expect(types[config.vocab_size - 1]).toBe(5); // an embedding row past the tokenizer: unused
    expect(md['tokenizer.ggml.bos_token_id']).toBe(tok.bosId);
    expect(md['tokenizer.chat_template']).toBe(JSON.parse(readFileSync(join(dir, 'tokenizer_config.json'), 'utf8')).chat_template);
    expect((md['tokenizer.ggml.merges'] as string[])[0]).toMatch(/^\S+ \S+$/);

    const infos = new Map(f.tensorInfos.map((t) => [t.name, t]));
    // Tied head: no output.weight; 2 + 9 per layer tensors.
    expect(infos.size).toBe(parameterShapes(config).size);
    expect(infos.has('output.weight')).toBe(false);
    const q = infos.get('blk.0.attn_q.weight')!;
    expect(q.shape.map(Number)).toEqual([64, 64]); // ne0 = in
    expect(q.dtype).toBe(8); // Q8_0
    expect(infos.get('blk.0.ffn_down.weight')!.shape.map(Number)).toEqual([172, 64]);
    expect(infos.get('blk.0.ffn_down.weight')!.dtype).toBe(1); // 172 is not whole blocks: F16
    expect(infos.get('blk.0.attn_norm.weight')!.dtype).toBe(0); // vectors stay F32

    // The Q8_0 bytes of attn_q decode to the permuted float weights within half a step per block
    // (plus the scale's float16 rounding, at most 2⁻¹¹ of it, times |q| ≤ 127).
    const bytes = readFileSync(dir + '-q8_0.gguf');
    const at = Number(f.tensorDataOffset + q.offset);
    const want = permuteRotary(weights.get('model.layers.0.self_attn.q_proj.weight')!.data, 4, 64);
    for (let b = 0; b < want.length / 32; b++) {
      const o = at + b * 34;
      const d = float16BitsToFloat(bytes.readUInt16LE(o));
      for (let i = 0; i < 32; i++) expect(Math.abs(bytes.readInt8(o + 2 + i) * d - want[b * 32 + i])).toBeLessThanOrEqual(d * (0.5 + 127 / 2048));
    }
  });

  it('permutes q/k rows from rotate-half to adjacent pairs, head by head', () => {
    // Head h, half j, index i → row 2i + j: [0,1,2,3 | 4,5,6,7] → [0,2,1,3 | 4,6,5,7] for hd 4.
    const rows = Float32Array.from({ length: 8 }, (_, i) => i);
    expect(Array.from(permuteRotary(rows, 2, 1))).toEqual([0, 2, 1, 3, 4, 6, 5, 7]);
    const q = quantizeQ8_0(Float32Array.from({ length: 32 }, (_, i) => i - 16));
    expect(float16BitsToFloat(q[0] | (q[1] << 8))).toBeCloseTo(16 / 127, 4);
    expect(new Int8Array(q.buffer, 2, 32)[0]).toBe(-127);
  });

  it('cuts the context of a sliding-window model to its window (llama.cpp attends without one)', async () => {
    const dir = noisyTinyModel(root, 'mistral-window', 'mistral');
    exportGguf(readExportSource(dir), dir + '.gguf', 'f32');
    const md = (await gguf(dir + '.gguf', { allowLocalFile: true })).metadata as Record<string, unknown>;
    expect(md['llama.context_length']).toBe(6);
  });

  it('refuses what llama.cpp would run differently, in one line', async () => {
    const dir = noisyTinyModel(root, 'gpt2-scaled', 'gpt2', { scale_attn_by_inverse_layer_idx: true });
    expect(() => exportGguf(readExportSource(dir), join(root, 'x.gguf'))).toThrow(/scale_attn_by_inverse_layer_idx/);
    const r = await prefzoo('export', '--model', dirs.get('gemma')!, '--format', 'gguf', '--dtype', 'q4_0', '-o', join(root, 'x.gguf'));
    expect(r.code).not.toBe(0);
    expect(r.stderr.trim()).toMatch(/^[^\n]*--dtype: "q4_0" is not one of f32, f16, q8_0 for --format gguf[^\n]*$/);
  });
});
