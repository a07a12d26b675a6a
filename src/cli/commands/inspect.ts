import type { Command } from 'commander';

export function register(program: Command): void {
  program
    .command('inspect')
    .description('show a data file: schema, kind, rows, length statistics of its text fields')
    .argument('<file>', 'a Parquet, Arrow IPC, JSON, JSONL or CSV/TSV file (.gz too)')
    .option('--json', 'print the report as JSON')
    .action(async (file: string, o: { json?: boolean }) => {
      // Loaded here, not at registration: Arrow and parquet-wasm cost every other command nothing.
      const { formatReport, inspectFile } = await import('../../../datasets/inspect.ts');
      const r = await inspectFile(file);
      process.stdout.write(o.json ? `${JSON.stringify(r, null, 2)}\n` : `${formatReport(r)}\n`);
    });
}
