import type { Command } from 'commander';
import { settingsHelp } from '../../train/settings.ts';
import { DEVICE_HELP, device } from '../flags.ts';
import { aliasFlags, collect, intFlag, samplingAliasFlags, type SamplingFlags } from '../../online/options.ts';
import { readPrompts } from '../../online/prompts.ts';
import { runSppo } from '../../online/sppo.ts';
import { terminalReporter } from '../progress.ts';
import { hubRecord } from '../hub.ts';

export function register(program: Command): void {
  const cmd = program
    .command('sppo')
    .description('SPPO iterations on the online loop: sample K responses per prompt from π_t, estimate each one\'s win-rate against π_t with a judge, train the sppo loss against π_t, continue from π_{t+1}')
    .requiredOption('--model <dir>', 'starting policy π_0 (Hugging Face model folder)')
    .requiredOption('--prompts <file>', 'prompts: .txt (one a line) or records with a "prompt" field')
    .requiredOption('--judge <spec>', 'task (the built-in addition task), reward:DIR (a reward model), or cmd:COMMAND (JSONL on stdin/stdout)')
    .requiredOption('-o, --out <dir>', 'run folder: iter-t/samples.jsonl, checkpoints/ (every save_steps), metrics.jsonl, final/, sppo.json')
    .option('--iterations <t>', 'number of iterations T', '3')
    .option('--samples <k>', 'responses per prompt and iteration K (≥ 2); same as --param num_generations=…');
  for (const [flag, doc] of aliasFlags()) cmd.option(flag, doc);
  cmd
    .option('--param <key=value>', 'a setting (num_epochs and max_steps count per iteration; save_steps, learning_rate, lora_r, …) or the loss\'s beta (repeatable), e.g. beta=0.1 num_epochs=2', collect, [])
    .option('--config <file>', 'JSON object of training settings')
    .option('--resume', 'continue the run in --out from its newest checkpoint (bit-exact: the iteration under way keeps its samples)')
    .option('--overwrite', 'replace the run already in --out')
    .addHelpText('after', () => `\nSettings it honours (--param key=value or --config), with defaults (docs/settings.md); any other is refused:\n${settingsHelp('sppo')}`)
    .option('--quiet', 'no progress output')
    .option('--device <device>', `${DEVICE_HELP}; same as --param device=…`)
    .option('--json', 'print a one-line JSON summary')
    .action(async (o: Partial<SamplingFlags> & { model: string; prompts: string; judge: string; out: string; iterations: string; samples?: string; param: string[]; device?: string; config?: string; quiet?: boolean; json?: boolean; resume?: boolean; overwrite?: boolean }) => {
      const sampling = samplingAliasFlags(o);
      const iterations = intFlag('--iterations', o.iterations);
      const prompts = await readPrompts(o.prompts);
      const r = await runSppo({ model: o.model, hub: hubRecord(), prompts, promptsFile: o.prompts, judge: o.judge, out: o.out, resume: o.resume, overwrite: o.overwrite, iterations, ...sampling, params: o.device ? [...o.param, `device=${device(o.device)}`] : o.param, configFile: o.config, reporter: terminalReporter(o.quiet) });
      if (o.json) process.stdout.write(JSON.stringify({ final: r.finalDir, seconds: r.seconds, iterations: r.iterations }) + '\n');
      else process.stdout.write(`${iterations} SPPO iterations in ${r.seconds}s; final policy in ${r.finalDir}\n`);
    });
}
