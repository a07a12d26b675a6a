/**
 * Settings → the training problem: the one place that turns a TrainConfig (with the model, the data
 * kind, the loss and what the data provides) into the TrainProblem and the artifact spec that
 * `prefzoo train` (trainer.ts), `prefzoo artifacts` (artifacts.ts) and `prefzoo bench`
 * (scripts/bench/step.ts) build their graphs from, so the three build the same graphs from the same
 * settings.
 */
import type { Kind } from '../../datasets/schema.ts';
import type { BoundLoss } from '../../losses/index.ts';
import type { ArtifactSpec } from '../artifacts/build.ts';
import { UserError } from '../errors.ts';
import { canPack } from '../models/batch.ts';
import { parameterShapes, type ModelConfig } from '../models/config.ts';
import { checkBlock, type BaseTensor } from '../models/quantize-base.ts';
import type { LoraConfig } from '../models/index.ts';
import type { TrainConfig } from './config.ts';
import { type BatchShape, buildSpec, PROVIDED_KEYS, type TrainProblem } from './graph.ts';
import { optimizerOf } from './run.ts';

export interface ProblemInputs {
  /** The policy's architecture. */
  model: ModelConfig;
  kind: Kind;
  loss: BoundLoss;
  /** The adapters trained (loraOf(settings), or a continued adapter's); null: every weight. */
  lora: LoraConfig | null;
  /** Optional batch columns the data provides; absent: every column the loss requires (a data-free export). */
  dataKeys?: Set<string>;
  /** A resumed run keeps the batch layout its artifacts were built with. */
  packed?: boolean;
  /** The largest micro-batch the graph will see (TrainProblem.longest), when known. */
  longest?: BatchShape;
}

/** Whether the loss reads KTO's mismatched KL pairs from single rows. */
export function klOf(loss: BoundLoss, kind: Kind): boolean {
  return kind === 'single' && (loss.keys(kind).oneOf ?? []).some((set) => set.includes('policy_kl_logps'));
}

/** Whether any term of the loss reads reference log-probs (every `ref_*` key, required, optional or one of a set). */
export function readsReference(loss: BoundLoss, kind: Kind): boolean {
  const k = loss.keys(kind);
  return [...k.required, ...(k.optional ?? []), ...(k.oneOf ?? []).flat()].some((key) => key.startsWith('ref_'));
}

/** The largest rationale_weight γ over the loss's terms (0: no rationale term). */
export function rationaleWeightOf(loss: BoundLoss): number {
  return Math.max(0, ...loss.terms.map((t) => Number(t.params.rationale_weight ?? 0)));
}

/** load_in_4bit's blocks, checked against the model's widths (one line naming quant_block_size). */
function base4bitOf(c: TrainConfig, model: ModelConfig): { block: number } {
  checkBlock(model, parameterShapes(model), c.quant_block_size);
  return { block: c.quant_block_size };
}

/** The training problem the settings describe. */
export function problemOf(c: TrainConfig, i: ProblemInputs): TrainProblem {
  const valueHead = i.loss.keys(i.kind).required.includes('values');
  const kl = klOf(i.loss, i.kind);
  const lengthWeighted = c.ld_alpha !== 1;
  if (lengthWeighted && i.kind !== 'pairwise') throw new UserError(`ld_alpha weights the tokens past the shorter response of a pair; ${i.kind} batches have no pairs`);
  const dataKeys = i.dataKeys ?? new Set(i.loss.keys(i.kind).required.filter((k) => !PROVIDED_KEYS.has(k)));
  return {
    config: i.model,
    kind: i.kind,
    loss: i.loss,
    lora: i.lora,
    kl,
    valueHead,
    dataKeys,
    packed: i.packed ?? (c.share_prompt && canPack(i.kind, kl) && !valueHead),
    lengthWeighted,
    rationale: i.kind === 'pairwise' && rationaleWeightOf(i.loss) > 0,
    dense: c.device === 'webgpu',
    recompute: c.gradient_checkpointing,
    baseDtype: c.base_dtype,
    ...(c.load_in_4bit ? { base4bit: base4bitOf(c, i.model) } : {}),
    ...(readsReference(i.loss, i.kind) ? {} : { noReference: true }),
    ...(i.longest ? { longest: i.longest } : {}),
  };
}

/** The problem's artifact spec under the settings' optimizer (running gradient sums only when micro-batches are accumulated). */
export function problemSpec(p: TrainProblem, init: ReadonlyMap<string, BaseTensor>, c: TrainConfig): ArtifactSpec {
  // Running sums only when micro-batches are accumulated: otherwise every step would feed
  // parameter-sized zeros (545 MB for Qwen's embedding alone) into them.
  return { ...buildSpec(p, init, optimizerOf(c)), gradientAccumulation: c.gradient_accumulation_steps > 1 };
}
