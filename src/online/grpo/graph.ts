/**
 * GRPO's training graph: completions [B, T] → per-token log-probs (and entropies) of the tempered
 * logits → the bound `grpo` loss (losses/grpo.ts), fed the sampler's log-probs, the entropy
 * controller's scalars and the other columns the loss reads. Its eval graph outputs the per-token
 * log-probs: the old ones when num_iterations > 1.
 */
import type { ArtifactSpec } from '../../artifacts/build.ts';
import type { Tensor } from '../../onnx/graph.ts';
import { buildCausalLM, type LoraConfig } from '../../models/index.ts';
import type { ModelConfig } from '../../models/config.ts';
import type { FloatTensor } from '../../models/checkpoint.ts';
import { headChunksOf, sequenceLogps } from '../../models/logps.ts';
import type { TrainConfig } from '../../train/config.ts';
import { modelSegment } from '../../train/graph.ts';
import { modelParamSpecs, optimizerOf } from '../../train/run.ts';
import type { BoundLoss } from '../../../losses/index.ts';
import { distillCoef, entropyBonusOn, entropyMaskGraph, type GrpoParams } from '../../../losses/grpo.ts';
import { tempered } from '../reference.ts';
import type { GrpoSettings } from './settings.ts';

/** Which optional columns a batch carries, given the loss's parameters and the settings. */
export interface Columns {
  /** old_token_logps (num_iterations > 1; else the live log-probs, detached). */
  old: boolean;
  /** ref_token_logps (beta > 0). */
  ref: boolean;
  /** teacher_token_logps (distill_coef > 0: `--teacher`'s log-probs of the sampled tokens). */
  teacher: boolean;
  /** num_items_in_batch (dapo, cispo, vespo: normalised by the round's completion tokens). */
  items: boolean;
  /** token_entropies reach the loss (top_entropy_quantile < 1, or the entropy bonus). */
  entropies: boolean;
  /** The entropy bonus is on (entropy_coef ≠ 0 or use_adaptive_entropy): token_entropies carry their gradient. */
  bonus: boolean;
  /** use_adaptive_entropy: the batch scalars entropy_coef and last_world_entropy, fed every step by the controller. */
  adaptive: boolean;
  /** sampling_token_logps: the sampler–trainer correction or the off-policy mask reads them. */
  sampling: boolean;
}

export function columnsOf(p: GrpoParams, s: GrpoSettings): Columns {
  const bonus = entropyBonusOn(p);
  return {
    old: s.num_iterations > 1,
    ref: p.beta > 0,
    teacher: distillCoef(p) > 0,
    items: p.loss_type === 'dapo' || p.loss_type === 'cispo' || p.loss_type === 'vespo',
    entropies: p.top_entropy_quantile < 1 || bonus,
    bonus,
    adaptive: p.use_adaptive_entropy,
    sampling: p.vllm_importance_sampling_correction || p.off_policy_mask_threshold !== null,
  };
}

/**
 * Graph metrics the controller reads and the metrics rows leave out (a leading `_`, train/loop.ts):
 * the step's entropy Σ H·m̃ and its token count Σ m̃, m̃ the tokens the bonus counts. Each is the
 * mean over the step's micro-batches, so their ratio is the step's pooled mean entropy.
 */
export const ENTROPY_SUM = '_entropy_sum';
export const ENTROPY_TOKENS = '_entropy_tokens';

export interface SpecOptions {
  config: ModelConfig;
  init: Map<string, FloatTensor>;
  lora: LoraConfig | null;
  train: TrainConfig;
  loss: BoundLoss;
  settings: GrpoSettings;
  /** Ids the sampler draws from (below the tokenizer's vocabulary size): log-probs and entropies are of that distribution. */
  vocabLimit?: number;
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
      ...(cols.teacher ? [{ name: 'teacher_token_logps', dtype: F, shape: ['rows', 'len'] }] : []),
      ...(cols.items ? [{ name: 'num_items_in_batch', dtype: F, shape: [] }] : []),
      ...(cols.sampling ? [{ name: 'sampling_token_logps', dtype: F, shape: ['rows', 'len'] }] : []),
      ...(cols.adaptive ? [{ name: 'entropy_coef', dtype: F, shape: [] }, { name: 'last_world_entropy', dtype: F, shape: [] }] : []),
    ] as ArtifactSpec['batchInputs'],
    optimizer: optimizerOf(o.train),
    loss: { name: 'grpo', params: p },
    modelConfig: o.config,
    recompute: recompute ? modelSegment : undefined,
    buildForward(g, params, batch, mode) {
      const base = buildCausalLM(g, o.config, new Map(Object.entries(params)), { inputIds: batch.input_ids, attentionMask: batch.attention_mask }, { lora: o.lora, attentionPieces: recompute ? 4 : undefined });
      const model = tempered(g, base, o.settings.temperature);
      const train = mode === 'train';
      // With the entropy bonus the per-token entropies stay differentiable: the bonus's gradient reaches the weights.
      const seq = sequenceLogps(g, model, batch.loss_mask, { perToken: true, stats: train, entropyGrad: train && cols.bonus, dense: o.train.device === 'webgpu', headChunks: recompute ? headChunksOf(o.config) : 1, vocabLimit: o.vocabLimit });
      const lp = seq.tokenLogps!;
      if (mode === 'eval') return { outputs: { token_logps: lp } };
      const old = cols.old ? batch.old_token_logps : g.stopGradient(lp);
      const ins: Record<string, Tensor> = {
        policy_token_logps: lp,
        old_token_logps: old,
        advantages: batch.advantages,
        completion_mask: batch.loss_mask,
      };
      if (cols.ref) ins.ref_token_logps = batch.ref_token_logps;
      if (cols.teacher) ins.teacher_token_logps = batch.teacher_token_logps;
      if (cols.items) ins.num_items_in_batch = batch.num_items_in_batch;
      if (cols.entropies) ins.token_entropies = seq.tokenEntropies!;
      // Tokens the policy did not sample (masked: tool results, padding) read the old log-prob: ratio 1, drift 0.
      if (cols.sampling) ins.sampling_token_logps = g.where(g.greater(batch.loss_mask, 0.5), batch.sampling_token_logps, old);
      if (cols.adaptive) {
        ins.entropy_coef = batch.entropy_coef;
        ins.last_world_entropy = batch.last_world_entropy;
      }
      const r = g.scope('loss', () => o.loss.emit(g, ins, 'grpo'));
      const metrics = { ...r.metrics };
      if (cols.adaptive) {
        const h = g.stopGradient(seq.tokenEntropies!);
        const em = p.top_entropy_quantile < 1 ? entropyMaskGraph(g, h, batch.loss_mask, p.top_entropy_quantile) : batch.loss_mask;
        metrics[ENTROPY_SUM] = g.reduceSum(g.mul(h, em), undefined, false);
        metrics[ENTROPY_TOKENS] = g.reduceSum(em, undefined, false);
      }
      if (!metrics.entropy && seq.entropySum) {
        const tokens = g.reduceSum(g.stopGradient(seq.tokens), undefined, false);
        metrics.entropy = g.div(g.reduceSum(seq.entropySum, undefined, false), g.max(tokens, g.constant(1, F)));
      }
      return { loss: r.loss, metrics };
    },
  };
}
