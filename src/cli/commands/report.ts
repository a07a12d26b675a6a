import type { Command } from 'commander';
import { writeReport } from '../../train/report.ts';

export function register(program: Command): void {
  program
    .command('report')
    .description('write RUN/report.html: loss, accuracy and margin curves (inline SVG), final eval, config')
    .argument('<run>', 'a training run folder (written by `prefzoo train -o RUN`)')
    .action((run: string) => {
      const out = writeReport(run);
      process.stdout.write(`wrote ${out}\n`);
    });
}
