import type { Command } from 'commander';
import { DEFAULT_CONFIG } from '../../train/config.ts';
import { trainAny } from '../../train/mpo.ts';
import { collect } from '../flags.ts';
import { terminalLog, terminalProgress } from '../progress.ts';

/** One-line notes of the workflow settings (TrainConfig's doc comments say more). */
const NOTES: Partial<Record<string, string>> = {
  ref_on_the_fly: 'score the reference for every batch instead of caching it once',
  sync_ref_model: 'TR-DPO: every ref_model_sync_steps steps ref ← α·policy + (1−α)·ref (reference scored on the fly)',
  ref_model_mixup_alpha: 'TR-DPO α of that soft update (1: hard update)',
  ref_model_sync_steps: 'TR-DPO: optimizer steps between reference updates',
  ld_alpha: 'LD-DPO: weight of policy tokens past the shorter response of a pair (1: off)',
  save_adapter: 'with LoRA: also write RUN/adapter/ in PEFT layout (adapter_model.safetensors, adapter_config.json)',
  save_merged: 'write the merged model to RUN/final/ (false with save_adapter: adapter only)',
};
const SETTINGS = Object.entries(DEFAULT_CONFIG)
  .map(([k, v]) => `  ${`${k}=${JSON.stringify(v)}`.padEnd(32)}${NOTES[k] ? ' ' + NOTES[k] : ''}`.trimEnd())
  .join('\n');

export const TIES = 'Ties: a pair counts as correct only when r(chosen) - r(rejected) exceeds float32 rounding of its log-probs (1e-6 x beta x the sum of their magnitudes); ties count as wrong, as in TRL, so a policy equal to its reference scores 0.';

export function register(program: Command): void {
  program
    .command('train')
    .description('fine-tune a model on preference data with a loss from the zoo')
    .requiredOption('--model <dir>', 'Hugging Face model folder (config.json, safetensors, tokenizer.json)')
    .requiredOption('--data <file>', 'canonical Parquet (a file, its shards, a directory of shards or a glob such as "data/train-*.parquet", streamed), or any file `prefzoo convert` accepts')
    .requiredOption('--loss <name>', 'loss name (dpo, ipo, rdpo, lipo, dro, sppo, …) or a mixture such as dpo:0.8,sft:0.2')
    .requiredOption('-o, --out <dir>', 'run folder: metrics.jsonl, checkpoints/, final/')
    .option('--param <key=value>', 'a training setting or loss parameter (repeatable), e.g. beta=0.1 max_steps=100', collect, [])
    .option('--config <file>', 'JSON object of settings (and loss parameters); --param overrides it')
    .option('--resume', 'continue from the last complete checkpoint in the run folder (same --model, --data, --loss and --ref)')
    .option('--overwrite', 'replace the run folder\'s earlier run (without it, or --resume, a non-empty folder is refused)')
    .option('--ref <dir>', 'reference model folder (default: the starting policy); any supported model with the same tokenizer, e.g. the SFT checkpoint')
    .option('--adapter <dir>', 'continue training this PEFT LoRA adapter folder (adapter_config.json + adapter_model.safetensors) on --model')
    .option('--ref-on-the-fly', 'compute reference log-probs for every batch instead of caching them once')
    .option('--quiet', 'no progress output')
    .option('--json', 'print a one-line JSON summary when done')
    .addHelpText('after', `\nSettings (--param key=value or --config), with defaults:\n${SETTINGS}\nAny other key is passed to the loss (e.g. beta, label_smoothing, epsilon, tau); every pairwise loss but sppo\nalso takes rationale_weight=0 (adds γ·(−log π(rationale | prompt, chosen, rejected)) on rows with a rationale).\n\nrewards/accuracies: ${TIES}`)
    .action(async (o: { model: string; data: string; loss: string; out: string; param: string[]; config?: string; resume?: boolean; overwrite?: boolean; ref?: string; adapter?: string; refOnTheFly?: boolean; quiet?: boolean; json?: boolean }) => {
      const r = await trainAny({ model: o.model, data: o.data, loss: o.loss, out: o.out, params: o.refOnTheFly ? [...o.param, 'ref_on_the_fly=true'] : o.param, configFile: o.config, resume: o.resume, overwrite: o.overwrite, quiet: o.quiet, refModel: o.ref, adapter: o.adapter, progress: terminalProgress, log: o.quiet ? undefined : terminalLog });
      const summary = { steps: r.steps, seconds: Math.round(r.seconds * 10) / 10, final: r.finalDir, loss: r.last.loss, 'rewards/accuracies': r.last['rewards/accuracies'], ...(r.eval ? { eval: r.eval.overall } : {}) };
      if (o.json) process.stdout.write(JSON.stringify(summary) + '\n');
      else process.stdout.write(`trained ${r.steps} steps in ${summary.seconds}s; final model in ${r.finalDir}; metrics in ${o.out}/metrics.jsonl\n`);
    });
}
