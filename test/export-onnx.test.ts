/**
 * `prefzoo export --format onnx`, checked by transformers.js itself: every family's exported tiny
 * model loads from disk (no remote models), its tokenizer and kept chat template give prefzoo's prompt
 * ids, its teacher-forced log-probs equal prefzoo's scoring graph (the one `prefzoo logps` runs), and
 * its greedy generate equals prefzoo's greedy sampling (`prefzoo generate --temperature 0`).
 */
import { describe, it, expect, beforeAll, afterAll } from 'vitest';
import { existsSync, mkdtempSync, readFileSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { AutoModelForCausalLM, AutoTokenizer, Tensor, env } from '@huggingface/transformers';
import type { Arch } from '../src/models/config.ts';
import { loadModel } from '../src/models/load.ts';
import { buildLogpsGraph } from '../src/models/logps.ts';
import { Session, toOrt } from '../src/runtime/session.ts';
import { ModelSampler } from '../src/online/policy.ts';
import { loadTokenizer } from '../src/tokenize/index.ts';
import type { Message } from '../datasets/names.ts';
import { promptIds } from '../src/online/prompts.ts';
import { readExportSource } from '../src/export/source.ts';
import { initLora } from '../src/models/lora.ts';
import { type LoadedAdapter, loadAdapter, saveAdapter } from '../src/models/peft.ts';
import { Normal } from '../src/random.ts';
import { exportOnnx, ONNX_DTYPES } from '../src/export/onnx.ts';
import { parseModel } from '../src/onnx/proto.ts';
import { EXPORT_ARCHS, EXPORT_PROMPT, noisyTinyModel } from './helpers/export-fixtures.ts';
import { prefzoo } from './helpers/cli.ts';

env.allowRemoteModels = false;
env.allowLocalModels = true;

const root = mkdtempSync(join(tmpdir(), 'pz-export-onnx-'));
const messages: Message[] = [{ role: 'user', content: EXPORT_PROMPT }];

/**
 * prefzoo's per-token log-probs of `ids` (token 0 has none), from the graph `prefzoo logps` runs;
 * with `adapter`, the unmerged LoRA forward (base weights plus the adapter's product at each projection).
 */
async function prefzooLogps(dir: string, ids: number[], adapter?: LoadedAdapter): Promise<{ sum: number; perToken: number[] }> {
  const { config, weights } = loadModel(dir);
  if (adapter) for (const [k, v] of adapter.weights) weights.set(k, v);
  const s = await Session.fromGraph(buildLogpsGraph(config, { weights, perToken: true, lora: adapter?.lora }), {});
  const T = ids.length;
  const out = await s.run({
    input_ids: toOrt('int64', BigInt64Array.from(ids.map(BigInt)), [1, T]),
    attention_mask: toOrt('int64', new BigInt64Array(T).fill(1n), [1, T]),
    loss_mask: toOrt('float32', new Float32Array(T).fill(1), [1, T]),
  });
  await s.release();
  const per = Array.from(out.token_logps.data as Float32Array);
  return { sum: (out.logp.data as Float32Array)[0], perToken: per.slice(1) };
}

/** transformers.js's log p(ids[t] | ids before t), t ≥ 1, from its logits (log-softmax in float64). */
async function transformersLogps(model: Awaited<ReturnType<typeof AutoModelForCausalLM.from_pretrained>>, ids: number[]): Promise<number[]> {
  const T = ids.length;
  const out = (await model({
    input_ids: new Tensor('int64', BigInt64Array.from(ids.map(BigInt)), [1, T]),
    attention_mask: new Tensor('int64', new BigInt64Array(T).fill(1n), [1, T]),
  })) as { logits: Tensor };
  const [, S, V] = out.logits.dims;
  expect(S).toBe(T);
  const data = out.logits.data as Float32Array;
  const lp: number[] = [];
  for (let t = 0; t + 1 < T; t++) {
    const row = data.subarray(t * V, (t + 1) * V);
    let max = -Infinity;
    for (const x of row) max = Math.max(max, x);
    let z = 0;
    for (const x of row) z += Math.exp(x - max);
    lp.push(row[ids[t + 1]] - max - Math.log(z));
  }
  return lp;
}

describe('export --format onnx, loaded by transformers.js', () => {
  const dirs = new Map<Arch, string>();

  beforeAll(() => {
    for (const arch of EXPORT_ARCHS) {
      const dir = noisyTinyModel(root, arch, arch);
      exportOnnx(readExportSource(dir), dir + '-onnx', { dtypes: arch === 'llama' ? ['fp32', 'fp16', 'q8'] : ['fp32'] });
      dirs.set(arch, dir);
    }
  });
  afterAll(() => rmSync(root, { recursive: true, force: true }));

  it("writes Optimum's input and output names and the tokenizer files, chat template kept", () => {
    const out = dirs.get('qwen3')! + '-onnx';
    for (const f of ['config.json', 'generation_config.json', 'tokenizer.json', 'tokenizer_config.json', 'onnx/model.onnx']) expect(existsSync(join(out, f)), f).toBe(true);
    const { graph } = parseModel(readFileSync(join(out, 'onnx', 'model.onnx')));
    const inputs = graph.inputs.map((i) => i.name);
    expect(inputs).toEqual(['input_ids', 'attention_mask', 'position_ids', 'past_key_values.0.key', 'past_key_values.0.value', 'past_key_values.1.key', 'past_key_values.1.value']);
    expect(graph.outputs.map((o) => o.name).sort()).toEqual(['logits', 'present.0.key', 'present.0.value', 'present.1.key', 'present.1.value']);
    expect(graph.inputs[3].shape).toEqual(['batch_size', 2, 'past_sequence_length', 16]);
    const src = JSON.parse(readFileSync(join(dirs.get('qwen3')!, 'tokenizer_config.json'), 'utf8'));
    expect(JSON.parse(readFileSync(join(out, 'tokenizer_config.json'), 'utf8')).chat_template).toBe(src.chat_template);
    expect(JSON.parse(readFileSync(join(out, 'config.json'), 'utf8')).model_type).toBe('qwen3');
    expect(existsSync(join(dirs.get('llama')! + '-onnx', 'onnx', ONNX_DTYPES.q8))).toBe(true);
  });

  it.each(EXPORT_ARCHS)('%s: log-probs and greedy tokens equal prefzoo\'s', async (arch) => {
    const dir = dirs.get(arch)!;
    const out = dir + '-onnx';
    const tok = await AutoTokenizer.from_pretrained(out);
    const ours = loadTokenizer(dir);
    const ids = promptIds(ours, messages);
    // The kept chat template and tokenizer give the same prompt ids in transformers.js.
    const templated = tok.apply_chat_template(messages, { add_generation_prompt: true, tokenize: true, return_tensor: false }) as unknown as { input_ids: number[] };
    expect(templated.input_ids).toEqual(ids);

    const model = await AutoModelForCausalLM.from_pretrained(out, { dtype: 'fp32', local_files_only: true });
    try {
      const seq = [...ids, ...tok.encode(' Paris, the city of light.', { add_special_tokens: false })];
      const theirs = await transformersLogps(model, seq);
      const ref = await prefzooLogps(dir, seq);
      const sum = theirs.reduce((a, b) => a + b, 0);
      expect(Math.abs(sum - ref.sum)).toBeLessThanOrEqual(1e-4 * Math.abs(ref.sum));
      theirs.forEach((lp, t) => expect(Math.abs(lp - ref.perToken[t]), `token ${t + 1}`).toBeLessThanOrEqual(1e-4 * Math.abs(ref.perToken[t]) + 1e-5));

      const policy = await ModelSampler.load(dir);
      const [sample] = await policy.sample([messages], { temperature: 0, maxNewTokens: 16, seed: 0 });
      await policy.release();
      expect(sample.promptIds).toEqual(ids);
      const gen = (await model.generate({ input_ids: new Tensor('int64', BigInt64Array.from(ids.map(BigInt)), [1, ids.length]), max_new_tokens: 16, do_sample: false })) as Tensor;
      const tokens = Array.from(gen.data as BigInt64Array, Number).slice(ids.length);
      expect(tokens).toEqual(sample.ids);
      expect(new Set(tokens).size, 'the greedy tokens vary, so the check can tell layouts apart').toBeGreaterThan(2);
    } finally {
      await model.dispose();
    }
  });

  it('fp16 and int8 files load and generate; fp16 log-probs stay close to fp32', async () => {
    const out = dirs.get('llama')! + '-onnx';
    const tok = await AutoTokenizer.from_pretrained(out);
    const ids = tok.encode(EXPORT_PROMPT) as number[];
    const logps = new Map<string, number>();
    for (const dtype of ['fp32', 'fp16', 'q8'] as const) {
      const model = await AutoModelForCausalLM.from_pretrained(out, { dtype, local_files_only: true });
      try {
        logps.set(dtype, (await transformersLogps(model, ids)).reduce((a, b) => a + b, 0));
        const gen = (await model.generate({ input_ids: new Tensor('int64', BigInt64Array.from(ids.map(BigInt)), [1, ids.length]), max_new_tokens: 16, do_sample: false })) as Tensor;
        expect(gen.dims[1]).toBeGreaterThan(ids.length);
      } finally {
        await model.dispose();
      }
    }
    expect(Math.abs(logps.get('fp16')! - logps.get('fp32')!)).toBeLessThan(0.01 * Math.abs(logps.get('fp32')!));
    expect(Math.abs(logps.get('q8')! - logps.get('fp32')!)).toBeLessThan(0.05 * Math.abs(logps.get('fp32')!));
  });

  it('exports a LoRA adapter folder merged into its base: log-probs equal the unmerged adapter forward', async () => {
    const base = dirs.get('qwen2')!;
    const { config } = loadModel(base);
    const lora = { rank: 4, alpha: 8, targets: ['q_proj', 'v_proj', 'down_proj'] };
    // B starts at zero in a fresh adapter, which would make merging invisible: give it values.
    const w = initLora(config, lora, 3);
    const rng = new Normal(11);
    for (const [k, t] of w) if (k.includes('lora_B')) t.data.set(rng.fill(t.data.length, 0.2));
    const adapterDir = join(root, 'qwen2-adapter');
    saveAdapter(adapterDir, w, { config, lora, baseModel: base });
    const out = join(root, 'qwen2-merged-onnx');
    exportOnnx(readExportSource(adapterDir), out); // the adapter folder names its base
    const ids = [256, ...Array.from({ length: 20 }, (_, i) => 30 + ((i * 37) % 400))];
    const model = await AutoModelForCausalLM.from_pretrained(out, { dtype: 'fp32', local_files_only: true });
    try {
      const theirs = (await transformersLogps(model, ids)).reduce((a, b) => a + b, 0);
      const merged = await prefzooLogps(base, ids, loadAdapter(adapterDir, config));
      const plain = await prefzooLogps(base, ids);
      expect(Math.abs(theirs - merged.sum)).toBeLessThanOrEqual(1e-4 * Math.abs(merged.sum));
      expect(Math.abs(theirs - plain.sum), 'the adapter changes the model').toBeGreaterThan(1e-2);
    } finally {
      await model.dispose();
    }
  });

  it('refuses a bad --format in one line', async () => {
    const dir = dirs.get('gpt2')!;
    const a = await prefzoo('export', '--model', dir, '--format', 'tflite', '-o', join(root, 'x'));
    expect(a.code).not.toBe(0);
    expect(a.stderr.trim()).toMatch(/^[^\n]*--format: "tflite" is not one of onnx, gguf[^\n]*$/);
    expect(existsSync(join(root, 'x'))).toBe(false);
  });
});
