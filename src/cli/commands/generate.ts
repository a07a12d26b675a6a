import type { Command } from 'commander';
import { DEVICE_HELP, device } from '../flags.ts';
import { existsSync, statSync } from 'node:fs';
import { dirname } from 'node:path';
import { UserError } from '../../errors.ts';
import { ModelSampler } from '../../online/policy.ts';
import { readPrompts } from '../../online/prompts.ts';
import { writeSamples } from '../../online/samples-io.ts';
import { aliasFlags, collect, intFlag, samplingAliasFlags, type SamplingFlags } from '../../online/options.ts';
import { generateSampling } from '../../online/sampling.ts';
import { settingsHelp } from '../../train/settings.ts';
import { productQuant } from '../../models/quantize.ts';

export function register(program: Command): void {
  const cmd = program
    .command('generate')
    .description('sample responses to prompts with a KV cache (temperature, top-k, top-p, stop tokens, seeded) and write them as Parquet')
    .requiredOption('--model <dir>', 'Hugging Face model folder')
    .requiredOption('--prompts <file>', 'prompts: .txt (one a line) or records with a "prompt" field (JSONL, JSON, CSV, Parquet, …)')
    .requiredOption('-o, --out <file>', 'output Parquet: prompt, prompt_index, sample, response, response_tokens, stopped')
    .option('--n <k>', 'responses per prompt', '1')
    .option('--seed <n>', 'seed; a sample depends only on (seed, prompt index, sample index)', '0')
    .option('--batch-size <n>', 'sequences decoded together', '32');
  for (const [flag, doc] of aliasFlags()) cmd.option(flag, doc);
  cmd
    .option('--param <key=value>', 'a sampling setting (repeatable), e.g. temperature=0.7 top_p=0.9', collect, [])
    .option('--config <file>', 'JSON object of sampling settings')
    .addHelpText('after', () => `\nSettings (--param key=value or --config), with defaults (docs/settings.md):\n${settingsHelp('generate')}`);
  cmd.option('--device <device>', DEVICE_HELP, 'cpu');
  cmd.option('--dtype <dtype>', 'precision of the products: f32, q8 or q4 (block-quantized weights through MatMulNBits, CPU only; f16 is refused)', 'f32');
  cmd.option('--block-size <n>', 'values per quantization block of --dtype q8/q4 (a power of two, 16–256)', '32');
  cmd.option('--chat-template <file>', "a Jinja chat-template file used instead of the model's own");
  cmd.option('--json', 'print a one-line JSON summary').action(async (o: Partial<SamplingFlags> & { param: string[]; config?: string; model: string; prompts: string; out: string; n: string; seed: string; batchSize: string; json?: boolean; device: string; dtype: string; blockSize: string; chatTemplate?: string }) => {
    const sampling = generateSampling({ ...samplingAliasFlags(o), params: o.param, configFile: o.config });
    const n = intFlag('--n', o.n);
    const seed = intFlag('--seed', o.seed, 0);
    const batchSize = intFlag('--batch-size', o.batchSize);
    const dir = dirname(o.out);
    if (!existsSync(dir) || !statSync(dir).isDirectory()) throw new UserError(`-o ${o.out}: folder ${dir} does not exist`);
    const prompts = await readPrompts(o.prompts);
    const t0 = Date.now();
    const ep = device(o.device);
    const quant = productQuant(o.dtype, intFlag('--block-size', o.blockSize), ep, { dtype: '--dtype', block: '--block-size' });
    const policy = await ModelSampler.load(o.model, { ep }, o.chatTemplate, quant);
    const samples = await policy.sample(prompts, { ...sampling, n, seed, batchSize });
    await policy.release();
    writeSamples(o.out, samples);
    const seconds = (Date.now() - t0) / 1000;
    const tokens = samples.reduce((a, s) => a + s.ids.length, 0);
    const summary = { prompts: prompts.length, samples: samples.length, tokens, stopped: samples.filter((s) => s.stopped).length, seconds: Math.round(seconds * 10) / 10, out: o.out };
    if (o.json) process.stdout.write(JSON.stringify(summary) + '\n');
    else process.stdout.write(`${samples.length} responses to ${prompts.length} prompts (${tokens} tokens, ${summary.stopped} stopped) in ${summary.seconds}s → ${o.out}\n`);
  });
}
