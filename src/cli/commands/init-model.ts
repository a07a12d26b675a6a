import type { Command } from 'commander';
import fs from 'node:fs';
import { UserError } from '../../errors.ts';
import { ARCHES, PRESETS, presetArch } from '../../models/config.ts';
import { initModelFolder, initModelFromConfig } from '../../models/init.ts';

export function register(program: Command): void {
  program
    .command('init-model')
    .description('write a random-initialised model in Hugging Face layout (config.json, model.safetensors, tokenizer) for demos, tests and benchmarks')
    .option('--arch <arch>', `architecture: ${ARCHES.join(', ')} (default llama; a released shape's own with --preset qwen2.5-0.5b etc.)`)
    .option(
      '--preset <preset>',
      `size: tiny (under 1M parameters), small (hidden 512, 8 layers, 8 heads, 4 KV heads, FFN 1376, vocabulary 32000), or a released model's shape: ${PRESETS.slice(2).join(', ')}`,
      'tiny',
    )
    .option('--config <file>', "a Hugging Face config.json (any supported model_type and shape) instead of --arch/--preset; the vocabulary is the config's")
    .requiredOption('-o, --output <dir>', 'folder to write (created if missing; model files in it are replaced)')
    .option('--seed <n>', 'random seed: the same seed writes the same weights', '0')
    .action((o: { arch?: string; preset: string; config?: string; output: string; seed: string }) => {
      if (!/^\d+$/.test(o.seed) || !Number.isSafeInteger(Number(o.seed))) throw new UserError(`--seed: must be a non-negative integer, got "${o.seed}"`);
      if (o.config !== undefined) {
        if (o.arch !== undefined) throw new UserError('--config and --arch: give one (the config names its model_type)');
        let text: string;
        try {
          text = fs.readFileSync(o.config, 'utf8');
        } catch (e) {
          throw new UserError(`--config ${o.config}: cannot read (${(e as NodeJS.ErrnoException).code ?? (e as Error).message})`);
        }
        let raw: unknown;
        try {
          raw = JSON.parse(text);
        } catch (e) {
          throw new UserError(`--config ${o.config}: invalid JSON (${(e as Error).message})`);
        }
        const r = initModelFromConfig(o.output, raw, o.config, Number(o.seed));
        process.stdout.write(`wrote ${r.config.model_type} from ${o.config} (${r.parameters.toLocaleString('en-US')} parameters, vocabulary ${r.config.vocab_size}) to ${o.output}\n`);
        return;
      }
      if (!PRESETS.includes(o.preset)) throw new UserError(`--preset: "${o.preset}" is not one of ${PRESETS.join(', ')}`);
      const arch = o.arch ?? presetArch(o.preset) ?? 'llama';
      if (!ARCHES.includes(arch)) throw new UserError(`--arch: "${arch}" is not one of ${ARCHES.join(', ')}`);
      const r = initModelFolder(o.output, arch, o.preset, Number(o.seed));
      process.stdout.write(`wrote ${arch} ${o.preset} (${r.parameters.toLocaleString('en-US')} parameters, vocabulary ${r.config.vocab_size}) to ${o.output}\n`);
    });
}
