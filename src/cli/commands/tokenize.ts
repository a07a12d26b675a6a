import type { Command } from 'commander';
import { DEFAULT_CONFIG } from '../../train/config.ts';
import { tokenizeDataset } from '../../train/tokenize-data.ts';
import { UserError } from '../../errors.ts';
import { positiveInt } from '../flags.ts';
import { terminalProgress } from '../progress.ts';

export function register(program: Command): void {
  program
    .command('tokenize')
    .description("add model-ready token columns (List<Int32>) to a canonical dataset, using the model's tokenizer and chat template")
    .argument('<in>', 'canonical Parquet written by `prefzoo convert`: a file, its shards, a directory of shards or a glob such as "data/train-*.parquet"')
    .requiredOption('--model <dir>', 'model folder with tokenizer.json (and tokenizer_config.json for chat templates)')
    .requiredOption('-o, --out <file>', 'output Parquet (written to a temporary name, then renamed; shards NAME-00000-of-000NN.parquet when large)')
    .option('--max-length <n>', 'longest prompt + response in tokens', String(DEFAULT_CONFIG.max_length))
    .option('--max-prompt-length <n>', 'longest prompt in tokens', String(DEFAULT_CONFIG.max_prompt_length))
    .option('--truncation <side>', 'which end of an over-long prompt to keep: keep_start or keep_end', DEFAULT_CONFIG.truncation)
    .option('--max-samples <n>', 'tokenize only the first N rows (default: all)')
    .option('--shard-size <MB>', 'start a new output shard past this many MB', '512')
    .option('--quiet', 'no progress output')
    .option('--chat-template <file>', "a Jinja chat-template file used instead of the model's own")
    .action(async (input: string, o: { model: string; out: string; maxLength: string; maxPromptLength: string; truncation: string; maxSamples?: string; shardSize: string; quiet?: boolean; chatTemplate?: string }) => {
      if (o.truncation !== 'keep_start' && o.truncation !== 'keep_end') throw new UserError(`--truncation must be keep_start or keep_end, got "${o.truncation}"`);
      const s = await tokenizeDataset(input, o.out, {
        model: o.model,
        maxLength: positiveInt('--max-length', o.maxLength, DEFAULT_CONFIG.max_length),
        maxPromptLength: positiveInt('--max-prompt-length', o.maxPromptLength, DEFAULT_CONFIG.max_prompt_length),
        truncation: o.truncation,
        maxRows: positiveInt('--max-samples', o.maxSamples),
        shardBytes: positiveInt('--shard-size', o.shardSize, 512) * 1024 * 1024,
        chatTemplateFile: o.chatTemplate,
        progress: o.quiet ? undefined : terminalProgress,
      });
      process.stdout.write(
        `rows: ${s.rows} ${s.kind}, ${s.truncated} truncated (max_length ${s.maxLength}, max_prompt_length ${s.maxPromptLength}, ${s.truncation})\n` +
          `tokens per row (prompt + longest response): mean ${s.meanTokens.toFixed(1)}, max ${s.maxTokens}\n` +
          `columns added: ${s.columns.join(', ')}\nwrote ${s.outputs.join(', ')}\n`,
      );
    });
}
