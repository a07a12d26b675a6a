import type { Command } from 'commander';
import { rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { evaluateRows, formatEvalTable } from '../../eval/evaluate.ts';
import { DEFAULT_CONFIG, parseParams } from '../../train/config.ts';
import { UserError } from '../../errors.ts';
import { DEVICE_HELP, collect, device, positiveInt } from '../flags.ts';
import { TIES } from './train.ts';
import { terminalReporter } from '../progress.ts';

export function register(program: Command): void {
  program
    .command('eval')
    .description('implicit-reward metrics of a policy against a reference: pairwise accuracy and margins, listwise NDCG / Kendall tau / top-1, single-trajectory ROC-AUC, per source')
    .requiredOption('--model <dir>', 'the trained policy (HF layout, e.g. RUN/final)')
    .requiredOption('--ref <dir>', 'the reference model (usually the starting model)')
    .requiredOption('--data <file>', 'canonical Parquet (a file, its shards, a directory of shards or a glob such as "data/test-*.parquet") or any file `prefzoo convert` accepts')
    .option('--param <key=value>', 'beta=… scales the implicit rewards (default 0.1); device=… is --device', collect, [])
    .option('--batch-size <n>', 'examples per forward pass', '8')
    .option('--max-length <n>', 'truncate prompt + response to this many tokens (default 512, at most the model\'s positions)')
    .option('--max-prompt-length <n>', 'truncate prompts to this many tokens, keeping their end (default 256)')
    .option('--max-samples <n>', 'evaluate on the first N rows only (default: all)')
    .option('--device <device>', `${DEVICE_HELP} (default cpu); same as --param device=…`)
    .option('--json', 'print one JSON line')
    .option('--quiet', 'no progress output (with --json, progress still goes to stderr unless --quiet)')
    .addHelpText('after', `\naccuracy, preference_accuracy: ${TIES} The ties column counts them.`)
    .action(async (o: { model: string; ref: string; data: string; param: string[]; batchSize: string; maxLength?: string; maxPromptLength?: string; maxSamples?: string; json?: boolean; quiet?: boolean; device?: string }) => {
      const params = parseParams(o.param);
      for (const k of Object.keys(params)) if (k !== 'beta' && k !== 'device') throw new UserError(`--param ${k}: eval takes only beta and device`);
      const given = params.device === undefined ? undefined : String(params.device);
      if (given !== undefined && o.device !== undefined && given !== o.device) throw new UserError(`--param device=${given} contradicts --device ${o.device}`);
      delete params.device;
      const ep = device(o.device ?? given ?? 'cpu');
      const bs = positiveInt('--batch-size', o.batchSize, 8);
      const max_length = positiveInt('--max-length', o.maxLength, DEFAULT_CONFIG.max_length);
      const max_prompt_length = positiveInt('--max-prompt-length', o.maxPromptLength, Math.min(DEFAULT_CONFIG.max_prompt_length, max_length - 1));
      if (max_prompt_length >= max_length) throw new UserError(`--max-prompt-length (${max_prompt_length}) must be smaller than --max-length (${max_length})`);
      const maxRows = positiveInt('--max-samples', o.maxSamples);
      const work = join(tmpdir(), `prefzoo-eval-${process.pid}`);
      const s = await evaluateRows({ policy: o.model, ref: o.ref, data: o.data, workDir: work, params, reporter: terminalReporter(o.quiet), batchSize: bs, runtime: { ep }, truncation: { max_length, max_prompt_length, truncation: 'keep_end' }, maxRows }).finally(() => rmSync(work, { recursive: true, force: true }));
      if (o.json) process.stdout.write(JSON.stringify({ kind: s.kind, ...s.overall, by_source: s.bySource }) + '\n');
      else process.stdout.write(formatEvalTable(s) + '\n');
    });
}
