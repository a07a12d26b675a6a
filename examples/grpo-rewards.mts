/**
 * GRPO from code: a prompts file with an `answer` column, the built-in `accuracy` reward and a reward
 * function of your own (a module exporting `(completions, rows) => (number | null)[]`), then the
 * TRL-named metrics of the run.
 *
 *   npx tsx examples/grpo-rewards.mts [WORK_DIR]      (STEPS=2 for a quick check)
 */
import { mkdtempSync, readFileSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { grpo, initModel, type GrpoOptions } from 'prefzoo';

const dir = process.argv[2] ?? mkdtempSync(join(tmpdir(), 'prefzoo-grpo-'));
const steps = Number(process.env.STEPS ?? 20);

initModel({ output: join(dir, 'model') });
// The task: answer the first digit of the prompt. Extra columns (here `answer`) reach the rewards as rows.
const prompts = Array.from({ length: 64 }, (_, i) => {
  const p = String((i * 7919) % 10000).padStart(4, '0');
  return { prompt: `${p}:`, answer: p[0] };
});
writeFileSync(join(dir, 'prompts.jsonl'), prompts.map((r) => JSON.stringify(r)).join('\n') + '\n');

// A reward of our own: 1 for an answer of one character, 0 otherwise; null would mean "no opinion".
writeFileSync(
  join(dir, 'rewards.mjs'),
  'export function short(completions) { return completions.map((c) => (c.trim().length === 1 ? 1 : 0)); }\n',
);

const options: GrpoOptions = {
  model: join(dir, 'model'),
  prompts: join(dir, 'prompts.jsonl'),
  rewards: ['accuracy', join(dir, 'rewards.mjs')],
  out: join(dir, 'run'),
  overwrite: true,
  settings: { max_steps: steps, num_generations: 4, batch_size: 16, max_completion_length: 4, learning_rate: 2e-3, reward_weights: '1,0.1' },
  log: (line) => console.log(line),
};
const run = await grpo(options);
const rows = readFileSync(join(dir, 'run', 'metrics.jsonl'), 'utf8').trim().split('\n').map((l) => JSON.parse(l));
const last = rows.filter((r) => 'reward' in r).at(-1);
console.log(`${run.steps} steps: reward ${last?.reward}, accuracy ${last?.['rewards/accuracy/mean']}, final model in ${run.finalDir}`);
