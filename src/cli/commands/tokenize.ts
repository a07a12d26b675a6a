import type { Command } from 'commander';
import * as arrow from 'apache-arrow';
import { ParquetSink, parquetFooter, readCanonicalBatches, resolveDataset } from '../../../datasets/parquet.ts';
import { META_KEY, type Kind } from '../../../datasets/schema.ts';
import { withTokenColumns, tokenColumnNames } from '../../../datasets/tokenized.ts';
import { loadTokenizer } from '../../tokenize/index.ts';
import { tableExamples, tokenizeExamples } from '../../../datasets/examples.ts';
import { DEFAULT_CONFIG } from '../../train/config.ts';
import { UserError } from '../../errors.ts';
import { positiveInt } from '../flags.ts';
import { Progress } from '../progress.ts';
import { checkOutputFolder } from '../../io/atomic.ts';

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
      const max_length = positiveInt('--max-length', o.maxLength, DEFAULT_CONFIG.max_length);
      const max_prompt_length = positiveInt('--max-prompt-length', o.maxPromptLength, DEFAULT_CONFIG.max_prompt_length);
      if (max_prompt_length >= max_length) throw new UserError(`--max-prompt-length (${max_prompt_length}) must be smaller than --max-length (${max_length})`);
      if (o.truncation !== 'keep_start' && o.truncation !== 'keep_end') throw new UserError(`--truncation must be keep_start or keep_end, got "${o.truncation}"`);
      const maxRows = positiveInt('--max-samples', o.maxSamples);
      const shardMb = positiveInt('--shard-size', o.shardSize, 512);
      checkOutputFolder(o.out, '-o');
      const tok = loadTokenizer(o.model, { chatTemplateFile: o.chatTemplate });
      // Rows to do, from the files' footers: the progress total.
      let total = 0;
      for (const f of resolveDataset(input)) total += (await parquetFooter(f)).rows;
      if (maxRows) total = Math.min(total, maxRows);
      const progress = new Progress('tokenize', total, { quiet: o.quiet });
      const trunc = { max_length, max_prompt_length, truncation: o.truncation as 'keep_start' | 'keep_end' };
      // Streams: one input batch at a time is tokenized and handed to the writer.
      let sink: ParquetSink | null = null;
      let schema: arrow.Schema | null = null;
      let kind: Kind = 'pairwise';
      let rowsOut = 0;
      let truncated = 0;
      let lenSum = 0;
      let lenMax = 0;
      try {
        for await (const b of readCanonicalBatches(input, { maxRows })) {
          const examples = tableExamples(b.batch, b.meta, b.file, b.fileRow);
          const r = tokenizeExamples(examples, tok, trunc, undefined, (n) => progress.update(rowsOut + n));
          const t = withTokenColumns(new arrow.Table([b.batch]), b.meta.kind, r.rows);
          if (!schema) {
            kind = b.meta.kind;
            schema = new arrow.Schema(t.schema.fields, new Map([[META_KEY, JSON.stringify(b.meta)]]));
            sink = new ParquetSink(o.out, b.meta, { shardBytes: shardMb * 1024 * 1024 });
          } else if (t.schema.fields.map((f) => f.name).join(',') !== schema.fields.map((f) => f.name).join(',')) {
            throw new UserError(`${b.file}: columns ${t.schema.fields.map((f) => f.name).join(', ')} differ from the first file's (${schema.fields.map((f) => f.name).join(', ')})`);
          }
          for (const rb of t.batches) await sink!.write(new arrow.RecordBatch(schema, rb.data));
          rowsOut += r.rows.length;
          truncated += r.truncated;
          for (const row of r.rows) {
            const len = row.promptIds.length + Math.max(...row.responseIds.map((x) => x.length));
            lenSum += len;
            lenMax = Math.max(lenMax, len);
          }
        }
        progress.stop();
        if (!sink || rowsOut === 0) throw new UserError(`${input}: has no rows`);
        const files = await (sink as ParquetSink).close();
        process.stdout.write(
          `rows: ${rowsOut} ${kind}, ${truncated} truncated (max_length ${max_length}, max_prompt_length ${max_prompt_length}, ${o.truncation})\n` +
            `tokens per row (prompt + longest response): mean ${(lenSum / rowsOut).toFixed(1)}, max ${lenMax}\n` +
            `columns added: ${tokenColumnNames(kind).join(', ')}\nwrote ${files.join(', ')}\n`,
        );
      } catch (e) {
        await (sink as ParquetSink | null)?.abort();
        throw e;
      }
    });
}
