import type { Command } from 'commander';
import { readCanonical, writeCanonical } from '../../../datasets/parquet.ts';
import { withTokenColumns, tokenColumnNames } from '../../../datasets/tokenized.ts';
import { loadTokenizer } from '../../tokenize/index.ts';
import { tableExamples, tokenizeExamples } from '../../train/data.ts';
import { DEFAULT_CONFIG } from '../../train/config.ts';
import { UserError } from '../errors.ts';
import { positiveInt } from '../flags.ts';
import { Progress } from '../progress.ts';
import { checkOutputFolder } from '../../files.ts';

export function register(program: Command): void {
  program
    .command('tokenize')
    .description("add model-ready token columns (List<Int32>) to a canonical dataset, using the model's tokenizer and chat template")
    .argument('<in>', 'canonical Parquet written by `prefzoo convert`')
    .requiredOption('--model <dir>', 'model folder with tokenizer.json (and tokenizer_config.json for chat templates)')
    .requiredOption('-o, --out <file>', 'output Parquet (written to a temporary name, then renamed)')
    .option('--max-length <n>', 'longest prompt + response in tokens', String(DEFAULT_CONFIG.max_length))
    .option('--max-prompt-length <n>', 'longest prompt in tokens', String(DEFAULT_CONFIG.max_prompt_length))
    .option('--truncation <side>', 'which end of an over-long prompt to keep: keep_start or keep_end', DEFAULT_CONFIG.truncation)
    .option('--quiet', 'no progress output')
    .action(async (input: string, o: { model: string; out: string; maxLength: string; maxPromptLength: string; truncation: string; quiet?: boolean }) => {
      const max_length = positiveInt('--max-length', o.maxLength, DEFAULT_CONFIG.max_length);
      const max_prompt_length = positiveInt('--max-prompt-length', o.maxPromptLength, DEFAULT_CONFIG.max_prompt_length);
      if (max_prompt_length >= max_length) throw new UserError(`--max-prompt-length (${max_prompt_length}) must be smaller than --max-length (${max_length})`);
      if (o.truncation !== 'keep_start' && o.truncation !== 'keep_end') throw new UserError(`--truncation must be keep_start or keep_end, got "${o.truncation}"`);
      checkOutputFolder(o.out, '-o');
      const tok = loadTokenizer(o.model);
      const { table, meta } = await readCanonical(input);
      const examples = tableExamples(table, meta, input);
      const progress = new Progress('tokenize', examples.length, { quiet: o.quiet });
      const { rows, truncated } = tokenizeExamples(examples, tok, { max_length, max_prompt_length, truncation: o.truncation }, undefined, (n) => progress.update(n));
      progress.stop();
      const out = withTokenColumns(table, meta.kind, rows);
      const files = await writeCanonical(out, meta, o.out);
      const lens = rows.map((r) => r.promptIds.length + Math.max(...r.responseIds.map((x) => x.length)));
      const mean = lens.reduce((a, b) => a + b, 0) / Math.max(1, lens.length);
      process.stdout.write(
        `rows: ${rows.length} ${meta.kind}, ${truncated} truncated (max_length ${max_length}, max_prompt_length ${max_prompt_length}, ${o.truncation})\n` +
          `tokens per row (prompt + longest response): mean ${mean.toFixed(1)}, max ${Math.max(0, ...lens)}\n` +
          `columns added: ${tokenColumnNames(meta.kind).join(', ')}\nwrote ${files.join(', ')}\n`,
      );
    });
}
