import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { afterAll, describe, expect, it } from 'vitest';
import { UserError } from '../src/errors.ts';
import { readSafetensorsHeader, writeSafetensors } from '../src/models/safetensors.ts';
import { loadCheckpoint, saveCheckpoint, INDEX_FILE, SINGLE_FILE, type FloatTensor } from '../src/models/checkpoint.ts';
import {
  countParameters,
  parameterShapes,
  parseConfig,
  presetConfig,
  readConfig,
  type LlamaConfig,
} from '../src/models/config.ts';
import { uniform } from '../src/random.ts';

const root = fs.mkdtempSync(path.join(os.tmpdir(), 'prefzoo-ckpt-'));
afterAll(() => fs.rmSync(root, { recursive: true, force: true }));
let counter = 0;
const newDir = () => path.join(root, `m${counter++}`);

/** Bitwise equality (distinguishes -0 from 0 and compares NaN payloads). */
function sameBits(a: Float32Array, b: Float32Array): boolean {
  return Buffer.from(a.buffer, a.byteOffset, a.byteLength).equals(Buffer.from(b.buffer, b.byteOffset, b.byteLength));
}

function userError(fn: () => unknown): string {
  try {
    fn();
  } catch (e) {
    expect(e).toBeInstanceOf(UserError);
    expect((e as Error).message).not.toContain('\n');
    return (e as Error).message;
  }
  throw new Error('expected a UserError');
}

/** Deterministic pseudo-random floats spanning many magnitudes and signs. */
function randomTensor(shape: number[], seed: number): FloatTensor {
  const next = uniform(seed);
  const n = shape.reduce((a, b) => a * b, 1);
  const data = new Float32Array(n);
  for (let i = 0; i < n; i++) data[i] = (next() - 0.5) * 2 ** Math.floor(next() * 40 - 20);
  return { shape, data };
}

/** bfloat16 rounding computed in float64 arithmetic: keep 8 significant bits, ties to even. */
function bf16Reference(v: number): number {
  if (v === 0 || !Number.isFinite(v)) return v;
  const e = Math.floor(Math.log2(Math.abs(v)));
  const ulp = 2 ** (e - 7);
  const q = v / ulp;
  const f = Math.floor(q);
  const r = q - f === 0.5 ? (f % 2 === 0 ? f : f + 1) : Math.round(q);
  return r * ulp;
}

function model(): Map<string, FloatTensor> {
  const cfg = presetConfig('llama', 'tiny', { vocabSize: 100 });
  const m = new Map<string, FloatTensor>();
  let seed = 1;
  for (const [name, shape] of parameterShapes(cfg)) m.set(name, randomTensor(shape, seed++));
  return m;
}

describe('saveCheckpoint / loadCheckpoint', () => {
  it('F32 save and reload is bit-exact, with config.json', () => {
    const dir = newDir();
    const tensors = model();
    const special = tensors.get('model.norm.weight')!.data;
    special.set([Infinity, -Infinity, -0, 1.4e-45, 3.4028234663852886e38]);
    const config = presetConfig('llama', 'tiny', { vocabSize: 100, eosTokenId: 3 });
    expect(saveCheckpoint(dir, tensors, { config })).toEqual([path.join(dir, SINGLE_FILE)]);
    const back = loadCheckpoint(dir);
    expect([...back.keys()].sort()).toEqual([...tensors.keys()].sort());
    for (const [name, t] of tensors) {
      const got = back.get(name)!;
      expect(got.shape).toEqual(t.shape);
      expect(sameBits(got.data, t.data)).toBe(true);
      expect(back.dtypes.get(name)).toBe('F32');
    }
    expect(readSafetensorsHeader(path.join(dir, SINGLE_FILE)).metadata).toEqual({ format: 'pt' });
    const cfg = readConfig(dir);
    expect(cfg).toEqual({ ...config, torch_dtype: 'float32' });
    expect(cfg.eos_token_id).toBe(3);
  });

  it('BF16 save rounds to nearest even and the rounded weights reload exactly', () => {
    const dir = newDir();
    const tensors = model();
    // Exact ties: 1 + 2^-8 keeps 1 (even), 1 + 3*2^-8 goes up to 1 + 2^-6.
    tensors.get('model.norm.weight')!.data.set([1 + 2 ** -8, 1 + 3 * 2 ** -8, -(1 + 2 ** -8 + 2 ** -20)]);
    saveCheckpoint(dir, tensors, { dtype: 'BF16', config: presetConfig('llama', 'tiny', { vocabSize: 100 }) });
    const back = loadCheckpoint(dir);
    expect(readConfig(dir).torch_dtype).toBe('bfloat16');
    for (const [name, t] of tensors) {
      expect(back.dtypes.get(name)).toBe('BF16');
      const got = back.get(name)!.data;
      const want = Float32Array.from(t.data, bf16Reference);
      expect(sameBits(got, want)).toBe(true);
    }
    expect(Array.from(back.get('model.norm.weight')!.data.subarray(0, 3))).toEqual([1, 1 + 2 ** -6, -(1 + 2 ** -7)]);
    // Saving the reloaded weights as BF16 again gives identical files.
    const dir2 = newDir();
    saveCheckpoint(dir2, back, { dtype: 'BF16' });
    expect(fs.readFileSync(path.join(dir2, SINGLE_FILE)).equals(fs.readFileSync(path.join(dir, SINGLE_FILE)))).toBe(true);
  });

  it('shards past maxShardBytes, writes a consistent index, and reloads identically', () => {
    const dir = newDir();
    const tensors = model();
    const totalBytes = [...tensors.values()].reduce((a, t) => a + t.data.length * 4, 0);
    const files = saveCheckpoint(dir, tensors, { maxShardBytes: 40_000 });
    const shards = files.filter((f) => f.endsWith('.safetensors')).map((f) => path.basename(f));
    expect(shards.length).toBeGreaterThan(2);
    shards.forEach((f, i) => expect(f).toBe(`model-${String(i + 1).padStart(5, '0')}-of-${String(shards.length).padStart(5, '0')}.safetensors`));
    expect(fs.existsSync(path.join(dir, SINGLE_FILE))).toBe(false);
    const index = JSON.parse(fs.readFileSync(path.join(dir, INDEX_FILE), 'utf8'));
    expect(index.metadata.total_size).toBe(totalBytes);
    expect(Object.keys(index.weight_map).sort()).toEqual([...tensors.keys()].sort());
    for (const shard of shards) {
      const h = readSafetensorsHeader(path.join(dir, shard));
      // Each shard respects the limit unless it holds a single oversized tensor.
      const bytes = [...h.tensors.values()].reduce((a, t) => a + t.end - t.begin, 0);
      expect(bytes <= 40_000 || h.tensors.size === 1).toBe(true);
      for (const name of h.tensors.keys()) expect(index.weight_map[name]).toBe(shard);
    }
    const back = loadCheckpoint(dir);
    for (const [name, t] of tensors) {
      expect(sameBits(back.get(name)!.data, t.data)).toBe(true);
      expect(path.basename(back.files.get(name)!)).toBe(index.weight_map[name]);
    }
    // Saving unsharded into the same folder removes the old shards and index.
    saveCheckpoint(dir, tensors);
    expect(fs.readdirSync(dir).sort()).toEqual([SINGLE_FILE]);
  });

  it('loads F16 and mixed-dtype files as float32', () => {
    const dir = newDir();
    fs.mkdirSync(dir);
    writeSafetensors(path.join(dir, SINGLE_FILE), {
      a: { dtype: 'F16', shape: [2], data: new Uint16Array([0x3c00, 0xc200]) },
      b: { dtype: 'F64', shape: [1], data: new Float64Array([0.1]) },
    });
    const back = loadCheckpoint(dir);
    expect(Array.from(back.get('a')!.data)).toEqual([1, -3]);
    expect(back.get('b')!.data[0]).toBe(Math.fround(0.1));
  });

  it('errors name the folder or file', () => {
    const missing = path.join(root, 'does-not-exist');
    expect(userError(() => loadCheckpoint(missing))).toBe(`${missing}: no such model folder`);

    const empty = newDir();
    fs.mkdirSync(empty);
    fs.writeFileSync(path.join(empty, 'pytorch_model.bin'), '');
    expect(userError(() => loadCheckpoint(empty))).toMatch(new RegExp(`^${empty}: no model.safetensors .*pytorch_model.bin is not supported`));

    const dir = newDir();
    saveCheckpoint(dir, model(), { maxShardBytes: 40_000 });
    const index = JSON.parse(fs.readFileSync(path.join(dir, INDEX_FILE), 'utf8'));
    const shard = index.weight_map['model.norm.weight'];
    index.weight_map['model.extra.weight'] = shard;
    fs.writeFileSync(path.join(dir, INDEX_FILE), JSON.stringify(index));
    expect(userError(() => loadCheckpoint(dir))).toBe(
      `${path.join(dir, shard)}: tensor "model.extra.weight" is listed in ${INDEX_FILE} but missing from the shard`,
    );
    index.weight_map['model.extra.weight'] = 'model-00009-of-00009.safetensors';
    fs.writeFileSync(path.join(dir, INDEX_FILE), JSON.stringify(index));
    expect(userError(() => loadCheckpoint(dir))).toMatch(/model-00009-of-00009.safetensors is listed in weight_map but does not exist/);
    fs.writeFileSync(path.join(dir, INDEX_FILE), '{"weight_map": ');
    expect(userError(() => loadCheckpoint(dir))).toMatch(new RegExp(`^${path.join(dir, INDEX_FILE)}: invalid JSON`));

    const ok = newDir();
    saveCheckpoint(ok, model());
    const ckpt = loadCheckpoint(ok);
    expect(userError(() => ckpt.require('lm_head.weight'))).toBe(`${ok}: tensor "lm_head.weight" not found in the checkpoint (${SINGLE_FILE})`);
    expect(userError(() => ckpt.require('model.norm.weight', [32]))).toBe(
      `${path.join(ok, SINGLE_FILE)}: tensor "model.norm.weight" has shape [64], expected [32]`,
    );
    expect(ckpt.require('model.norm.weight', [64]).data.length).toBe(64);
  });

  it('rejects tensors whose data does not match their shape', () => {
    const dir = newDir();
    expect(userError(() => saveCheckpoint(dir, { w: { shape: [2, 2], data: new Float32Array(3) } }))).toBe(
      `${dir}: tensor "w" needs 4 float32 values for shape [2, 2], got 3`,
    );
  });
});

describe('config.json', () => {
  it('reads a Qwen2.5-0.5B style config, fills defaults, keeps unknown keys', () => {
    const raw = {
      architectures: ['Qwen2ForCausalLM'],
      model_type: 'qwen2',
      hidden_size: 896,
      intermediate_size: 4864,
      num_attention_heads: 14,
      num_key_value_heads: 2,
      num_hidden_layers: 24,
      max_position_embeddings: 32768,
      rms_norm_eps: 1e-6,
      rope_theta: 1000000.0,
      vocab_size: 151936,
      tie_word_embeddings: true,
      use_sliding_window: false,
      transformers_version: '4.43.1',
    };
    const cfg = parseConfig(raw) as LlamaConfig;
    expect(cfg.head_dim).toBe(64);
    expect(cfg.hidden_act).toBe('silu');
    const shapes = parameterShapes(cfg);
    expect([shapes.has('model.layers.0.self_attn.q_proj.bias'), shapes.has('model.layers.0.self_attn.o_proj.bias')]).toEqual([true, false]);
    expect(cfg.use_sliding_window).toBe(false);
    expect(cfg.transformers_version).toBe('4.43.1');
    // 24 layers: q 896², k,v 128·896, o 896², biases 896+128+128, MLP 3·4864·896, two norms; tied head.
    const perLayer = 2 * 896 * 896 + 2 * 128 * 896 + 896 + 2 * 128 + 3 * 4864 * 896 + 2 * 896;
    expect(countParameters(cfg)).toBe(151936 * 896 + 24 * perLayer + 896);
  });

  it('applies HF defaults', () => {
    const llama = parseConfig({ model_type: 'llama', hidden_size: 256, num_attention_heads: 8 }) as LlamaConfig;
    expect(llama).toMatchObject({
      num_key_value_heads: 8,
      head_dim: 32,
      vocab_size: 32000,
      intermediate_size: 11008,
      rms_norm_eps: 1e-6,
      rope_theta: 10000,
      max_position_embeddings: 2048,
      attention_bias: false,
      tie_word_embeddings: false,
    });
    const biased = parameterShapes({ ...llama, attention_bias: true });
    expect([biased.has('model.layers.0.self_attn.q_proj.bias'), biased.has('model.layers.0.self_attn.o_proj.bias')]).toEqual([true, true]);
    const gpt2 = parseConfig({ model_type: 'gpt2' });
    expect(gpt2).toMatchObject({ n_embd: 768, n_layer: 12, n_head: 12, n_positions: 1024, vocab_size: 50257, n_inner: null, layer_norm_epsilon: 1e-5, activation_function: 'gelu_new', tie_word_embeddings: true });
    // GPT-2 small has 124,439,808 parameters (published figure for the tied model).
    expect(countParameters(gpt2)).toBe(124_439_808);
  });

  it('rejects bad configs with messages naming the file and field', () => {
    expect(userError(() => parseConfig({ hidden_size: 8 }, 'x/config.json'))).toBe('x/config.json: missing "model_type" (expected one of llama, qwen2, qwen3, mistral, gemma, phi3, gpt2)');
    expect(userError(() => parseConfig({ model_type: 'bert' }, 'c.json'))).toBe('c.json: model_type "bert" is not supported (supported: llama, qwen2, qwen3, mistral, gemma, phi3, gpt2)');
    expect(userError(() => parseConfig({ model_type: 'llama', hidden_size: '64' }, 'c.json'))).toBe('c.json: "hidden_size" must be a positive integer, got "64"');
    expect(userError(() => parseConfig({ model_type: 'llama', rms_norm_eps: -1 }, 'c.json'))).toBe('c.json: "rms_norm_eps" must be a positive number, got -1');
    expect(userError(() => parseConfig({ model_type: 'llama', num_attention_heads: 6, num_key_value_heads: 4, hidden_size: 48 }, 'c.json'))).toMatch(
      /num_attention_heads 6 is not a multiple of num_key_value_heads 4/,
    );
    expect(userError(() => parseConfig({ model_type: 'llama', hidden_size: 100, num_attention_heads: 8 }, 'c.json'))).toMatch(/not divisible/);
    expect(userError(() => parseConfig({ model_type: 'gpt2', activation_function: 'swish2' }, 'c.json'))).toMatch(/"activation_function" must be one of/);
    expect(userError(() => parseConfig({ model_type: 'llama', tie_word_embeddings: 'yes' }, 'c.json'))).toMatch(/"tie_word_embeddings" must be true or false/);
    const dir = newDir();
    fs.mkdirSync(dir);
    expect(userError(() => readConfig(dir))).toMatch(new RegExp(`^${path.join(dir, 'config.json')}: no such file`));
    fs.writeFileSync(path.join(dir, 'config.json'), '{');
    expect(userError(() => readConfig(dir))).toMatch(new RegExp(`^${path.join(dir, 'config.json')}: invalid JSON`));
  });
});

describe('presetConfig', () => {
  it('tiny presets stay well under 1M parameters (hand-counted)', () => {
    // vocab 300 → 320. llama layer: norms 128, q/o 2·64², k/v 2·32·64, MLP 3·172·64.
    const llamaLayer = 128 + 2 * 64 * 64 + 2 * 32 * 64 + 3 * 172 * 64;
    const llama = presetConfig('llama', 'tiny', { vocabSize: 300 });
    expect(llama.vocab_size).toBe(320);
    expect(countParameters(llama)).toBe(320 * 64 + 2 * llamaLayer + 64);
    const qwen = presetConfig('qwen2', 'tiny', { vocabSize: 300 });
    expect(countParameters(qwen)).toBe(320 * 64 + 2 * (llamaLayer + 64 + 32 + 32) + 64);
    expect(qwen.model_type).toBe('qwen2');
    expect(parameterShapes(qwen).get('model.layers.1.self_attn.k_proj.bias')).toEqual([32]);
    expect(parameterShapes(qwen).has('model.layers.1.self_attn.o_proj.bias')).toBe(false);
    // gpt2 layer: 2 LayerNorms, c_attn 64→192, c_proj 64→64, c_fc 64→256, c_proj 256→64 (with biases).
    const gptLayer = 4 * 64 + (64 * 192 + 192) + (64 * 64 + 64) + (64 * 256 + 256) + (256 * 64 + 64);
    const gpt2 = presetConfig('gpt2', 'tiny', { vocabSize: 300 });
    expect(countParameters(gpt2)).toBe(320 * 64 + 512 * 64 + 2 * gptLayer + 128);
    for (const c of [llama, qwen, gpt2]) expect(countParameters(c)).toBeLessThan(1_000_000);
  });

  it('small presets have the documented sizes', () => {
    expect(presetConfig('llama', 'small')).toMatchObject({
      hidden_size: 512,
      num_hidden_layers: 8,
      num_attention_heads: 8,
      num_key_value_heads: 4,
      intermediate_size: 1376,
      vocab_size: 32000,
      architectures: ['LlamaForCausalLM'],
    });
    expect(presetConfig('gpt2', 'small')).toMatchObject({ n_embd: 512, n_layer: 8, n_head: 8, vocab_size: 32000 });
    expect(userError(() => presetConfig('gpt3' as 'gpt2', 'tiny', { vocabSize: 10 }))).toBe('--arch: "gpt3" is not one of llama, qwen2, qwen3, mistral, gemma, phi3, gpt2');
  });
});
