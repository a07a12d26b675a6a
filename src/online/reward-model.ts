/**
 * Reward models: a causal LM with a scalar head (`value_head.weight [D]`, `value_head.bias [1]`) read
 * at the last token of prompt ++ response (the response ends with EOS or the template's end-of-turn,
 * so the head sees the whole answer). Trained with the Bradley–Terry loss on preference pairs,
 *
 *   L = −log σ(r(x, y_w) − r(x, y_l))     (mean over pairs),
 *
 * as in "Training language models to follow instructions with human feedback" (2022). The folder is
 * an ordinary HF model folder whose safetensors also hold the head, plus `reward_model.json`.
 */
import { existsSync, mkdirSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import * as arrow from 'apache-arrow';
import { readCanonical, writeCanonical } from '../../datasets/parquet.ts';
import { orderColumns } from '../../datasets/schema.ts';
import { buildArtifacts, type ArtifactSpec } from '../artifacts/build.ts';
import { TrainingArtifacts } from '../artifacts/training.ts';
import { UserError } from '../errors.ts';
import { startProgress } from '../progress.ts';
import { buildCausalLM, valueHead, type LoraConfig } from '../models/index.ts';
import { loadModel } from '../models/load.ts';
import type { ModelConfig } from '../models/config.ts';
import type { FloatTensor } from '../models/checkpoint.ts';
import { modelParameterShapes, parameterInitializers, VALUE_HEAD_WEIGHT } from '../models/params.ts';
import { Graph, type Tensor } from '../onnx/graph.ts';
import { lrAt } from '../optim/schedule.ts';
import { Session, toOrt, type Feeds, type RuntimeOptions } from '../runtime/session.ts';
import { loadTokenizer, tokenizePromptResponse, type LoadedTokenizer } from '../tokenize/index.ts';
import { resolveConfig, type TrainConfig } from '../train/config.ts';
import { loadData, tokenizeExamples, type LoadedData, type TokenizedExample } from '../../datasets/examples.ts';
import type { Text } from '../../datasets/schema.ts';
import { SeededRandom } from '../random.ts';
import { negLogSigmoid } from '../../losses/core/ops.ts';
import { artifactsOf, checkDeviceOf, loraOf, modelParamSpecs, optimizerOf, runtimeOf, saveModelFolder, startingParams, stepPlan, type LoopOptions } from '../train/run.ts';
import { writeJsonAtomic } from '../io/atomic.ts';

export const REWARD_MODEL_FILE = 'reward_model.json';

/** Token sequences of (prompt, response) pairs, right-padded to a multiple of `padTo`. */
function batchFeeds(seqs: number[][], padId: number, padTo: number): { feeds: Feeds; tokens: number } {
  const N = seqs.length;
  const T = Math.ceil(Math.max(2, ...seqs.map((s) => s.length)) / padTo) * padTo;
  const ids = new BigInt64Array(N * T).fill(BigInt(padId));
  const mask = new BigInt64Array(N * T);
  const last = new BigInt64Array(N);
  let tokens = 0;
  seqs.forEach((s, n) => {
    s.forEach((id, t) => {
      ids[n * T + t] = BigInt(id);
      mask[n * T + t] = 1n;
    });
    last[n] = BigInt(s.length - 1);
    tokens += s.length;
  });
  return {
    feeds: { input_ids: toOrt('int64', ids, [N, T]), attention_mask: toOrt('int64', mask, [N, T]), value_index: toOrt('int64', last, [N]) },
    tokens,
  };
}

/** r(x, y) per sequence `[N]` from a built graph's inputs. */
function rewardOf(g: Graph, config: ModelConfig, params: Map<string, Tensor>, batch: Record<string, Tensor>, lora: LoraConfig | null): Tensor {
  const model = buildCausalLM(g, config, params, { inputIds: batch.input_ids, attentionMask: batch.attention_mask }, { lora });
  return valueHead(g, model, params, batch.value_index);
}

/** A trained reward model, scoring (prompt, response) texts. */
export class RewardModel {
  private constructor(
    readonly dir: string,
    private readonly tok: LoadedTokenizer,
    private readonly session: Session,
    private readonly padTo: number,
  ) {}

  static async load(dir: string, runtime?: RuntimeOptions): Promise<RewardModel> {
    if (!existsSync(join(dir, 'config.json'))) throw new UserError(`${dir}: not a model folder (no config.json)`);
    let m;
    try {
      m = loadModel(dir, { valueHead: true });
    } catch (e) {
      if (e instanceof UserError && e.message.includes(VALUE_HEAD_WEIGHT)) {
        throw new UserError(`${dir}: has no reward head (${VALUE_HEAD_WEIGHT}); train one with \`prefzoo reward-train\``);
      }
      throw e;
    }
    const g = new Graph('prefzoo_reward');
    const batch = {
      input_ids: g.input('input_ids', 'int64', ['batch', 'seq']),
      attention_mask: g.input('attention_mask', 'int64', ['batch', 'seq']),
      value_index: g.input('value_index', 'int64', ['batch']),
    };
    const params = parameterInitializers(g, m.weights, modelParameterShapes(m.config, { valueHead: true }).keys());
    g.output(rewardOf(g, m.config, params, batch, null), 'reward');
    return new RewardModel(dir, loadTokenizer(dir), await Session.fromGraph(g, runtime), 16);
  }

  /** r(prompt, response) per item, `batchSize` sequences per forward pass. */
  async score(items: readonly { prompt: Text; response: Text }[], batchSize = 32): Promise<number[]> {
    const seqs = items.map((x) => {
      const t = tokenizePromptResponse(this.tok, x.prompt, x.response);
      return [...t.promptIds, ...t.responseIds];
    });
    const out = new Array<number>(items.length);
    const order = seqs.map((_, i) => i).sort((a, b) => seqs[a].length - seqs[b].length);
    for (let s = 0; s < order.length; s += batchSize) {
      const idx = order.slice(s, s + batchSize);
      const { feeds } = batchFeeds(idx.map((i) => seqs[i]), this.tok.padId ?? 0, this.padTo);
      const r = (await this.session.run(feeds)).reward.data as Float32Array;
      idx.forEach((i, k) => (out[i] = r[k]));
    }
    return out;
  }

  async release(): Promise<void> {
    await this.session.release();
  }
}

/** The Bradley–Terry training problem as artifacts: sequences [chosen_1..chosen_B, rejected_1..rejected_B]. */
function rewardSpec(config: ModelConfig, init: Map<string, FloatTensor>, lora: LoraConfig | null, c: TrainConfig): ArtifactSpec {
  const params = modelParamSpecs(config, init, lora, true);
  return {
    params,
    batchInputs: [
      { name: 'input_ids', dtype: 'int64', shape: ['seqs', 'len'] },
      { name: 'attention_mask', dtype: 'int64', shape: ['seqs', 'len'] },
      { name: 'value_index', dtype: 'int64', shape: ['seqs'] },
    ],
    optimizer: optimizerOf(c),
    loss: { name: 'bradley_terry' },
    modelConfig: config,
    buildForward(g, p, batch, mode) {
      const r = rewardOf(g, config, new Map(Object.entries(p)), batch, lora);
      if (mode === 'eval') return { outputs: { reward: r } };
      const two = g.reshape(r, [2, -1]);
      const rw = g.gather(two, g.constant(0, 'int64'), 0);
      const rl = g.gather(two, g.constant(1, 'int64'), 0);
      const margin = g.sub(rw, rl);
      const loss = g.reduceMean(negLogSigmoid(g, margin), undefined, false);
      const m = g.stopGradient(margin);
      return {
        loss,
        metrics: {
          accuracy: g.reduceMean(g.cast(g.greater(m, 0), 'float32'), undefined, false),
          margin: g.reduceMean(m, undefined, false),
          'rewards/chosen': g.reduceMean(g.stopGradient(rw), undefined, false),
          'rewards/rejected': g.reduceMean(g.stopGradient(rl), undefined, false),
        },
      };
    },
  };
}

export interface RewardTrainOptions extends LoopOptions {
  data: string;
  rows?: LoadedData;
}

export interface RewardTrainResult {
  dir: string;
  steps: number;
  seconds: number;
  /** Mean over the last logged steps. */
  last: Record<string, number>;
  /** Pairwise accuracy r(y_w) > r(y_l) over the training pairs with the final weights. */
  train_accuracy: number;
  /** The same on `eval_data`, when given. */
  eval_accuracy?: number;
}

/** Share of pairs the reward model orders like the data. */
export async function pairAccuracy(rm: RewardModel, examples: { prompt: Text; responses: Text[] }[]): Promise<number> {
  const r = await rm.score(examples.flatMap((e) => [{ prompt: e.prompt, response: e.responses[0] }, { prompt: e.prompt, response: e.responses[1] }]));
  let ok = 0;
  for (let i = 0; i < examples.length; i++) if (r[2 * i] > r[2 * i + 1]) ok++;
  return ok / examples.length;
}

/**
 * `prefzoo reward-train`: Bradley–Terry training of a reward head (and the model, or LoRA adapters)
 * on pairwise data, with the trainer's settings (learning_rate, batch_size, max_steps, num_epochs, …).
 */
export async function rewardTrain(o: RewardTrainOptions): Promise<RewardTrainResult> {
  const t0 = Date.now();
  const log = o.log ?? (() => {});
  const { config, lossParams } = resolveConfig({ configFile: o.configFile, params: o.params, base: o.base, command: 'reward-train' });
  const unknown = Object.keys(lossParams);
  if (unknown.length) throw new UserError(`reward-train: unknown setting ${unknown.map((k) => `"${k}"`).join(', ')} (the Bradley–Terry loss has no parameters)`);
  if (existsSync(join(o.out, REWARD_MODEL_FILE))) throw new UserError(`${o.out} already holds a reward model; choose another -o`);
  mkdirSync(o.out, { recursive: true });
  const work = join(o.out, '.work');
  const base = loadModel(o.model);
  const tok = loadTokenizer(o.model);
  const data = o.rows ?? (await loadData(o.data, work, { seed: config.seed }));
  if (data.kind !== 'pairwise') throw new UserError(`${o.data}: reward-train needs pairwise data (prompt, chosen, rejected); this is ${data.kind}`);
  const { rows } = tokenizeExamples(data.examples, tok, config);
  log(`reward-train: ${rows.length} pairs from ${o.data}`);

  const lora = loraOf(config);
  const init = startingParams(base.config, base.weights, { lora, valueHead: true, seed: config.seed });
  const artDir = join(work, 'artifacts');
  await checkDeviceOf(config);
  buildArtifacts(rewardSpec(base.config, init, lora, config), artDir, artifactsOf(config));
  const art = await TrainingArtifacts.load(artDir, runtimeOf(config, base.config));

  const perEpoch = Math.max(1, Math.floor(Math.ceil(rows.length / config.batch_size) / config.gradient_accumulation_steps));
  const { total, schedule } = stepPlan(config, perEpoch);
  let order: number[] = [];
  let cursor = 0;
  let epoch = 0;
  const nextBatch = (): TokenizedExample[] => {
    if (cursor >= order.length) {
      order = new SeededRandom(config.seed * 1000003 + epoch++).shuffle(rows.map((_, i) => i));
      cursor = 0;
    }
    const idx = order.slice(cursor, cursor + config.batch_size);
    cursor += idx.length;
    return idx.map((i) => rows[i]);
  };
  const metricsFile = join(o.out, 'metrics.jsonl');
  writeFileSync(metricsFile, '');
  const progress = startProgress(o.progress, 'reward-train', total, o.quiet);
  let last: Record<string, number> = {};
  for (let step = 1; step <= total; step++) {
    const sums: Record<string, number> = {};
    for (let k = 0; k < config.gradient_accumulation_steps; k++) {
      const b = nextBatch();
      const seqs = [0, 1].flatMap((j) => b.map((r) => [...r.promptIds, ...r.responseIds[j]]));
      const m = await art.computeGradients(batchFeeds(seqs, tok.padId ?? 0, config.pad_to_multiple_of).feeds);
      for (const [key, v] of Object.entries(m)) sums[key] = (sums[key] ?? 0) + v / config.gradient_accumulation_steps;
    }
    if (!Number.isFinite(sums.loss)) {
      progress.stop();
      await art.release();
      throw new UserError(`reward-train: loss is ${sums.loss} at step ${step}; lower learning_rate`);
    }
    const lr = lrAt(step, schedule);
    const { gradNorm } = await art.optimizerStep(lr);
    last = { step, ...sums, grad_norm: gradNorm, learning_rate: lr };
    if (step % config.logging_steps === 0 || step === total) writeFileSync(metricsFile, JSON.stringify(last) + '\n', { flag: 'a' });
    progress.update(step, { loss: sums.loss, acc: sums.accuracy });
  }
  progress.stop();
  const weights = new Map<string, FloatTensor>();
  await art.toHost();
  for (const p of art.manifest.params) weights.set(p.name, { shape: p.shape, data: Float32Array.from(art.param(p.name) as Float32Array) });
  await art.release();
  saveModelFolder(o.out, weights, { config: base.config, lora, sourceDir: o.model, dtype: config.save_dtype, into: true });
  rmSync(join(work, 'artifacts'), { recursive: true, force: true });
  const rm = await RewardModel.load(o.out, runtimeOf(config, base.config));
  const result: RewardTrainResult = { dir: o.out, steps: total, seconds: 0, last, train_accuracy: await pairAccuracy(rm, data.examples) };
  if (config.eval_data) {
    const ev = await loadData(config.eval_data, work, { seed: config.seed, kind: 'pairwise' });
    result.eval_accuracy = await pairAccuracy(rm, ev.examples);
  }
  await rm.release();
  result.seconds = Math.round((Date.now() - t0) / 100) / 10;
  writeJsonAtomic(join(o.out, REWARD_MODEL_FILE), { base_model: o.model, data: o.data, loss: 'bradley_terry', ...config, result });
  log(`reward-train: ${total} steps in ${result.seconds}s; pair accuracy ${result.train_accuracy.toFixed(3)} (train)${result.eval_accuracy !== undefined ? `, ${result.eval_accuracy.toFixed(3)} (eval)` : ''}`);
  return result;
}

/** Reads `reward_model.json` of a folder, if any. */
export function rewardModelInfo(dir: string): Record<string, unknown> | null {
  const f = join(dir, REWARD_MODEL_FILE);
  return existsSync(f) ? JSON.parse(readFileSync(f, 'utf8')) : null;
}

export interface ScorePairsResult {
  rows: number;
  /** Share of pairs the reward model scores chosen above rejected. */
  agreement: number;
  out: string;
}

/**
 * Adds `chosen_score`/`rejected_score` (Float64, replacing any present) from a reward model to a
 * pairwise dataset and writes it as canonical Parquet: the input MPO's easy/hard split reads.
 */
export async function scorePairs(o: { rewardModel: string; data: string; out: string; runtime?: RuntimeOptions }): Promise<ScorePairsResult> {
  const work = mkdtempSync(join(tmpdir(), 'prefzoo-score-'));
  try {
    const data = await loadData(o.data, work, { kind: 'pairwise' });
    const rm = await RewardModel.load(o.rewardModel, o.runtime);
    const r = await rm.score(data.examples.flatMap((e) => [{ prompt: e.prompt, response: e.responses[0] }, { prompt: e.prompt, response: e.responses[1] }]));
    await rm.release();
    const n = data.examples.length;
    const chosen = Float64Array.from({ length: n }, (_, i) => r[2 * i]);
    const rejected = Float64Array.from({ length: n }, (_, i) => r[2 * i + 1]);
    const table = data.table ?? (await readCanonical(data.files)).table;
    const cols: Record<string, arrow.Vector> = {};
    for (const f of table.schema.fields) if (f.name !== 'chosen_score' && f.name !== 'rejected_score') cols[f.name] = table.getChild(f.name)!;
    cols.chosen_score = arrow.makeVector(chosen);
    cols.rejected_score = arrow.makeVector(rejected);
    const order = orderColumns('pairwise', Object.keys(cols));
    const scored = new arrow.Table(Object.fromEntries(order.map((k) => [k, cols[k]])));
    await writeCanonical(scored, { ...data.meta, source_format: `${data.meta.source_format}+reward_scores` }, o.out);
    let agree = 0;
    for (let i = 0; i < n; i++) if (chosen[i] > rejected[i]) agree++;
    return { rows: n, agreement: agree / n, out: o.out };
  } finally {
    rmSync(work, { recursive: true, force: true });
  }
}
