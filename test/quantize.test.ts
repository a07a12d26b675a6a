/**
 * Quantized generation (src/models/quantize.ts): the block quantizer against ggml's Q8_0 / Q4_0 of the
 * GGUF export (the same quants, another layout), the MatMulNBits node against float64 products over
 * the dequantized weight (accuracy 0: the float32 product within rounding; accuracy 4: the
 * activations quantized to int8 per block, which the reference does too), and the quantized decoder
 * against the float32 decoder fed the dequantized weights (quantized-vs-dequantized: the same logits
 * within rounding, every product of every graph kind rewritten); a one- or two-row quantized step on
 * one intra-op thread, drawing as a two-thread one.
 */
import { describe, expect, it } from 'vitest';
import { Graph } from '../src/onnx/graph.ts';
import { Session, toOrt } from '../src/runtime/session.ts';
import { allocQuantized, dequantizeBlocks, matmulNBits, quantizeBlocks, quantizeInto, type QuantBits } from '../src/models/quantize.ts';
import { quantizeQ4_0, quantizeQ8_0 } from '../src/export/gguf-file.ts';
import { Decoder, GenerationSession, generateIds } from '../src/models/generate.ts';
import { sampleRandom } from '../src/models/sampling.ts';
import { SeededRandom, uniform } from '../src/random.ts';
import { randomWeights, testConfig } from './helpers/model-fixtures.ts';
import type { FloatTensor } from '../src/models/checkpoint.ts';

const values = (n: number, seed: number, scale = 1) => {
  const u = uniform(seed);
  return Float32Array.from({ length: n }, () => scale * (2 * u() - 1));
};

/** y = x·Ŵᵀ in float64 for x [M, K], Ŵ [N, K]; with `actBlock`, each x row first rounded to int8 per block of that many (scale max|x|/127), as MatMulNBits' accuracy 4 does. */
function reference(x: Float32Array, W: Float32Array, M: number, N: number, K: number, actBlock?: number): Float64Array {
  const xs = Float64Array.from(x);
  if (actBlock) {
    for (let m = 0; m < M; m++) {
      for (let b0 = 0; b0 < K; b0 += actBlock) {
        const end = Math.min(K, b0 + actBlock);
        let amax = 0;
        for (let k = b0; k < end; k++) amax = Math.max(amax, Math.abs(x[m * K + k]));
        const d = Math.fround(amax / 127);
        for (let k = b0; k < end; k++) xs[m * K + k] = d === 0 ? 0 : Math.round(x[m * K + k] / d) * d;
      }
    }
  }
  const y = new Float64Array(M * N);
  for (let m = 0; m < M; m++) for (let n = 0; n < N; n++) for (let k = 0; k < K; k++) y[m * N + n] += xs[m * K + k] * W[n * K + k];
  return y;
}

async function runNBits(x: Float32Array, q: ReturnType<typeof quantizeBlocks>, M: number, accuracy: number): Promise<Float32Array> {
  const g = new Graph('t');
  const xi = g.input('x', 'float32', ['M', q.K]);
  const packed = g.initializer('w.q', { dtype: 'uint8', dims: q.packedShape, data: q.packed });
  const scales = g.initializer('w.scales', { dtype: 'float32', dims: [q.scales.length], data: q.scales });
  g.output(matmulNBits(g, xi, { packed, scales }, { N: q.N, K: q.K, bits: q.bits, block: q.block, accuracy }), 'y');
  const s = await Session.fromGraph(g, { threads: 1 });
  const y = (await s.run({ x: toOrt('float32', x, [M, q.K]) })).y.data as Float32Array;
  await s.release();
  return y;
}

describe('block quantizer', () => {
  it("at a block of 32 gives ggml's Q8_0 / Q4_0 quants of the GGUF export, laid out for MatMulNBits", () => {
    const [N, K] = [6, 96];
    const W = values(N * K, 3, 0.2);
    W[5] = 0; // a zero and an all-zero block
    W.fill(0, 64, 96);
    const q8 = quantizeBlocks(W, N, K, 8, 32);
    const g8 = quantizeQ8_0(W);
    const q4 = quantizeBlocks(W, N, K, 4, 32);
    const g4 = quantizeQ4_0(W);
    for (let b = 0; b < (N * K) / 32; b++) {
      for (let i = 0; i < 32; i++) {
        expect(q8.packed[b * 32 + i] - 128, `q8 block ${b} value ${i}`).toBe(new Int8Array(g8.buffer, b * 34 + 2 + i, 1)[0]);
        // GGUF: byte j holds values j (low) and 16 + j (high); MatMulNBits: values 2j (low) and 2j + 1 (high).
        const gguf = i < 16 ? g4[b * 18 + 2 + i] & 15 : g4[b * 18 + 2 + i - 16] >> 4;
        const mine = i % 2 === 0 ? q4.packed[b * 16 + (i >> 1)] & 15 : q4.packed[b * 16 + (i >> 1)] >> 4;
        expect(mine, `q4 block ${b} value ${i}`).toBe(gguf);
      }
    }
  });

  it('dequantizes within half a step of each value (q8), pads a short last block with zeros, and refills its buffers in place', () => {
    const [N, K, block] = [5, 40, 16];
    const W = values(N * K, 5);
    const q = quantizeBlocks(W, N, K, 8, block);
    const back = dequantizeBlocks(q);
    const nb = Math.ceil(K / block);
    for (let n = 0; n < N; n++) {
      for (let k = 0; k < K; k++) {
        const d = q.scales[n * nb + Math.floor(k / block)];
        expect(Math.abs(back[n * K + k] - W[n * K + k])).toBeLessThanOrEqual(d / 2 + 1e-7);
      }
    }
    // The padded tail of each row's last block is the zero point.
    expect([...q.packed.subarray(nb * block - 8, nb * block)]).toEqual(new Array(8).fill(128));
    const again = allocQuantized(N, K, 8, block);
    quantizeInto(W, again);
    expect(again.packed).toEqual(q.packed);
    expect(again.scales).toEqual(q.scales);
  });
});

describe('MatMulNBits over the quantized blocks', () => {
  for (const bits of [4, 8] as QuantBits[]) {
    for (const [K, block] of [[64, 16], [96, 32], [80, 32], [256, 128]]) {
      it(`q${bits}, K ${K}, block ${block}: accuracy 0 = x·Ŵᵀ in float32; accuracy 4 = the same over int8 activations`, async () => {
        const [M, N] = [3, 24];
        const W = values(N * K, 7 + K + bits, 0.1);
        const x = values(M * K, 11 + block, 2);
        const q = quantizeBlocks(W, N, K, bits, block);
        const What = dequantizeBlocks(q);
        for (const accuracy of [0, 4]) {
          const y = await runNBits(x, q, M, accuracy);
          const want = reference(x, What, M, N, K, accuracy === 4 ? block : undefined);
          // Float32 rounding of K products and their sum: a few ulps of Σ|x·ŵ|.
          for (let m = 0; m < M; m++) {
            for (let n = 0; n < N; n++) {
              let mag = 0;
              for (let k = 0; k < K; k++) mag += Math.abs(x[m * K + k] * What[n * K + k]);
              expect(Math.abs(y[m * N + n] - want[m * N + n]), `acc ${accuracy} [${m}, ${n}]`).toBeLessThan(4 * 2 ** -24 * mag * Math.log2(K) + 1e-7);
            }
          }
        }
        // The quantized product is not the float32 one: a test of the rewrite can tell them apart.
        const exact = reference(x, W, M, N, K);
        expect(Math.max(...(await runNBits(x, q, M, 0)).map((v, i) => Math.abs(v - exact[i])))).toBeGreaterThan(1e-4);
      });
    }
  }
});

describe('quantized decoder', () => {
  /** The float32 weights with every matrix a product reads replaced by its dequantized blocks (the head too: tied or not). */
  function dequantized(w: Map<string, FloatTensor>, bits: QuantBits, block: number, gpt2: boolean): Map<string, FloatTensor> {
    const out = new Map(w);
    for (const [name, t] of w) {
      if (t.shape.length !== 2 || name.endsWith('embed_tokens.weight') || name.endsWith('wte.weight') || name.endsWith('wpe.weight')) continue;
      const [r, k] = t.shape;
      if (gpt2 && name !== 'lm_head.weight') {
        // Conv1D [in, out]: quantized as its transpose.
        const T = new Float32Array(r * k);
        for (let i = 0; i < r; i++) for (let j = 0; j < k; j++) T[j * r + i] = t.data[i * k + j];
        const d = dequantizeBlocks(quantizeBlocks(T, k, r, bits, block));
        const back = new Float32Array(r * k);
        for (let i = 0; i < r; i++) for (let j = 0; j < k; j++) back[i * k + j] = d[j * r + i];
        out.set(name, { shape: t.shape, data: back });
      } else out.set(name, { shape: t.shape, data: dequantizeBlocks(quantizeBlocks(t.data, r, k, bits, block)) });
    }
    return out;
  }

  for (const [arch, bits, tied] of [['llama', 4, false], ['qwen2', 8, true], ['gpt2', 4, false]] as const) {
    it(`${arch} q${bits}${tied ? ' (tied head)' : ''}: prefill and step logits = the float32 decoder's over the dequantized weights`, async () => {
      const c = testConfig(arch, { tied });
      const w = randomWeights(c, 9);
      const block = 16;
      const quant = await Decoder.create(c, w, { quant: { bits, block, accuracy: 0 } });
      const plain = await Decoder.create(c, w, {});
      // Tied, the head reads the dequantized table and the Gather the float32 one: the reference is
      // the untied model with lm_head = the dequantized embedding.
      const untied = testConfig(arch, { tied: false });
      const reference = (weights: Map<string, FloatTensor>) => {
        if (!tied) return Decoder.create(c, dequantized(weights, bits, block, arch === 'gpt2'), {});
        const embed = weights.get('model.embed_tokens.weight')!;
        const [V, D] = embed.shape;
        const head = { shape: embed.shape, data: dequantizeBlocks(quantizeBlocks(embed.data, V, D, bits, block)) };
        return Decoder.create(untied, new Map([...dequantized(weights, bits, block, false), ['lm_head.weight', head]]), {});
      };
      const ref = await reference(w);
      const logitsAfter = async (dec: Decoder) => {
        const s = GenerationSession.open(dec);
        const row = s.start([3, 9, 1, 4, 7], new SeededRandom(1));
        const first = await row.logits();
        row.extend([5]);
        const second = await row.logits();
        await s.close();
        return [first, second];
      };
      const [q, r, p] = await Promise.all([quant, ref, plain].map(logitsAfter));
      const diff = (a: Float32Array, b: Float32Array) => a.reduce((m, v, i) => Math.max(m, Math.abs(v - b[i])), 0);
      for (let i = 0; i < 2; i++) {
        expect(diff(q[i], r[i]), `run ${i}`).toBeLessThan(1e-4);
        expect(diff(q[i], p[i]), `run ${i} differs from float32`).toBeGreaterThan(1e-4);
      }
      // New weights: the next run quantizes them (no stale session).
      const w2 = randomWeights(c, 10);
      quant.setWeights((name) => w2.get(name)?.data);
      const ref2 = await reference(w2);
      const [q2, r2] = await Promise.all([quant, ref2].map(logitsAfter));
      expect(diff(q2[0], r2[0])).toBeLessThan(1e-4);
      expect(quant.quantizeMs).toBeGreaterThan(0);
      for (const d of [quant, ref, plain, ref2]) await d.release();
    });
  }

  it("a one-row step runs on one intra-op thread unless the runtime names a count, and draws as a two-thread session's", async () => {
    const c = testConfig('llama');
    const w = randomWeights(c, 9);
    const saved = process.env.PREFZOO_THREADS;
    process.env.PREFZOO_THREADS = '3';
    try {
      const quant = { bits: 4, block: 16 } as const;
      const one = await Decoder.create(c, w, { quant });
      const two = await Decoder.create(c, w, { quant, runtime: { threads: 2 } });
      const plain = await Decoder.create(c, w, {});
      // One or two rows: one thread; a larger batch and the float32 decoder: the default (PREFZOO_THREADS here).
      expect([one.stepThreads(1), one.stepThreads(2), one.stepThreads(3), two.stepThreads(1), plain.stepThreads(1)]).toEqual([1, 1, 3, 2, 3]);
      const draw = (dec: Decoder) =>
        generateIds([{ decoder: dec, weight: 1 }], [{ promptIds: [3, 9, 1, 4, 7], rng: sampleRandom(4, 0, 0) }], { temperature: 1, maxNewTokens: 12, stopIds: [], padId: 0, batchSize: 1, logprobs: true });
      const [a, b] = [await draw(one), await draw(two)];
      expect(a[0].ids).toEqual(b[0].ids);
      expect(a[0].logps).toEqual(b[0].logps);
      expect(a[0].logps!.length).toBe(12);
      for (const d of [one, two, plain]) await d.release();
    } finally {
      if (saved === undefined) delete process.env.PREFZOO_THREADS;
      else process.env.PREFZOO_THREADS = saved;
    }
  });

});
