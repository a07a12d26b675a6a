import type { Command } from 'commander';
import { UserError } from '../../errors.ts';
import { ARCHES, type Arch } from '../../models/config.ts';
import { initModelFolder } from '../../models/init.ts';

export function register(program: Command): void {
  program
    .command('init-model')
    .description('write a random-initialised model in Hugging Face layout (config.json, model.safetensors, tokenizer) for demos and tests')
    .requiredOption('--arch <arch>', `architecture: ${ARCHES.join(', ')}`)
    .option('--preset <preset>', 'tiny (under 1M parameters) or small (hidden 512, 8 layers, 8 heads, 4 KV heads, FFN 1376, vocabulary 32000)', 'tiny')
    .requiredOption('-o, --output <dir>', 'folder to write (created if missing; model files in it are replaced)')
    .option('--seed <n>', 'random seed: the same seed writes the same weights', '0')
    .action((o: { arch: string; preset: string; output: string; seed: string }) => {
      if (!(ARCHES as readonly string[]).includes(o.arch)) throw new UserError(`--arch: "${o.arch}" is not one of ${ARCHES.join(', ')}`);
      if (o.preset !== 'tiny' && o.preset !== 'small') throw new UserError(`--preset: "${o.preset}" is not one of tiny, small`);
      if (!/^\d+$/.test(o.seed) || !Number.isSafeInteger(Number(o.seed))) throw new UserError(`--seed: must be a non-negative integer, got "${o.seed}"`);
      const r = initModelFolder(o.output, o.arch as Arch, o.preset, Number(o.seed));
      process.stdout.write(`wrote ${o.arch} ${o.preset} (${r.parameters.toLocaleString('en-US')} parameters, vocabulary ${r.config.vocab_size}) to ${o.output}\n`);
    });
}
