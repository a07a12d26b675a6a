/**
 * The training problem as an artifact spec: model forward → per-sequence log-probs → the loss
 * terms of the chosen loss (or weighted mixture) on those statistics → scalar loss + TRL metrics.
 * The eval graph of the same spec outputs the per-sequence log-probs (and values, for DRO).
 */
import type { Kind } from '../../datasets/schema.ts';
import type { BatchTensors } from '../../losses/core/types.ts';
import type { BoundLoss } from '../../losses/index.ts';
import type { ArtifactSpec, BatchInputSpec } from '../artifacts/build.ts';
import type { OptimizerConfig } from '../optim/config.ts';
import { attr, type Graph, type Node, type Tensor } from '../onnx/graph.ts';
import type { ModelConfig } from '../models/config.ts';
import type { BaseTensor } from '../models/quantize-base.ts';
import { buildCausalLM, valueHead, type LoraConfig } from '../models/index.ts';
import type { Chunking } from '../models/layers.ts';
import { headChunksOf, scoredLogps, sequenceLogps, type SequenceLogps } from '../models/logps.ts';
import { modelParamSpecs } from './run.ts';
import { canPack } from '../models/batch.ts';

export interface TrainProblem {
  config: ModelConfig;
  kind: Kind;
  /** The loss (or weighted mixture) with its parameters bound. */
  loss: BoundLoss;
  lora: LoraConfig | null;
  /** Whether any term reads values V(x) (DRO): adds the value head. */
  valueHead: boolean;
  /** Which optional batch columns the data provides (chosen_scores, win_probs, labels, …). */
  dataKeys: Set<string>;
  /** KTO: the batch also holds each row's mismatched sequence for the KL estimate. */
  kl?: boolean;
  /** Pairwise and listwise: each example's responses share one computed prompt (src/models/batch.ts). */
  packed?: boolean;
  /** Recompute each layer's activations in the backward pass (src/autodiff/recompute.ts). */
  recompute?: boolean;
  /** LoRA: frozen base weights held in float16 (TrainConfig.base_dtype); default float32. */
  baseDtype?: 'float32' | 'float16';
  /** QLoRA (TrainConfig.load_in_4bit): the frozen projection weights held in 4 bits, blocks of `block` values (src/models/quantize-base.ts). */
  base4bit?: { block: number };
  /** Unpacked batches: the head over every position, no data-dependent ops (for WebGPU; see sequenceLogps). */
  dense?: boolean;
  /** LD-DPO: the log-prob sums are token-weighted, so the batch carries the token counts (`sequence_tokens`). */
  lengthWeighted?: boolean;
  /** Pairwise: the batch ends with one rationale sequence per row, and `rationale_mask [B]`. */
  rationale?: boolean;
  /** The loss reads no reference log-probs (SFT, SimPO, ORPO): the batch carries no `ref_logps`, and no reference is scored. */
  noReference?: boolean;
  /**
   * The largest micro-batch the graph is built for: `rows` × `len` input ids. Under recomputation the
   * MLP and attention then run in as many pieces as keep each tensor under glibc's 32 MiB mmap bound
   * at that shape (layers.ts TENSOR_BOUND); absent, or where a tensor already fits: the graph as without it.
   */
  longest?: BatchShape;
}

/** A micro-batch's size for chunking (TrainProblem.longest). */
export interface BatchShape {
  rows: number;
  len: number;
  /** The bound in bytes each tensor is kept under (absent: layers.ts TENSOR_BOUND); tests set it small. */
  bound?: number;
}

const F = 'float32' as const;

/** Keys of a loss's batch that the model and the collation provide; the data must provide any other. */
export const PROVIDED_KEYS: ReadonlySet<string> = new Set(['policy_chosen_logps', 'policy_rejected_logps', 'ref_chosen_logps', 'ref_rejected_logps', 'chosen_tokens', 'rejected_tokens', 'policy_logps', 'ref_logps', 'tokens', 'values', 'mask', 'scores', 'weight', 'policy_rationale_logps', 'rationale_mask']);

/** Names the loss reads that the batch (rather than the model) provides, by kind. */
export function batchInputSpecs(p: TrainProblem): BatchInputSpec[] {
  const model: BatchInputSpec[] = p.packed
    ? [
        { name: 'input_ids', dtype: 'int64', shape: ['rows', 'len'] },
        { name: 'position_ids', dtype: 'int64', shape: ['rows', 'len'] },
        { name: 'segment_ids', dtype: 'int64', shape: ['rows', 'len'] },
        { name: 'score_index', dtype: 'int64', shape: ['scored'] },
        { name: 'score_target', dtype: 'int64', shape: ['scored'] },
        { name: 'score_select', dtype: F, shape: ['seqs', 'scored'] },
      ]
    : [
        { name: 'input_ids', dtype: 'int64', shape: ['seqs', 'len'] },
        { name: 'attention_mask', dtype: 'int64', shape: ['seqs', 'len'] },
        { name: 'loss_mask', dtype: F, shape: ['seqs', 'len'] },
      ];
  // Rationale sequences have no reference log-prob: ref_logps is then shorter than the sequence list.
  const specs: BatchInputSpec[] = [...model, ...(p.noReference ? [] : [{ name: 'ref_logps', dtype: F, shape: [p.rationale ? 'ref_seqs' : 'seqs'] }]), { name: 'weight', dtype: F, shape: ['rows'] }];
  if (p.lengthWeighted) specs.push({ name: 'sequence_tokens', dtype: F, shape: ['seqs'] });
  const perRow = (name: string) => specs.push({ name, dtype: F, shape: ['rows'] });
  if (p.kind === 'pairwise') {
    for (const k of ['chosen_scores', 'rejected_scores', 'chosen_probs', 'rejected_probs']) if (p.dataKeys.has(k)) perRow(k);
    if (p.rationale) perRow('rationale_mask');
  } else if (p.kind === 'listwise') {
    specs.push({ name: 'scores', dtype: F, shape: ['rows', 'k'] }, { name: 'mask', dtype: F, shape: ['rows', 'k'] });
    if (p.dataKeys.has('win_probs')) specs.push({ name: 'win_probs', dtype: F, shape: ['rows', 'k'] });
  } else {
    for (const k of ['rewards', 'labels']) if (p.dataKeys.has(k)) perRow(k);
    if (p.valueHead) specs.push({ name: 'value_index', dtype: 'int64', shape: ['rows'] });
  }
  return specs;
}


/** [nB] response-major → n tensors [B]: chosen/rejected (/rationale), or KTO's own/mismatched. */
function splitN(g: Graph, x: Tensor, n: number): Tensor[] {
  const parts = g.reshape(x, [n, -1]);
  // Every part carries the per-example dim 'rows' (as weights and scores do), so gradients of the loss's elementwise ops unbroadcast statically.
  const part = (i: number) => g.op('Gather', [parts, g.constant(i, 'int64')], { axis: attr.int(0) }, [{ dtype: x.dtype, shape: ['rows'] }])[0];
  return Array.from({ length: n }, (_, k) => part(k));
}

function splitPairs(g: Graph, x: Tensor): [Tensor, Tensor] {
  const [a, b] = splitN(g, x, 2);
  return [a, b];
}

/** Batch tensors by the loss zoo's key names, from the model's statistics and the batch inputs. */
function lossInputs(g: Graph, p: TrainProblem, logp: Tensor, tokens: Tensor, batch: Record<string, Tensor>, values: Tensor | null): BatchTensors {
  // Losses that sort the batch (AOT) take no row weights.
  const ins: BatchTensors = p.loss.rowwise ? { weight: batch.weight } : {};
  if (p.kind === 'pairwise') {
    const n = p.rationale ? 3 : 2;
    [ins.policy_chosen_logps, ins.policy_rejected_logps, ins.policy_rationale_logps] = splitN(g, logp, n);
    if (!p.noReference) [ins.ref_chosen_logps, ins.ref_rejected_logps] = splitPairs(g, batch.ref_logps);
    [ins.chosen_tokens, ins.rejected_tokens] = splitN(g, tokens, n);
    if (p.rationale) ins.rationale_mask = batch.rationale_mask;
    else delete ins.policy_rationale_logps;
    for (const k of ['chosen_scores', 'rejected_scores', 'chosen_probs', 'rejected_probs']) if (batch[k]) ins[k] = batch[k];
  } else if (p.kind === 'listwise') {
    const shape = g.shapeOf(batch.mask);
    ins.policy_logps = g.reshape(logp, shape);
    if (!p.noReference) ins.ref_logps = g.reshape(batch.ref_logps, shape);
    ins.scores = batch.scores;
    ins.mask = batch.mask;
    if (batch.win_probs) ins.win_probs = batch.win_probs;
  } else if (p.kl) {
    [ins.policy_logps, ins.policy_kl_logps] = splitPairs(g, logp);
    if (!p.noReference) [ins.ref_logps, ins.ref_kl_logps] = splitPairs(g, batch.ref_logps);
    ins.tokens = splitPairs(g, tokens)[0];
    if (batch.rewards) ins.rewards = batch.rewards;
    if (batch.labels) ins.labels = batch.labels;
  } else {
    ins.policy_logps = logp;
    if (!p.noReference) ins.ref_logps = batch.ref_logps;
    ins.tokens = tokens;
    if (batch.rewards) ins.rewards = batch.rewards;
    if (batch.labels) ins.labels = batch.labels;
    if (values) ins.values = values;
  }
  return ins;
}

/** Recomputation segments of the model graphs: one per decoder layer (`layers.i/…`, GPT-2's `h.i/…`) and head slice (`logps/head.k/…`). */
export function modelSegment(n: Node): string | null {
  return /^((layers|h)\.\d+|logps\/head\.\d+)(?=\/)/.exec(n.name)?.[0] ?? null;
}

/**
 * A float16 weight's widening to float32, or a 4-bit weight's dequantization (Params.get), is its own
 * segment: redone in the backward, not kept from the forward.
 */
export function widenSegment(n: Node): string | null {
  const widen = n.op === 'Cast' && /(^|\/)widen\//.test(n.name);
  const dequant = n.op === 'GatherBlockQuantized' && /(^|\/)dequant\//.test(n.name);
  return widen || dequant ? n.outputs[0] : null;
}

/**
 * TRL's monitoring metrics over the counted response tokens (token-weighted means, no gradient):
 * `logits/chosen` and `logits/rejected` (pairwise: the mean logit over the vocabulary, averaged
 * over the chosen or rejected tokens of the batch) and `entropy` (mean entropy in nats of the
 * predicted next-token distribution; KTO's mismatched KL sequences are left out).
 */
function tokenStatMetrics(g: Graph, p: TrainProblem, seq: SequenceLogps): Record<string, Tensor> {
  if (!seq.logitSum || !seq.entropySum) return {};
  return g.scope('token_stats', (): Record<string, Tensor> => {
    const tokens = g.stopGradient(seq.tokens);
    const ratio = (num: Tensor, den: Tensor) => g.div(g.reduceSum(num, undefined, false), g.max(g.reduceSum(den, undefined, false), g.constant(1, den.dtype)));
    if (p.kind === 'pairwise') {
      const [lc, lr] = splitPairs(g, seq.logitSum!);
      const [tc, tr] = splitPairs(g, tokens);
      return { 'logits/chosen': ratio(lc, tc), 'logits/rejected': ratio(lr, tr), entropy: ratio(seq.entropySum!, tokens) };
    }
    if (p.kl) return { entropy: ratio(splitPairs(g, seq.entropySum!)[0], splitPairs(g, tokens)[0]) };
    return { entropy: ratio(seq.entropySum!, tokens) };
  });
}

export function buildSpec(p: TrainProblem, weights: ReadonlyMap<string, BaseTensor>, optimizer: OptimizerConfig): ArtifactSpec {
  const chunking: Chunking | undefined = p.recompute && p.longest ? { ...p.longest } : undefined;
  if (p.packed && (!canPack(p.kind, p.kl) || p.valueHead)) throw new Error(`buildSpec: ${p.kind} batches${p.kl ? ' with KL pairs' : ''}${p.valueHead ? ' with a value head' : ''} cannot share prompts`);
  return {
    params: modelParamSpecs(p.config, weights, p.lora, p.valueHead, p.baseDtype, p.base4bit),
    batchInputs: batchInputSpecs(p),
    optimizer,
    loss: { name: p.loss.spec, params: Object.fromEntries(p.loss.terms.map((t) => [t.loss.name, t.params])) },
    modelConfig: p.config,
    // Read after the forward is built: only a forward that was cut into pieces sums in place.
    gemmSums: () => (chunking?.built ?? 1) > 1,
    recompute: p.recompute || p.baseDtype === 'float16' || p.base4bit ? (n) => (p.recompute ? modelSegment(n) : null) ?? widenSegment(n) : undefined,
    buildForward(g, params, batch, mode) {
      const paramMap = new Map(Object.entries(params));
      const inputs = p.packed
        ? { inputIds: batch.input_ids, packed: { positionIds: batch.position_ids, segmentIds: batch.segment_ids } }
        : { inputIds: batch.input_ids, attentionMask: batch.attention_mask };
      // Under recomputation attention also runs in pieces (at most 4 groups of key/value heads).
      // ... and, built for a known longest batch, the MLP over runs of rows and attention over blocks of queries.
      const model = buildCausalLM(g, p.config, paramMap, inputs, { lora: p.lora, attentionPieces: p.recompute ? 4 : undefined, chunking });
      const stats = mode === 'train';
      // Under recomputation the output head runs in slices too, each a segment (src/models/logps.ts);
      // the eval graph's forward then holds one slice's logits at a time as well.
      const headChunks = p.recompute ? headChunksOf(p.config) : 1;
      const seq = p.packed
        ? scoredLogps(g, model, batch.score_index, batch.score_target, batch.score_select, { stats, headChunks })
        : sequenceLogps(g, model, batch.loss_mask, { stats, dense: p.dense, headChunks });
      const logp = seq.logp;
      const tokens = p.lengthWeighted ? batch.sequence_tokens : seq.tokens;
      const values = p.valueHead && batch.value_index ? valueHead(g, model, paramMap, batch.value_index) : null;
      if (mode === 'eval') {
        const outputs: Record<string, Tensor> = { logp, tokens };
        if (values) outputs.values = values;
        return { outputs };
      }
      const ins = lossInputs(g, p, logp, tokens, batch, values);
      const r = g.scope('loss', () => p.loss.emit(g, ins, p.kind));
      return { loss: r.loss, metrics: { ...r.metrics, ...tokenStatMetrics(g, p, seq) } };
    },
  };
}
