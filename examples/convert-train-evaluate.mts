/**
 * The main job through the library: a preference file → canonical Parquet → DPO training → held-out
 * accuracy against the reference, with a tiny random model on the CPU.
 *
 *   npx tsx examples/convert-train-evaluate.mts [WORK_DIR]      (STEPS=2 for a quick check)
 */
import { mkdtempSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { convert, evaluate, initModel, train, UserError, type ProgressFactory, type TrainOptions } from 'prefzoo';

const dir = process.argv[2] ?? mkdtempSync(join(tmpdir(), 'prefzoo-example-'));
const steps = Number(process.env.STEPS ?? 40);

// Progress as plain lines on stderr; the `prefzoo` command draws bars through the same callback.
const progress: ProgressFactory = (label, total) => ({
  update(value, fields) {
    if (value === total) process.stderr.write(`${label}: ${value}/${total} ${JSON.stringify(fields ?? {})}\n`);
  },
  stop() {},
});

// 1. A model in Hugging Face layout: here a random tiny Llama with a generated tokenizer. Any
//    Llama / Qwen / Mistral / Gemma / Phi-3 / GPT-2 folder with safetensors and tokenizer.json works.
const model = join(dir, 'model');
initModel({ output: model, preset: 'tiny', seed: 0 });

// 2. Preference data in any format convert detects (JSONL with prompt/chosen/rejected here): the
//    preferred answer repeats the prompt's first digit.
const pairs = Array.from({ length: 64 }, (_, i) => {
  const digits = String(1000 + ((i * 7919) % 9000));
  const wrong = String((Number(digits[0]) + 1 + (i % 8)) % 10);
  return { prompt: `${digits}:`, chosen: digits[0], rejected: wrong };
});
writeFileSync(join(dir, 'pairs.jsonl'), pairs.map((p) => JSON.stringify(p)).join('\n') + '\n');
const data = join(dir, 'pairs.parquet');
const converted = await convert(join(dir, 'pairs.jsonl'), data);
console.log(`converted ${converted.written} ${converted.kind} rows (${converted.formats.join(', ')})`);

// 3. Training: settings and loss parameters by name, as `prefzoo train --param` takes them.
const options: TrainOptions = {
  model,
  data,
  loss: 'dpo',
  out: join(dir, 'run'),
  overwrite: true,
  settings: { max_steps: steps, batch_size: 8, learning_rate: 1e-3, max_length: 16, max_prompt_length: 8, beta: 0.1 },
  progress,
  signal: AbortSignal.timeout(10 * 60_000),
};
try {
  const run = await train(options);
  console.log(`trained ${run.steps} steps in ${run.seconds.toFixed(1)} s; final model in ${run.finalDir}`);

  // 4. Implicit-reward accuracy of the trained policy against the starting model.
  const metrics = await evaluate({ model: run.finalDir, ref: model, data, progress });
  console.log(`accuracy ${metrics.overall.accuracy.toFixed(3)}, margin ${metrics.overall.margin.toFixed(4)} over ${metrics.overall.count} pairs`);
} catch (e) {
  // A mistake the user can fix is a UserError, with the file / line / setting at fault where known.
  if (e instanceof UserError) {
    console.error(`${e.kind}: ${e.message}${e.setting ? ` (setting ${e.setting})` : ''}`);
    process.exitCode = 1;
  } else throw e;
}
