import type { Command } from 'commander';
import { settingsHelp } from '../../train/settings.ts';
import { DEVICE_HELP, device } from '../flags.ts';
import { collect } from '../../online/options.ts';
import { rewardTrain, scorePairs } from '../../online/reward-model.ts';
import { terminalReporter } from '../progress.ts';
import { hubRecord } from '../hub.ts';

export function register(program: Command): void {
  program
    .command('reward-train')
    .description('train a reward model (the causal LM plus a scalar head on the last token) on preference pairs with the Bradley–Terry loss −log σ(r_w − r_l)')
    .requiredOption('--model <dir>', 'base model (Hugging Face model folder)')
    .requiredOption('--data <file>', 'pairwise preference data (canonical Parquet or any file `prefzoo convert` accepts)')
    .requiredOption('-o, --out <dir>', 'the reward model folder (HF layout with value_head.*), metrics.jsonl, checkpoints/ (every save_steps), reward_model.json')
    .option('--param <key=value>', 'a training setting (learning_rate, batch_size, max_steps, num_epochs, lora_r, save_steps, eval_data, eval_steps, …; repeatable); settings reward-train does not use are refused', collect, [])
    .option('--config <file>', 'JSON object of training settings')
    .option('--resume', 'continue the unfinished run in --out from its newest checkpoint (bit-exact)')
    .option('--overwrite', 'replace an unfinished run in --out')
    .addHelpText('after', () => `\nSettings it honours (--param key=value or --config), with defaults (docs/settings.md); any other is refused:\n${settingsHelp('reward-train')}`)
    .option('--quiet', 'no progress output')
    .option('--device <device>', `${DEVICE_HELP}; same as --param device=…`)
    .option('--json', 'print a one-line JSON summary')
    .action(async (o: { model: string; data: string; out: string; param: string[]; device?: string; config?: string; quiet?: boolean; json?: boolean; resume?: boolean; overwrite?: boolean }) => {
      const r = await rewardTrain({ model: o.model, hub: hubRecord(), data: o.data, out: o.out, resume: o.resume, overwrite: o.overwrite, params: o.device ? [...o.param, `device=${device(o.device)}`] : o.param, configFile: o.config, reporter: terminalReporter(o.quiet, !o.json) });
      if (o.json) process.stdout.write(JSON.stringify(r) + '\n');
      else process.stdout.write(`reward model in ${r.dir}: pair accuracy ${r.train_accuracy.toFixed(3)} on the training pairs${r.eval_accuracy !== undefined ? `, ${r.eval_accuracy.toFixed(3)} on eval_data` : ''}\n`);
    });
  program
    .command('reward-score')
    .description('add chosen_score/rejected_score from a reward model to pairwise data (what `prefzoo train --loss mpo` splits on)')
    .requiredOption('--model <dir>', 'reward model folder (from prefzoo reward-train)')
    .requiredOption('--data <file>', 'pairwise preference data')
    .requiredOption('-o, --out <file>', 'canonical Parquet with the scores')
    .option('--device <device>', DEVICE_HELP, 'cpu')
    .option('--json', 'print a one-line JSON summary')
    .action(async (o: { model: string; data: string; out: string; json?: boolean; device: string }) => {
      const r = await scorePairs({ rewardModel: o.model, data: o.data, out: o.out, runtime: { ep: device(o.device) } });
      if (o.json) process.stdout.write(JSON.stringify(r) + '\n');
      else process.stdout.write(`${r.rows} pairs scored (reward model agrees with the labels on ${(r.agreement * 100).toFixed(1)}%) → ${o.out}\n`);
    });
}
