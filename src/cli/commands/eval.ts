import type { Command } from 'commander';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { evaluateRows, formatEvalTable } from '../../eval/evaluate.ts';
import { parseParams } from '../../train/config.ts';
import { UserError } from '../errors.ts';

function collect(v: string, prev: string[]): string[] {
  return [...prev, v];
}

export function register(program: Command): void {
  program
    .command('eval')
    .description('implicit-reward metrics of a policy against a reference: pairwise accuracy and margins, listwise NDCG / Kendall tau / top-1, single-trajectory ROC-AUC, per source')
    .requiredOption('--model <dir>', 'the trained policy (HF layout, e.g. RUN/final)')
    .requiredOption('--ref <dir>', 'the reference model (usually the starting model)')
    .requiredOption('--data <file>', 'canonical Parquet or any file `prefzoo convert` accepts')
    .option('--param <key=value>', 'beta=… scales the implicit rewards (default 0.1)', collect, [])
    .option('--batch-size <n>', 'examples per forward pass', '8')
    .option('--json', 'print one JSON line')
    .option('--quiet', 'no progress output')
    .action(async (o: { model: string; ref: string; data: string; param: string[]; batchSize: string; json?: boolean; quiet?: boolean }) => {
      const params = parseParams(o.param);
      for (const k of Object.keys(params)) if (k !== 'beta') throw new UserError(`--param ${k}: eval takes only beta`);
      const bs = Number(o.batchSize);
      if (!Number.isInteger(bs) || bs < 1) throw new UserError(`--batch-size must be a positive integer, got "${o.batchSize}"`);
      const s = await evaluateRows({ policy: o.model, ref: o.ref, data: o.data, workDir: join(tmpdir(), `prefzoo-eval-${process.pid}`), params, quiet: o.quiet || o.json, batchSize: bs });
      if (o.json) process.stdout.write(JSON.stringify({ kind: s.kind, ...s.overall, by_source: s.bySource }) + '\n');
      else process.stdout.write(formatEvalTable(s) + '\n');
    });
}
