import type { Command } from 'commander';
import { settingsHelp } from '../../train/settings.ts';
import { distill } from '../../train/distill.ts';
import { collect } from '../flags.ts';
import { hubRecord } from '../hub.ts';
import { terminalReporter } from '../progress.ts';

export function register(program: Command): void {
  const cmd = program
    .command('distill')
    .description("offline distillation: the teacher's top-K log-probs on the data's responses, computed once and cached in the run, then KD steps of the gkd loss on the student")
    .requiredOption('--teacher <dir>', 'teacher model folder or Hub name: any supported architecture with the student\'s tokenizer')
    .requiredOption('--model <dir>', 'student model folder or Hub name (the starting weights)')
    .requiredOption('--data <file>', 'any data train reads: single rows (their responses), pairs (the chosen responses), conversations (the assistant\'s own tokens)')
    .requiredOption('-o, --out <dir>', 'run folder: data/teacher.parquet (the cache), artifacts/, checkpoints/, metrics.jsonl, final/')
    .option('--param <key=value>', 'a training setting, distill_topk, or gkd\'s beta / temperature (repeatable); settings distill does not use are refused', collect, [])
    .option('--config <file>', 'JSON object of settings; --param overrides it')
    .option('--resume', 'continue the run in --out from its newest checkpoint (same --teacher, --model and --data; the cache is reused)')
    .option('--overwrite', 'replace the run already in --out')
    .option('--quiet', 'no progress output')
    .option('--json', 'print a one-line JSON summary')
    .addHelpText('after', () => [
      '',
      "Loss: gkd over the teacher's K ids and one bucket for the rest of each distribution (docs/losses.md, Distillation):",
      '  beta=0.5        0: forward KL(teacher ‖ student), 1: reverse KL(student ‖ teacher), between: the generalized JSD',
      "  temperature=1   τ of the loss: both (K + 1)-outcome distributions raised to 1/τ and renormalised (TRL's GKD",
      "                  calls its loss at 1; its `temperature` is the sampling one, which offline distillation has none of)",
      '',
      `Settings it honours (--param key=value or --config), with defaults (docs/settings.md); any other is refused:\n${settingsHelp('distill')}`,
    ].join('\n'))
    .action(async (o: { teacher: string; model: string; data: string; out: string; param: string[]; config?: string; resume?: boolean; overwrite?: boolean; quiet?: boolean; json?: boolean }) => {
      // Hub names are folders and files by now (src/cli/hub.ts).
      const r = await distill({ teacher: o.teacher, model: o.model, data: o.data, out: o.out, hub: hubRecord(), params: o.param, configFile: o.config, resume: o.resume, overwrite: o.overwrite, reporter: terminalReporter(o.quiet) });
      const summary = { steps: r.steps, seconds: r.seconds, final: r.finalDir, loss: r.last.loss, teacher_cached: r.cached };
      if (o.json) process.stdout.write(JSON.stringify(summary) + '\n');
      else process.stdout.write(`distilled ${r.steps} steps in ${r.seconds}s (teacher targets ${r.cached ? 'read from the cache' : 'computed and cached'}); final model in ${r.finalDir}; metrics in ${o.out}/metrics.jsonl\n`);
    });
}
