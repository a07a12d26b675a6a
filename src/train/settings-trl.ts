/**
 * A TRL YAML config (`trl dpo --config dpo.yaml`: DPOConfig / TrainingArguments keys, and the script's
 * model_name_or_path, dataset_name, output_dir) mapped to prefzoo's settings and loss parameters,
 * conventions converted. Keys prefzoo has under the same name pass through; the keys prefzoo cannot
 * honour (or values it cannot, such as `bf16: true`) are named together in one refusal.
 *
 * Conventions that differ (docs/trl-handoff.md):
 * - `f_alpha_divergence_coef` = 1 − prefzoo's `f_alpha`; `f_divergence_type: js_divergence` is `js`.
 * - `loss_type` (a name or a list, with `loss_weights`) is the loss spec: `sigmoid` is `dpo`,
 *   `aot_pair` (TRL's unpaired AOT) is `aot_unpaired`; a list is a mixture `dpo:w1,sft:w2`.
 * - `rpo_alpha: null` is 0 and `ld_alpha: null` is 1 (off); `use_weighting` is `wpo`.
 * - `lora_r`, `lora_alpha`, `lora_target_modules` apply under `use_peft: true` only (TRL's defaults r 16, alpha 32).
 * - `optim: adamw_torch` (or `adamw_torch_fused`, `adamw_hf`) is `adamw`; `report_to` may be a list.
 * - Keys that change only speed or memory in TRL (`precompute_ref_log_probs`, `dataset_num_proc`, …)
 *   are accepted: prefzoo's results do not depend on them.
 */
import { UserError } from '../errors.ts';
import { TRAIN_SETTINGS, type SettingTable } from './settings.ts';

/** What a TRL config says that prefzoo's command line takes as flags. */
export interface TrlFlags {
  model?: string;
  data?: string;
  out?: string;
  /** The loss spec from loss_type (and loss_weights). */
  loss?: string;
  /** model_revision: the model's Hub revision. */
  revision?: string;
  /** dataset_config and dataset_train_split: the Hub dataset's subset and split. */
  subset?: string;
  split?: string;
}

/** TRL's loss_type names where prefzoo's differ; every other name is prefzoo's own. */
const LOSS_NAMES: Readonly<Record<string, string>> = { sigmoid: 'dpo', aot_pair: 'aot_unpaired' };

/** TRL keys that change no result of prefzoo's (speed, memory, logging destinations), with the values that keep that true (undefined: any). */
const NEUTRAL: Readonly<Record<string, readonly unknown[] | undefined>> = {
  precompute_ref_log_probs: undefined,
  precompute_ref_batch_size: undefined,
  dataset_num_proc: undefined,
  use_logits_to_keep: undefined,
  per_device_eval_batch_size: undefined,
  dataloader_num_workers: undefined,
  logging_dir: undefined,
  run_name: undefined,
  overwrite_output_dir: undefined,
  do_train: undefined,
  do_eval: undefined,
  disable_dropout: [true],
  reference_free: [false],
  padding_free: [false],
  bf16: [false],
  fp16: [false],
  max_completion_length: [null],
  f_divergence_type: undefined, // mapped below when given; listed so a null is accepted
  eval_strategy: ['no', 'steps'],
  save_strategy: ['no', 'steps'],
  logging_strategy: ['steps'],
  push_to_hub: [false],
};

/** TRL's name → prefzoo's (from the tables' `trl` fields: TRAIN_SETTINGS and a command's own). */
function renamed(own: SettingTable): Map<string, string> {
  const m = new Map<string, string>();
  const all: SettingTable = { ...TRAIN_SETTINGS, ...own };
  for (const [k, d] of Object.entries(all)) if (d.trl) m.set(d.trl, k);
  return m;
}

/** Maps a TRL config's keys (`src`, read from `file`); `own`: the command's own settings table, whose `trl` names map too. */
export function fromTrl(src: Record<string, unknown>, file: string, own: SettingTable = {}): { values: Record<string, unknown>; flags: TrlFlags } {
  const values: Record<string, unknown> = {};
  const loss: Record<string, unknown> = {};
  const flags: TrlFlags = {};
  const refused: string[] = [];
  const names = renamed(own);
  const refuse = (k: string, v: unknown) => refused.push(`${k}: ${JSON.stringify(v)}`);
  for (const [k, v] of Object.entries(src)) {
    switch (k) {
      case 'model_name_or_path':
        flags.model = String(v);
        continue;
      case 'dataset_name':
        flags.data = String(v);
        continue;
      case 'model_revision':
        if (v !== null) flags.revision = String(v);
        continue;
      case 'dataset_config':
        if (v !== null) flags.subset = String(v);
        continue;
      case 'dataset_train_split':
        flags.split = String(v);
        continue;
      case 'output_dir':
        flags.out = String(v);
        continue;
      case 'loss_type': {
        const types = Array.isArray(v) ? v.map(String) : [String(v)];
        const w = src.loss_weights;
        if (w !== undefined && w !== null && (!Array.isArray(w) || w.length !== types.length)) {
          refuse('loss_weights', w);
          continue;
        }
        const spec = types.map((t, i) => `${LOSS_NAMES[t] ?? t}${Array.isArray(w) ? `:${w[i]}` : types.length > 1 ? ':1' : ''}`);
        flags.loss = spec.join(',');
        continue;
      }
      case 'loss_weights':
      case 'use_peft':
        continue; // read with loss_type; read after the loop
      case 'beta':
      case 'label_smoothing':
      case 'discopop_tau':
        loss[k] = v;
        continue;
      case 'f_divergence_type':
        if (v !== null) loss.f_divergence = v === 'js_divergence' ? 'js' : v;
        continue;
      case 'f_alpha_divergence_coef':
        // Read only under the α-divergence (TRL ignores it otherwise; its default 1 would be f_alpha 0).
        if (src.f_divergence_type === 'alpha_divergence') loss.f_alpha = typeof v === 'number' ? 1 - v : v;
        continue;
      case 'use_weighting':
        loss.wpo = v;
        continue;
      case 'rpo_alpha':
        loss.rpo_alpha = v === null ? 0 : v;
        continue;
      case 'ld_alpha':
        values.ld_alpha = v === null ? 1 : v;
        continue;
      case 'optim':
        if (v === 'sgd') values.optimizer = 'sgd';
        else if (v === 'adamw_torch' || v === 'adamw_torch_fused' || v === 'adamw_hf') values.optimizer = 'adamw';
        else refuse(k, v);
        continue;
      case 'lr_scheduler_type':
        if (v === 'linear' || v === 'cosine' || v === 'constant') values.lr_scheduler = v;
        else if (v === 'constant_with_warmup') values.lr_scheduler = 'constant';
        else refuse(k, v);
        continue;
      case 'report_to': {
        const list = Array.isArray(v) ? v.map(String) : v === null ? [] : [String(v)];
        const rest = list.filter((x) => x !== 'none' && x !== 'tensorboard');
        if (rest.length) refuse(k, v);
        else values.report_to = list.includes('tensorboard') ? 'tensorboard' : 'none';
        continue;
      }
    }
    if (Object.prototype.hasOwnProperty.call(NEUTRAL, k)) {
      const ok = NEUTRAL[k];
      if (ok && !ok.includes(v)) refuse(k, v);
      continue;
    }
    const name = names.get(k) ?? (Object.prototype.hasOwnProperty.call(TRAIN_SETTINGS, k) || Object.prototype.hasOwnProperty.call(own, k) ? k : undefined);
    if (name !== undefined) {
      if (v === null) refuse(k, v);
      else values[name] = v;
      continue;
    }
    if (k === 'loss_params' && v && typeof v === 'object') {
      Object.assign(loss, v);
      continue;
    }
    refuse(k, v);
  }
  // transformers' constant schedule has no warm-up; prefzoo's constant warms up like the others.
  if (src.lr_scheduler_type === 'constant' && (Number(src.warmup_steps ?? 0) > 0 || Number(src.warmup_ratio ?? 0) > 0)) refused.push('lr_scheduler_type: "constant" with warm-up (TRL skips the warm-up; constant_with_warmup keeps it)');
  // TRL's ModelConfig reads lora_* only under use_peft (its defaults then: r 16, alpha 32).
  if (src.use_peft === true) {
    values.lora_r ??= 16;
    values.lora_alpha ??= 32;
  } else {
    for (const k of ['lora_r', 'lora_alpha', 'lora_target_modules']) delete values[k];
  }
  if (refused.length) throw new UserError(`${file}: prefzoo does not honour ${refused.length > 1 ? `these ${refused.length} TRL settings` : 'this TRL setting'}: ${refused.join(', ')}`);
  if (Object.keys(loss).length) values.loss_params = loss;
  return { values, flags };
}
