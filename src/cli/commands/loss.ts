/**
 * `prefzoo loss NAME --input BATCH.json` — evaluates one loss (or a weighted mixture) of the loss
 * zoo on per-sequence statistics (per-token log-probs for grpo, logits for gkd) and prints one JSON
 * line {"loss", "per_example", "grad"}.
 */
import fs from 'node:fs';
import type { Command } from 'commander';
import { UserError } from '../../errors.ts';
import { listLosses, resolveLoss } from '../../../losses/index.ts';
import { detectKind, parseBatch } from '../../../losses/core/batch.ts';
import { describeRange, parseParamArgs } from '../../../losses/core/params.ts';
import { runLossOnnx, runLossReference, shapeLike, type FloatDType } from '../../../losses/core/engine.ts';
import { OPTION_SPECS } from '../../../losses/core/pairwise.ts';
import type { ParamSpec } from '../../../losses/core/types.ts';

/** The loss table printed under --help: name, data kind, parameters with defaults and ranges. */
function lossTable(): string {
  const shared = new Set<string>(Object.keys(OPTION_SPECS));
  const param = (p: ParamSpec) =>
    `${p.name}=${p.default ?? '(unset)'}  ${describeRange(p)}  — ${p.doc}`;
  const lines = ['', 'Losses (parameters: name=default, valid range):'];
  for (const l of listLosses()) {
    lines.push(`  ${l.name.padEnd(13)} ${l.kinds.join('/').padEnd(18)} ${l.paper}`);
    for (const p of l.params.filter((q) => !shared.has(q.name))) lines.push(`  ${''.padEnd(32)} ${param(p)}`);
    const opts = l.params.filter((q) => shared.has(q.name)).map((q) => q.name);
    if (opts.length) lines.push(`  ${''.padEnd(32)} + pairwise options: ${opts.join(', ')}`);
  }
  lines.push('', 'Pairwise options:', ...Object.values(OPTION_SPECS).map((p) => `  ${param(p)}`));
  lines.push(
    '',
    'Batch keys (JSON object of columns; see losses/core/batch.ts):',
    '  pairwise: policy_chosen_logps, policy_rejected_logps, ref_chosen_logps, ref_rejected_logps, chosen_tokens,',
    '            rejected_tokens, chosen_probs, rejected_probs, chosen_scores, rejected_scores, weight',
    '  listwise: policy_logps, ref_logps, scores, mask, win_probs as [B][K] arrays; weight [B]',
    '  single:   policy_logps, ref_logps, rewards, values (dro), labels (kto), kl or policy_kl_logps + ref_kl_logps (kto)',
    '  nash_md:  policy_logps, ref_logps, probs',
    '  reward_pairs: chosen_rewards, rejected_rewards (a reward model\'s scores of the pair)',
    '  grpo:     policy_token_logps, old_token_logps, ref_token_logps (beta > 0), teacher_token_logps (distill_coef > 0),',
    '            completion_mask, token_entropies (top_entropy_quantile < 1, entropy bonus), sampling_token_logps',
    '            (the sampler\'s own: its correction) as [B][T] arrays; advantages [B]; numbers: num_items_in_batch',
    '            (dapo/cispo/vespo), entropy_coef (the bonus\'s coefficient this step), last_world_entropy',
    '            (use_adaptive_entropy: the last step\'s entropy)',
    '  distill:  student_logits [B][T][V], completion_mask [B][T], and the teacher as teacher_logits [B][T][V]',
    '            or as its top K: teacher_topk_ids, teacher_topk_logps (log-probs at temperature 1) [B][T][K]',
    '',
    'Example: prefzoo loss dpo --input batch.json --param beta=0.1 --grad',
  );
  return lines.join('\n');
}

function readJson(file: string): unknown {
  let text: string;
  try {
    text = fs.readFileSync(file, 'utf8');
  } catch (e) {
    throw new UserError(`${file}: cannot read (${(e as NodeJS.ErrnoException).code ?? (e as Error).message})`);
  }
  try {
    return JSON.parse(text);
  } catch (e) {
    throw new UserError(`${file}: invalid JSON (${(e as Error).message})`);
  }
}

export function register(program: Command): void {
  program
    .command('loss')
    .description('evaluate a loss of the zoo (or a weighted mixture such as dpo:0.8,sft:1) on a batch of per-sequence statistics; prints {"loss","per_example","grad"}')
    .argument('<name>', 'loss name, or a mixture NAME:WEIGHT,NAME:WEIGHT')
    .requiredOption('--input <file>', 'batch JSON: an object of columns named as below')
    .option('--param <k=v>', 'loss parameter (repeatable; in a mixture NAME.k=v sets one term)', (v: string, acc: string[]) => [...acc, v], [] as string[])
    .option('--grad', 'also print the gradient of the mean loss w.r.t. each differentiable input')
    .option('--engine <engine>', 'onnx (the training subgraph through ONNX Runtime) or reference (float64 TypeScript)', 'onnx')
    .option('--dtype <dtype>', 'float64 or float32 (onnx engine)', 'float64')
    .option('--metrics', 'also print the batch metrics (rewards/accuracies, …)')
    .addHelpText('after', lossTable())
    .action(async (name: string, o: { input: string; param: string[]; grad?: boolean; engine: string; dtype: string; metrics?: boolean }) => {
      if (o.engine !== 'onnx' && o.engine !== 'reference') throw new UserError(`--engine must be onnx or reference, got "${o.engine}"`);
      if (o.dtype !== 'float64' && o.dtype !== 'float32') throw new UserError(`--dtype must be float64 or float32, got "${o.dtype}"`);
      const bound = resolveLoss(name, parseParamArgs(o.param));
      const json = readJson(o.input);
      if (json === null || typeof json !== 'object' || Array.isArray(json)) throw new UserError(`${o.input}: expected a JSON object of batch columns`);
      const kind = detectKind(bound.kinds, json as Record<string, unknown>);
      const batch = parseBatch(json, kind, bound.keys(kind), o.input);
      const run = o.engine === 'onnx'
        ? await runLossOnnx(bound, batch, { dtype: o.dtype as FloatDType, grad: o.grad })
        : runLossReference(bound, batch, { grad: o.grad });
      const out: Record<string, unknown> = { loss: run.loss, per_example: run.perExample };
      if (o.grad) out.grad = Object.fromEntries(Object.entries(run.grad).map(([k, v]) => [k, shapeLike(v, batch[k].dims)]));
      if (o.metrics) out.metrics = run.metrics;
      process.stdout.write(`${JSON.stringify(out)}\n`);
    });
}
