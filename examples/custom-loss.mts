/**
 * The loss zoo from code: list the losses and their parameters, then train with a weighted mixture
 * of two (DPO plus an SFT term on the chosen responses), with a loss parameter set by name.
 *
 *   npx tsx examples/custom-loss.mts [WORK_DIR]      (STEPS=2 for a quick check)
 */
import { mkdtempSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { BadInputError, UserError, convert, initModel, listLosses, parseLossSpec, resolveLoss, train } from 'prefzoo';

const dir = process.argv[2] ?? mkdtempSync(join(tmpdir(), 'prefzoo-loss-'));
const steps = Number(process.env.STEPS ?? 20);

// Every loss: its name, the data it takes, its paper, and its parameters with defaults.
for (const loss of listLosses()) {
  console.log(`${loss.name.padEnd(14)} ${loss.kinds.join('/').padEnd(20)} ${loss.params.map((p) => `${p.name}=${p.default ?? '-'}`).join(' ')}`);
}

// A mixture is a spec string: NAME:WEIGHT terms, summed.
const spec = 'dpo:0.8,sft:0.2';
console.log(parseLossSpec(spec).map((t) => `${t.weight} × ${t.name}`).join(' + '));

// Parameters are checked against each term's declared range before anything runs.
try {
  resolveLoss('ipo', { beta: -1 });
} catch (e) {
  if (!(e instanceof UserError)) throw e;
  console.log(`refused as expected (${e instanceof BadInputError ? 'bad input' : e.kind}, setting ${e.setting}): ${e.message}`);
}
const bound = resolveLoss(spec, { beta: 0.2, label_smoothing: 0.1 });
console.log(`bound: ${bound.terms.map((t) => t.loss.name).join(', ')}; kind ${bound.kinds.join('/')}`);

initModel({ output: join(dir, 'model') });
const pairs = Array.from({ length: 32 }, (_, i) => ({ prompt: `${i % 10}${(i * 37) % 100}:`, chosen: String(i % 10), rejected: String((i + 3) % 10) }));
writeFileSync(join(dir, 'pairs.jsonl'), pairs.map((p) => JSON.stringify(p)).join('\n') + '\n');
await convert(join(dir, 'pairs.jsonl'), join(dir, 'pairs.parquet'));

const run = await train({
  model: join(dir, 'model'),
  data: join(dir, 'pairs.parquet'),
  loss: spec,
  out: join(dir, 'run'),
  overwrite: true,
  settings: { max_steps: steps, batch_size: 4, max_length: 16, max_prompt_length: 8, beta: 0.2, label_smoothing: 0.1 },
});
console.log(`${spec}: ${run.steps} steps, last loss ${run.last.loss?.toFixed(4)}, metrics in ${run.finalDir}/../metrics.jsonl`);
