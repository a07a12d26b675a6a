/**
 * A quantized rollout's weight update (issue 45, item 1 follow-up). The block quantizer, rewritten
 * without per-value closures and reading a transposed weight in place, gives the bytes of the
 * former one (kept here as the reference) for q4 and q8, short last blocks, transposed reads and
 * edge values. A LoRA decoder over a frozen base quantizes the base once: new adapters are only new
 * feeds (no session made again, nothing quantized again) and decode as a decoder made from scratch
 * over base + those adapters, unmerged; without the base frozen, an update makes new sessions. And
 * a LoRA grpo run at rollout_dtype=q4: its policy after an update draws the same tokens and
 * log-probs as a q4 decoder built afresh over the base and the adapter the run saved, and no update
 * made a session again. The model bytes written into a reused buffer (`serializeModelInto`) read
 * back as `serializeModel`'s.
 */
import { mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, describe, expect, it } from 'vitest';
import { allocQuantized, blocksPerRow, quantizeBlocks, quantizeInto, quantizeProducts, type QuantBits, type QuantizedWeight } from '../src/models/quantize.ts';
import { Decoder, generateIds, type Generated } from '../src/models/generate.ts';
import { initLora, type LoraConfig } from '../src/models/lora.ts';
import { initModelFolder } from '../src/models/init.ts';
import { loadModel } from '../src/models/load.ts';
import { loadAdapter } from '../src/models/peft.ts';
import { sampleRandom } from '../src/models/sampling.ts';
import { grpo } from '../src/online/grpo/index.ts';
import { buildDecodeGraph } from '../src/models/decode.ts';
import { parseModel, serializeModel, serializeModelInto } from '../src/onnx/proto.ts';
import { uniform } from '../src/random.ts';
import { randomWeights, testConfig } from './helpers/model-fixtures.ts';
import type { FloatTensor } from '../src/models/checkpoint.ts';
import type { ModelConfig } from '../src/models/config.ts';

const dir = mkdtempSync(join(tmpdir(), 'prefzoo-quant-update-'));
afterAll(() => rmSync(dir, { recursive: true, force: true }));

/** The quantizer as it was before (commit 11d537a): one closure call per 4-bit value, a transposed copy made first. */
function formerQuantize(W: Float32Array, N: number, K: number, bits: QuantBits, block: number): QuantizedWeight {
  const q = allocQuantized(N, K, bits, block);
  const { packed, scales } = q;
  const nb = blocksPerRow(K, block);
  const blob = (block * bits) / 8;
  const f = Math.fround;
  for (let n = 0; n < N; n++) {
    const row = n * K;
    for (let b = 0; b < nb; b++) {
      const at = row + b * block;
      const len = Math.min(block, K - b * block);
      const o = (n * nb + b) * blob;
      let amax = 0;
      let m = 0;
      for (let i = 0; i < len; i++) {
        const a = Math.abs(W[at + i]);
        if (a > amax) {
          amax = a;
          m = W[at + i];
        }
      }
      if (bits === 8) {
        const d = f(amax / 127);
        scales[n * nb + b] = d;
        const inv = d === 0 ? 0 : 1 / d;
        for (let i = 0; i < len; i++) {
          const x = W[at + i] * inv;
          packed[o + i] = 128 + Math.sign(x) * Math.round(Math.abs(x));
        }
        packed.fill(128, o + len, o + block);
      } else {
        const d = f(m / -8);
        scales[n * nb + b] = d;
        const inv = d === 0 ? 0 : f(1 / d);
        const qv = (i: number): number => (i < len ? Math.min(15, Math.floor(f(f(W[at + i] * inv) + 8.5))) : 8);
        for (let j = 0; j < blob; j++) packed[o + j] = qv(2 * j) | (qv(2 * j + 1) << 4);
      }
    }
  }
  return q;
}

/** Values with the quantizer's edge cases mixed in: zero blocks, exact halves of a step, a lone large value, subnormals, −0. */
function edgyValues(n: number, seed: number): Float32Array {
  const u = uniform(seed);
  const w = Float32Array.from({ length: n }, () => 2 * u() - 1);
  w.fill(0, 0, 40);
  for (let i = 40; i < n; i += 37) w[i] = Math.fround(((i % 17) - 8) / 8);
  for (let i = 45; i < n; i += 53) w[i] = 1e-42;
  for (let i = 50; i < n; i += 61) w[i] = -0;
  for (let i = 55; i < n; i += 101) w[i] = 40 * (u() - 0.5);
  return w;
}

const transposeOf = (a: Float32Array, rows: number, cols: number) => {
  const out = new Float32Array(a.length);
  for (let r = 0; r < rows; r++) for (let c = 0; c < cols; c++) out[c * rows + r] = a[r * cols + c];
  return out;
};

describe('the block quantizer', () => {
  it('gives the former quantizer\'s bytes: q4 and q8, short last blocks, transposed in place', () => {
    for (const bits of [4, 8] as const) {
      for (const [N, K, block] of [[7, 96, 32], [5, 83, 16], [3, 301, 64], [4, 33, 32]] as const) {
        const W = edgyValues(N * K, N * K + bits);
        const want = formerQuantize(W, N, K, bits, block);
        const got = allocQuantized(N, K, bits, block);
        got.packed.fill(0xa5); // the buffers are refilled whole
        quantizeInto(W, got);
        expect(Buffer.from(got.packed).equals(Buffer.from(want.packed)), `q${bits} [${N}, ${K}] block ${block}`).toBe(true);
        expect(Buffer.from(got.scales.buffer).equals(Buffer.from(want.scales.buffer))).toBe(true);
        // [K, N] stored (GPT-2's Conv1D), its transpose quantized without a copy.
        const T = allocQuantized(N, K, bits, block);
        quantizeInto(transposeOf(W, N, K), T, true);
        expect(Buffer.from(T.packed).equals(Buffer.from(want.packed)), `transposed q${bits} [${N}, ${K}]`).toBe(true);
        expect(Buffer.from(T.scales.buffer).equals(Buffer.from(want.scales.buffer))).toBe(true);
      }
    }
  });
});

describe('serializeModelInto', () => {
  it("reads back as serializeModel's model, written again into the same buffer", () => {
    const c = testConfig('llama');
    const w = randomWeights(c, 4);
    const graph = (past: boolean) => {
      const g = buildDecodeGraph(c, { past, head: 'sample-t1', weightFirst: false });
      // Large enough initializers to be spliced (64 KiB and more): the products' blocks and a filler.
      quantizeProducts(g, { bits: 8, block: 16 }, (name) => quantizeBlocks(w.get(name)!.data, w.get(name)!.shape[0], w.get(name)!.shape[1], 8, 16));
      g.initializer('filler', { dtype: 'float32', dims: [40000], data: Float32Array.from({ length: 40000 }, (_, i) => i) });
      return g;
    };
    const summary = (bytes: Uint8Array) => {
      const { graph: g } = parseModel(bytes);
      return {
        nodes: g.nodes.map((n) => [n.op, n.domain, n.inputs, n.outputs, JSON.stringify(n.attrs)]),
        inputs: g.inputs.map((v) => [v.name, v.dtype, v.shape]),
        outputs: g.outputs.map((v) => [v.name, v.dtype, v.shape]),
        initializers: [...g.initializers].sort(([a], [b]) => a.localeCompare(b)).map(([name, t]) => [name, t.dtype, t.dims, Buffer.from(t.data.buffer, t.data.byteOffset, t.data.byteLength).toString('base64')]),
      };
    };
    const [prefill, step] = [graph(false), graph(true)];
    const first = serializeModelInto(step, null);
    expect(summary(first)).toEqual(summary(serializeModel(step)));
    const again = serializeModelInto(prefill, new Uint8Array(first.buffer));
    expect(again.buffer).toBe(first.buffer);
    expect(summary(again)).toEqual(summary(serializeModel(prefill)));
  });
});

/** Tokens and log-probs of a fixed batch of draws (temperature 1, every row its own stream). */
async function draws(dec: Decoder, seed: number): Promise<Generated[]> {
  const reqs = [[3, 9, 1, 4], [7, 7, 2], [5, 1, 8, 8, 6]].map((promptIds, i) => ({ promptIds, rng: sampleRandom(seed, i, 0) }));
  return generateIds([{ decoder: dec, weight: 1 }], reqs, { temperature: 1, maxNewTokens: 6, stopIds: [], padId: 0, logprobs: true });
}

function expectSameDraws(a: Generated[], b: Generated[]): void {
  expect(a.map((g) => g.ids)).toEqual(b.map((g) => g.ids));
  for (let i = 0; i < a.length; i++) for (let t = 0; t < a[i].logps!.length; t++) expect(Math.abs(a[i].logps![t] - b[i].logps![t])).toBeLessThan(1e-5);
}

/** Adapters with B drawn (not PEFT's zero start), so they move every product they touch. */
function liveAdapters(c: ModelConfig, lora: LoraConfig, seed: number): Map<string, FloatTensor> {
  const u = uniform(seed);
  const out = initLora(c, lora, seed);
  for (const [name, t] of out) if (name.includes('lora_B')) out.set(name, { shape: t.shape, data: Float32Array.from(t.data, () => 0.5 * (2 * u() - 1)) });
  return out;
}

describe('a LoRA decoder over a frozen, quantized base', () => {
  it('new adapters are new feeds: no session made again, nothing quantized again, the draws of a decoder made afresh', async () => {
    const c = testConfig('llama');
    const base = randomWeights(c, 3);
    const lora: LoraConfig = { rank: 4, alpha: 8, targets: ['all-linear'] };
    const quant = { bits: 4 as const, block: 16 };
    const [a1, a2] = [liveAdapters(c, lora, 1), liveAdapters(c, lora, 2)];
    const frozen = new Set(base.keys());
    const dec = await Decoder.create(c, new Map([...base, ...a1]), { lora, quant, frozen });
    const first = await draws(dec, 5);
    const [built, quantized] = [dec.sessionsBuilt, dec.quantizeMs];
    expect(built).toBeGreaterThan(0);
    dec.setWeights((name) => (a2.get(name) ?? base.get(name))?.data);
    const second = await draws(dec, 5);
    expect(dec.sessionsBuilt).toBe(built);
    expect(dec.quantizeMs).toBe(quantized);
    const fresh = await Decoder.create(c, new Map([...base, ...a2]), { lora, quant });
    expectSameDraws(second, await draws(fresh, 5));
    // The adapters reach the draws: the first adapters' differ.
    expect(first.some((g, i) => g.logps!.some((v, t) => Math.abs(v - second[i].logps![t]) > 1e-3))).toBe(true);
    // Nothing frozen (a full fine-tune): the same update makes the sessions again.
    fresh.setWeights((name) => (a1.get(name) ?? base.get(name))?.data);
    const builtBefore = fresh.sessionsBuilt;
    expectSameDraws(await draws(fresh, 5), first);
    expect(fresh.sessionsBuilt).toBeGreaterThan(builtBefore);
    await Promise.all([dec.release(), fresh.release()]);
  });
});

describe('grpo with LoRA at rollout_dtype=q4', () => {
  it('the policy after an update draws as a q4 decoder made afresh over the base and the saved adapter; no update made a session', async () => {
    const model = join(dir, 'model');
    initModelFolder(model, 'llama', 'tiny', 5);
    const prompts = join(dir, 'prompts.jsonl');
    writeFileSync(prompts, ['1+2=', '3+4=', '5+6=', '7+1='].map((p) => JSON.stringify({ prompt: p }) + '\n').join(''));
    // A reward that tells completions apart by their text, so every round has advantages to learn from.
    const rewards = join(dir, 'rewards.mjs');
    writeFileSync(rewards, 'export function text(completions) { return completions.map((c) => [...c].reduce((s, ch) => s + ch.charCodeAt(0), 0) % 7); }\n');
    const seen: { step: number; built: number; quantizeMs: number; draws: Generated[] }[] = [];
    const out = join(dir, 'run');
    const r = await grpo({
      model, prompts, rewards: [`${rewards}:text`], out, overwrite: true,
      params: ['max_steps=3', 'batch_size=4', 'num_generations=2', 'max_completion_length=4', 'beta=0', 'learning_rate=0.05', 'pad_to_multiple_of=8',
        'lora_r=4', 'lora_alpha=8', 'lora_target_modules=all-linear', 'save_adapter=true', 'rollout_dtype=q4', 'rollout_block_size=16'],
      until: async (step, policy) => {
        const dec = await policy();
        const d = await draws(dec, 11);
        seen.push({ step, built: dec.sessionsBuilt, quantizeMs: dec.quantizeMs, draws: d });
        return step === 2;
      },
    });
    expect(r.steps).toBe(2);
    expect(seen.map((s) => s.step)).toEqual([1, 2]);
    // Step 1's policy made its sessions (rollout and these draws); step 2's update made none and quantized nothing.
    expect(seen[1].built).toBe(seen[0].built);
    expect(seen[1].quantizeMs).toBe(seen[0].quantizeMs);
    // The saved adapter is step 2's; the run moved it (B starts at zero).
    const m = loadModel(model);
    const adapter = loadAdapter(join(out, 'adapter'), m.config);
    const Bmax = Math.max(...[...adapter.weights].filter(([n]) => n.includes('lora_B')).map(([, t]) => Math.max(...t.data.map(Math.abs))));
    expect(Bmax).toBeGreaterThan(1e-3);
    const fresh = await Decoder.create(m.config, new Map([...m.weights, ...adapter.weights]), { lora: adapter.lora, quant: { bits: 4, block: 16 } });
    expectSameDraws(seen[1].draws, await draws(fresh, 11));
    await fresh.release();
  });
});
