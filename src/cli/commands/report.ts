import type { Command } from 'commander';
import { writeReport } from '../../train/report.ts';

export function register(program: Command): void {
  program
    .command('report')
    .description('write RUN/report.html: the curves the run logged (inline SVG: loss, accuracy and margin; for GRPO reward per function, entropy, KL, clip ratios, lengths, sampler mismatch), final eval, sampled completions, config')
    .argument('<run>', 'a training run folder (written by `prefzoo train -o RUN`)')
    .action((run: string) => {
      const out = writeReport(run);
      process.stdout.write(`wrote ${out}\n`);
    });
}
