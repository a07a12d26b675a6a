/**
 * `prefzoo artifacts`: the training artifacts of a model and a loss, written to a folder without
 * data or a run: training, eval and optimizer graphs (and the fused step graph), the checkpoint of
 * the starting parameters, and artifacts.json. The batch inputs are those the loss reads, for the
 * kind the loss takes first (or `kind`); the settings (LoRA, optimizer, share_prompt, device, …) are
 * the trainer's, from --param and --config, turned into the problem by problem.ts as `train` does;
 * a setting that only matters while steps run (learning_rate, batch_size, …) is refused.
 */
import { existsSync, readdirSync, renameSync, rmSync } from 'node:fs';
import { basename, dirname, join } from 'node:path';
import type { Kind } from '../../datasets/schema.ts';
import { resolveLoss } from '../../losses/index.ts';
import { buildArtifacts } from '../artifacts/build.ts';
import { UserError } from '../errors.ts';
import { loadModel } from '../models/load.ts';
import { resolveConfig } from './config.ts';
import { problemOf, problemSpec } from './problem.ts';
import { artifactsOf, loraOf, startingParams } from './run.ts';

export interface ExportOptions {
  model: string;
  /** A loss name or a weighted mixture (`dpo:0.8,sft:0.2`). */
  loss: string;
  out: string;
  /** Trainer settings and loss parameters, as `key=value`. */
  params?: string[];
  configFile?: string;
  /** The data kind the artifacts take (default: the loss's first). */
  kind?: string;
}

export interface ExportResult {
  dir: string;
  kind: Kind;
  /** Parameters in the checkpoint (adapters and value head included). */
  params: number;
  trainable: number;
  /** The artifacts take shared-prompt batches (src/models/batch.ts). */
  packed: boolean;
  /** Files written, relative to `dir`. */
  files: string[];
}

export function exportArtifacts(o: ExportOptions): ExportResult {
  const { config, lossParams } = resolveConfig({ configFile: o.configFile, params: o.params, command: 'artifacts', loss: o.loss });
  const loss = resolveLoss(o.loss, lossParams);
  const asked = o.kind ?? loss.kinds[0];
  if (asked === 'nash_md') throw new UserError(`loss ${o.loss} trains on its own samples; prefzoo nash-md builds its artifacts`);
  if (asked === 'grpo') throw new UserError(`loss ${o.loss} trains on its own rollouts; prefzoo grpo builds its artifacts (in its run folder's artifacts/)`);
  if (asked === 'distill') throw new UserError(`loss ${o.loss} reads a teacher's distribution over the vocabulary, which the training graph of prefzoo artifacts does not compute`);
  if (!(loss.kinds as readonly string[]).includes(asked)) throw new UserError(`--kind: loss ${o.loss} takes ${loss.kinds.join(' or ')} data, not "${asked}"`);
  const kind = asked as Kind;
  if (existsSync(o.out) && readdirSync(o.out).length > 0) throw new UserError(`${o.out}: exists and is not empty; choose another -o`);
  const base = loadModel(o.model);
  const lora = loraOf(config);
  // No data: the artifacts read every column the loss needs from the batch (rewards, scores, labels, …).
  const problem = problemOf(config, { model: base.config, kind, loss, lora });
  const init = startingParams(base.config, base.weights, { lora, valueHead: problem.valueHead, seed: config.seed });
  const spec = problemSpec(problem, init, config);
  // Built next to the target and renamed, so a failed build leaves no half-written folder.
  const tmp = join(dirname(o.out), `.${basename(o.out)}.tmp-${process.pid}`);
  rmSync(tmp, { recursive: true, force: true });
  try {
    buildArtifacts(spec, tmp, artifactsOf(config));
    rmSync(o.out, { recursive: true, force: true });
    renameSync(tmp, o.out);
  } catch (e) {
    rmSync(tmp, { recursive: true, force: true });
    throw e;
  }
  return {
    dir: o.out,
    kind,
    params: spec.params.length,
    trainable: spec.params.filter((p) => p.trainable).length,
    packed: !!problem.packed,
    files: readdirSync(o.out).sort(),
  };
}
