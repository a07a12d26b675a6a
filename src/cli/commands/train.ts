import type { Command } from 'commander';
import { DEFAULT_CONFIG } from '../../train/config.ts';
import { trainAny } from '../../train/mpo.ts';
import { collect } from '../flags.ts';

const SETTINGS = Object.entries(DEFAULT_CONFIG)
  .map(([k, v]) => `  ${k}=${JSON.stringify(v)}`)
  .join('\n');

export const TIES = 'Ties: a pair counts as correct only when r(chosen) - r(rejected) exceeds float32 rounding of its log-probs (1e-6 x beta x the sum of their magnitudes); ties count as wrong, as in TRL, so a policy equal to its reference scores 0.';

export function register(program: Command): void {
  program
    .command('train')
    .description('fine-tune a model on preference data with a loss from the zoo')
    .requiredOption('--model <dir>', 'Hugging Face model folder (config.json, safetensors, tokenizer.json)')
    .requiredOption('--data <file>', 'canonical Parquet, or any file `prefzoo convert` accepts')
    .requiredOption('--loss <name>', 'loss name (dpo, ipo, rdpo, lipo, dro, sppo, …) or a mixture such as dpo:0.8,sft:0.2')
    .requiredOption('-o, --out <dir>', 'run folder: metrics.jsonl, checkpoints/, final/')
    .option('--param <key=value>', 'a training setting or loss parameter (repeatable), e.g. beta=0.1 max_steps=100', collect, [])
    .option('--config <file>', 'JSON object of settings (and loss parameters); --param overrides it')
    .option('--resume', 'continue from the last complete checkpoint in the run folder (same --model, --data and --loss)')
    .option('--overwrite', 'replace the run folder\'s earlier run (without it, or --resume, a non-empty folder is refused)')
    .option('--ref-on-the-fly', 'compute reference log-probs for every batch instead of caching them once')
    .option('--quiet', 'no progress output')
    .option('--json', 'print a one-line JSON summary when done')
    .addHelpText('after', `\nSettings (--param key=value or --config), with defaults:\n${SETTINGS}\nAny other key is passed to the loss (e.g. beta, label_smoothing, epsilon, tau).\n\nrewards/accuracies: ${TIES}`)
    .action(async (o: { model: string; data: string; loss: string; out: string; param: string[]; config?: string; resume?: boolean; overwrite?: boolean; refOnTheFly?: boolean; quiet?: boolean; json?: boolean }) => {
      const r = await trainAny({ model: o.model, data: o.data, loss: o.loss, out: o.out, params: o.refOnTheFly ? [...o.param, 'ref_on_the_fly=true'] : o.param, configFile: o.config, resume: o.resume, overwrite: o.overwrite, quiet: o.quiet });
      const summary = { steps: r.steps, seconds: Math.round(r.seconds * 10) / 10, final: r.finalDir, loss: r.last.loss, 'rewards/accuracies': r.last['rewards/accuracies'], ...(r.eval ? { eval: r.eval.overall } : {}) };
      if (o.json) process.stdout.write(JSON.stringify(summary) + '\n');
      else process.stdout.write(`trained ${r.steps} steps in ${summary.seconds}s; final model in ${r.finalDir}; metrics in ${o.out}/metrics.jsonl\n`);
    });
}
