/**
 * `prefzoo export --format gguf --dtype q4_k_m`: llama.cpp's Q4_K_M mix. The tensor types follow
 * llama-quantize's rule (read back by @huggingface/gguf, which reads but does not dequantize K-quants);
 * every tensor's bytes, decoded here in float64 from the published block layouts, equal prefzoo's own
 * quantize → decode round trip bit for bit and lie within each format's bound of the float32 weights;
 * llama.cpp loads the files, and on a 256-wide model its greedy tokens equal prefzoo's through a model
 * whose weights are decoded from the same blocks.
 */
import { describe, it, expect, beforeAll, afterAll } from 'vitest';
import { mkdtempSync, readFileSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { gguf } from '@huggingface/gguf';
import { getLlama, type Llama, type Token } from 'node-llama-cpp';
import { loadModel } from '../src/models/load.ts';
import { Decoder, GenerationSession } from '../src/models/generate.ts';
import { SeededRandom } from '../src/random.ts';
import { loadTokenizer } from '../src/tokenize/index.ts';
import { promptIds } from '../src/online/prompts.ts';
import { readExportSource } from '../src/export/source.ts';
import { exportGguf, ggufNames, ggufTensors, q4kmType } from '../src/export/gguf.ts';
import { decodeTensor, encodeTensor } from '../src/export/gguf-file.ts';
import { EXPORT_PROMPT, llamaGreedy, noisyTinyModel, f16, f32Values } from './helpers/export-fixtures.ts';
import { prefzoo } from './helpers/cli.ts';

const root = mkdtempSync(join(tmpdir(), 'pz-export-q4km-'));
// ggml type ids
const F32 = 0, F16 = 1, Q5_0 = 6, Q8_0 = 8, Q4_K = 12, Q6_K = 14;
let llama: Llama;
let wide: string; // qwen2, hidden 256, FFN 512, untied: every matrix whole super-blocks
let tiny: string; // llama's tiny preset, hidden 64, FFN 172, tied: every fallback

describe('export --format gguf --dtype q4_k_m', () => {
  beforeAll(async () => {
    llama = await getLlama({ gpu: false, build: 'never', logLevel: 'error' as never });
    const shape = { hidden_size: 256, intermediate_size: 512, num_attention_heads: 4, num_key_value_heads: 2, head_dim: 64, tie_word_embeddings: false } as never;
    wide = noisyTinyModel(root, 'wide', 'qwen2', {}, shape);
    tiny = noisyTinyModel(root, 'tiny', 'llama');
    for (const dir of [wide, tiny]) {
      exportGguf(readExportSource(dir), dir + '.gguf', 'f32');
      exportGguf(readExportSource(dir), dir + '-q4_k_m.gguf', 'q4_k_m');
    }
  });
  afterAll(async () => {
    await llama?.dispose();
    rmSync(root, { recursive: true, force: true });
  });

  it("gives each tensor llama-quantize's Q4_K_M type: Q6_K head and the use_more_bits layers' attn_v/ffn_down, Q4_K the rest, fallbacks for narrow rows", async () => {
    const types = async (file: string) => {
      const f = await gguf(file, { allowLocalFile: true });
      expect((f.metadata as Record<string, unknown>)['general.file_type']).toBe(15); // MOSTLY_Q4_K_M
      expect((f.metadata as Record<string, unknown>)['general.quantization_version']).toBe(2);
      return Object.fromEntries(f.tensorInfos.map((t) => [t.name, t.dtype as number]));
    };
    // Two layers: use_more_bits picks layer 1 only (1 ≥ 7·2/8).
    const w = await types(wide + '-q4_k_m.gguf');
    expect(w['output.weight']).toBe(Q6_K);
    expect(w['token_embd.weight']).toBe(Q4_K); // untied: the embedding is an ordinary matrix
    for (const l of [0, 1]) {
      for (const m of ['attn_q', 'attn_k', 'attn_output', 'ffn_gate', 'ffn_up']) expect(w[`blk.${l}.${m}.weight`], `${l} ${m}`).toBe(Q4_K);
      expect(w[`blk.${l}.attn_v.weight`]).toBe(l === 1 ? Q6_K : Q4_K);
      expect(w[`blk.${l}.ffn_down.weight`]).toBe(l === 1 ? Q6_K : Q4_K);
      expect(w[`blk.${l}.attn_norm.weight`]).toBe(F32);
      expect(w[`blk.${l}.attn_q.bias`]).toBe(F32);
    }
    // Rows of 64 and 172: Q4_K → Q5_0 (whole blocks of 32), Q6_K → Q8_0, F16 where not whole blocks of 32;
    // the tied embedding takes the head's type, Q8_0 for rows that are not whole super-blocks.
    const t = await types(tiny + '-q4_k_m.gguf');
    expect(t['output.weight']).toBeUndefined();
    expect(t['token_embd.weight']).toBe(Q8_0);
    expect(t['blk.0.attn_q.weight']).toBe(Q5_0);
    expect(t['blk.0.attn_v.weight']).toBe(Q5_0);
    expect(t['blk.1.attn_v.weight']).toBe(Q8_0);
    expect(t['blk.0.ffn_gate.weight']).toBe(Q5_0);
    expect(t['blk.0.ffn_down.weight']).toBe(F16);
    expect(t['blk.1.ffn_down.weight']).toBe(F16);

    // 24 layers (Qwen2.5-0.5B): i < 3, i ≥ 21, or (i − 3) mod 3 = 2.
    const more = Array.from({ length: 24 }, (_, i) => i).filter((i) => q4kmType(`blk.${i}.ffn_down.weight`, 4864, 24, true) === 'Q6_K');
    expect(more).toEqual([0, 1, 2, 5, 8, 11, 14, 17, 20, 21, 22, 23]);
    expect(q4kmType('blk.5.attn_qkv.weight', 3072, 24, false)).toBe('Q6_K');
    expect(q4kmType('blk.4.attn_qkv.weight', 3072, 24, false)).toBe('Q4_K');
  });

  it('every tensor decodes (float64, the published layouts) to prefzoo\'s own round trip bit for bit, within its format\'s bound of the f32 weights', async () => {
    for (const dir of [wide, tiny]) {
      const file = dir + '-q4_k_m.gguf';
      const q = await gguf(file, { allowLocalFile: true });
      const f = await gguf(dir + '.gguf', { allowLocalFile: true });
      const bytes = readFileSync(file);
      const fbytes = readFileSync(dir + '.gguf');
      const finfos = new Map(f.tensorInfos.map((t) => [t.name, t]));
      const src = readExportSource(dir);
      const ours = new Map(ggufTensors(src.config, src.weights, ggufNames(src.config), 'q4_k_m').map((t) => [t.name, t]));
      const bad: string[] = [];
      let offset = 0;
      for (const t of q.tensorInfos) {
        const n = t.shape.map(Number).reduce((a, b) => a * b, 1);
        const type = t.dtype as number;
        const size = { [F32]: 4 * n, [F16]: 2 * n, [Q8_0]: (n / 32) * 34, [Q5_0]: (n / 32) * 22, [Q4_K]: (n / 256) * 144, [Q6_K]: (n / 256) * 210 }[type]!;
        expect(Number(t.offset), t.name).toBe(offset);
        offset = Math.ceil((offset + size) / 32) * 32;
        const at = Number(q.tensorDataOffset + t.offset);
        const block = bytes.subarray(at, at + size);
        const mine = ours.get(t.name)!;
        // The file's bytes are the encoder's, and they decode (independently, in float64) to what
        // prefzoo's decoder makes of them, after float32 rounding, bit for bit.
        expect(Buffer.from(encodeTensor(mine)).equals(block), t.name).toBe(true);
        const got = decode64(type, block, n);
        const round = decodeTensor(mine.type, encodeTensor(mine), n);
        for (let i = 0; i < n; i++) if (!Object.is(Math.fround(got[i]), round[i])) bad.push(`${t.name}[${i}]: ${got[i]} vs ${round[i]}`);
        const want = f32Values(fbytes, Number(f.tensorDataOffset + finfos.get(t.name)!.offset), n);
        bad.push(...withinBound(t.name, type, block, got, want));
      }
      expect(bad.slice(0, 5), dir).toEqual([]);
      expect(bytes.length - Number(q.tensorDataOffset)).toBe(offset);
    }
  });

  it('Q4_K and Q6_K on hand-made super-blocks: scales past 15 (their high bits), mins, zeros, signs, value order', () => {
    // Sub-block j of a Q4_K block: values spread over [−j/8, j] so the 8 scales and mins differ and
    // the larger ones need their top 2 bits; an all-zero sub-block (j = 0) decodes to zeros.
    const x = new Float32Array(256);
    for (let j = 0; j < 8; j++) for (let l = 0; l < 32; l++) x[32 * j + l] = j === 0 ? 0 : -j / 8 + ((j + j / 8) * l) / 31;
    const q4 = Buffer.from(encodeTensor({ name: 'x', shape: [1, 256], type: 'Q4_K', data: x }));
    const y4 = decode64(Q4_K, q4, 256);
    const scales = Array.from({ length: 8 }, (_, j) => q4kScaleMin(q4, 0, j));
    expect(scales.some(([sc]) => sc > 15) && scales.some(([, m]) => m > 15)).toBe(true);
    expect(Array.from(y4.subarray(0, 32))).toEqual(new Array(32).fill(0));
    for (let i = 32; i < 256; i++) expect(Math.abs(y4[i] - x[i]), `${i}`).toBeLessThanOrEqual((7 + 7 / 8) / 15 / 2 + 0.1);
    // Each value sits where the layout says: its sub-block's first and last values are its min and max.
    for (let j = 1; j < 8; j++) expect(y4[32 * j]).toBeLessThan(y4[32 * j + 31]);

    // Q6_K: 16 sub-blocks of 16 with alternating signs and growing magnitudes.
    const z = Float32Array.from({ length: 256 }, (_, i) => (i % 2 ? -1 : 1) * (1 + (i >> 4)) * ((i % 16) + 1) / 16);
    const q6 = Buffer.from(encodeTensor({ name: 'z', shape: [1, 256], type: 'Q6_K', data: z }));
    const y6 = decode64(Q6_K, q6, 256);
    const d = f16(q6.readUInt16LE(208));
    for (let i = 0; i < 256; i++) expect(Math.abs(y6[i] - z[i]), `${i}`).toBeLessThanOrEqual((d * q6.readInt8(192 + (i >> 4))) / 2 + 1e-7);
    expect(Array.from(decode64(Q6_K, Buffer.from(encodeTensor({ name: 'o', shape: [1, 256], type: 'Q6_K', data: new Float32Array(256) })), 256))).toEqual(new Array(256).fill(0));
    expect(() => encodeTensor({ name: 'r', shape: [1, 64], type: 'Q4_K', data: new Float32Array(64) })).toThrow(/^Q4_K: 64 values are not whole blocks of 256$/);
  });

  it("llama.cpp loads both files and generates; on the 256-wide model its next-token probabilities are prefzoo's through weights decoded from the same blocks", async () => {
    for (const dir of [wide, tiny]) {
      const tok = loadTokenizer(dir);
      const ids = promptIds(tok, [{ role: 'user', content: EXPORT_PROMPT }]);
      const got = await llamaGreedy(llama, dir + '-q4_k_m.gguf', ids, 8);
      expect(got.length, dir).toBeGreaterThan(0);
      expect(got.every((t) => Number.isInteger(t) && t >= 0 && t < loadModel(dir).config.vocab_size)).toBe(true);
    }
    // Teacher-forced over the prompt and 12 tokens, llama.cpp's distribution (which quantizes the
    // activations too: Q8_K against the K-quants) against prefzoo's float32 run on the decoded
    // blocks, and on the unquantized weights: a misread block would put llama.cpp far from the first.
    const tok = loadTokenizer(wide);
    const ids = promptIds(tok, [{ role: 'user', content: EXPORT_PROMPT }]);
    const tail = Array.from({ length: 12 }, (_, i) => 3 + ((i * 37) % 200));
    const theirs = await llamaProbabilities(wide + '-q4_k_m.gguf', ids, tail, loadModel(wide).config.vocab_size);
    const decoded = await prefzooProbabilities(wide, ids, tail, true);
    const plain = await prefzooProbabilities(wide, ids, tail, false);
    const dist = (a: Float64Array[], b: Float64Array[]) => Math.max(...a.map((p, i) => p.reduce((m, v, t) => Math.max(m, Math.abs(v - b[i][t])), 0)));
    const near = dist(theirs, decoded);
    const far = dist(theirs, plain);
    // Measured: 0.055 against 0.35 (the largest gap in any token's probability over the 13 positions).
    expect(near, `decoded ${near} vs unquantized ${far}`).toBeLessThan(far / 4);
  });

  it("refuses an 80-layer llama, qwen2 or mistral (llama.cpp's 70B class: attn_v Q5_K), not a 79-layer one nor an 80-layer qwen3", () => {
    const base = readExportSource(tiny).config;
    const tensors = (model_type: string, layers: number) => {
      const c = { ...base, model_type, num_hidden_layers: layers } as typeof base;
      return () => ggufTensors(c, new Map(), ggufNames(c), 'q4_k_m');
    };
    for (const t of ['llama', 'qwen2', 'mistral']) expect(tensors(t, 80)).toThrow(/^--dtype q4_k_m: llama\.cpp's mix gives an 80-layer \w+ model's attn_v Q5_K/);
    // Past the refusal the writer reads the weights, which these calls do not give: any other error means it was not refused.
    for (const [t, n] of [['llama', 79], ['qwen3', 80]] as const) expect(tensors(t, n)).toThrow(/^(?!--dtype q4_k_m: llama)/);
  });

  it('is refused for other k-quant names, in one line', async () => {
    const r = await prefzoo('export', '--model', tiny, '--format', 'gguf', '--dtype', 'q4_k_s', '-o', join(root, 'x.gguf'));
    expect(r.code).not.toBe(0);
    expect(r.stderr.trim()).toMatch(/^[^\n]*--dtype: "q4_k_s" is not one of f32, f16, q8_0, q4_0, q4_k_m for --format gguf[^\n]*$/);
  });
});

/** llama.cpp's next-token probabilities (temperature 1, no truncation) after each of `tail`'s tokens, fed after `ids`. */
async function llamaProbabilities(file: string, ids: number[], tail: number[], vocab: number): Promise<Float64Array[]> {
  const model = await llama.loadModel({ modelPath: file });
  try {
    const ctx = await model.createContext({ contextSize: 64, threads: 1 });
    try {
      const next = { probabilities: true, options: { temperature: 1, topK: 0, topP: 1, minP: 0 } };
      const input = [...ids, ...tail].map((t, i) => (i >= ids.length - 1 ? ([t, { generateNext: next }] as [Token, { generateNext: typeof next }]) : (t as Token)));
      const out = await ctx.getSequence().controlledEvaluate(input);
      return out.slice(ids.length - 1).map((o) => {
        const p = new Float64Array(vocab);
        for (const [t, v] of o!.next.probabilities!) p[t] = v;
        return p;
      });
    } finally {
      await ctx.dispose();
    }
  } finally {
    await model.dispose();
  }
}

/**
 * prefzoo's next-token probabilities at the same positions, the matrices decoded from the q4_k_m
 * blocks (`decoded`) or as saved. Blocks run along rows, so decoding each HF matrix through its GGUF
 * tensor's type equals the file's tensor with any row permutation undone.
 */
async function prefzooProbabilities(dir: string, ids: number[], tail: number[], decoded: boolean): Promise<Float64Array[]> {
  const { config, weights } = loadModel(dir);
  if (decoded) {
    const src = readExportSource(dir);
    const names = ggufNames(src.config);
    const typeOf = new Map(ggufTensors(src.config, src.weights, names, 'q4_k_m').map((t) => [t.name, t.type]));
    for (const [hf, w] of weights) {
      const type = typeOf.get(names.tensorName(hf) ?? '');
      if (type && w.shape.length === 2) w.data.set(decodeTensor(type, encodeTensor({ name: hf, shape: w.shape, type, data: w.data }), w.data.length));
    }
  }
  const decoder = await Decoder.create(config, weights, { bake: true });
  const session = GenerationSession.open(decoder, { padId: 0 });
  try {
    const row = session.start(ids, new SeededRandom(0));
    const out: Float64Array[] = [];
    for (let i = 0; i <= tail.length; i++) {
      const logits = await row.logits();
      let max = -Infinity;
      for (const v of logits) max = Math.max(max, v);
      const p = Float64Array.from(logits, (v) => Math.exp(v - max));
      const z = p.reduce((a, b) => a + b, 0);
      out.push(p.map((v) => v / z));
      if (i < tail.length) row.extend([tail[i]]);
    }
    row.close();
    return out;
  } finally {
    await session.close();
    await decoder.release();
  }
}

/** Q4_K sub-block j's 6-bit scale and min, from the 12 scale bytes after the block's d and dmin. */
function q4kScaleMin(buf: Buffer, block: number, j: number): [number, number] {
  const s = block + 4;
  if (j < 4) return [buf[s + j] & 63, buf[s + 4 + j] & 63];
  return [(buf[s + 4 + j] & 15) | ((buf[s + j - 4] >> 6) << 4), (buf[s + 4 + j] >> 4) | ((buf[s + j] >> 6) << 4)];
}

/**
 * `n` values of a tensor's data in float64, from ggml-common.h's layouts:
 *   Q8_0 [d f16, 32 × int8]: q·d.   Q5_0 [d f16, u32 fifth bits, 16 bytes]: ((nibble | bit << 4) − 16)·d.
 *   Q4_K [d, dmin, 12 scale bytes, 128 bytes]: sub-block j = 0..7 of 32, pair p = j >> 1 in bytes
 *        32p..32p+31, low nibble for even j: d·sc_j·q − dmin·m_j.
 *   Q6_K [128 ql, 64 qh, 16 int8 scales, d]: value i (0..255), half h = i >> 7, r = i & 127, quarter
 *        k = r >> 5, l = r & 31: low 4 bits from ql[64h + l + 32(k & 1)] (high nibble for k ≥ 2), high
 *        2 bits from qh[32h + l] bits 2k..2k+1; d·scale[i >> 4]·(q − 32).
 */
function decode64(type: number, buf: Buffer, n: number): Float64Array {
  const out = new Float64Array(n);
  if (type === F32) for (let i = 0; i < n; i++) out[i] = buf.readFloatLE(4 * i);
  if (type === F16) for (let i = 0; i < n; i++) out[i] = f16(buf.readUInt16LE(2 * i));
  if (type === Q8_0) for (let i = 0; i < n; i++) out[i] = buf.readInt8(34 * (i >> 5) + 2 + (i & 31)) * f16(buf.readUInt16LE(34 * (i >> 5)));
  if (type === Q5_0) {
    for (let i = 0; i < n; i++) {
      const o = 22 * (i >> 5);
      const k = i & 31;
      const byte = buf[o + 6 + (k & 15)];
      const q = (k < 16 ? byte & 15 : byte >> 4) | (((buf.readUInt32LE(o + 2) >>> k) & 1) << 4);
      out[i] = (q - 16) * f16(buf.readUInt16LE(o));
    }
  }
  if (type === Q4_K) {
    for (let i = 0; i < n; i++) {
      const o = 144 * (i >> 8);
      const r = i & 255;
      const j = r >> 5;
      const byte = buf[o + 16 + 32 * (j >> 1) + (r & 31)];
      const [sc, m] = q4kScaleMin(buf, o, j);
      out[i] = f16(buf.readUInt16LE(o)) * sc * (j % 2 ? byte >> 4 : byte & 15) - f16(buf.readUInt16LE(o + 2)) * m;
    }
  }
  if (type === Q6_K) {
    for (let i = 0; i < n; i++) {
      const o = 210 * (i >> 8);
      const r = i & 255;
      const h = r >> 7;
      const k = (r & 127) >> 5;
      const l = r & 31;
      const low = buf[o + 64 * h + l + 32 * (k & 1)];
      const q = (k >= 2 ? low >> 4 : low & 15) | (((buf[o + 128 + 32 * h + l] >> (2 * k)) & 3) << 4);
      out[i] = f16(buf.readUInt16LE(o + 208)) * buf.readInt8(o + 192 + (r >> 4)) * (q - 32);
    }
  }
  return out;
}

/**
 * Each format's bound of the decoded `got` against the f32 weights `want` (float32 rounding of a
 * decoded value, relative 2⁻²⁴, allowed on top):
 *   Q4_K: no value is clipped, every value decodes to its sub-block grid's nearest point, within half
 *         a step d·sc, and the step is at most one 6-bit unit d past the sub-block's range over 15.
 *   Q6_K: within half a step d·sc of its 16-value sub-block, the step at most d past max|x|/31.
 *   Q5_0, Q8_0: ggml's reference rounding (half a step; Q5_0's clipped values of m's opposite sign a
 *         whole one), plus the float16 rounding of d times the largest |q|.
 *   F16: relative 2⁻¹¹; F32: equal.
 */
function withinBound(name: string, type: number, buf: Buffer, got: Float64Array, want: Float32Array): string[] {
  const bad: string[] = [];
  const ulp = (v: number) => Math.abs(v) * 2 ** -23;
  const check = (i: number, bound: number) => {
    if (!(Math.abs(got[i] - want[i]) <= bound + ulp(got[i]))) bad.push(`${name}[${i}]: ${got[i]} for ${want[i]} (bound ${bound})`);
  };
  const n = want.length;
  if (type === F32) for (let i = 0; i < n; i++) check(i, 0);
  if (type === F16) for (let i = 0; i < n; i++) check(i, Math.abs(want[i]) * 2 ** -11 + 2 ** -25);
  if (type === Q8_0) for (let i = 0; i < n; i++) check(i, f16(buf.readUInt16LE(34 * (i >> 5))) * (0.5 + 127 / 2048));
  if (type === Q5_0) {
    for (let i = 0; i < n; i++) {
      const d = f16(buf.readUInt16LE(22 * (i >> 5)));
      check(i, Math.abs(d) * ((want[i] / d > 15.5 ? 1 : 0.5) + 16 * 2 ** -11) * (1 + 2 ** -10));
    }
  }
  if (type === Q4_K) {
    for (let b = 0; b < n / 256; b++) {
      const o = 144 * b;
      const d = f16(buf.readUInt16LE(o));
      const dmin = f16(buf.readUInt16LE(o + 2));
      for (let j = 0; j < 8; j++) {
        const [sc, m] = q4kScaleMin(buf, o, j);
        const step = d * sc;
        const xs = want.subarray(256 * b + 32 * j, 256 * b + 32 * j + 32);
        const lo = Math.min(0, ...xs);
        const hi = Math.max(...xs);
        if (!(-dmin * m <= lo && 15 * step - dmin * m >= hi)) bad.push(`${name} block ${b}.${j}: grid [${-dmin * m}, ${15 * step - dmin * m}] misses [${lo}, ${hi}]`);
        if (!(step <= (hi - lo + dmin) / 15 + d)) bad.push(`${name} block ${b}.${j}: step ${step} for range ${hi - lo}`);
        for (let l = 0; l < 32; l++) check(256 * b + 32 * j + l, step / 2);
      }
    }
  }
  if (type === Q6_K) {
    for (let b = 0; b < n / 256; b++) {
      const d = f16(buf.readUInt16LE(210 * b + 208));
      for (let s = 0; s < 16; s++) {
        const step = d * buf.readInt8(210 * b + 192 + s);
        const xs = want.subarray(256 * b + 16 * s, 256 * b + 16 * s + 16);
        const amax = Math.max(...Array.from(xs, Math.abs));
        if (!(step <= amax / 31 + d)) bad.push(`${name} block ${b}.${s}: step ${step} for max ${amax}`);
        for (let l = 0; l < 16; l++) check(256 * b + 16 * s + l, step / 2);
      }
    }
  }
  return bad;
}
