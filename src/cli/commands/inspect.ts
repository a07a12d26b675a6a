import type { Command } from 'commander';
import { rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { UserError } from '../../errors.ts';

export function register(program: Command): void {
  program
    .command('inspect')
    .description('show a data file: schema, kind, rows, length statistics of its text fields')
    .argument('<file>', 'a Parquet, Arrow IPC, JSON, JSONL or CSV/TSV file (.gz too)')
    .option('--json', 'print the report as JSON')
    .option('--tokenizer <dir>', 'also count tokens of a preference dataset with this model folder\'s tokenizer and chat template')
    .action(async (file: string, o: { json?: boolean; tokenizer?: string }) => {
      // Loaded here, not at registration: Arrow and parquet-wasm cost every other command nothing.
      const { formatReport, inspectFile } = await import('../../../datasets/inspect.ts');
      const r = await inspectFile(file);
      let tokens: import('../../train/token-stats.ts').TokenReport | undefined;
      let formatTokens = (_: NonNullable<typeof tokens>) => '';
      if (o.tokenizer) {
        if (!r.kind) throw new UserError(`${file}: --tokenizer counts tokens of preference data; this file is not preference data`);
        const { tokenReport, formatTokenReport } = await import('../../train/token-stats.ts');
        const work = join(tmpdir(), `prefzoo-inspect-${process.pid}`);
        try {
          tokens = await tokenReport(file, o.tokenizer, work);
        } finally {
          rmSync(work, { recursive: true, force: true });
        }
        formatTokens = formatTokenReport;
      }
      if (o.json) process.stdout.write(`${JSON.stringify(tokens ? { ...r, tokens } : r, null, 2)}\n`);
      else process.stdout.write(`${formatReport(r)}\n${tokens ? formatTokens(tokens) + '\n' : ''}`);
    });
}
