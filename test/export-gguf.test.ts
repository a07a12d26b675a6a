/**
 * `prefzoo export --format gguf`, checked by llama.cpp itself (node-llama-cpp's prebuilt CPU binary)
 * and read back by an independent parser (@huggingface/gguf): every family's f32 file loads and its
 * greedy tokens from prefzoo's prompt ids equal prefzoo's for 16 tokens; the q8_0, q4_0 and f16 files
 * load and generate; the layout (names, ggml shapes, types, tokenizer arrays) is what llama.cpp
 * expects; the Q4_0 blocks decode (here, in float64) to the f32 file's weights within Q4_0's bound and
 * follow ggml's reference rounding on hand-made blocks.
 */
import { describe, it, expect, beforeAll, afterAll } from 'vitest';
import { mkdtempSync, readFileSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { gguf } from '@huggingface/gguf';
import { getLlama, type Llama } from 'node-llama-cpp';
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
import { quantizeQ4_0, quantizeQ8_0 } from '../src/export/gguf-file.ts';
import { EXPORT_ARCHS, EXPORT_PROMPT, llamaGreedy as greedyIn, noisyTinyModel, f16, f32Values } from './helpers/export-fixtures.ts';
import { prefzoo } from './helpers/cli.ts';

const root = mkdtempSync(join(tmpdir(), 'pz-export-gguf-'));
const messages: Message[] = [{ role: 'user', content: EXPORT_PROMPT }];
// llama.cpp runs Mistral and Phi-3 without their sliding window (the export cuts their context to
// it), so the token-by-token comparison uses them without one; the window's context is checked below.
const NO_WINDOW: Partial<Record<Arch, Record<string, unknown>>> = { mistral: { sliding_window: null }, phi3: { sliding_window: null } };

let llama: Llama;
const llamaGreedy = (file: string, ids: number[], n: number) => greedyIn(llama, file, ids, n);

describe('export --format gguf, loaded by llama.cpp', () => {
  const dirs = new Map<Arch, string>();

  beforeAll(async () => {
    llama = await getLlama({ gpu: false, build: 'never', logLevel: 'error' as never });
    for (const arch of EXPORT_ARCHS) {
      const dir = noisyTinyModel(root, arch, arch, NO_WINDOW[arch]);
      const src = readExportSource(dir);
      exportGguf(src, dir + '.gguf', 'f32');
      exportGguf(src, dir + '-q8_0.gguf', 'q8_0');
      exportGguf(src, dir + '-q4_0.gguf', 'q4_0');
      dirs.set(arch, dir);
    }
  });
  afterAll(async () => {
    await llama?.dispose();
    rmSync(root, { recursive: true, force: true });
  });

  it.each(EXPORT_ARCHS)("%s: f32 greedy tokens equal prefzoo's; q8_0 and q4_0 load and generate", async (arch) => {
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
    for (const file of [dir + '-q8_0.gguf', dir + '-q4_0.gguf']) {
      const q = await llamaGreedy(file, ids, 16);
      expect(q.length, file).toBeGreaterThan(0);
      expect(q.every((t) => Number.isInteger(t) && t >= 0 && t < config.vocab_size)).toBe(true);
    }
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
    const r = await prefzoo('export', '--model', dirs.get('gemma')!, '--format', 'gguf', '--dtype', 'q5_k_m', '-o', join(root, 'x.gguf'));
    expect(r.code).not.toBe(0);
    expect(r.stderr.trim()).toMatch(/^[^\n]*--dtype: "q5_k_m" is not one of f32, f16, q8_0, q4_0, q4_k_m for --format gguf[^\n]*$/);
    expect(() => quantizeQ4_0(new Float32Array(48))).toThrow(/^Q4_0: 48 values are not whole blocks of 32$/);
  });

  it('q4_0: types, ggml shapes, offsets and file_type read back by @huggingface/gguf; every block decodes to the f32 weights within Q4_0 bounds', async () => {
    const dir = dirs.get('llama')!;
    const q4 = await gguf(dir + '-q4_0.gguf', { allowLocalFile: true });
    const f32 = await gguf(dir + '.gguf', { allowLocalFile: true });
    const md = q4.metadata as Record<string, unknown>;
    expect(md['general.file_type']).toBe(2); // MOSTLY_Q4_0
    expect(md['general.quantization_version']).toBe(2);
    const bytes = readFileSync(dir + '-q4_0.gguf');
    const fbytes = readFileSync(dir + '.gguf');
    const finfos = new Map(f32.tensorInfos.map((t) => [t.name, t]));
    expect(q4.tensorInfos.map((t) => t.name)).toEqual(f32.tensorInfos.map((t) => t.name));

    let offset = 0;
    const seen = new Set<number>();
    const bad: string[] = [];
    let clips = 0;
    for (const t of q4.tensorInfos) {
      const ne = t.shape.map(Number);
      expect(ne, t.name).toEqual(finfos.get(t.name)!.shape.map(Number));
      const n = ne.reduce((a, b) => a * b, 1);
      // Vectors F32; matrices Q4_0 where ne0 (the row) is whole blocks of 32, F16 otherwise.
      const type = ne.length === 1 ? 0 : ne[0] % 32 === 0 ? 2 : 1;
      expect(t.dtype, t.name).toBe(type);
      seen.add(type);
      expect(Number(t.offset), t.name).toBe(offset);
      const size = type === 0 ? 4 * n : type === 1 ? 2 * n : (n / 32) * 18;
      offset = Math.ceil((offset + size) / 32) * 32;

      const want = f32Values(fbytes, Number(f32.tensorDataOffset + finfos.get(t.name)!.offset), n);
      const at = Number(q4.tensorDataOffset + t.offset);
      if (type === 0) expect(f32Values(bytes, at, n)).toEqual(want);
      if (type === 1) {
        for (let i = 0; i < n; i++) if (!(Math.abs(f16(bytes.readUInt16LE(at + 2 * i)) - want[i]) <= Math.abs(want[i]) * 2 ** -11 + 2 ** -25)) bad.push(`${t.name}[${i}]`);
      }
      if (type !== 2) continue;
      const got = dequantQ4_0(bytes, at, n);
      for (let b = 0; b < n / 32; b++) {
        const d = f16(bytes.readUInt16LE(at + b * 18));
        const block = want.subarray(b * 32, b * 32 + 32);
        // m: the block's first value of largest magnitude; d = m/−8 up to float16 rounding, and m
        // itself decodes to −8·d.
        let first = 0;
        for (let i = 1; i < 32; i++) if (Math.abs(block[i]) > Math.abs(block[first])) first = i;
        const m = block[first];
        if (!(Math.abs(d - m / -8) <= (Math.abs(m) / 8) * 2 ** -11)) bad.push(`${t.name} block ${b}: d ${d}, m ${m}`);
        if (got[b * 32 + first] !== -8 * d) bad.push(`${t.name} block ${b}: m decodes to ${got[b * 32 + first]}`);
        for (let i = 0; i < 32; i++) {
          // Half a step, or a whole one for a value of m's opposite sign clipped at q = 15 (x/d past
          // 7.5), plus the scale's float16 rounding (relative 2⁻¹¹) times |q − 8| ≤ 8.
          const clipped = block[i] / d > 7.5;
          clips += clipped ? 1 : 0;
          const bound = Math.abs(d) * ((clipped ? 1 : 0.5) + 8 * 2 ** -11) * (1 + 2 ** -10);
          if (!(Math.abs(got[b * 32 + i] - block[i]) <= bound)) bad.push(`${t.name} block ${b} value ${i}: ${got[b * 32 + i]} for ${block[i]}`);
        }
      }
    }
    expect(bad.slice(0, 5)).toEqual([]);
    expect(clips, 'some values of the sign opposite m are clipped').toBeGreaterThan(0);
    expect([...seen].sort()).toEqual([0, 1, 2]);
    expect(bytes.length - Number(q4.tensorDataOffset)).toBe(offset);
    expect(bytes.length).toBeLessThan(readFileSync(dir + '-q8_0.gguf').length);
  });

  it("q4_0 quantizes as ggml's reference rule does: first largest magnitude, halves up, clipping, zeros, nibble order", () => {
    // m = −8 first (x[0]; x[31] ties it and loses): d = 1, every value on the grid, q = x + 8.
    const grid = Float32Array.from({ length: 32 }, (_, i) => (i < 16 ? i - 8 : 23 - i));
    const g = quantizeQ4_0(grid);
    expect(g.length).toBe(18);
    expect(f16(g[0] | (g[1] << 8))).toBe(1);
    // Byte j: value j in the low nibble, value 16 + j in the high one.
    expect(Array.from(g.subarray(2))).toEqual(Array.from({ length: 16 }, (_, j) => j | ((15 - j) << 4)));
    expect(Array.from(dequantQ4_0(Buffer.from(g), 0, 32))).toEqual(Array.from(grid)); // on the grid: exact

    // Ties of magnitude: the first one sets d's sign, and the other is clipped to 7·d.
    const tie = (a: number, b: number) => {
      const x = new Float32Array(32);
      x[3] = a;
      x[10] = b;
      x[20] = 1;
      const q = quantizeQ4_0(x);
      return { d: f16(q[0] | (q[1] << 8)), x: Array.from(dequantQ4_0(Buffer.from(q), 0, 32)) };
    };
    const pos = tie(4, -4);
    expect(pos.d).toBe(-0.5);
    expect([pos.x[3], pos.x[10], pos.x[20]]).toEqual([4, -3.5, 1]);
    const neg = tie(-4, 4);
    expect(neg.d).toBe(0.5);
    expect([neg.x[3], neg.x[10], neg.x[20]]).toEqual([-4, 3.5, 1]);

    // Halves between grid points go to the larger q: toward +∞ in x/d, so toward −∞ in x when d < 0.
    const halves = [0.5, -0.5, 2.5, -2.5, 7.5, -7.5, 6.49];
    const up = new Float32Array(32);
    up[0] = -8; // d = 1
    up.set(halves, 1);
    const u = dequantQ4_0(Buffer.from(quantizeQ4_0(up)), 0, 32);
    expect(Array.from(u.subarray(1, 8))).toEqual([1, 0, 3, -2, 7, -7, 6]);
    const down = new Float32Array(32);
    down[0] = 8; // d = −1
    down.set(halves, 1);
    const dn = dequantQ4_0(Buffer.from(quantizeQ4_0(down)), 0, 32);
    expect(Array.from(dn.subarray(1, 8))).toEqual([0, -1, 2, -3, 7, -7, 6]);

    // An all-zero block: d = 0/−8 = −0 (float16 0x8000), every q 8.
    expect(Array.from(quantizeQ4_0(new Float32Array(32)))).toEqual([0x00, 0x80, ...new Array(16).fill(0x88)]);
  });
});

/** `n` values of Q4_0 blocks from byte `at`, in float64: x = (q − 8)·d, q the low nibbles then the high. */
function dequantQ4_0(buf: Buffer, at: number, n: number): Float64Array {
  const out = new Float64Array(n);
  for (let b = 0; b < n / 32; b++) {
    const o = at + b * 18;
    const d = f16(buf.readUInt16LE(o));
    for (let j = 0; j < 16; j++) {
      const byte = buf[o + 2 + j];
      // (+ 0 turns a −0 into 0)
      out[b * 32 + j] = ((byte & 15) - 8) * d + 0;
      out[b * 32 + 16 + j] = ((byte >> 4) - 8) * d + 0;
    }
  }
  return out;
}
