/**
 * Nash-MD, on-policy ("Nash Learning from Human Feedback", 2023), with the `nash_md` loss of the zoo:
 * every optimizer step
 *
 *   y  ~ π_θ(·|x)                                   (the current weights, fed straight to the decoder)
 *   y′ ~ softmax((1−m)·logits_θ + m·logits_ref)     (the geometric mixture with the reference)
 *   P  = P(y ≻ y′ | x)                              (the judge)
 *   L  = β·stopgrad(ℓ(y))·logp(y) − (P − ½)·logp(y),  ℓ = logp − ref
 *
 * Samples are token ids, so the step trains on exactly what was generated (no re-tokenization).
 * Settings are the trainer's (learning_rate, batch_size = prompts per step, max_steps or num_epochs
 * over the prompts, gradient_accumulation_steps, save_steps, lora_r, …) plus the loss's `beta` and
 * `mixture_coef`; settings it does not use (eval_data, max_length, …) are refused. It runs on the
 * training loop (src/train/loop.ts): one round = batch_size × gradient_accumulation_steps prompts, one update.
 * Run folder: config.json, artifacts/, checkpoints/step-N (every save_steps; --resume continues
 * bit-exact), metrics.jsonl, final/ (HF layout).
 */
import type { ArtifactSpec } from '../artifacts/build.ts';
import { buildCausalLM, type LoraConfig } from '../models/index.ts';
import type { ModelConfig } from '../models/config.ts';
import type { FloatTensor } from '../models/checkpoint.ts';
import { sequenceLogps } from '../models/logps.ts';
import { toOrt } from '../runtime/session.ts';
import { collate } from '../models/batch.ts';
import { resolveConfig, type TrainConfig } from '../train/config.ts';
import type { TokenizedExample } from '../../datasets/examples.ts';
import type { Text } from '../../datasets/schema.ts';
import { resolveLoss, type BoundLoss } from '../../losses/index.ts';
import { Decoder } from '../models/generate.ts';
import { withJudge, type Judge } from './judges.ts';
import { ReferenceScorer } from './reference.ts';
import { sampleWith } from './policy.ts';
import { modelParamSpecs, optimizerOf, runtimeOf } from '../train/run.ts';
import { declareCommand, ONLINE_LOOP_SETTINGS, ROLLOUT, type SettingsOf } from '../train/settings.ts';
import { fromAliases, samplerOptions, samplingSettings, type SamplingAliases } from './sampling.ts';

/** Nash-MD's own settings: sampling one completion per prompt (and its mixture), 64 tokens at most unless told. */
export const NASH_MD_SETTINGS = samplingSettings(['max_completion_length', 'temperature', 'top_p', 'top_k'], { max_completion_length: 64 });
declareCommand('nash-md', { honours: [...ONLINE_LOOP_SETTINGS, ...ROLLOUT], own: NASH_MD_SETTINGS, lossParams: 'nash_md' });
import { runOnline, type OnlineMethod, type OnlineOptions } from '../train/loop.ts';

/** `params`: trainer settings and the loss's `beta`, `mixture_coef`, as `key=value`. */
export interface NashMdOptions extends SamplingAliases, OnlineOptions {
  prompts: readonly Text[];
  /** The judge, or its spec (`task`, `reward:DIR`, `cmd:COMMAND`): then loaded on the run's device and released at the end. */
  judge: Judge | string;
  /** Settings by name, typed (as `--param` takes them, after `params`). */
  settings?: Readonly<Record<string, unknown>>;
  /** The prompts file, recorded in config.json (a --resume must name the same). */
  promptsFile?: string;
}

export interface NashMdResult {
  finalDir: string;
  steps: number;
  seconds: number;
  last: Record<string, number>;
}

/** Training graph: sequences [y_1..y_B] → logp(y) → the bound `nash_md` loss with `ref_logps`, `probs`. */
function nashMdSpec(config: ModelConfig, init: Map<string, FloatTensor>, lora: LoraConfig | null, c: TrainConfig, loss: BoundLoss): ArtifactSpec {
  return {
    params: modelParamSpecs(config, init, lora, false),
    batchInputs: [
      { name: 'input_ids', dtype: 'int64', shape: ['rows', 'len'] },
      { name: 'attention_mask', dtype: 'int64', shape: ['rows', 'len'] },
      { name: 'loss_mask', dtype: 'float32', shape: ['rows', 'len'] },
      { name: 'ref_logps', dtype: 'float32', shape: ['rows'] },
      { name: 'probs', dtype: 'float32', shape: ['rows'] },
    ],
    optimizer: optimizerOf(c),
    loss: { name: 'nash_md', params: loss.terms[0].params },
    modelConfig: config,
    buildForward(g, p, batch, mode) {
      const model = buildCausalLM(g, config, new Map(Object.entries(p)), { inputIds: batch.input_ids, attentionMask: batch.attention_mask }, { lora });
      const { logp, tokens } = sequenceLogps(g, model, batch.loss_mask);
      if (mode === 'eval') return { outputs: { logp, tokens } };
      const r = loss.emit(g, { policy_logps: logp, ref_logps: batch.ref_logps, probs: batch.probs }, 'nash_md');
      return { loss: r.loss, metrics: { ...r.metrics, 'logps/policy': g.reduceMean(g.stopGradient(logp), undefined, false) } };
    },
  };
}

/** One Nash-MD round: y ~ π_θ per prompt (token ids), P(y ≻ y′) from the judge, log π_ref(y). */
interface NashMdRound {
  promptIds: number[][];
  ids: number[][];
  prompts: Text[];
  responses: string[];
  probs: number[];
  refLogps: number[];
}

export async function runNashMd(o: NashMdOptions): Promise<NashMdResult> {
  // The older names (--max-new-tokens, --temperature, …) are the sampling settings under another name.
  const settings = { ...fromAliases(o), ...o.settings };
  const runtime = () => runtimeOf(resolveConfig({ configFile: o.configFile, params: o.params, settings, base: o.base, command: 'nash-md' }).config);
  return withJudge(o.judge, runtime, (judge) => nashMdWith({ ...o, settings, judge }));
}

async function nashMdWith(o: NashMdOptions & { judge: Judge }): Promise<NashMdResult> {
  const { config, lossParams, own } = resolveConfig({ configFile: o.configFile, params: o.params, settings: o.settings, base: o.base, command: 'nash-md' });
  const sampling = samplerOptions(own as unknown as SettingsOf<typeof NASH_MD_SETTINGS>);
  const loss = resolveLoss('nash_md', lossParams);
  const r = await runOnline(o, o.prompts, nashMdMethod({ config, loss, sampling, judge: o.judge }), {
    config,
    record: { prompts: o.promptsFile ?? null, judge: o.judge.name, loss: 'nash_md', loss_params: loss.terms[0].params, max_new_tokens: sampling.maxNewTokens, sampling: { temperature: sampling.temperature, top_k: sampling.topK, top_p: sampling.topP } },
    inputs: [
      ...(o.promptsFile ? [{ key: 'prompts', now: o.promptsFile, flag: '--prompts' }] : []),
      { key: 'judge', now: o.judge.name, flag: '--judge' },
    ],
  });
  return { finalDir: r.finalDir, steps: r.steps, seconds: r.seconds, last: r.last };
}

/** What Nash-MD is made of once its command's settings are resolved. */
export interface NashMdSetup {
  config: TrainConfig;
  loss: BoundLoss;
  sampling: ReturnType<typeof samplerOptions>;
  judge: Judge;
}

/** Nash-MD as a method of the online loop: `runNashMd` runs it under `nash-md`. */
export function nashMdMethod({ config, loss, sampling, judge }: NashMdSetup): OnlineMethod<Text, NashMdRound> {
  const m = loss.terms[0].params.mixture_coef as number;
  let ref: Decoder | null = null;
  let refScorer: ReferenceScorer | null = null;
  const B = config.batch_size;
  return {
    name: 'nash-md',
    spec: (s) => nashMdSpec(s.model, s.init, s.lora, s.config, loss),
    async open(ctx) {
      // π_θ decodes from the live parameters (ctx.policy(), re-pointed every round); π_ref is fixed.
      ref = await Decoder.create(ctx.model, ctx.baseWeights, { runtime: ctx.runtime, bake: true });
      refScorer = await ReferenceScorer.create(ctx.model, ctx.baseWeights, ctx.runtime);
    },
    async collect(ctx, prompts, info) {
      const policy = await ctx.policy();
      const draw = { ...sampling, n: 1 };
      // Each step's two sample streams are fixed by (seed, step): a resumed run draws the same.
      const seed = (config.seed * 7919 + info.step * 2) >>> 0;
      const ys = await sampleWith(ctx.tok, policy, prompts, { ...draw, seed });
      const yps = await sampleWith(ctx.tok, policy, prompts, { ...draw, seed: (seed + 1) >>> 0, mixture: { decoder: ref!, coef: m } });
      const probs = await judge.compare(prompts.map((prompt, i) => ({ prompt, a: ys[i].response, b: yps[i].response })));
      const refLogps = (await refScorer!.score(ys, { batchSize: B, padTo: config.pad_to_multiple_of, padId: ctx.tok.padId ?? 0 })).sums;
      return { promptIds: ys.map((y) => y.promptIds), ids: ys.map((y) => y.ids), prompts: [...prompts], responses: ys.map((y) => y.response), probs: [...probs], refLogps };
    },
    async microBatches(ctx, r) {
      const n = r.ids.length;
      const out = [];
      for (let s = 0; s < n; s += B) {
        const idx = Array.from({ length: Math.min(B, n - s) }, (_, k) => s + k);
        const rows: TokenizedExample[] = idx.map((i) => ({ promptIds: r.promptIds[i], responseIds: [r.ids[i]], src: { prompt: r.prompts[i], responses: [r.responses[i]] } }));
        const c = collate(rows, { kind: 'single', padTo: config.pad_to_multiple_of, padId: ctx.tok.padId ?? 0, dtype: 'float32', refLogps: (_, i) => [r.refLogps[idx[i]]] });
        const feeds = { input_ids: c.feeds.input_ids, attention_mask: c.feeds.attention_mask, loss_mask: c.feeds.loss_mask, ref_logps: c.feeds.ref_logps, probs: toOrt('float32', Float32Array.from(idx.map((i) => r.probs[i])), [rows.length]) };
        out.push({ feeds, tokens: c.tokens });
      }
      return out;
    },
    metrics: (r) => ({
      'objective/win_rate_vs_mixture': r.probs.reduce((a, b) => a + b, 0) / r.probs.length,
      'completions/mean_length': r.ids.reduce((a, y) => a + y.length, 0) / r.ids.length,
    }),
    progressFields: (row) => ({ loss: row.loss, win: row['objective/win_rate_vs_mixture'] }),
    async close() {
      await Promise.all([ref?.release(), refScorer?.release()]);
    },
  };
}
