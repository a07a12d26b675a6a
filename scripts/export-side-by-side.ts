/**
 * A trained model's greedy answers in three runtimes, side by side: prefzoo (`generate
 * --temperature 0`), transformers.js on the ONNX export, node-llama-cpp on the f32 GGUF export
 * (the q8_0 file's answer too). All start from the same prompt ids (the model's chat template).
 *
 *   node --import tsx scripts/export-side-by-side.ts --model run/final [--prompt TEXT]... [--tokens 16]
 */
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { parseArgs } from 'node:util';
import { AutoModelForCausalLM, Tensor, env } from '@huggingface/transformers';
import { getLlama, type Token } from 'node-llama-cpp';
import { exportGguf } from '../src/export/gguf.ts';
import { exportOnnx } from '../src/export/onnx.ts';
import { readExportSource } from '../src/export/source.ts';
import { ModelSampler } from '../src/online/policy.ts';

const { values } = parseArgs({ options: { model: { type: 'string' }, prompt: { type: 'string', multiple: true }, tokens: { type: 'string', default: '16' } } });
if (!values.model) throw new Error('--model DIR is required');
const n = Number(values.tokens);
const prompts = values.prompt?.length ? values.prompt : ['What is the capital of France?', 'Please explain why the sky is blue.'];
const tmp = mkdtempSync(join(tmpdir(), 'pz-side-'));
try {
  const src = readExportSource(values.model);
  exportOnnx(src, join(tmp, 'onnx'));
  exportGguf(src, join(tmp, 'model.gguf'), 'f32');
  exportGguf(src, join(tmp, 'model-q8_0.gguf'), 'q8_0');

  const policy = await ModelSampler.load(values.model);
  const samples = await policy.sample(
    prompts.map((p) => [{ role: 'user' as const, content: p }]),
    { temperature: 0, maxNewTokens: n, seed: 0 },
  );
  await policy.release();
  const text = (ids: number[]) => policy.tok.decode(ids.filter((t) => !policy.tok.stopIds.includes(t)), { skipSpecialTokens: false });

  env.allowRemoteModels = false;
  const tjs = await AutoModelForCausalLM.from_pretrained(join(tmp, 'onnx'), { dtype: 'fp32', local_files_only: true });
  const llama = await getLlama({ gpu: false, build: 'never', logLevel: 'error' as never });
  const llamaGreedy = async (file: string, ids: number[]) => {
    const model = await llama.loadModel({ modelPath: file });
    const ctx = await model.createContext({ contextSize: Math.min(512, ids.length + n + 8), threads: 1 });
    const got: number[] = [];
    for await (const t of ctx.getSequence().evaluate(ids as Token[], { temperature: 0 })) {
      got.push(t);
      if (got.length === n) break;
    }
    await ctx.dispose();
    await model.dispose();
    return got;
  };

  console.log(`model ${values.model} (${src.config.model_type}), greedy, ${n} new tokens at most\n`);
  for (const s of samples) {
    const gen = (await tjs.generate({ input_ids: new Tensor('int64', BigInt64Array.from(s.promptIds.map(BigInt)), [1, s.promptIds.length]), max_new_tokens: n, do_sample: false })) as Tensor;
    const tjsIds = Array.from(gen.data as BigInt64Array, Number).slice(s.promptIds.length);
    const ggufIds = await llamaGreedy(join(tmp, 'model.gguf'), s.promptIds);
    const q8Ids = await llamaGreedy(join(tmp, 'model-q8_0.gguf'), s.promptIds);
    console.log(`prompt: ${JSON.stringify(s.prompt)}`);
    const rows: [string, number[]][] = [
      ['prefzoo generate', s.ids],
      ['transformers.js (onnx)', tjsIds],
      ['node-llama-cpp (f32)', ggufIds],
      ['node-llama-cpp (q8_0)', q8Ids],
    ];
    for (const [who, ids] of rows) console.log(`  ${who.padEnd(24)} ${JSON.stringify(text(ids))}  [${ids.join(' ')}]`);
    console.log();
  }
  await tjs.dispose();
  await llama.dispose();
} finally {
  rmSync(tmp, { recursive: true, force: true });
}
