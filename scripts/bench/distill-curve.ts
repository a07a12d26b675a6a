/**
 * The distill demo's distillation evaluated after every step (`node --import tsx
 * scripts/bench/distill-curve.ts SEED [STEPS] [VARIANTS] [DIR]`): the demo's task, π_0 and teacher for
 * SEED (src/demos/distill.ts), then one `distill` run per variant from π_0 with the demo's settings
 * and the variant's `--param`s after them (VARIANTS: `|`-separated, each space-separated params; ''
 * is the demo's own), held-out accuracy after steps 1, 2, … until the first multiple of the demo's
 * 5 steps at or above the target (0.9 × the teacher's) or STEPS (default 25). One line per variant:
 * the first step at the target, the step the demo would count, the curve, and the first six steps'
 * grad_norm (before clipping) and distill/forward_kl. A variant starting `grpo` is the demo's GRPO run
 * from the same π_0 with its params after GRPO's, evaluated every 5 steps to the same target within
 * the demo's 400 steps (its learning rate decays over them: STEPS is distillation's budget only): the
 * step it reached the target and the curve.
 *
 *   node --import tsx scripts/bench/distill-curve.ts 8 25 '|adam_beta1=0.9|temperature=2'
 *   node --import tsx scripts/bench/distill-curve.ts 3 25 'grpo|grpo adam_beta1=0.5'
 */
import { mkdtempSync, readFileSync } from 'node:fs';
import os from 'node:os';
import { join } from 'node:path';
import { accuracyOfFolder, DISTILL, DISTILL_PARAMS, distillPrompts, GRPO_BUDGET, trainTeacher } from '../../src/demos/distill.ts';
import { grpoOnRecallLast, recallLastTask } from '../../src/demos/grpo.ts';
import { grpo } from '../../src/online/grpo/index.ts';
import { loadTokenizer } from '../../src/tokenize/index.ts';
import { distill } from '../../src/train/distill.ts';

const [seedArg, stepsArg, variants, dirArg] = process.argv.slice(2);
if (seedArg === undefined) throw new Error('usage: distill-curve.ts SEED [STEPS] [VARIANTS] [DIR]');
const seed = Number(seedArg);
const steps = Number(stepsArg ?? 25);
const dir = dirArg ?? mkdtempSync(join(os.tmpdir(), 'prefzoo-distill-curve-'));
const task = await recallLastTask(dir, seed, { intro: () => '' });
try {
  const teacher = await trainTeacher(dir, seed, task);
  const target = 0.9 * (await accuracyOfFolder(task, teacher.finalDir));
  const tok = loadTokenizer(task.startDir);
  const data = distillPrompts(dir, task);
  for (const v of (variants ?? '').split('|')) {
    const extra = v.trim().split(/\s+/).filter(Boolean);
    if (extra[0] === 'grpo') {
      const curve: number[] = [];
      let reached = 0;
      const g = grpoOnRecallLast(seed);
      await grpo({
        model: task.startDir, prompts: task.promptsFile, rewards: ['accuracy'], out: join(dir, 'grpo'), overwrite: true,
        base: { ...g.base, max_steps: GRPO_BUDGET }, params: [...g.params, ...extra.slice(1)],
        until: async (step, policy) => {
          if (step % 5 !== 0) return false;
          const a = (await task.accuracy(tok, await policy())).perFunction.accuracy;
          curve.push(a);
          if (a >= target) reached = step;
          return reached > 0;
        },
      });
      console.log(`seed ${seed} [${extra.join(' ')}] target ${target.toFixed(4)}: reached ${reached || `> ${GRPO_BUDGET}`}: ${curve.map((a) => a.toFixed(3)).join(' ')} (every 5 steps)`);
      continue;
    }
    const curve: number[] = [];
    let first = 0;
    let counted = 0;
    const run = join(dir, 'run');
    await distill({
      teacher: teacher.finalDir, model: task.startDir, data, out: run, overwrite: true,
      base: { ...DISTILL, seed, max_steps: steps }, params: [...DISTILL_PARAMS, ...extra],
      until: async (step, policy) => {
        const a = (await task.accuracy(tok, await policy())).perFunction.accuracy;
        curve.push(a);
        if (a >= target && first === 0) first = step;
        if (a >= target && step % 5 === 0) counted = step;
        return counted > 0;
      },
    });
    const rows = readFileSync(join(run, 'metrics.jsonl'), 'utf8').trim().split('\n').map((l) => JSON.parse(l) as Record<string, number>).slice(0, 6);
    const f2 = (key: string) => rows.map((r) => r[key].toFixed(2)).join(' ');
    console.log(`seed ${seed} [${extra.join(' ') || 'the demo\'s'}] target ${target.toFixed(4)}: first ${first || `> ${steps}`}, counted ${counted || `> ${steps}`}: ${curve.map((a) => a.toFixed(3)).join(' ')} | grad_norm ${f2('grad_norm')} | forward_kl ${f2('distill/forward_kl')}`);
  }
} finally {
  await task.release();
}
