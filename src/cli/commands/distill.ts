import type { Command } from 'commander';
import { settingsHelp } from '../../train/settings.ts';
import { distill } from '../../train/distill.ts';
import { collect } from '../flags.ts';
import { distillAgents } from '../../online/distill-agents.ts';
import { hubRecord } from '../hub.ts';
import { terminalReporter } from '../progress.ts';

export function register(program: Command): void {
  const cmd = program
    .command('distill')
    .description("distillation: KD steps of the gkd loss on the student against the teacher's top-K log-probs — on the data's responses (computed once, cached in the run) or, with lmbda > 0, on the student's own samples for the data's prompts (scored fresh), or with seq_kd on the teacher's own generations (made once, cached); the teacher one model or, with --teacher-ref, AlignDistil's combination of a DPO model and its reference")
    .requiredOption('--teacher <dir>', 'teacher model folder or Hub name: any supported architecture with the student\'s tokenizer')
    .option('--teacher-ref <dir>', "AlignDistil: --teacher is a DPO model and this its reference; the teacher's logits are z_ref + teacher_weight·(z_dpo − z_ref) (docs/distill.md)")
    .requiredOption('--model <dir>', 'student model folder or Hub name (the starting weights)')
    .requiredOption('--data <file>', 'any data train reads: single rows (their responses), pairs (the chosen responses), conversations (the assistant\'s own tokens)')
    .requiredOption('-o, --out <dir>', 'run folder: data/teacher.parquet (the cache), artifacts/, checkpoints/, metrics.jsonl, final/')
    .option('--param <key=value>', 'a training setting, distill_topk, lmbda and the on-policy sampling settings, or gkd\'s beta / temperature (repeatable); settings distill does not use are refused', collect, [])
    .option('--config <file>', 'JSON object of settings; --param overrides it')
    .option('--resume', 'continue the run in --out from its newest checkpoint (same --teacher, --model and --data; the cache is reused)')
    .option('--overwrite', 'replace the run already in --out')
    .option('--tools <module>', "tools the student may call in its on-policy rollouts (repeatable; lmbda > 0): a .mjs/.ts module exporting { name, description, parameters, run } or AI SDK tool() objects, or cmd:COMMAND; the on-policy micro-batches become multi-turn, the teacher grading the student's own tokens only (docs/distill.md, Multi-turn)", collect, [] as string[])
    .option('--mcp <command>', 'an MCP server to start over stdio, its tools offered in the on-policy rollouts (repeatable), as grpo --mcp', collect, [] as string[])
    .option('--mcp-config <file>', 'MCP servers from an {"mcpServers": {…}} file, as grpo --mcp-config')
    .option('--env <module>', "an environment answering each turn of the on-policy rollouts, as grpo --env (its reset(row, { seed }) sees the row's prompt only)")
    .option('--quiet', 'no progress output')
    .option('--json', 'print a one-line JSON summary')
    .addHelpText('after', () => [
      '',
      "Loss: gkd over the teacher's K ids and one bucket for the rest of each distribution (docs/losses.md, Distillation):",
      '  beta=0.5        0: forward KL(teacher ‖ student), 1: reverse KL(student ‖ teacher), between: the generalized JSD',
      "  temperature=1   τ of the loss: both (K + 1)-outcome distributions raised to 1/τ and renormalised (TRL's GKD",
      "                  calls its loss at 1; its `temperature` is the sampling one: here sampling_temperature)",
      '',
      "On-policy (docs/distill.md, On-policy distillation): lmbda=L makes each micro-batch, with probability L, the",
      "student's own samples for its rows' prompts (max_completion_length, sampling_temperature, top_p, top_k),",
      "scored by the teacher's top K then; lmbda=1 beta=1 is on-policy distillation (reverse KL on the student's samples).",
      "seq_kd=true trains the other micro-batches on the teacher's own generations for the prompts (made once, cached).",
      '',
      `Settings it honours (--param key=value or --config), with defaults (docs/settings.md); any other is refused:\n${settingsHelp('distill')}`,
    ].join('\n'))
    .action(async (o: { teacher: string; teacherRef?: string; model: string; data: string; out: string; param: string[]; config?: string; resume?: boolean; overwrite?: boolean; quiet?: boolean; json?: boolean; tools: string[]; mcp: string[]; mcpConfig?: string; env?: string }) => {
      // Hub names are folders and files by now (src/cli/hub.ts).
      const r = await distill({ teacher: o.teacher, teacherRef: o.teacherRef, model: o.model, data: o.data, out: o.out, hub: hubRecord(), params: o.param, configFile: o.config, resume: o.resume, overwrite: o.overwrite, reporter: terminalReporter(o.quiet), multiTurn: distillAgents({ tools: o.tools, mcp: o.mcp, mcpConfig: o.mcpConfig, env: o.env }) });
      const p = r.onPolicy;
      const q = r.seqKd;
      const summary = { steps: r.steps, seconds: r.seconds, final: r.finalDir, loss: r.last.loss, teacher_cached: r.cached, ...(q ? { seq_kd_cached: q.cached, seq_kd_seconds: q.seconds, seq_kd_mean_length: q.meanLength } : {}), ...(p ? { lmbda: p.lmbda, micro_batches: p.microBatches, on_policy_micro_batches: p.sampled, sample_seconds: p.sampleSeconds, teacher_seconds: p.teacherSeconds } : {}) };
      const offline = p && p.lmbda >= 1 ? '' : `${q ? `teacher generations ${q.cached ? 'read from the cache' : `made in ${q.seconds}s`}, ` : ''}teacher targets ${r.cached ? 'read from the cache' : 'computed and cached'}`;
      const online = p ? `${p.sampled} of ${p.microBatches} micro-batches the student's own samples: sampled in ${p.sampleSeconds}s, scored by the teacher in ${p.teacherSeconds}s` : '';
      if (o.json) process.stdout.write(JSON.stringify(summary) + '\n');
      else process.stdout.write(`distilled ${r.steps} steps in ${r.seconds}s (${[offline, online].filter(Boolean).join('; ')}); final model in ${r.finalDir}; metrics in ${o.out}/metrics.jsonl\n`);
    });
}
