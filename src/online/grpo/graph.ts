/**
 * GRPO's training graph: completions [B, T] → per-token log-probs of the tempered logits → the bound
 * `grpo` loss (losses/grpo.ts). Its eval graph outputs the per-token log-probs: the old ones when
 * num_iterations > 1.
 */
import type { ArtifactSpec } from '../../artifacts/build.ts';
import type { Tensor } from '../../onnx/graph.ts';
import { buildCausalLM, type LoraConfig } from '../../models/index.ts';
import type { ModelConfig } from '../../models/config.ts';
import type { FloatTensor } from '../../models/checkpoint.ts';
import { sequenceLogps } from '../../models/logps.ts';
import type { TrainConfig } from '../../train/config.ts';
import { headChunksOf, modelSegment } from '../../train/graph.ts';
import { modelParamSpecs, optimizerOf } from '../../train/run.ts';
import type { BoundLoss } from '../../../losses/index.ts';
import type { GrpoParams } from '../../../losses/grpo.ts';
import { tempered } from '../reference.ts';
import type { GrpoSettings } from './settings.ts';

/** Which optional columns a batch carries, given the loss's parameters and the settings. */
export interface Columns {
  /** old_token_logps (num_iterations > 1; else the live log-probs, detached). */
  old: boolean;
  /** ref_token_logps (beta > 0). */
  ref: boolean;
  /** num_items_in_batch (dapo, cispo: normalised by the round's completion tokens). */
  items: boolean;
  /** token_entropies reach the loss (top_entropy_quantile < 1). */
  entropies: boolean;
}

export function columnsOf(p: GrpoParams, s: GrpoSettings): Columns {
  return { old: s.num_iterations > 1, ref: p.beta > 0, items: p.loss_type === 'dapo' || p.loss_type === 'cispo', entropies: p.top_entropy_quantile < 1 };
}

export interface SpecOptions {
  config: ModelConfig;
  init: Map<string, FloatTensor>;
  lora: LoraConfig | null;
  train: TrainConfig;
  loss: BoundLoss;
  settings: GrpoSettings;
}

export function grpoSpec(o: SpecOptions): ArtifactSpec {
  const p = o.loss.terms[0].params as GrpoParams;
  const cols = columnsOf(p, o.settings);
  const F = 'float32' as const;
  const recompute = o.train.gradient_checkpointing;
  return {
    params: modelParamSpecs(o.config, o.init, o.lora, false),
    batchInputs: [
      { name: 'input_ids', dtype: 'int64', shape: ['rows', 'len'] },
      { name: 'attention_mask', dtype: 'int64', shape: ['rows', 'len'] },
      { name: 'loss_mask', dtype: F, shape: ['rows', 'len'] },
      { name: 'advantages', dtype: F, shape: ['rows'] },
      ...(cols.old ? [{ name: 'old_token_logps', dtype: F, shape: ['rows', 'len'] }] : []),
      ...(cols.ref ? [{ name: 'ref_token_logps', dtype: F, shape: ['rows', 'len'] }] : []),
      ...(cols.items ? [{ name: 'num_items_in_batch', dtype: F, shape: [] }] : []),
    ] as ArtifactSpec['batchInputs'],
    optimizer: optimizerOf(o.train),
    loss: { name: 'grpo', params: p },
    modelConfig: o.config,
    recompute: recompute ? modelSegment : undefined,
    buildForward(g, params, batch, mode) {
      const base = buildCausalLM(g, o.config, new Map(Object.entries(params)), { inputIds: batch.input_ids, attentionMask: batch.attention_mask }, { lora: o.lora, attentionPieces: recompute ? 4 : undefined });
      const model = tempered(g, base, o.settings.temperature);
      const seq = sequenceLogps(g, model, batch.loss_mask, { perToken: true, stats: mode === 'train', dense: o.train.device === 'webgpu', headChunks: recompute ? headChunksOf(o.config) : 1 });
      const lp = seq.tokenLogps!;
      if (mode === 'eval') return { outputs: { token_logps: lp } };
      const ins: Record<string, Tensor> = {
        policy_token_logps: lp,
        old_token_logps: cols.old ? batch.old_token_logps : g.stopGradient(lp),
        advantages: batch.advantages,
        completion_mask: batch.loss_mask,
      };
      if (cols.ref) ins.ref_token_logps = batch.ref_token_logps;
      if (cols.items) ins.num_items_in_batch = batch.num_items_in_batch;
      if (cols.entropies) ins.token_entropies = seq.tokenEntropies!;
      const r = g.scope('loss', () => o.loss.emit(g, ins, 'grpo'));
      const metrics = { ...r.metrics };
      if (!metrics.entropy && seq.entropySum) {
        const tokens = g.reduceSum(g.stopGradient(seq.tokens), undefined, false);
        metrics.entropy = g.div(g.reduceSum(seq.entropySum, undefined, false), g.max(tokens, g.constant(1, F)));
      }
      return { loss: r.loss, metrics };
    },
  };
}
