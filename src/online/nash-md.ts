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
 * over the prompts, lora_r, …) plus the loss's `beta` and `mixture_coef`. Run folder: metrics.jsonl,
 * config.json, final/ (HF layout).
 */
import { existsSync, mkdirSync, rmSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { buildArtifacts, type ArtifactSpec } from '../artifacts/build.ts';
import { TrainingArtifacts } from '../artifacts/training.ts';
import { UserError } from '../errors.ts';
import { startProgress } from '../progress.ts';
import { buildCausalLM, type LoraConfig } from '../models/index.ts';
import { loadModel } from '../models/load.ts';
import type { ModelConfig } from '../models/config.ts';
import type { FloatTensor } from '../models/checkpoint.ts';
import { sequenceLogps } from '../models/logps.ts';
import { lrAt } from '../optim/schedule.ts';
import { toOrt } from '../runtime/session.ts';
import { loadTokenizer } from '../tokenize/index.ts';
import { collate } from '../models/batch.ts';
import { resolveConfig, type TrainConfig } from '../train/config.ts';
import type { TokenizedExample } from '../../datasets/examples.ts';
import type { Text } from '../../datasets/schema.ts';
import { SeededRandom } from '../random.ts';
import { Scorer } from '../models/scorer.ts';
import { resolveLoss, type BoundLoss } from '../../losses/index.ts';
import { Decoder } from '../models/generate.ts';
import type { Judge } from './judges.ts';
import { sampleWith } from './policy.ts';
import type { SamplingOptions } from '../models/sampling.ts';
import { currentWeights, artifactsOf, checkDeviceOf, loraOf, modelParamSpecs, optimizerOf, runtimeOf, saveModelFolder, startingParams, stepPlan, type LoopOptions } from '../train/run.ts';
import { writeJsonAtomic } from '../io/atomic.ts';

/** `params`: trainer settings and the loss's `beta`, `mixture_coef`, as `key=value`. */
export interface NashMdOptions extends SamplingOptions, LoopOptions {
  prompts: readonly Text[];
  judge: Judge;
  maxNewTokens: number;
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

export async function runNashMd(o: NashMdOptions): Promise<NashMdResult> {
  const t0 = Date.now();
  const log = o.log ?? (() => {});
  if (o.prompts.length === 0) throw new UserError('nash-md: no prompts');
  const { config, lossParams } = resolveConfig({ configFile: o.configFile, params: o.params, base: o.base, command: 'nash-md' });
  const loss = resolveLoss('nash_md', lossParams);
  const m = loss.terms[0].params.mixture_coef as number;
  if (existsSync(join(o.out, 'metrics.jsonl'))) throw new UserError(`${o.out} already holds a nash-md run; choose another -o`);
  mkdirSync(o.out, { recursive: true });
  await checkDeviceOf(config);
  const base = loadModel(o.model);
  const runtime = runtimeOf(config, base.config);
  const tok = loadTokenizer(o.model);
  const lora = loraOf(config);
  const init = startingParams(base.config, base.weights, { lora, seed: config.seed });
  const artDir = join(o.out, 'artifacts');
  rmSync(artDir, { recursive: true, force: true });
  buildArtifacts(nashMdSpec(base.config, init, lora, config, loss), artDir, artifactsOf(config));
  const art = await TrainingArtifacts.load(artDir, runtime);
  // π_θ decodes from the live parameters (re-pointed after every update); π_ref is fixed.
  const policy = await Decoder.create(base.config, init, { runtime, lora });
  const ref = await Decoder.create(base.config, base.weights, { runtime, bake: true });
  const refScorer = await Scorer.create(base.config, base.weights, runtime, tok.padId ?? 0);
  writeJsonAtomic(join(o.out, 'config.json'), { model: o.model, judge: o.judge.name, loss: 'nash_md', loss_params: loss.terms[0].params, max_new_tokens: o.maxNewTokens, sampling: { temperature: o.temperature, top_k: o.topK, top_p: o.topP }, ...config });

  const B = Math.min(config.batch_size, o.prompts.length);
  const perEpoch = Math.max(1, Math.floor(o.prompts.length / B));
  const { total, schedule } = stepPlan(config, perEpoch);
  let order: number[] = [];
  let cursor = 0;
  let epoch = 0;
  const metricsFile = join(o.out, 'metrics.jsonl');
  writeFileSync(metricsFile, '');
  const progress = startProgress(o.progress, 'nash-md', total, o.quiet);
  let last: Record<string, number> = {};
  for (let step = 1; step <= total; step++) {
    if (cursor + B > order.length) {
      order = new SeededRandom(config.seed * 1000003 + epoch++).shuffle(o.prompts.map((_, i) => i));
      cursor = 0;
    }
    const prompts = order.slice(cursor, cursor + B).map((i) => o.prompts[i]);
    cursor += B;
    await art.toHost(); // on the GPU: the sampler reads this step's weights on the host
    policy.setWeights((name) => art.param(name) as Float32Array);
    const sampling = { ...o, n: 1 };
    const ys = await sampleWith(tok, policy, prompts, { ...sampling, seed: (config.seed * 7919 + step * 2) >>> 0 });
    const yps = await sampleWith(tok, policy, prompts, { ...sampling, seed: (config.seed * 7919 + step * 2 + 1) >>> 0, mixture: { decoder: ref, coef: m } });
    const P = await o.judge.compare(prompts.map((prompt, i) => ({ prompt, a: ys[i].response, b: yps[i].response })));
    const rows: TokenizedExample[] = ys.map((y) => ({ promptIds: y.promptIds, responseIds: [y.ids], src: { prompt: y.prompt, responses: [y.response] } }));
    const refLogps = (await refScorer.score('single', rows, { batchSize: B, padTo: config.pad_to_multiple_of })).logps;
    const c = collate(rows, { kind: 'single', padTo: config.pad_to_multiple_of, padId: tok.padId ?? 0, dtype: 'float32', refLogps: (_, i) => refLogps[i] });
    const feeds = { input_ids: c.feeds.input_ids, attention_mask: c.feeds.attention_mask, loss_mask: c.feeds.loss_mask, ref_logps: c.feeds.ref_logps, probs: toOrt('float32', Float32Array.from(P), [rows.length]) };
    const metrics = await art.computeGradients(feeds);
    if (!Number.isFinite(metrics.loss)) {
      progress.stop();
      await Promise.all([art.release(), policy.release(), ref.release(), refScorer.release()]);
      throw new UserError(`nash-md: loss is ${metrics.loss} at step ${step}; lower learning_rate or raise beta`);
    }
    const lr = lrAt(step, schedule);
    const { gradNorm } = await art.optimizerStep(lr);
    const winRate = P.reduce((a, b) => a + b, 0) / P.length;
    last = {
      step,
      epoch: Math.round(((step * B) / o.prompts.length) * 1e4) / 1e4,
      ...metrics,
      'objective/win_rate_vs_mixture': winRate,
      'completions/mean_length': ys.reduce((a, y) => a + y.ids.length, 0) / ys.length,
      grad_norm: gradNorm,
      learning_rate: lr,
    };
    if (step % config.logging_steps === 0 || step === total) writeFileSync(metricsFile, JSON.stringify(last) + '\n', { flag: 'a' });
    progress.update(step, { loss: metrics.loss, win: winRate });
  }
  progress.stop();
  const finalDir = join(o.out, 'final');
  await art.toHost();
  saveModelFolder(finalDir, currentWeights(art), { config: base.config, lora, sourceDir: o.model, dtype: config.save_dtype });
  await Promise.all([art.release(), policy.release(), ref.release(), refScorer.release()]);
  return { finalDir, steps: total, seconds: Math.round((Date.now() - t0) / 100) / 10, last };
}
