import type { Command } from 'commander';
import { runDemo } from '../../demos/offline.ts';
import { METHOD_DEMOS } from '../../demos/index.ts';
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
    .option('--json', 'print one JSON line: accuracy_before, accuracy_after, steps, seconds (with --method, the demo\'s result: the keys it reports and seconds)')
    .option('--method <name>', `an online method's demo instead of --loss: ${Object.entries(METHOD_DEMOS).map(([k, d]) => `${k} (${d.summary})`).join('; ')}`)
    .action(async (o: { loss: string; seed: string; steps?: string; param: string[]; out?: string; json?: boolean; method?: string }) => {
      const seed = Number(o.seed);
      if (!Number.isInteger(seed) || seed < 0) throw new UserError(`--seed must be an integer ≥ 0, got "${o.seed}"`);
      if (o.method !== undefined) return methodDemoCommand({ method: o.method, seed, params: o.param, out: o.out, json: o.json });
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

/** `prefzoo demo --method M`: runs the method's demo (src/demos/index.ts) and prints its result (one JSON line with --json). */
async function methodDemoCommand(o: { method: string; seed: number; params: string[]; out?: string; json?: boolean }): Promise<void> {
  const demo = METHOD_DEMOS[o.method];
  if (!demo) throw new UserError(`--method must be one of ${Object.keys(METHOD_DEMOS).join(', ')}, got "${o.method}"`);
  const r = await demo.run({ seed: o.seed, params: o.params, out: o.out, reporter: terminalReporter(o.json) });
  process.stdout.write(o.json ? JSON.stringify(r) + '\n' : demo.lines(r as never).join('\n') + '\n');
}
