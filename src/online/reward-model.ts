/**
 * Reward models: a causal LM with a scalar head (`value_head.weight [D]`, `value_head.bias [1]`) read
 * at the last token of prompt ++ response (the response ends with EOS or the template's end-of-turn,
 * so the head sees the whole answer). Trained with the Bradley–Terry loss of the registry
 * (losses/bradley_terry.ts) on preference pairs, L = −log σ(r(x, y_w) − r(x, y_l)), mean over pairs. The folder is
 * an ordinary HF model folder whose safetensors also hold the head, plus `reward_model.json`.
 */
import { existsSync, mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import * as arrow from '../../datasets/arrow.ts';
import { readCanonical, writeCanonical } from '../../datasets/parquet.ts';
import { orderColumns } from '../../datasets/schema.ts';
import type { ArtifactSpec } from '../artifacts/build.ts';
import { UserError } from '../errors.ts';
import { buildCausalLM, valueHead, type LoraConfig } from '../models/index.ts';
import { loadModel } from '../models/load.ts';
import type { ModelConfig } from '../models/config.ts';
import type { FloatTensor } from '../models/checkpoint.ts';
import { modelParameterShapes, parameterInitializers, VALUE_HEAD_WEIGHT } from '../models/params.ts';
import { Graph, type Tensor } from '../onnx/graph.ts';
import { Session, toOrt, type Feeds, type RuntimeOptions } from '../runtime/session.ts';
import { loadTokenizer, tokenizePromptResponse, type LoadedTokenizer } from '../tokenize/index.ts';
import { resolveConfig, type TrainConfig } from '../train/config.ts';
import { loadData, tokenizeExamples, type LoadedData, type TokenizedExample } from '../../datasets/examples.ts';
import type { Text } from '../../datasets/schema.ts';
import { resolveLoss } from '../../losses/index.ts';
import { modelParamSpecs, optimizerOf, runtimeOf, saveModelFolder } from '../train/run.ts';
import { runOnline, type OnlineContext, type OnlineMethod, type OnlineOptions } from '../train/loop.ts';
import { writeJsonAtomic } from '../io/atomic.ts';
import { declareCommand, ONLINE_LOOP_SETTINGS } from '../train/settings.ts';

/** The reward model is saved into the output folder itself, merged: save_merged and save_adapter do not apply. */
declareCommand('reward-train', {
  honours: [...ONLINE_LOOP_SETTINGS.filter((k) => k !== 'save_merged' && k !== 'save_adapter'), 'max_length', 'max_prompt_length', 'truncation', 'max_samples', 'eval_data', 'eval_steps', 'eval_samples'],
  lossParams: 'none',
});

export const REWARD_MODEL_FILE = 'reward_model.json';

/** The loss of the registry reward models train with (losses/bradley_terry.ts). */
const BRADLEY_TERRY = resolveLoss('bradley_terry', {});

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
      return BRADLEY_TERRY.emit(g, { chosen_rewards: rw, rejected_rewards: rl }, 'reward_pairs');
    },
  };
}

export interface RewardTrainOptions extends OnlineOptions {
  data: string;
  /** Settings by name, typed (as `--param` takes them, after `params`). */
  settings?: Readonly<Record<string, unknown>>;
  rows?: LoadedData;
}

export interface RewardTrainResult {
  dir: string;
  steps: number;
  seconds: number;
  /** The last step's metrics row. */
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

/** Sequences [chosen_1..chosen_B, rejected_1..rejected_B] of pairs: the layout the Bradley–Terry graph reads. */
function pairSeqs(rows: readonly TokenizedExample[]): number[][] {
  return [0, 1].flatMap((j) => rows.map((r) => [...r.promptIds, ...r.responseIds[j]]));
}

/**
 * `prefzoo reward-train`: Bradley–Terry training of a reward head (and the model, or LoRA adapters)
 * on pairwise data, with the trainer's settings (learning_rate, batch_size, max_steps, num_epochs,
 * save_steps, eval_data/eval_steps, …), on the training loop (src/train/loop.ts): every pair once per epoch in
 * a seeded shuffle, checkpoints under OUT/checkpoints, --resume bit-exact. The reward model is written
 * into `out` itself (HF layout with value_head.*), with reward_model.json last.
 */
export async function rewardTrain(o: RewardTrainOptions): Promise<RewardTrainResult> {
  const { config, lossParams } = resolveConfig({ configFile: o.configFile, params: o.params, settings: o.settings, base: o.base, command: 'reward-train' });
  // The settings it honours are declared in train/settings.ts ('reward-train'); resolveConfig refuses the others.
  const unknown = Object.keys(lossParams);
  if (unknown.length) throw new UserError(`reward-train: unknown setting ${unknown.map((k) => `"${k}"`).join(', ')} (the Bradley–Terry loss has no parameters)`);
  if (existsSync(join(o.out, REWARD_MODEL_FILE))) throw new UserError(`${o.out} already holds a reward model; choose another -o`);
  let examples: LoadedData['examples'] = [];
  let evalRows: TokenizedExample[] | null = null;
  const B = config.batch_size;
  /** Pair accuracy and loss of the live weights on eval_data, through the artifacts' eval graph. */
  const evaluate = async (ctx: OnlineContext): Promise<Record<string, number>> => {
    if (!evalRows) {
      const ev = await loadData(config.eval_data, join(ctx.run, 'data'), { seed: config.seed, kind: 'pairwise', maxRows: config.eval_samples });
      evalRows = tokenizeExamples(ev.examples, ctx.tok, config).rows;
    }
    let ok = 0;
    let loss = 0;
    for (let s = 0; s < evalRows.length; s += B) {
      const batch = evalRows.slice(s, s + B);
      const out = await ctx.art.evaluate(batchFeeds(pairSeqs(batch), ctx.tok.padId ?? 0, config.pad_to_multiple_of).feeds);
      const r = out.reward.data as Float32Array;
      batch.forEach((_, i) => {
        const margin = r[i] - r[batch.length + i];
        if (margin > 0) ok++;
        loss += Math.log1p(Math.exp(-Math.abs(margin))) + Math.max(0, -margin);
      });
    }
    return { accuracy: ok / evalRows.length, loss: loss / evalRows.length };
  };
  const method: OnlineMethod<TokenizedExample, { seqs: number[][] }> = {
    name: 'reward-train',
    valueHead: true,
    // Offline rows: every pair once per epoch, the last round short, as in the trainer.
    partialRounds: true,
    spec: (s) => rewardSpec(s.model, s.init, s.lora, s.config),
    async collect(_ctx, rows) {
      // Micro-batches of batch_size pairs, each laid out [chosen…, rejected…].
      const seqs: number[][] = [];
      for (let k = 0; k < rows.length; k += B) seqs.push(...pairSeqs(rows.slice(k, k + B)));
      return { seqs };
    },
    async microBatches(ctx, r) {
      const out = [];
      for (let k = 0; k < r.seqs.length; k += 2 * B) {
        const b = batchFeeds(r.seqs.slice(k, k + 2 * B), ctx.tok.padId ?? 0, config.pad_to_multiple_of);
        out.push({ feeds: b.feeds, tokens: b.tokens });
      }
      return out;
    },
    progressFields: (row) => ({ loss: row.loss, acc: row.accuracy }),
    evaluate,
    async save(ctx, weights) {
      saveModelFolder(o.out, weights, { config: ctx.model, lora: ctx.lora, sourceDir: o.model, dtype: config.save_dtype, into: true });
      return o.out;
    },
  };
  const r = await runOnline(
    o,
    async ({ run, tok, info }) => {
      const data = o.rows ?? (await loadData(o.data, join(run, 'data'), { seed: config.seed, maxRows: config.max_samples }));
      if (data.kind !== 'pairwise') throw new UserError(`${o.data}: reward-train needs pairwise data (prompt, chosen, rejected); this is ${data.kind}`);
      examples = data.examples;
      const { rows, truncated } = tokenizeExamples(data.examples, tok, config, data.tokens);
      info(`reward-train: ${rows.length} pairs from ${o.data}${truncated ? `, ${truncated} truncated` : ''}`);
      return rows;
    },
    method,
    { config, record: { data: o.data, loss: 'bradley_terry' }, inputs: o.rows ? [] : [{ key: 'data', now: o.data, flag: '--data' }] },
  );
  // The training graphs are not part of the model folder.
  rmSync(join(o.out, 'artifacts'), { recursive: true, force: true });
  const rm = await RewardModel.load(o.out, runtimeOf(config));
  const result: RewardTrainResult = { dir: o.out, steps: r.steps, seconds: 0, last: r.last, train_accuracy: await pairAccuracy(rm, examples) };
  await rm.release();
  if (r.eval) result.eval_accuracy = r.eval.accuracy;
  result.seconds = r.seconds;
  writeJsonAtomic(join(o.out, REWARD_MODEL_FILE), { base_model: o.model, data: o.data, loss: 'bradley_terry', ...config, result });
  o.reporter?.info(`reward-train: ${r.steps} steps in ${result.seconds}s; pair accuracy ${result.train_accuracy.toFixed(3)} (train)${result.eval_accuracy !== undefined ? `, ${result.eval_accuracy.toFixed(3)} (eval)` : ''}`);
  return result;
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
