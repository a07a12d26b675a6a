/**
 * `prefzoo demo`: the main job end to end on embedded defaults. A tiny llama is initialised, the
 * built-in task (recall the first digit of "4719:"; see task.ts) is written in the data shape
 * the loss needs (pairs, ranked lists or labelled single answers), converted to canonical Parquet,
 * tokenized, scored by the reference, trained, and evaluated on held-out prompts the training never
 * showed.
 *
 * Accuracy here is the policy's own preference on those held-out pairs: the share where it assigns
 * more log-probability to the right answer than to the wrong one (ties count wrong). It is ≈ 0.5
 * for a random model, so "before" and "after" are comparable; the implicit-reward accuracy against
 * the starting model is reported too (0 before training: every reward is 0, a tie, and ties count
 * as wrong everywhere, as in TRL: see losses/metrics.ts). Both, and every metric of the held-out
 * evaluation before and after, are kept in the run folder (demo_eval.json, see demo-eval.ts), so
 * `prefzoo report RUN` shows what the demo printed.
 */
import { SILENT, type Reporter } from '../progress.ts';
import { mkdirSync, mkdtempSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { convert } from '../../datasets/convert.ts';
import { getLoss } from '../../losses/index.ts';
import { UserError } from '../errors.ts';
import { initModelFolder } from '../models/init.ts';
import { evaluateRows } from '../eval/evaluate.ts';
import type { TrainConfig } from '../train/config.ts';
import { demoLists, demoPairs, demoSingles } from './task.ts';
import { trainAny } from '../train/mpo.ts';
import { writeDemoEval } from '../train/demo-eval.ts';

/** Settings that make the tiny model learn the task in a couple of minutes on two cores. */
export const DEMO_CONFIG: Partial<TrainConfig> = {
  learning_rate: 3e-3,
  batch_size: 32,
  max_steps: 1200,
  warmup_steps: 50,
  lr_scheduler: 'linear',
  weight_decay: 0,
  max_grad_norm: 1,
  max_length: 32,
  max_prompt_length: 16,
  // The task's sequences are under 10 tokens: padding them to 64 would quadruple the work.
  pad_to_multiple_of: 16,
  logging_steps: 10,
  save_steps: 0,
};

export interface DemoOptions {
  loss: string;
  seed: number;
  out?: string;
  /** The training progress and the demo's notes (the CLI's: on stderr); none without it. */
  reporter?: Reporter;
  steps?: number;
  params?: string[];
}

export interface DemoResult {
  loss: string;
  kind: string;
  accuracy_before: number;
  accuracy_after: number;
  /** Implicit-reward accuracy of the starting model against itself: 0, every pair a tie (ties count as wrong). */
  reward_accuracy_before: number;
  reward_accuracy_after: number;
  steps: number;
  seconds: number;
  run: string;
}

function writeJsonl(file: string, rows: unknown[]): void {
  writeFileSync(file, rows.map((r) => JSON.stringify(r)).join('\n') + '\n');
}

export async function runDemo(o: DemoOptions): Promise<DemoResult> {
  const t0 = Date.now();
  const reporter = o.reporter ?? SILENT;
  const loss = getLoss(o.loss.split(',')[0].split(':')[0]);
  const kind = loss.kinds.includes('pairwise') ? 'pairwise' : loss.kinds.includes('listwise') ? 'listwise' : loss.kinds.includes('single') ? 'single' : null;
  if (!kind) throw new UserError(`demo: loss ${o.loss} needs on-policy data (${loss.kinds.join(', ')}); the offline demo covers pairwise, listwise and single-trajectory losses (try --method nash_md)`);
  const dir = o.out ?? mkdtempSync(join(tmpdir(), 'prefzoo-demo-'));
  mkdirSync(dir, { recursive: true });
  const model = join(dir, 'model');
  const init = initModelFolder(model, 'llama', 'tiny', o.seed);
  reporter.info(`demo: tiny llama (${init.parameters.toLocaleString('en-US')} parameters) in ${model}`);

  // The task, in the shape the loss reads, plus held-out pairs for the evaluation.
  const pairs = demoPairs(o.seed);
  const trainJsonl = join(dir, `train.${kind}.jsonl`);
  if (kind === 'pairwise') writeJsonl(trainJsonl, pairs.train);
  else if (kind === 'listwise') writeJsonl(trainJsonl, demoLists(o.seed).train.map((l) => ({ prompt: l.prompt, responses: l.responses, scores: l.scores })));
  else writeJsonl(trainJsonl, demoSingles(o.seed).train.map((s) => ({ prompt: s.prompt, completion: s.response, label: s.label })));
  const testJsonl = join(dir, 'test.pairwise.jsonl');
  writeJsonl(testJsonl, pairs.test);
  const trainParquet = join(dir, `train.${kind}.parquet`);
  const testParquet = join(dir, 'test.pairwise.parquet');
  const format = kind === 'pairwise' ? 'trl' : kind === 'listwise' ? 'listwise' : 'kto';
  const s1 = await convert([trainJsonl], trainParquet, { format });
  await convert([testJsonl], testParquet, { format: 'trl' });
  reporter.info(`demo: ${s1.written} ${kind} training rows, ${pairs.test.length} held-out pairs`);

  const before = await evaluateRows({ policy: model, ref: model, data: testParquet, workDir: dir });
  const run = join(dir, `run-${o.loss.replace(/[^a-z0-9_]+/gi, '_')}`);
  const base = { ...DEMO_CONFIG, seed: o.seed, ...(o.steps ? { max_steps: o.steps } : {}) };
  const r = await trainAny({ model, data: trainParquet, loss: o.loss, out: run, base, params: o.params, reporter, overwrite: true });
  const after = await evaluateRows({ policy: r.finalDir, ref: model, data: testParquet, workDir: dir });
  const result: DemoResult = {
    loss: o.loss,
    kind,
    accuracy_before: before.overall.preference_accuracy,
    accuracy_after: after.overall.preference_accuracy,
    reward_accuracy_before: before.overall.accuracy,
    reward_accuracy_after: after.overall.accuracy,
    steps: r.steps,
    seconds: Math.round(((Date.now() - t0) / 1000) * 10) / 10,
    run,
  };
  // What was printed stays in the run folder for `prefzoo report`: the two headline figures under
  // their printed names, then every metric of the held-out evaluation before and after.
  const both = Object.keys(before.overall).filter((k) => k in after.overall);
  writeDemoEval(run, {
    demo: o.loss,
    heldout: `${pairs.test.length} held-out pairs (${testParquet}); before = the initialised model, after = ${r.finalDir}`,
    metrics: {
      accuracy: { before: result.accuracy_before, after: result.accuracy_after },
      reward_accuracy: { before: result.reward_accuracy_before, after: result.reward_accuracy_after },
      ...Object.fromEntries(both.map((k) => [`eval/${k}`, { before: before.overall[k], after: after.overall[k] }])),
    },
    values: { steps: result.steps, seconds: result.seconds },
  });
  return result;
}
