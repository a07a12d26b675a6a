import type { Command } from 'commander';
import { settingsHelp } from '../../train/settings.ts';
import { DEVICE_HELP, device } from '../flags.ts';
import { runNashMd } from '../../online/nash-md.ts';
import { aliasFlags, collect, samplingAliasFlags, type SamplingFlags } from '../../online/options.ts';
import { readPrompts } from '../../online/prompts.ts';
import { terminalReporter } from '../progress.ts';
import { hubRecord } from '../hub.ts';

export function register(program: Command): void {
  const cmd = program
    .command('nash-md')
    .description('on-policy Nash-MD: each step samples y from the policy and y\' from its geometric mixture with the reference, judges P(y ≻ y\'), and takes a step of the nash_md loss')
    .requiredOption('--model <dir>', 'starting policy, also the reference π_ref (Hugging Face model folder)')
    .requiredOption('--prompts <file>', 'prompts: .txt (one a line) or records with a "prompt" field')
    .requiredOption('--judge <spec>', 'task (the built-in addition task), reward:DIR (a reward model), or cmd:COMMAND (JSONL on stdin/stdout)')
    .requiredOption('-o, --out <dir>', 'run folder: config.json, artifacts/, checkpoints/ (every save_steps), metrics.jsonl, final/');
  for (const [flag, doc] of aliasFlags()) cmd.option(flag, doc);
  cmd
    .option('--param <key=value>', 'a training setting (batch_size = prompts per micro-batch, gradient_accumulation_steps, max_steps, learning_rate, save_steps, …) or beta / mixture_coef (repeatable); settings nash-md does not use are refused', collect, [])
    .option('--config <file>', 'JSON object of training settings')
    .option('--resume', 'continue the run in --out from its newest checkpoint (bit-exact: same samples, same updates)')
    .option('--overwrite', 'replace the run already in --out')
    .addHelpText('after', () => `\nSettings it honours (--param key=value or --config), with defaults (docs/settings.md); any other is refused:\n${settingsHelp('nash-md')}`)
    .option('--quiet', 'no progress output')
    .option('--device <device>', `${DEVICE_HELP}; same as --param device=…`)
    .option('--json', 'print a one-line JSON summary')
    .action(async (o: Partial<SamplingFlags> & { model: string; prompts: string; judge: string; out: string; param: string[]; device?: string; config?: string; quiet?: boolean; json?: boolean; resume?: boolean; overwrite?: boolean }) => {
      const sampling = samplingAliasFlags(o);
      const prompts = await readPrompts(o.prompts);
      const r = await runNashMd({ model: o.model, hub: hubRecord(), prompts, promptsFile: o.prompts, judge: o.judge, out: o.out, resume: o.resume, overwrite: o.overwrite, ...sampling, params: o.device ? [...o.param, `device=${device(o.device)}`] : o.param, configFile: o.config, reporter: terminalReporter(o.quiet) });
      if (o.json) process.stdout.write(JSON.stringify({ final: r.finalDir, steps: r.steps, seconds: r.seconds, last: r.last }) + '\n');
      else process.stdout.write(`${r.steps} Nash-MD steps in ${r.seconds}s; final policy in ${r.finalDir}; metrics in ${o.out}/metrics.jsonl\n`);
    });
}
