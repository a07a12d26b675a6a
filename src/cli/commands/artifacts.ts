import type { Command } from 'commander';
import { settingsHelp } from '../../train/settings.ts';
import { exportArtifacts } from '../../train/artifacts.ts';
import { collect } from '../flags.ts';

export function register(program: Command): void {
  program
    .command('artifacts')
    .description('write the training artifacts of a model and a loss: training, eval and optimizer graphs, the checkpoint of the starting parameters, artifacts.json')
    .requiredOption('--model <dir>', 'Hugging Face model folder (config.json, safetensors)')
    .requiredOption('--loss <name>', 'loss name (dpo, ipo, lipo, kto, …) or a mixture such as dpo:0.8,sft:0.2')
    .requiredOption('-o, --out <dir>', 'the artifacts folder (must not exist, or be empty)')
    .option('--kind <kind>', "data kind the batch inputs follow: pairwise, listwise or single (default: the loss's first)")
    .option('--param <key=value>', 'a training setting (lora_r, optimizer, share_prompt, …) or loss parameter (repeatable); see prefzoo train --help', collect, [])
    .option('--config <file>', "JSON object of settings (and loss parameters), or YAML with TRL's names; --param overrides it")
    .addHelpText('after', () => `\nSettings it honours (--param key=value or --config), with defaults (docs/settings.md); any other is refused:\n${settingsHelp('artifacts')}`)
    .option('--json', 'print one JSON line: dir, kind, params, trainable, packed, files')
    .action((o: { model: string; loss: string; out: string; kind?: string; param: string[]; config?: string; json?: boolean }) => {
      const r = exportArtifacts({ model: o.model, loss: o.loss, out: o.out, kind: o.kind, params: o.param, configFile: o.config });
      if (o.json) process.stdout.write(JSON.stringify(r) + '\n');
      else process.stdout.write(`wrote ${r.files.join(', ')} to ${r.dir} (${r.kind} batches${r.packed ? ', prompts shared' : ''}; ${r.trainable} of ${r.params} parameters trainable)\n`);
    });
}
