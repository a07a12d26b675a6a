import type { Command } from 'commander';
import { runDemo } from '../../train/demo.ts';
import { ONLINE_METHODS, type OnlineDemoMethod, runOnlineDemo } from '../../online/demo.ts';
import { runGrpoDemo } from '../../online/grpo-demo.ts';
import { terminalReporter } from '../progress.ts';
import { UserError } from '../../errors.ts';
import { collect, positiveInt } from '../flags.ts';

export function register(program: Command): void {
  program
    .command('demo')
    .description('the main job end to end on a built-in task (recall the first digit of a prompt) and a tiny llama: convert → tokenize → reference cache → train → eval; prints accuracy before and after')
    .option('--loss <name>', 'loss to train with (pairwise, listwise or single-trajectory)', 'dpo')
    .option('--seed <n>', 'seed of the model, the data and the shuffles', '0')
    .option('--steps <n>', 'optimizer steps (default 1200)')
    .option('--param <key=value>', 'a training setting or loss parameter (repeatable)', collect, [])
    .option('-o, --out <dir>', 'keep the model, data and run here (default: a new temporary folder)')
    .option('--json', 'print one JSON line: accuracy_before, accuracy_after, steps, seconds')
    .option('--method <name>', 'an online method instead of --loss: sppo, nash_md or mpo (sampling + the task judge; reports win_rate_vs_start), or grpo (the accuracy reward; reports heldout_accuracy_start/final)')
    .action(async (o: { loss: string; seed: string; steps?: string; param: string[]; out?: string; json?: boolean; method?: string }) => {
      const seed = Number(o.seed);
      if (!Number.isInteger(seed) || seed < 0) throw new UserError(`--seed must be an integer ≥ 0, got "${o.seed}"`);
      if (o.method === 'grpo') return grpoDemoCommand({ seed, params: o.param, out: o.out, json: o.json });
      if (o.method !== undefined) return onlineDemoCommand({ method: o.method, seed, params: o.param, out: o.out, json: o.json });
      const steps = positiveInt('--steps', o.steps);
      const r = await runDemo({ loss: o.loss, seed, steps, params: o.param, out: o.out, reporter: terminalReporter(o.json) });
      if (o.json) {
        process.stdout.write(JSON.stringify(r) + '\n');
        return;
      }
      process.stdout.write(
        [
          `loss ${r.loss} (${r.kind} data), ${r.steps} steps in ${r.seconds}s`,
          `held-out preference accuracy (log p(right) > log p(wrong); ties count as wrong): ${r.accuracy_before.toFixed(3)} before → ${r.accuracy_after.toFixed(3)} after`,
          `implicit-reward accuracy vs the starting model (eval's "accuracy"): ${r.reward_accuracy_before.toFixed(3)} before (policy = reference: every pair ties) → ${r.reward_accuracy_after.toFixed(3)} after`,
          `run folder: ${r.run} (try: npx prefzoo report ${r.run})`,
        ].join('\n') + '\n',
      );
    });
}

/** `prefzoo demo --method M`: runs the online demo and prints its result (one JSON line with --json). */
async function onlineDemoCommand(o: { method: string; seed: number; params: string[]; out?: string; json?: boolean }): Promise<void> {
  if (!(ONLINE_METHODS as readonly string[]).includes(o.method)) throw new UserError(`--method must be one of ${ONLINE_METHODS.join(', ')}, got "${o.method}"`);
  const r = await runOnlineDemo({ method: o.method as OnlineDemoMethod, seed: o.seed, params: o.params, out: o.out, reporter: terminalReporter(o.json) });
  if (o.json) {
    process.stdout.write(JSON.stringify(r) + '\n');
    return;
  }
  process.stdout.write(
    [
      `method ${r.method} in ${r.seconds}s`,
      `win-rate of the final policy's samples vs the starting policy's on ${r.heldout_prompts} held-out prompts: ${r.win_rate_vs_start.toFixed(3)}`,
      `win-rate on the training prompts (fresh samples): ${r.win_rate_vs_start_train_prompts.toFixed(3)}`,
      `correct answers, held-out prompts: ${r.heldout_accuracy_start.toFixed(3)} → ${r.heldout_accuracy_final.toFixed(3)}; training prompts: ${r.train_accuracy_start.toFixed(3)} → ${r.train_accuracy_final.toFixed(3)}`,
      `run folder: ${r.run} (try: npx prefzoo report ${r.run})`,
    ].join('\n') + '\n',
  );
}

/** `prefzoo demo --method grpo`: the GRPO demo (src/online/grpo-demo.ts). */
async function grpoDemoCommand(o: { seed: number; params: string[]; out?: string; json?: boolean }): Promise<void> {
  const r = await runGrpoDemo({ seed: o.seed, params: o.params, out: o.out, reporter: terminalReporter(o.json) });
  if (o.json) {
    process.stdout.write(JSON.stringify(r) + '\n');
    return;
  }
  process.stdout.write(
    [
      `method grpo (reward: accuracy), ${r.steps} steps in ${r.seconds}s`,
      `right answers among ${r.samples_per_prompt} samples per held-out prompt (${r.heldout_prompts} prompts): ${r.heldout_accuracy_start.toFixed(3)} → ${r.heldout_accuracy_final.toFixed(3)}`,
      `mean training reward, first → last five logged steps: ${r.reward_mean_start.toFixed(3)} → ${r.reward_mean_final.toFixed(3)}`,
      `run folder: ${r.run} (try: npx prefzoo report ${r.run})`,
    ].join('\n') + '\n',
  );
}
