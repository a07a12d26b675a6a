import { type Command, Option } from 'commander';
import { KINDS, type Kind } from '../../../datasets/names.ts';
import { FORMAT_NAMES, type FormatName } from '../../../datasets/formats/index.ts';
import { UserError } from '../../errors.ts';

/** `--map prompt=question,chosen=good` (repeatable) → {prompt: 'question', chosen: 'good'}. */
function parseMap(value: string, previous: Record<string, string> = {}): Record<string, string> {
  const out = { ...previous };
  for (const pair of value.split(',')) {
    const eq = pair.indexOf('=');
    const dst = pair.slice(0, eq).trim();
    const src = pair.slice(eq + 1).trim();
    if (eq <= 0 || !dst || !src) throw new UserError(`--map ${JSON.stringify(pair)}: expected COLUMN=SOURCE_FIELD, e.g. --map prompt=question`);
    out[dst] = src;
  }
  return out;
}

function parseCount(name: string, min: number) {
  return (v: string): number => {
    const n = Number(v);
    if (!Number.isInteger(n) || n < min) throw new UserError(`${name} ${v}: expected an integer >= ${min}`);
    return n;
  };
}

interface Opts {
  output: string;
  format?: FormatName;
  kind?: Kind;
  map?: Record<string, string>;
  onInvalid: 'error' | 'skip';
  binarize?: boolean;
  seed: number;
  allowEmpty?: boolean;
  allowIdentical?: boolean;
  allowTies?: boolean;
  shardSize: number;
  compression: 'zstd' | 'snappy';
}

export function register(program: Command): void {
  program
    .command('convert')
    .description('convert preference data (JSON, JSONL, CSV/TSV, Parquet, Arrow; .gz too) to canonical Parquet')
    .argument('<inputs...>', 'input files; all must give the same kind of data')
    .requiredOption('-o, --output <file>', 'output Parquet file (shards NAME-00000-of-000NN.parquet when large)')
    .addOption(new Option('--format <name>', 'input format (default: detected from the first record)').choices([...FORMAT_NAMES]))
    .addOption(new Option('--kind <kind>', 'output kind; pairwise on listwise input binarizes').choices([...KINDS]))
    .option('--map <dst=src>', 'read field DST from the input field SRC (repeatable, or comma-separated)', parseMap)
    .addOption(new Option('--on-invalid <mode>', 'stop at the first bad record, or skip it and list it in OUT.skipped.jsonl').choices(['error', 'skip']).default('error'))
    .option('--binarize', 'listwise → pairwise: the best response against a seeded random other')
    .option('--seed <n>', 'seed of the --binarize draw', parseCount('--seed', 0), 0)
    .option('--allow-empty', 'accept empty prompts and responses')
    .option('--allow-identical', 'accept chosen identical to rejected (and repeated listwise responses)')
    .option('--allow-ties', 'accept pairs whose chosen and rejected scores are equal')
    .option('--shard-size <MB>', 'start a new shard past this many MB', parseCount('--shard-size', 1), 512)
    .addOption(new Option('--compression <codec>', 'Parquet compression').choices(['zstd', 'snappy']).default('zstd'))
    .action(async (inputs: string[], o: Opts) => {
      // Loaded here, not at registration: Arrow and the readers cost every other command nothing.
      const { convert } = await import('../../../datasets/convert.ts');
      const s = await convert(inputs, o.output, {
        format: o.format,
        kind: o.kind,
        map: o.map,
        onInvalid: o.onInvalid,
        binarize: o.binarize,
        seed: o.seed,
        allowEmpty: o.allowEmpty,
        allowIdentical: o.allowIdentical,
        allowTies: o.allowTies,
        shardBytes: o.shardSize * 1024 * 1024,
        compression: o.compression,
      });
      const out = process.stdout;
      out.write(`format: ${s.formats.join(', ')} → ${s.kind} (${s.text} text)\n`);
      out.write(`rows: read ${s.read}, written ${s.written}, skipped ${s.skipped}\n`);
      for (const f of s.outputs) out.write(`wrote ${f}\n`);
      if (s.skippedPath) out.write(`skipped records and reasons: ${s.skippedPath}\n`);
    });
}
