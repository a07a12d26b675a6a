/**
 * `prefzoo artifacts`: the training artifacts of a model and a loss, written to a folder without
 * data or a run: training, eval and optimizer graphs (and the fused step graph), the checkpoint of
 * the starting parameters, and artifacts.json. The batch inputs are those the loss reads, for the
 * kind the loss takes first (or `kind`); the settings (LoRA, optimizer, share_prompt, …) are the
 * trainer's, from --param and --config.
 */
import { existsSync, readdirSync, renameSync, rmSync } from 'node:fs';
import { basename, dirname, join } from 'node:path';
import type { Kind } from '../../datasets/schema.ts';
import { resolveLoss } from '../../losses/index.ts';
import { buildArtifacts } from '../artifacts/build.ts';
import { UserError } from '../errors.ts';
import { canPack } from '../models/batch.ts';
import { loadModel } from '../models/load.ts';
import { resolveConfig } from './config.ts';
import { buildSpec, PROVIDED_KEYS, type TrainProblem } from './graph.ts';
import { loraOf, optimizerOf, startingParams } from './run.ts';

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
  const { config, lossParams } = resolveConfig({ configFile: o.configFile, params: o.params });
  const loss = resolveLoss(o.loss, lossParams);
  const asked = o.kind ?? loss.kinds[0];
  if (asked === 'nash_md') throw new UserError(`loss ${o.loss} trains on its own samples; prefzoo nash-md builds its artifacts`);
  if (!(loss.kinds as readonly string[]).includes(asked)) throw new UserError(`--kind: loss ${o.loss} takes ${loss.kinds.join(' or ')} data, not "${asked}"`);
  const kind = asked as Kind;
  if (existsSync(o.out) && readdirSync(o.out).length > 0) throw new UserError(`${o.out}: exists and is not empty; choose another -o`);
  const base = loadModel(o.model);
  const keys = loss.keys(kind);
  const valueHead = keys.required.includes('values');
  // The artifacts read every column the loss needs from the data (rewards, scores, labels, …).
  const dataKeys = new Set(keys.required.filter((k) => !PROVIDED_KEYS.has(k)));
  const kl = kind === 'single' && (keys.oneOf ?? []).some((set) => set.includes('policy_kl_logps'));
  const packed = config.share_prompt && canPack(kind, kl) && !valueHead;
  const lora = loraOf(config);
  const problem: TrainProblem = { config: base.config, kind, loss, lora, kl, valueHead, dataKeys, packed };
  const init = startingParams(base.config, base.weights, { lora, valueHead, seed: config.seed });
  const spec = buildSpec(problem, init, optimizerOf(config));
  // Built next to the target and renamed, so a failed build leaves no half-written folder.
  const tmp = join(dirname(o.out), `.${basename(o.out)}.tmp-${process.pid}`);
  rmSync(tmp, { recursive: true, force: true });
  try {
    buildArtifacts(spec, tmp);
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
    packed,
    files: readdirSync(o.out).sort(),
  };
}
