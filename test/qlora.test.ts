/**
 * QLoRA (TrainConfig.load_in_4bit, src/models/quantize-base.ts): the 4-bit blocks hold what the
 * Q4_0 rule says, the graph dequantizes them to the same float32 values, a QLoRA step's loss and
 * adapter gradients equal those of a LoRA step over that base dequantized to float32, the backward
 * keeps no dequantized weight from the forward, and the settings are refused where they cannot hold.
 */
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { afterAll, describe, expect, it } from 'vitest';
import { buildArtifacts } from '../src/artifacts/build.ts';
import { readCheckpoint } from '../src/artifacts/checkpoint.ts';
import { initModel, train } from '../src/index.ts';
import { loadModel as loadHfModel } from '../src/models/load.ts';
import { loadAdapter } from '../src/models/peft.ts';
import { mergeLora } from '../src/models/lora.ts';
import { TrainingArtifacts } from '../src/artifacts/training.ts';
import { collate } from '../src/models/batch.ts';
import type { FloatTensor } from '../src/models/checkpoint.ts';
import { parseConfig, type ModelConfig } from '../src/models/config.ts';
import { initLora } from '../src/models/lora.ts';
import { dequantizedBase, dequantizeNode, dequantizeQ4, q4Names, quantizedWeights, quantizeQ4 } from '../src/models/quantize-base.ts';
import { Graph } from '../src/onnx/graph.ts';
import { loadModel } from '../src/onnx/proto.ts';
import { gradName } from '../src/optim/config.ts';
import { Normal } from '../src/random.ts';
import { Session, toOrt } from '../src/runtime/session.ts';
import { resolveConfig } from '../src/train/config.ts';
import { buildSpec, type TrainProblem } from '../src/train/graph.ts';
import { problemOf } from '../src/train/problem.ts';
import { resolveLoss } from '../losses/index.ts';
import { benchPairs } from '../scripts/bench/step.ts';
import { randomWeights, testConfig } from './helpers/model-fixtures.ts';

const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'pz-qlora-'));
afterAll(() => fs.rmSync(dir, { recursive: true, force: true }));

describe('4-bit blocks', () => {
  const rng = new Normal(4);
  const R = 6;
  const C = 64;
  const W: FloatTensor = { shape: [R, C], data: rng.fill(R * C, 0.5) };
  W.data.fill(0, 32, 48); // an all-zero block (scale 0)

  it('hold each value to within half a step of its block, the largest exactly (Q4_0)', () => {
    for (const block of [16, 32]) {
      const q = quantizeQ4(W, block);
      const back = dequantizeQ4(q).data;
      for (let b = 0; b < (R * C) / block; b++) {
        const xs = Array.from(W.data.subarray(b * block, (b + 1) * block));
        const m = xs.reduce((a, x) => (Math.abs(x) > Math.abs(a) ? x : a), 0);
        const d = Math.fround(m / -8);
        expect(q.scales[b]).toBe(d);
        xs.forEach((x, i) => {
          const y = back[b * block + i];
          // Levels are (q − 8)·d for an integer q in 0..15, the nearest to x (within float32 rounding).
          if (d !== 0) {
            const level = y / d + 8;
            expect(Math.abs(level - Math.round(level))).toBeLessThan(1e-6);
            expect(Math.round(level)).toBeGreaterThanOrEqual(0);
            expect(Math.round(level)).toBeLessThanOrEqual(15);
          }
          // Within half a step where the levels reach (−8d … 7d); past 7d, on the side opposite m, the last level.
          const [lo, hi] = [Math.min(-8 * d, 7 * d), Math.max(-8 * d, 7 * d)];
          if (x >= lo && x <= hi) expect(Math.abs(x - y)).toBeLessThanOrEqual((Math.abs(d) / 2) * (1 + 1e-6));
          else expect(Math.abs(y - Math.fround(7 * d))).toBeLessThanOrEqual(1e-7 * Math.abs(d));
          if (x === m) expect(y === m).toBe(true);
        });
      }
    }
  });

  it('GatherBlockQuantized gives back the same float32 values', async () => {
    const q = quantizeQ4(W, 16);
    const g = new Graph('dq');
    const packed = g.input('p', 'uint8', [R, C / 2]);
    const scales = g.input('s', 'float32', [R, C / 16]);
    g.output(dequantizeNode(g, packed, scales), 'w');
    const s = await Session.fromGraph(g);
    const out = await s.run({ p: toOrt('uint8', q.packed, [R, C / 2]), s: toOrt('float32', q.scales, [R, C / 16]) });
    await s.release();
    expect(Array.from(out.w.data as Float32Array)).toEqual(Array.from(dequantizeQ4(q).data));
  });
});

const OPT = { type: 'adamw' as const, betas: [0.9, 0.999] as [number, number], eps: 1e-8, weightDecay: 0, maxGradNorm: 1 };

/** One DPO micro-batch's loss and adapter gradients through the training artifacts of `p` over `weights`. */
async function step(name: string, p: TrainProblem, weights: Map<string, FloatTensor>, profile = false) {
  const spec = buildSpec(p, weights, OPT);
  const initial = new Map(spec.params.map((q) => [q.name, q.data!]));
  spec.params = spec.params.map((q) => ({ ...q, data: undefined }));
  const out = path.join(dir, name);
  buildArtifacts(spec, out);
  const art = await TrainingArtifacts.load(out, profile ? { profilePrefix: path.join(dir, `${name}-prof`) } : {}, { checkpoint: false, update: 'host' });
  for (const [k, v] of initial) art.setParam(k, v);
  const rows = benchPairs(p.config.vocab_size, 2, 24);
  const batch = collate(rows, { kind: 'pairwise', padTo: 8, padId: 0, dtype: 'float32', packed: true, refLogps: (_, i) => [-40 - i, -41 + i] });
  const m = await art.computeGradients(batch.feeds);
  const grads = new Map(art.trainableNames.map((n) => [n, Float32Array.from(art.store.data(gradName(n)) as Float32Array)]));
  const params = art.manifest.params;
  await art.release();
  return { loss: m.loss, grads, params, dir: out };
}

function maxRelDiff(a: Float32Array, b: Float32Array): number {
  let diff = 0;
  let scale = 0;
  for (let i = 0; i < a.length; i++) {
    diff = Math.max(diff, Math.abs(a[i] - b[i]));
    scale = Math.max(scale, Math.abs(b[i]));
  }
  return diff / scale;
}

describe.each([
  ['qwen2', testConfig('qwen2', { extra: { intermediate_size: 48 } }), 16],
  ['gpt2', testConfig('gpt2', { extra: { n_embd: 32, n_head: 4 } }), 32],
] as const)('a QLoRA step on %s', (arch, config, block) => {
  const lora = { rank: 2, alpha: 4, targets: ['all-linear'] };
  const base = randomWeights(config, 3);
  const withAdapters = (w: Map<string, FloatTensor>) => {
    const out = new Map(w);
    // B non-zero, so the adapters' own path and A's gradient are exercised.
    const rng = new Normal(8);
    for (const [k, v] of initLora(config, lora, 1)) out.set(k, k.includes('lora_B') ? { shape: v.shape, data: rng.fill(v.data.length, 0.3) } : v);
    return out;
  };
  const problem = (base4bit: boolean): TrainProblem => ({
    config, kind: 'pairwise', loss: resolveLoss('dpo'), lora, valueHead: false, dataKeys: new Set(), packed: true, baseDtype: 'float32',
    ...(base4bit ? { base4bit: { block } } : {}),
  });

  it('equals a LoRA step over the same base dequantized to float32', async () => {
    const q = await step(`${arch}-q`, problem(true), withAdapters(base));
    const deq = await step(`${arch}-deq`, problem(false), withAdapters(dequantizedBase(config, base, block)));
    const orig = await step(`${arch}-f32`, problem(false), withAdapters(base));
    // The base really is held in 4 bits: packed bytes and scales, no float weight of a projection.
    for (const n of quantizedWeights(config)) {
      expect(q.params.find((p) => p.name === q4Names(n).packed)?.dtype).toBe('uint8');
      expect(q.params.some((p) => p.name === n)).toBe(false);
    }
    expect(Math.abs(q.loss - deq.loss)).toBeLessThanOrEqual(2 ** -22 * Math.abs(deq.loss));
    let worst = 0;
    let moved = 0;
    for (const [n, d] of deq.grads) {
      worst = Math.max(worst, maxRelDiff(q.grads.get(n)!, d));
      moved = Math.max(moved, maxRelDiff(orig.grads.get(n)!, d));
    }
    console.log(`${arch}: loss ${q.loss} against ${deq.loss}; adapter gradients differ by ${worst.toExponential(2)} of their largest (${moved.toExponential(2)} from the unquantized base)`);
    expect(worst).toBeLessThan(1e-6);
    // The quantization matters: the float32 base's gradients differ by far more than that.
    expect(moved).toBeGreaterThan(1e-3);
    expect(Math.abs(orig.loss - deq.loss)).toBeGreaterThan(1e-4);
  });
});

/** ONNX Runtime's own count of the bytes it holds (`mem_bytes_in_use` after each node), the largest over the profiles named `prefix`. */
function profilePeak(prefix: string): number {
  let peak = 0;
  for (const f of fs.readdirSync(dir).filter((f) => f.startsWith(prefix) && f.endsWith('.json'))) {
    for (const e of JSON.parse(fs.readFileSync(path.join(dir, f), 'utf8')) as { cat?: string; args?: Record<string, string> }[]) {
      if (e.cat === 'Node' && e.args?.mem_bytes_in_use) peak = Math.max(peak, Number(e.args.mem_bytes_in_use));
    }
  }
  return peak;
}

it('the backward dequantizes again: no layer keeps its float32 weights from the forward', async () => {
  // Wide layers and short rows, so the dequantized weights (4 layers × 3.1 MB) outweigh the activations.
  const config: ModelConfig = parseConfig({ model_type: 'qwen2', vocab_size: 64, hidden_size: 256, intermediate_size: 768, num_hidden_layers: 4, num_attention_heads: 4, num_key_value_heads: 2, max_position_embeddings: 64, tie_word_embeddings: true });
  const lora = { rank: 2, alpha: 4, targets: ['q_proj'] };
  const w = randomWeights(config, 2);
  for (const [k, v] of initLora(config, lora, 1)) w.set(k, v);
  const p: TrainProblem = { config, kind: 'pairwise', loss: resolveLoss('dpo'), lora, valueHead: false, dataKeys: new Set(), packed: true };
  const q = await step('sched-q', { ...p, base4bit: { block: 64 } }, w, true);
  await step('sched-f', p, dequantizedBase(config, w, 64), true);
  // No backward node outside a recomputation reads a forward dequantization.
  const { graph } = loadModel(path.join(q.dir, 'training_model.onnx'));
  const deq = graph.nodes.filter((n) => n.op === 'GatherBlockQuantized');
  const forward = new Set(deq.filter((n) => !n.name.startsWith('recompute/')).flatMap((n) => n.outputs));
  expect(deq.length).toBeGreaterThan(forward.size); // recomputed copies exist
  const readers = graph.nodes.filter((n) => n.inputs.some((i) => forward.has(i)));
  expect(readers.every((n) => n.op === 'Gemm' && !/(^|\/)grad/.test(n.name))).toBe(true);
  // What the 4-bit base adds to the step's peak (the float32 base is fed, not counted): about one
  // layer's dequantized weights, where keeping them from the forward would add all four layers'.
  const layerBytes = 4 * (256 * 256 * 2 + 2 * 256 * 128 + 3 * 256 * 768);
  const extra = profilePeak('sched-q-prof') - profilePeak('sched-f-prof');
  expect(profilePeak('sched-f-prof')).toBeGreaterThan(0);
  console.log(`4-bit base: ${(extra / 1e6).toFixed(2)} MB more at the peak, one layer's float32 weights ${(layerBytes / 1e6).toFixed(2)} MB`);
  expect(extra / layerBytes).toBeLessThan(1.5);
});

it('train: the reference is the dequantized base, the final model that base plus the adapters, the checkpoint 4-bit', async () => {
  const model = path.join(dir, 'model');
  initModel({ output: model, config: { model_type: 'qwen2', vocab_size: 600, hidden_size: 64, intermediate_size: 128, num_hidden_layers: 2, num_attention_heads: 4, num_key_value_heads: 2, max_position_embeddings: 256, tie_word_embeddings: true } });
  const data = path.join(dir, 'pairs.jsonl');
  fs.writeFileSync(data, Array.from({ length: 4 }, (_, i) => JSON.stringify({ prompt: `question ${i}?`, chosen: ` yes ${i} good`, rejected: ` no ${i} bad` })).join('\n') + '\n');
  const out = path.join(dir, 'run');
  const settings = { lora_r: 4, lora_target_modules: 'all-linear', load_in_4bit: true, quant_block_size: 32, max_steps: 2, batch_size: 2, learning_rate: 0.05, save_adapter: true, save_steps: 2 };
  await train({ model, data, loss: 'dpo', out, settings });
  // Step 1: the policy (fresh adapters: B = 0) scores as the reference does, within float32 rounding
  // of log-probs near −40 (β = 0.1); the float32 base as reference would differ by the quantization's effect.
  const first = JSON.parse(fs.readFileSync(path.join(out, 'metrics.jsonl'), 'utf8').split('\n')[0]);
  expect(Math.abs(first['rewards/chosen'])).toBeLessThan(1e-5);
  expect(Math.abs(first['rewards/rejected'])).toBeLessThan(1e-5);
  const base = loadHfModel(model);
  const adapter = loadAdapter(path.join(out, 'adapter'), base.config);
  const expected = mergeLora(new Map([...dequantizedBase(base.config, base.weights, 32), ...adapter.weights]), base.config, adapter.lora);
  const saved = loadHfModel(path.join(out, 'final')).weights;
  const name = 'model.layers.1.mlp.down_proj.weight';
  expect(maxRelDiff(saved.get(name)!.data, expected.get(name)!.data)).toBeLessThan(1e-6);
  // The adapters moved, so the comparison says something about the merge.
  expect(maxRelDiff(expected.get(name)!.data, dequantizedBase(base.config, base.weights, 32).get(name)!.data)).toBeGreaterThan(1e-5);
  const ckpt = readCheckpoint(path.join(out, 'checkpoints', 'step-00000002'));
  expect(ckpt.params.get(`${name}_q4`)?.dtype).toBe('U8');
  expect(ckpt.params.has(name)).toBe(false);
});

describe('settings', () => {
  const model = testConfig('qwen2', { extra: { intermediate_size: 64 } });
  it('load_in_4bit needs LoRA and the CPU; its formats and blocks are checked', () => {
    expect(() => resolveConfig({ params: ['load_in_4bit=true'] })).toThrow(/load_in_4bit=true needs LoRA \(lora_r > 0\)/);
    expect(() => resolveConfig({ params: ['load_in_4bit=true', 'lora_r=4', 'device=webgpu'] })).toThrow(/CPU only/);
    expect(() => resolveConfig({ params: ['lora_r=4', 'quant_block_size=32'] })).toThrow(/quant_block_size .*needs load_in_4bit=true/);
    expect(() => resolveConfig({ params: ['load_in_4bit=true', 'lora_r=4', 'bnb_4bit_quant_type=nf4'] })).toThrow(/bnb_4bit_quant_type/);
    const c = resolveConfig({ params: ['load_in_4bit=true', 'lora_r=4', 'quant_block_size=32'] }).config;
    const p = problemOf(c, { model, kind: 'pairwise', loss: resolveLoss('dpo'), lora: { rank: 4, alpha: 8, targets: ['q_proj'] } });
    expect(p.base4bit).toEqual({ block: 32 });
    const bad = resolveConfig({ params: ['load_in_4bit=true', 'lora_r=4', 'quant_block_size=48'] }).config;
    expect(() => problemOf(bad, { model, kind: 'pairwise', loss: resolveLoss('dpo'), lora: null })).toThrow(/quant_block_size=48: must be one of 16, 32, 64, 128, 256/);
    const wide = resolveConfig({ params: ['load_in_4bit=true', 'lora_r=4', 'quant_block_size=64'] }).config;
    expect(() => problemOf(wide, { model, kind: 'pairwise', loss: resolveLoss('dpo'), lora: null })).toThrow(/quant_block_size=64: model\.layers\.0\.self_attn\.q_proj\.weight has rows of 32 values/);
  });
});
