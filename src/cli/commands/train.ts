import type { Command } from 'commander';
import { resolveConfig } from '../../train/config.ts';
import { settingsHelp } from '../../train/settings.ts';
import { UserError } from '../../errors.ts';
import { trainAny } from '../../train/mpo.ts';
import { DEVICE_HELP, collect, device } from '../flags.ts';
import { Names, dataHubFlags, modelHubFlags, type HubFlags } from '../hub.ts';
import { terminalReporter } from '../progress.ts';

export const TIES = 'Ties: a pair counts as correct only when r(chosen) - r(rejected) exceeds float32 rounding of its log-probs (1e-6 x beta x the sum of their magnitudes); ties count as wrong, as in TRL, so a policy equal to its reference scores 0.';

export function register(program: Command): void {
  const cmd = program
    .command('train')
    .description('fine-tune a model on preference data with a loss from the zoo')
    .option('--model <dir>', 'Hugging Face model folder (config.json, safetensors, tokenizer.json) or Hub name ORG/NAME[@revision] (docs/hub.md); required unless a TRL --config gives model_name_or_path')
    .option('--data <file>', 'canonical Parquet (a file, its shards, a directory of shards or a glob such as "data/train-*.parquet", streamed), any file `prefzoo convert` accepts, or a Hub dataset name ORG/NAME (with --split, --subset); required unless a TRL --config gives dataset_name')
    .option('--loss <name>', 'loss name (dpo, ipo, rdpo, lipo, dro, sppo, …) or a mixture such as dpo:0.8,sft:0.2; required unless a TRL --config gives loss_type')
    .option('-o, --out <dir>', 'run folder: metrics.jsonl, checkpoints/, final/; required unless a TRL --config gives output_dir')
    .option('--param <key=value>', 'a training setting or loss parameter (repeatable), e.g. beta=0.1 max_steps=100', collect, [])
    .option('--config <file>', "JSON object of settings (and loss parameters), or a YAML file with TRL's DPOConfig keys (as `trl dpo --config` takes); --param overrides it")
    .option('--resume', 'continue from the last complete checkpoint in the run folder (same --model, --data, --loss and --ref)')
    .option('--overwrite', 'replace the run folder\'s earlier run (without it, or --resume, a non-empty folder is refused)')
    .option('--ref <dir>', 'reference model folder or Hub name (default: the starting policy); any supported model with the same tokenizer, e.g. the SFT checkpoint')
    .option('--adapter <dir>', 'continue training this PEFT LoRA adapter (a folder or Hub name: adapter_config.json + adapter_model.safetensors) on --model')
    .option('--ref-on-the-fly', 'compute reference log-probs for every batch instead of caching them once')
    .option('--device <device>', `${DEVICE_HELP}; same as --param device=…`)
    .option('--quiet', 'no progress output')
    .option('--json', 'print a one-line JSON summary when done');
  modelHubFlags(dataHubFlags(cmd))
    .addHelpText('after', () => `\nSettings (--param key=value or --config), with defaults (docs/settings.md):\n${settingsHelp('train')}\nAny other key is passed to the loss (e.g. beta, label_smoothing, epsilon, tau); every pairwise loss but sppo\nalso takes rationale_weight=0 (adds γ·(−log π(rationale | prompt, chosen, rejected)) on rows with a rationale).\n\nrewards/accuracies: ${TIES}`)
    .action(async (o: HubFlags & { model?: string; data?: string; loss?: string; out?: string; param: string[]; config?: string; resume?: boolean; overwrite?: boolean; ref?: string; adapter?: string; refOnTheFly?: boolean; device?: string; quiet?: boolean; json?: boolean }) => {
      // A TRL YAML config may name the model, data, loss and run folder; a flag given as well must agree.
      const trl = o.config ? (resolveConfig({ configFile: o.config, params: o.param, loss: o.loss }).trl ?? {}) : {};
      const pick = (flag: string, given: string | undefined, key: string, fromTrl: string | undefined): string => {
        if (given !== undefined && fromTrl !== undefined && given !== fromTrl) throw new UserError(`${flag} ${given} contradicts ${o.config}'s ${key}: ${fromTrl}`);
        const v = given ?? fromTrl;
        if (v === undefined) throw new UserError(`required option '${flag}' not specified`);
        return v;
      };
      const model = pick('--model', o.model, 'model_name_or_path', trl.model);
      const data = pick('--data', o.data, 'dataset_name', trl.data);
      // TRL's loss_type defaults to sigmoid, prefzoo's dpo.
      const loss = pick('--loss', o.loss, 'loss_type', trl.loss ?? (o.config && /\.ya?ml$/i.test(o.config) && !o.loss ? 'dpo' : undefined));
      const out = pick('--out', o.out, 'output_dir', trl.out);
      // Hub names become snapshot folders of the shared cache here; the run records which.
      const names = new Names({ ...o, revision: o.revision ?? trl.revision, split: o.split ?? trl.split, subset: o.subset ?? trl.subset });
      const modelDir = await names.model('model', '--model', model);
      const dataSpec = (await names.data('data', '--data', data)).spec;
      const refDir = await names.model('ref', '--ref', o.ref);
      const adapterDir = await names.model('adapter', '--adapter', o.adapter, 'adapter');
      const params = [...o.param, ...(o.refOnTheFly ? ['ref_on_the_fly=true'] : []), ...(o.device ? [`device=${device(o.device)}`] : [])];
      const r = await trainAny({ model: modelDir, data: dataSpec, loss, out, hub: names.record, params, configFile: o.config, resume: o.resume, overwrite: o.overwrite, refModel: refDir, adapter: adapterDir, reporter: terminalReporter(o.quiet) });
      const summary = { steps: r.steps, seconds: Math.round(r.seconds * 10) / 10, final: r.finalDir, loss: r.last.loss, 'rewards/accuracies': r.last['rewards/accuracies'], ...(r.eval ? { eval: r.eval.overall } : {}) };
      if (o.json) process.stdout.write(JSON.stringify(summary) + '\n');
      else process.stdout.write(`trained ${r.steps} steps in ${summary.seconds}s; final model in ${r.finalDir}; metrics in ${out}/metrics.jsonl\n`);
    });
}
