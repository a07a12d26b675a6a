/**
 * `prefzoo demo --method sppo|nash_md|mpo`: the online methods end to end on the built-in task
 * (recall the first digit: "4719:" → "4") with its verifiable judge.
 *
 *   1. prompts: 200 for training and 100 held-out ones the training never shows
 *   2. a tiny llama is initialised and warmed up by a short SFT whose answers are a random digit of
 *      the prompt, on prompts of one to four digits (`warmStartRows`): the starting policy π_0
 *      answers with one of the prompt's digits (about 90% of its samples) and stops, with no
 *      preference among them, so it is right about a fifth of the time, chance among the prompt's
 *      digits (online methods start from such a model; from random weights no sample would ever be
 *      an answer)
 *   3. the method trains on the 200: SPPO iterations or on-policy Nash-MD with the task judge, or
 *      MPO (a reward model trained on offline pairs without scores scores them, then the two stages)
 *   4. `win_rate_vs_start`: on the held-out prompts, samples of the final policy against samples of
 *      π_0, judged (a correct answer beats a wrong one, equal correctness ties at ½);
 *      `win_rate_vs_start_train_prompts`: the same on the training prompts with fresh samples
 *   5. the figures are kept in the method's run folder (RUN/demo_eval.json, see train/demo-eval.ts),
 *      which is `run` in the result: `prefzoo report RUN` shows them with the training curves
 */
import { SILENT, type Reporter } from '../progress.ts';
import { mkdirSync, mkdtempSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { makeMeta } from '../../datasets/schema.ts';
import { UserError } from '../errors.ts';
import { initModelFolder } from '../models/init.ts';
import type { TrainConfig } from '../train/config.ts';
import type { Example, LoadedData } from '../../datasets/examples.ts';
import { trainMpo } from '../train/mpo.ts';
import { SeededRandom } from '../random.ts';
import { train } from '../train/trainer.ts';
import { writeDemoEval } from '../train/demo-eval.ts';
import { taskCorrect, TaskJudge, type Judge } from '../online/judges.ts';
import { runNashMd } from '../online/nash-md.ts';
import { ModelSampler } from '../online/policy.ts';
import { RewardModel } from '../online/reward-model.ts';
import { rewardTrain } from '../online/reward-model.ts';
import { runSppo } from '../online/sppo.ts';

export const ONLINE_METHODS = ['sppo', 'nash_md', 'mpo'] as const;
/** A method the online demo runs (not loop.ts's OnlineMethod, the interface a method implements). */
export type OnlineDemoMethod = (typeof ONLINE_METHODS)[number];

export interface OnlineDemoOptions {
  method: OnlineDemoMethod;
  seed: number;
  out?: string;
  /** The progress of the training stages and the demo's notes (the CLI's: on stderr); none without it. */
  reporter?: Reporter;
  /** Extra `key=value` settings for the method's training (e.g. beta=0.2, max_steps=100). */
  params?: string[];
  /** Steps of the SFT warm start that makes π_0 (default 400; tests shorten it). */
  warmStartSteps?: number;
}

export interface OnlineDemoResult {
  method: OnlineDemoMethod;
  /** Judged win-rate of the final policy's samples against π_0's on the held-out prompts. */
  win_rate_vs_start: number;
  /** Share of correct samples on the held-out prompts, π_0 and final. */
  heldout_accuracy_start: number;
  heldout_accuracy_final: number;
  /** The same win-rate on the training prompts (fresh samples, not the ones trained on). */
  win_rate_vs_start_train_prompts: number;
  /** Correct share on the training prompts, π_0 and final. */
  train_accuracy_start: number;
  train_accuracy_final: number;
  heldout_prompts: number;
  samples_per_prompt: number;
  seconds: number;
  /** The method's run folder (metrics.jsonl, final/, demo_eval.json): `prefzoo report` takes it. */
  run: string;
}

/** Shared settings of every stage: tiny sequences, no padding to 64, few logs. */
const COMMON: Partial<TrainConfig> = {
  batch_size: 32,
  weight_decay: 0,
  max_grad_norm: 1,
  max_length: 32,
  max_prompt_length: 16,
  pad_to_multiple_of: 16,
  lr_scheduler: 'linear',
  logging_steps: 10,
  save_steps: 0,
};

/** The SFT warm start (answer format only). */
const WARM_START: Partial<TrainConfig> = { ...COMMON, learning_rate: 3e-3, max_steps: 400, warmup_steps: 10 };

/** Per-method settings, tuned to finish in a couple of minutes on two cores. */
const METHOD: Record<OnlineDemoMethod, { config: Partial<TrainConfig>; params: string[] }> = {
  sppo: { config: { ...COMMON, learning_rate: 3e-3, num_epochs: 20, warmup_steps: 5 }, params: ['beta=0.1'] },
  // The opponent y′ is drawn mostly from π_0 (mixture_coef 0.9, TRL's default is 0.5): under a verifier
  // an opponent that improves with the policy turns most comparisons into ties and the signal vanishes,
  // while near π_0 a right answer keeps beating it. 300 steps because the seed table (docs/losses.md,
  // "The demos") is already at 99–100% there.
  nash_md: { config: { ...COMMON, learning_rate: 3e-3, max_steps: 300, warmup_steps: 10 }, params: ['beta=0.05', 'mixture_coef=0.9'] },
  // RPO's NLL term on the chosen answer (rpo_alpha, both stages): plain DPO lowers the right answer's
  // log-prob together with the wrong one's, and stage 2 would start from, and be referenced to, a model
  // that answers junk (docs/losses.md, "The demos").
  mpo: { config: { ...COMMON, learning_rate: 3e-3, num_epochs: 16, warmup_steps: 10 }, params: ['beta=0.1', 'rpo_alpha=1'] },
};

const SAMPLING = { temperature: 1, maxNewTokens: 4 };
const EVAL_SAMPLES = 8;

const DIGITS = 4;

/** `count` distinct prompts of four distinct digits and a colon, none in `avoid`. */
export function recallPrompts(rand: SeededRandom, count: number, avoid: ReadonlySet<string> = new Set()): string[] {
  const seen = new Set(avoid);
  const out: string[] = [];
  while (out.length < count) {
    const p = rand.shuffle([0, 1, 2, 3, 4, 5, 6, 7, 8, 9]).slice(0, DIGITS).join('') + ':';
    if (seen.has(p)) continue;
    seen.add(p);
    out.push(p);
  }
  return out;
}

/**
 * The warm start's rows: prompts of 1 to 4 distinct digits (a quarter of each length), each answered
 * with a random digit of its own. The short prompts are why π_0 copies: a one-digit prompt ("7:" →
 * "7") has a single right answer, learnt within a few dozen steps, and the only rule right at every
 * length is "one of the prompt's digits", with no preference among positions; four-digit prompts alone
 * leave SFT on the plateau of the digits' marginal. The four-digit rows are the training prompts; no
 * held-out prompt occurs.
 */
export function warmStartRows(rand: SeededRandom, trainPrompts: readonly string[], avoid: ReadonlySet<string>): Example[] {
  const rows: Example[] = [];
  const four = [...trainPrompts];
  const n = 4 * trainPrompts.length;
  for (let i = 0; i < n; i++) {
    const len = 1 + (i % DIGITS);
    let p: string;
    if (len === DIGITS) p = four[(i / DIGITS) | 0];
    else {
      do p = rand.shuffle([0, 1, 2, 3, 4, 5, 6, 7, 8, 9]).slice(0, len).join('') + ':';
      while (avoid.has(p));
    }
    rows.push({ prompt: p, responses: [p[rand.int(len)], p[rand.int(len)]] });
  }
  return rand.shuffle(rows);
}

/** 200 training prompts and 100 held-out ones, disjoint. */
export function demoSplit(seed: number): { train: string[]; heldout: string[] } {
  const rand = new SeededRandom(seed + 17);
  const train = recallPrompts(rand, 200);
  return { train, heldout: recallPrompts(rand, 100, new Set(train)) };
}

function rowsOf(kind: 'pairwise', examples: Example[]): LoadedData {
  return { kind, meta: makeMeta(kind, 'plain', 'demo'), examples, files: [] };
}

/** Correct share of n samples per prompt, and the samples' texts. */
async function sampleAndScore(dir: string, prompts: string[], seed: number): Promise<{ texts: string[][]; accuracy: number }> {
  const policy = await ModelSampler.load(dir);
  const s = await policy.sample(prompts, { ...SAMPLING, n: EVAL_SAMPLES, seed });
  await policy.release();
  const texts = prompts.map((_, i) => s.slice(i * EVAL_SAMPLES, (i + 1) * EVAL_SAMPLES).map((x) => x.response));
  const correct = s.filter((x) => taskCorrect(x.prompt, x.response)).length;
  return { texts, accuracy: correct / s.length };
}

/** Mean judged P(final_k ≻ start_k) over prompts and sample slots. */
async function winRate(judge: Judge, prompts: string[], final: string[][], start: string[][]): Promise<number> {
  const items = prompts.flatMap((prompt, i) => final[i].map((a, k) => ({ prompt, a, b: start[i][k] })));
  const p = await judge.compare(items);
  return p.reduce((x, y) => x + y, 0) / p.length;
}

export async function runOnlineDemo(o: OnlineDemoOptions): Promise<OnlineDemoResult> {
  const t0 = Date.now();
  if (!ONLINE_METHODS.includes(o.method)) throw new UserError(`--method must be one of ${ONLINE_METHODS.join(', ')}, got "${o.method}"`);
  const reporter = o.reporter ?? SILENT;
  const dir = o.out ?? mkdtempSync(join(tmpdir(), `prefzoo-demo-${o.method}-`));
  mkdirSync(dir, { recursive: true });
  const init = initModelFolder(join(dir, 'model'), 'llama', 'tiny', o.seed);
  reporter.info(`demo: tiny llama (${init.parameters.toLocaleString('en-US')} parameters); method ${o.method}`);
  const split = demoSplit(o.seed);
  const trainPrompts = split.train;
  const heldPrompts = split.heldout;
  const rand = new SeededRandom(o.seed + 5);
  const digitOf = (p: string, k: number) => p[k];

  // π_0: the answer format, with no preference among the prompt's digits.
  const sftRows = warmStartRows(rand, trainPrompts, new Set(heldPrompts));
  const warm = { ...WARM_START, seed: o.seed, ...(o.warmStartSteps !== undefined ? { max_steps: o.warmStartSteps } : {}) };
  const start = await train({ model: join(dir, 'model'), data: 'sft.jsonl', rows: rowsOf('pairwise', sftRows), loss: 'sft', out: join(dir, 'start'), base: warm, reporter, overwrite: true });
  const pi0 = start.finalDir;

  const judge = new TaskJudge();
  const m = METHOD[o.method];
  const params = [...m.params, ...(o.params ?? [])];
  const base = { ...m.config, seed: o.seed };
  let finalDir: string;
  if (o.method === 'sppo') {
    const r = await runSppo({ model: pi0, prompts: trainPrompts, judge, out: join(dir, 'sppo'), iterations: 6, samples: 8, ...SAMPLING, params, base, reporter });
    finalDir = r.finalDir;
  } else if (o.method === 'nash_md') {
    const r = await runNashMd({ model: pi0, prompts: trainPrompts, judge, out: join(dir, 'nash_md'), ...SAMPLING, params, base, reporter });
    finalDir = r.finalDir;
  } else {
    // Offline pairs without scores (a right and a wrong answer per training prompt): a reward model
    // learns them, scores them, and MPO splits by its margins.
    const pairs: Example[] = trainPrompts.flatMap((p) => [1, 2].map(() => ({ prompt: p, responses: [digitOf(p, 0), digitOf(p, 1 + rand.int(DIGITS - 1))] })));
    const rmDir = join(dir, 'reward_model');
    await rewardTrain({ model: pi0, data: 'pairs.jsonl', rows: rowsOf('pairwise', pairs), out: rmDir, base: { ...COMMON, learning_rate: 3e-3, num_epochs: 4, warmup_steps: 10, seed: o.seed }, reporter });
    const rm = await RewardModel.load(rmDir);
    const scores = await rm.score(pairs.flatMap((p) => [{ prompt: p.prompt, response: p.responses[0] }, { prompt: p.prompt, response: p.responses[1] }]));
    await rm.release();
    const scored = pairs.map((p, i) => ({ ...p, responseScores: [scores[2 * i], scores[2 * i + 1]] }));
    const r = await trainMpo({ model: pi0, data: 'pairs.jsonl', rows: rowsOf('pairwise', scored), loss: 'mpo', out: join(dir, 'mpo'), params, base, reporter, overwrite: true });
    finalDir = r.finalDir;
  }

  const seed = o.seed * 31 + 7;
  const s0 = await sampleAndScore(pi0, heldPrompts, seed);
  const s1 = await sampleAndScore(finalDir, heldPrompts, seed + 1);
  const t0s = await sampleAndScore(pi0, trainPrompts, seed + 2);
  const t1s = await sampleAndScore(finalDir, trainPrompts, seed + 3);
  const run = join(dir, o.method);
  const r: OnlineDemoResult = {
    method: o.method,
    win_rate_vs_start: await winRate(judge, heldPrompts, s1.texts, s0.texts),
    win_rate_vs_start_train_prompts: await winRate(judge, trainPrompts, t1s.texts, t0s.texts),
    heldout_accuracy_start: s0.accuracy,
    heldout_accuracy_final: s1.accuracy,
    train_accuracy_start: t0s.accuracy,
    train_accuracy_final: t1s.accuracy,
    heldout_prompts: heldPrompts.length,
    samples_per_prompt: EVAL_SAMPLES,
    seconds: Math.round((Date.now() - t0) / 100) / 10,
    run,
  };
  // What was printed stays in the run folder for `prefzoo report RUN`.
  writeDemoEval(run, {
    demo: o.method,
    heldout: `${heldPrompts.length} held-out prompts and the ${trainPrompts.length} training prompts, ${EVAL_SAMPLES} samples each at temperature ${SAMPLING.temperature}; before = π_0 (${pi0}), after = ${finalDir}`,
    metrics: {
      heldout_accuracy: { before: r.heldout_accuracy_start, after: r.heldout_accuracy_final },
      train_accuracy: { before: r.train_accuracy_start, after: r.train_accuracy_final },
    },
    values: { win_rate_vs_start: r.win_rate_vs_start, win_rate_vs_start_train_prompts: r.win_rate_vs_start_train_prompts, seconds: r.seconds },
  });
  return r;
}
