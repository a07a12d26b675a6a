import { describe, it, expect } from 'vitest';
import type { Arch } from '../src/models/config.ts';
import { Normal } from '../src/random.ts';
import { Graph } from '../src/onnx/graph.ts';
import { serializeModel } from '../src/onnx/proto.ts';
import { Session, toOrt, type Feeds } from '../src/runtime/session.ts';
import { gradients } from '../src/autodiff/index.ts';
import { buildCausalLM, declareParameters, valueHead, initLora, initValueHead } from '../src/models/index.ts';
import { sequenceLogps } from '../src/models/logps.ts';
import { mkdtempSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { saveCheckpoint } from '../src/models/checkpoint.ts';
import { loadModel } from '../src/models/load.ts';
import { loraModules, mergeLora } from '../src/models/lora.ts';
import { referenceHidden, referenceLogits, referenceLogps } from './helpers/reference-forward.ts';
import { pad, randomIds, randomWeights, runModel, testConfig, type Row } from './helpers/model-fixtures.ts';

const ARCHS: Arch[] = ['llama', 'qwen2', 'gpt2'];

function rowsFor(vocab: number, seed: number, lengths: number[]): Row[] {
  const rng = new Normal(seed);
  return lengths.map((n) => ({ ids: randomIds(n, vocab, rng), loss: Array.from({ length: n }, (_, t) => (t >= 2 ? 1 : 0)) }));
}

describe.each(ARCHS)('%s graph vs the float64 reference forward', (arch) => {
  const c = testConfig(arch);
  const w = randomWeights(c, 11);
  const rows = rowsFor(c.vocab_size, 5, [6, 3, 8, 5]);
  const batch = pad(rows, 9, ['right', 'left', 'left', 'right']);

  for (const dtype of ['float64', 'float32'] as const) {
    it(`logits and log-probs agree with padding (${dtype})`, async () => {
      const out = await runModel(c, w, batch, { dtype });
      const tol = dtype === 'float64' ? 1e-10 : 1e-5;
      const T = batch.ids[0].length;
      let maxAbs = 0;
      rows.forEach((r, b) => {
        const ref = referenceLogits(c, w, r.ids);
        ref.forEach((row, t) => {
          const base = ((b * T + batch.offset[b] + t) * c.vocab_size);
          row.forEach((v, j) => {
            const got = out.logits[base + j];
            maxAbs = Math.max(maxAbs, Math.abs(v));
            expect(Math.abs(got - v)).toBeLessThan(tol * Math.max(1, Math.abs(v)));
          });
        });
        const rl = referenceLogps(c, w, r.ids, r.loss);
        expect(out.tokens[b]).toBe(rl.tokens);
        expect(Math.abs(out.logp[b] - rl.logp)).toBeLessThan(tol * Math.max(1, Math.abs(rl.logp)));
      });
      // The weights are large enough that logits are far from uniform.
      expect(maxAbs).toBeGreaterThan(1);
    });
  }
});

describe.each([
  ['llama', false],
  ['qwen2', false],
  ['gpt2', false],
  ['llama', true],
  ['gpt2', true],
] as const)('%s gradients vs central finite differences (float64, LoRA %s)', (arch, withLora) => {
  it('matches on sampled coordinates of every parameter tensor', async () => {
    const c = testConfig(arch);
    const lora = withLora ? { rank: 3, alpha: 6, targets: arch === 'gpt2' ? ['c_attn', 'c_fc'] : ['q_proj', 'v_proj', 'down_proj'] } : null;
    const w = randomWeights(c, 21);
    if (lora) {
      // Nonzero B so every adapter tensor has a gradient path.
      const rng = new Normal(99);
      for (const [k, v] of initLora(c, lora, 5)) w.set(k, { shape: v.shape, data: k.includes('lora_B') ? rng.fill(v.data.length, 0.3) : v.data });
    }
    for (const [k, v] of initValueHead(c, 3)) w.set(k, { shape: v.shape, data: new Normal(4).fill(v.data.length, 0.5) });
    const rows = rowsFor(c.vocab_size, 8, [5, 3, 6]);
    const batch = pad(rows, 7, ['left', 'right', 'left']);
    const B = rows.length;
    const T = 7;

    const g = new Graph('grad');
    const inputIds = g.input('input_ids', 'int64', ['batch', 'seq']);
    const attentionMask = g.input('attention_mask', 'int64', ['batch', 'seq']);
    const lossMask = g.input('loss_mask', 'float64', ['batch', 'seq']);
    const valueIndex = g.input('value_index', 'int64', ['batch']);
    const params = declareParameters(g, c, { dtype: 'float64', lora, valueHead: true });
    const model = buildCausalLM(g, c, params, { inputIds, attentionMask }, { lora });
    const { logp } = sequenceLogps(g, model, lossMask);
    const value = valueHead(g, model, params, valueIndex);
    // A scalar mixing every output with fixed weights, so no gradient is special.
    const mix = (t: typeof logp, ws: number[]) => g.reduceSum(g.mul(t, g.constant(ws, 'float64', [ws.length])), undefined, false);
    const loss = g.output(g.add(mix(logp, [0.7, -1.3, 0.4]), mix(g.mul(value, value), [0.5, 0.2, -0.9])), 'loss');
    const names = [...params.keys()];
    const grads = gradients(g, loss, names.map((n) => params.get(n)!));
    grads.forEach((d, i) => {
      expect(d, `gradient of ${names[i]}`).not.toBeNull();
      g.output(d!, `grad:${names[i]}`);
    });
    const session = await Session.create(serializeModel(g));
    const feeds: Feeds = {
      input_ids: toOrt('int64', BigInt64Array.from(batch.ids.flat().map(BigInt)), [B, T]),
      attention_mask: toOrt('int64', BigInt64Array.from(batch.attention.flat().map(BigInt)), [B, T]),
      loss_mask: toOrt('float64', Float64Array.from(batch.loss.flat()), [B, T]),
      value_index: toOrt('int64', BigInt64Array.from(rows.map((r, b) => BigInt(batch.offset[b] + r.ids.length - 2))), [B]),
    };
    const data = new Map<string, Float64Array>();
    for (const n of names) {
      data.set(n, Float64Array.from(w.get(n)!.data));
      feeds[n] = toOrt('float64', data.get(n)!, params.get(n)!.staticShape!);
    }
    const all = await session.run(feeds);
    const lossAt = async () => (await session.run(feeds, ['loss'])).loss.data[0] as number;
    const rng = new Normal(1234);
    let checked = 0;
    let nonzero = 0;
    for (const n of names) {
      const x = data.get(n)!;
      const grad = all[`grad:${n}`].data as Float64Array;
      expect(grad.length).toBe(x.length);
      // Embedding rows of tokens in the batch, else any coordinate.
      const usedIds = batch.ids.flat();
      for (let s = 0; s < 2; s++) {
        let at = Math.floor(rng.uniform() * x.length);
        if (n.endsWith('embed_tokens.weight') || n.endsWith('wte.weight')) {
          const D = x.length / c.vocab_size;
          at = usedIds[Math.floor(rng.uniform() * usedIds.length)] * D + Math.floor(rng.uniform() * D);
        }
        const h = 1e-5;
        const x0 = x[at];
        x[at] = x0 + h;
        const up = await lossAt();
        x[at] = x0 - h;
        const down = await lossAt();
        x[at] = x0;
        const fd = (up - down) / (2 * h);
        const err = Math.abs(fd - grad[at]) / Math.max(1e-3, Math.abs(fd) + Math.abs(grad[at]));
        expect(err, `${n}[${at}]: autodiff ${grad[at]} vs finite difference ${fd}`).toBeLessThan(1e-6);
        checked++;
        if (Math.abs(fd) > 1e-6) nonzero++;
      }
    }
    expect(checked).toBeGreaterThan(30);
    // Most sampled coordinates matter, so agreement is not agreement on zeros.
    expect(nonzero).toBeGreaterThan(0.75 * checked);
    await session.release();
  });
});

describe('padding and the value head', () => {
  it.each(ARCHS)('%s: a row scores the same alone, left-padded and right-padded (float32)', async (arch) => {
    const c = testConfig(arch);
    const w = randomWeights(c, 31);
    const rows = rowsFor(c.vocab_size, 12, [7, 4, 9]);
    const left = await runModel(c, w, pad(rows, 12, ['left', 'left', 'left']));
    const right = await runModel(c, w, pad(rows, 10, ['right', 'right', 'right']));
    for (let b = 0; b < rows.length; b++) {
      const alone = await runModel(c, w, pad([rows[b]], rows[b].ids.length, ['right']));
      for (const other of [left, right]) {
        expect(Math.abs(other.logp[b] - alone.logp[0])).toBeLessThan(1e-5 * Math.abs(alone.logp[0]));
        expect(other.tokens[b]).toBe(alone.tokens[0]);
      }
      // Per-token values sit at each token's own position and sum to the sequence value.
      const n = rows[b].ids.length;
      const leftOffset = 12 - n;
      for (let t = 0; t < n; t++) {
        expect(Math.abs(left.tokenLogps[b * 12 + leftOffset + t] - alone.tokenLogps[t])).toBeLessThan(1e-5);
        expect(Math.abs(right.tokenLogps[b * 10 + t] - alone.tokenLogps[t])).toBeLessThan(1e-5);
      }
      const sum = alone.tokenLogps.reduce((a, v) => a + v, 0);
      expect(Math.abs(sum - alone.logp[0])).toBeLessThan(1e-5 * Math.abs(sum));
      expect(Math.abs(alone.tokenLogps[0])).toBe(0);
    }
  });

  it.each(ARCHS)('%s: the value head reads the final hidden state at value_index', async (arch) => {
    const c = testConfig(arch);
    const w = randomWeights(c, 41);
    const vh = initValueHead(c, 2);
    vh.get('value_head.bias')!.data[0] = 0.25;
    for (const [k, v] of vh) w.set(k, v);
    const rows = rowsFor(c.vocab_size, 13, [5, 8]);
    const batch = pad(rows, 8, ['left', 'right']);
    const index = [batch.offset[0] + 2, batch.offset[1] + 7];
    const out = await runModel(c, w, batch, { dtype: 'float64', valueIndex: index });
    rows.forEach((r, b) => {
      const h = referenceHidden(c, w, r.ids)[index[b] - batch.offset[b]];
      const wv = w.get('value_head.weight')!.data;
      const want = h.reduce((a, x, j) => a + x * wv[j], 0.25);
      expect(Math.abs(out.value![b] - want)).toBeLessThan(1e-10);
    });
  });
});

describe.each(['llama', 'gpt2'] as const)('%s LoRA', (arch) => {
  const c = testConfig(arch);
  const lora = { rank: 4, alpha: 8, targets: arch === 'gpt2' ? ['c_attn', 'c_proj'] : ['q_proj', 'v_proj', 'gate_proj'] };
  const rows = rowsFor(c.vocab_size, 17, [6, 4]);
  const batch = pad(rows, 7, ['left', 'right']);
  const base = randomWeights(c, 51);

  it('fresh adapters (B = 0) leave the model unchanged', async () => {
    const w = new Map([...base, ...initLora(c, lora, 3)]);
    const on = await runModel(c, w, batch, { lora });
    const off = await runModel(c, base, batch);
    on.logits.forEach((v, i) => expect(Math.abs(v - off.logits[i])).toBeLessThan(1e-6));
  });

  it('adapters on match the reference with adapters; off matches the base; merged weights match on', async () => {
    const w = new Map(base);
    const rng = new Normal(77);
    for (const [k, v] of initLora(c, lora, 3)) w.set(k, { shape: v.shape, data: k.includes('lora_B') ? rng.fill(v.data.length, 0.2) : v.data });
    const modules = loraModules(c, lora).map((m) => m.name);
    expect(modules.length).toBe(c.model_type === 'gpt2' ? 2 * 3 : 2 * 3); // 2 layers × 3 adapted modules
    const on64 = await runModel(c, w, batch, { dtype: 'float64', lora });
    const off = await runModel(c, w, batch, { declareLora: lora });
    const plain = await runModel(c, base, batch);
    const merged = await runModel(c, mergeLora(w, c, lora), batch);
    const on32 = await runModel(c, w, batch, { lora });
    let moved = 0;
    rows.forEach((r, b) => {
      const ref = referenceLogps(c, w, r.ids, r.loss, { rank: lora.rank, alpha: lora.alpha, modules });
      expect(Math.abs(on64.logp[b] - ref.logp)).toBeLessThan(1e-10 * Math.abs(ref.logp));
      expect(off.logp[b]).toBe(plain.logp[b]);
      expect(Math.abs(merged.logp[b] - on32.logp[b])).toBeLessThan(1e-5 * Math.abs(on32.logp[b]));
      moved = Math.max(moved, Math.abs(on32.logp[b] - plain.logp[b]));
    });
    // The adapters change the output, so "off equals base" is not trivially true.
    expect(moved).toBeGreaterThan(0.1);
  });

  it('rejects a target no module has', () => {
    expect(() => loraModules(c, { ...lora, targets: ['nope_proj'] })).toThrow(/lora target "nope_proj" matches no module/);
  });
});

describe('checkpoints', () => {
  it.each(ARCHS)('%s: save and reload is bit-exact, and scores are unchanged', async (arch) => {
    const c = testConfig(arch);
    const w = randomWeights(c, 61);
    for (const [k, v] of initValueHead(c, 9)) w.set(k, v);
    const dir = mkdtempSync(join(tmpdir(), 'pz-models-'));
    saveCheckpoint(dir, w, { config: c });
    const back = loadModel(dir, { valueHead: true });
    expect([...back.weights.keys()].sort()).toEqual([...w.keys()].sort());
    for (const [k, t] of w) {
      const got = back.weights.get(k)!;
      expect(got.shape).toEqual(t.shape);
      expect(Buffer.from(got.data.buffer, got.data.byteOffset, got.data.byteLength).equals(Buffer.from(t.data.buffer, t.data.byteOffset, t.data.byteLength))).toBe(true);
    }
    const batch = pad(rowsFor(c.vocab_size, 3, [5, 6]), 6, ['left', 'right']);
    const a = await runModel(c, w, batch);
    const b = await runModel(back.config, back.weights, batch);
    expect(Array.from(b.logp)).toEqual(Array.from(a.logp));
  });

  it('loads GPT-2 checkpoints saved without the transformer. prefix and with mask buffers', () => {
    const c = testConfig('gpt2');
    const w = randomWeights(c, 71);
    const renamed = new Map([...w].map(([k, v]) => [k.replace(/^transformer\./, ''), v]));
    renamed.set('h.0.attn.bias', { shape: [1, 1, 4, 4], data: new Float32Array(16).fill(1) });
    const dir = mkdtempSync(join(tmpdir(), 'pz-gpt2-'));
    saveCheckpoint(dir, renamed, { config: c });
    const back = loadModel(dir);
    expect([...back.weights.keys()].sort()).toEqual([...w.keys()].sort());
    expect(back.weights.get('transformer.h.1.mlp.c_fc.weight')!.data).toEqual(w.get('transformer.h.1.mlp.c_fc.weight')!.data);
  });

  it('names the missing tensor and the file', () => {
    const c = testConfig('llama');
    const w = randomWeights(c, 81);
    w.delete('model.layers.1.mlp.up_proj.weight');
    const dir = mkdtempSync(join(tmpdir(), 'pz-missing-'));
    saveCheckpoint(dir, w, { config: c });
    expect(() => loadModel(dir)).toThrow(/tensor "model\.layers\.1\.mlp\.up_proj\.weight" not found.*model\.safetensors/);
  });
});

describe('config variants vs the float64 reference', () => {
  const variants: [string, Arch, { tied?: boolean; extra?: Record<string, unknown> }][] = [
    ['llama with q/k/v/o and MLP biases, tied head', 'llama', { tied: true, extra: { attention_bias: true, mlp_bias: true } }],
    ['llama with llama3 rope scaling', 'llama', { extra: { rope_scaling: { rope_type: 'llama3', factor: 8, low_freq_factor: 1, high_freq_factor: 4, original_max_position_embeddings: 256 } } }],
    ['llama with linear rope scaling and no GQA', 'llama', { extra: { num_key_value_heads: 4, rope_scaling: { type: 'linear', factor: 3 } } }],
    ['qwen2 with a tied head and relu', 'qwen2', { tied: true, extra: { hidden_act: 'relu' } }],
    ['gpt2 with an untied head, layer-scaled attention and quick_gelu', 'gpt2', { tied: false, extra: { scale_attn_by_inverse_layer_idx: true, activation_function: 'quick_gelu', n_inner: 40 } }],
  ];
  it.each(variants)('%s', async (_name, arch, o) => {
    const c = testConfig(arch, o);
    const w = randomWeights(c, 91);
    const rows = rowsFor(c.vocab_size, 19, [9, 6]);
    const batch = pad(rows, 10, ['left', 'right']);
    const out = await runModel(c, w, batch, { dtype: 'float64' });
    rows.forEach((r, b) => {
      const ref = referenceLogps(c, w, r.ids, r.loss);
      expect(Math.abs(out.logp[b] - ref.logp)).toBeLessThan(1e-10 * Math.abs(ref.logp));
    });
  });

  it('refuses rope scaling it does not implement', async () => {
    const c = testConfig('llama', { extra: { rope_scaling: { rope_type: 'yarn', factor: 4 } } });
    await expect(runModel(c, randomWeights(c, 1), pad(rowsFor(c.vocab_size, 1, [3]), 3, ['right']))).rejects.toThrow(/rope_scaling type "yarn" is not supported/);
  });
});

describe('policy and adapters-off reference in one graph', () => {
  it('share the base weights and the batch tensors, and give the separate results', async () => {
    const c = testConfig('qwen2');
    const lora = { rank: 2, alpha: 4, targets: ['k_proj', 'o_proj', 'up_proj'] };
    const w = randomWeights(c, 101);
    const rng = new Normal(5);
    for (const [k, v] of initLora(c, lora, 3)) w.set(k, { shape: v.shape, data: k.includes('lora_B') ? rng.fill(v.data.length, 0.2) : v.data });
    const rows = rowsFor(c.vocab_size, 23, [6, 4]);
    const batch = pad(rows, 6, ['right', 'left']);
    const g = new Graph('both');
    const inputIds = g.input('input_ids', 'int64', ['batch', 'seq']);
    const attentionMask = g.input('attention_mask', 'int64', ['batch', 'seq']);
    const lossMask = g.input('loss_mask', 'float32', ['batch', 'seq']);
    const params = declareParameters(g, c, { lora });
    const policy = buildCausalLM(g, c, params, { inputIds, attentionMask }, { lora });
    const reference = buildCausalLM(g, c, params, { inputIds, attentionMask }, { batch: policy.batch });
    g.output(sequenceLogps(g, policy, lossMask).logp, 'policy');
    g.output(sequenceLogps(g, reference, lossMask).logp, 'reference');
    expect(g.inputs.length).toBe(3 + params.size);
    // One batch index: its positions and its causal key/query index are one running count each (a
    // second, unshared index would make four).
    expect(g.nodes.filter((n) => n.op === 'CumSum')).toHaveLength(2);
    const s = await Session.create(serializeModel(g));
    const B = 2;
    const T = 6;
    const feeds: Feeds = {
      input_ids: toOrt('int64', BigInt64Array.from(batch.ids.flat().map(BigInt)), [B, T]),
      attention_mask: toOrt('int64', BigInt64Array.from(batch.attention.flat().map(BigInt)), [B, T]),
      loss_mask: toOrt('float32', Float32Array.from(batch.loss.flat()), [B, T]),
    };
    for (const [n, t] of params) feeds[n] = toOrt('float32', w.get(n)!.data, t.staticShape!);
    const out = await s.run(feeds);
    const on = await runModel(c, w, batch, { lora });
    const off = await runModel(c, w, batch, { declareLora: lora });
    for (let b = 0; b < B; b++) {
      expect(Math.abs((out.policy.data[b] as number) - on.logp[b])).toBeLessThan(1e-6 * Math.abs(on.logp[b]));
      expect(Math.abs((out.reference.data[b] as number) - off.logp[b])).toBeLessThan(1e-6 * Math.abs(off.logp[b]));
      expect(Math.abs(on.logp[b] - off.logp[b])).toBeGreaterThan(0.01);
    }
  });
});
