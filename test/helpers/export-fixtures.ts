/**
 * Tiny models for the export tests (test/export-onnx.test.ts, test/export-gguf.test.ts): init-model's
 * tiny preset with noise added to every weight, so that greedy decoding depends on the whole context
 * (fresh N(0, 0.02) weights mostly repeat one token, which would hide a wrong layout), and the
 * norms and biases are not their neutral 1 and 0.
 */
import { join } from 'node:path';
import type { Llama, Token } from 'node-llama-cpp';
import type { Arch } from '../../src/models/config.ts';
import { saveCheckpoint } from '../../src/models/checkpoint.ts';
import { type ShapeField, initModelFolder } from '../../src/models/init.ts';
import { loadModel } from '../../src/models/load.ts';
import { Normal } from '../../src/random.ts';
import { loadTokenizer } from '../../src/tokenize/index.ts';

export const EXPORT_ARCHS: Arch[] = ['llama', 'qwen2', 'qwen3', 'mistral', 'gemma', 'phi3', 'gpt2'];

/** A prompt of the generated tokenizer's bytes and merges. */
export const EXPORT_PROMPT = 'The capital of France is';

/**
 * Writes `root/name`: the tiny `arch` with noisy weights; `config` overrides config fields (e.g. a
 * sliding window); `shape` changes the preset's sizes before the weights are made (a wider model).
 * Gemma's embedding, scaled by √hidden and tied to the head, keeps small noise, or every position
 * would predict its own token back.
 */
export function noisyTinyModel(root: string, name: string, arch: Arch, config: Record<string, unknown> = {}, shape: Partial<Record<ShapeField, number>> = {}): string {
  const dir = join(root, name);
  initModelFolder(dir, arch, 'tiny', 1, {}, shape);
  const m = loadModel(dir);
  const tokens = loadTokenizer(dir).vocabSize;
  const rng = new Normal(7);
  for (const [key, t] of m.weights) {
    const std = t.shape.length === 1 ? 0.1 : arch === 'gemma' && key.includes('embed') ? 0.03 : 0.15;
    // Rows of the embedding past the tokenizer's tokens are never trained: they keep their small
    // initial values (prefzoo never samples them; the runtimes could, were they noisy).
    const rows = /(embed_tokens|wte)\.weight$/.test(key) ? tokens : t.shape[0];
    const n = t.shape.length === 1 ? t.data.length : rows * (t.data.length / t.shape[0]);
    const noise = rng.fill(n, std);
    for (let i = 0; i < n; i++) t.data[i] += noise[i];
  }
  saveCheckpoint(dir, m.weights, { config: { ...m.config, ...config } as typeof m.config });
  return dir;
}

/**
 * llama.cpp's greedy continuation of `ids` (node-llama-cpp's `llama`): `n` tokens, or those before an
 * end-of-generation token (which it does not yield). One thread: the suite shares two cores with
 * ONNX Runtime.
 */
export async function llamaGreedy(llama: Llama, file: string, ids: number[], n: number): Promise<number[]> {
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

/** `n` little-endian float32 values of `buf` from byte `at`. */
export function f32Values(buf: Buffer, at: number, n: number): Float32Array {
  return Float32Array.from({ length: n }, (_, i) => buf.readFloatLE(at + 4 * i));
}

/** IEEE binary16 bits → number (written for the tests, apart from the exporter's float16 code). */
export function f16(bits: number): number {
  const e = (bits >> 10) & 31;
  const f = bits & 1023;
  const v = e === 0 ? f * 2 ** -24 : e === 31 ? (f ? NaN : Infinity) : (1 + f / 1024) * 2 ** (e - 15);
  return bits & 0x8000 ? -v : v;
}
