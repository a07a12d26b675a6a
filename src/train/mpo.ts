/**
 * MPO's two-stage schedule ("Mixed Preference Optimization: Reinforcement Learning with Data
 * Selection and Better Reference Model", 2024): split reward-scored pairs by margin |s_w − s_l| into
 * easy (≥ δ) and hard; stage 1 trains DPO from π_ref on the easy pairs; stage 2 trains `stage2_loss`
 * on the hard pairs starting from, and referenced to, the stage-1 model.
 *
 * Run folder: RUN/stage1/ and RUN/stage2/ are ordinary training runs; RUN/final is stage 2's final
 * model; RUN/metrics.jsonl holds both stages' rows (field `stage`, steps numbered on from stage 1).
 */
import { cpSync, existsSync, rmSync } from 'node:fs';
import { writeJsonAtomic } from '../io/atomic.ts';
import { joinRunMetrics } from './report.ts';
import { join } from 'node:path';
import { mpoSplit } from '../../losses/mpo.ts';
import { UserError } from '../errors.ts';
import { resolveConfig } from './config.ts';
import { loadData, type LoadedData } from '../../datasets/examples.ts';
import { getLoss, resolveLoss, scheduleOf } from '../../losses/index.ts';
import { train, type TrainOptions, type TrainResult } from './trainer.ts';
import { prepareRunFolder } from './run.ts';

export async function trainMpo(o: TrainOptions): Promise<TrainResult> {
  const { config, lossParams } = resolveConfig({ configFile: o.configFile, params: o.params, base: o.base });
  const [term] = resolveLoss('mpo', lossParams).terms;
  const p = term.params as { beta: number; label_smoothing: number; delta: number | null; delta_quantile: number; stage2_loss: string; rpo_alpha: number };
  if (!config.save_merged) throw new UserError('mpo: stage 2 starts from stage 1\'s merged model, so save_merged=false cannot be used');
  prepareRunFolder(o.out, o);
  const data = o.rows ?? (await loadData(o.data, join(o.out, 'data'), { seed: config.seed }));
  if (data.kind !== 'pairwise') throw new UserError(`${o.data}: mpo trains on pairwise data, this is ${data.kind}`);
  const unscored = data.examples.findIndex((e) => !e.responseScores);
  if (unscored >= 0) {
    throw new UserError(`${o.data}: row ${unscored + 1} has no chosen_score/rejected_score; MPO splits pairs by reward margin, so score the pairs with a reward model first`);
  }
  const split = mpoSplit(data.examples.map((e) => e.responseScores![0]), data.examples.map((e) => e.responseScores![1]), {
    delta: p.delta,
    quantile: p.delta_quantile,
  });
  o.reporter?.info(`mpo: δ = ${split.delta.toPrecision(4)}: ${split.easy.length} easy pairs (stage 1, dpo), ${split.hard.length} hard pairs (stage 2, ${p.stage2_loss})`);
  if (split.easy.length === 0 || split.hard.length === 0) {
    throw new UserError(`mpo: the split at δ = ${split.delta} leaves the ${split.easy.length === 0 ? 'easy' : 'hard'} set empty; choose delta or delta_quantile so both stages have pairs`);
  }
  const subset = (idx: number[]): LoadedData => ({ ...data, examples: idx.map((i) => data.examples[i]) });
  // Loss parameters other than MPO's own split settings go to both stages' losses where they apply.
  const passOn = Object.entries(lossParams).filter(([k]) => !['delta', 'delta_quantile', 'stage2_loss'].includes(k));
  const stage2Loss = getLoss(p.stage2_loss);
  const params2 = passOn.filter(([k]) => stage2Loss.params.some((s) => s.name === k || s.aliases?.includes(k)));
  const settings = (o.params ?? []).filter((kv) => !kv.includes('=') || !Object.prototype.hasOwnProperty.call(lossParams, kv.split('=')[0].trim()));
  const stage1Dir = join(o.out, 'stage1');
  const stage1Final = join(stage1Dir, 'final');
  let r1: TrainResult | null = null;
  if (!(o.resume && existsSync(stage1Final))) {
    r1 = await train({
      ...o,
      loss: 'dpo',
      out: stage1Dir,
      params: [...settings, `beta=${p.beta}`, `label_smoothing=${p.label_smoothing}`, ...(p.rpo_alpha > 0 ? [`rpo_alpha=${p.rpo_alpha}`] : [])],
      rows: subset(split.easy),
      overwrite: false,
    });
  }
  const r2 = await train({
    ...o,
    model: stage1Final,
    loss: p.stage2_loss,
    out: join(o.out, 'stage2'),
    params: [...settings, ...params2.map(([k, v]) => `${k}=${v}`)],
    rows: subset(split.hard),
    // Stage 1's merged model is both the start and the reference of stage 2 (an --adapter is in it).
    refModel: undefined,
    adapter: undefined,
    overwrite: false,
  });
  // Both stages' metrics in one file; stage 2's steps continue after stage 1's.
  joinRunMetrics(o.out, [
    { dir: stage1Dir, tag: { stage: 1 } },
    { dir: join(o.out, 'stage2'), tag: { stage: 2 } },
  ]);
  writeJsonAtomic(join(o.out, 'config.json'), { model: o.model, data: o.data, loss: 'mpo', ...(o.hub ? { hub: o.hub } : {}), ...config, loss_params: lossParams, split: { delta: split.delta, easy: split.easy.length, hard: split.hard.length } });
  const finalDir = join(o.out, 'final');
  rmSync(finalDir, { recursive: true, force: true });
  cpSync(r2.finalDir, finalDir, { recursive: true });
  return { ...r2, steps: (r1?.steps ?? 0) + r2.steps, finalDir };
}

/** `prefzoo train`'s entry: the schedule the loss declares (MPO's two stages for `--loss mpo`), else a single run. */
export function trainAny(o: TrainOptions): Promise<TrainResult> {
  return scheduleOf(o.loss) === 'mpo_stages' ? trainMpo(o) : train(o);
}
