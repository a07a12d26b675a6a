/**
 * `prefzoo grpo --model M --prompts FILE --reward R [--reward R2 …] -o RUN` (or `--env MODULE`, whose
 * environments may give the prompts and the reward) — GRPO and its family
 * (DAPO, Dr. GRPO, GSPO, CISPO, RLOO) with verifiable rewards, on the online loop. Every setting is a
 * `--param key=value` with TRL's GRPOConfig name; `--help` lists them all with their defaults.
 */
import type { Command } from 'commander';
import { DEVICE_HELP, collect, device } from '../flags.ts';
import { DEFAULT_DISTILL_COEF, grpo } from '../../online/grpo/index.ts';
import { rewardHelp, rewardSyntax } from '../../online/rewards/index.ts';
import { settingsHelp as honouredHelp } from '../../train/settings.ts';
import { getLoss } from '../../../losses/index.ts';
import { describeRange } from '../../../losses/core/params.ts';
import { terminalReporter } from '../progress.ts';
import { hubRecord } from '../hub.ts';

/** Every setting grpo takes, with its default: GRPO's own and the trainer's it honours (the settings table), and the loss's. */
function settingsHelp(): string {
  const loss = getLoss('grpo').params.filter((p) => p.name !== 'max_completion_length');
  const show = (v: unknown) => (v === '' ? "''" : v === null ? '(unset)' : String(v));
  return [
    '',
    'Settings (--param name=value or --config; TRL GRPOConfig names; docs/settings.md), with grpo\'s defaults',
    '(batch_size counts completions per micro-batch; a round is batch_size × gradient_accumulation_steps completions, whole groups):',
    honouredHelp('grpo'),
    '',
    'Loss parameters (losses/grpo.ts; docs/losses.md has the formulas):',
    ...loss.map((p) => `    ${p.name}=${show(p.default)}  ${describeRange(p)}  — ${p.doc}${p.trl ? ` (TRL ${p.trl}${p.aliases?.length ? `; also ${p.aliases.join(', ')}` : ''})` : ''}`),
    '',
    'Rewards (--reward, repeatable; docs/settings.md):',
    rewardHelp(),
    '',
    'Example: prefzoo grpo --model M --prompts gsm8k.jsonl --reward accuracy --reward "format:\\\\boxed\\{" -o runs/g \\',
    '           --param lora_r=16 --param max_completion_length=256 --param loss_type=dapo',
  ].join('\n');
}

export function register(program: Command): void {
  program
    .command('grpo')
    .description('GRPO / DAPO / Dr. GRPO / GSPO / CISPO / RLOO: sample num_generations completions per prompt, score them with reward functions, push the policy toward those that beat their group')
    .requiredOption('--model <dir>', 'starting policy (Hugging Face model folder); also the reference when beta > 0')
    .option('--prompts <file>', "prompts: .txt, or records (JSON, JSONL, CSV, Parquet, …) with a prompt, question or problem column; other columns (answer, …) go to the reward functions and the environment; with --env, optional (rows lacking a prompt, or no file: the environment's reset() gives it)")
    .option('--reward <spec>', `a reward function (repeatable; required unless --env's environment has reward() or --agent returns rewards; with --agent it scores the agent's final text): ${rewardSyntax()}`, collect, [] as string[])
    .option('--tools <module>', 'tools the model may call (repeatable): a .mjs/.ts module exporting { name, description, parameters, run } or AI SDK tool() objects, or cmd:COMMAND (a JSON-lines program); rollouts become multi-turn (docs/agents.md)', collect, [] as string[])
    .option('--mcp <command>', "an MCP server to start over stdio, its tools offered to the model (repeatable), e.g. --mcp 'npx @modelcontextprotocol/server-memory'", collect, [] as string[])
    .option('--mcp-config <file>', 'MCP servers from an {"mcpServers": {…}} file (the Claude Desktop / Cursor / verl layout)')
    .option('--agent <module>', "an agent written against an OpenAI-compatible API, trained unchanged: a .mjs/.ts module whose default export is async (task, { baseURL, apiKey, model, seed, signal }) => reward; each rollout talks to the run's own endpoint over the live weights, every call recorded as sampled (docs/agents.md \"Training the agent you already wrote\"); --prompts rows are its tasks (any columns)")
    .option('--env <module>', "an environment: a .mjs/.ts module whose factory makes { reset(row, { seed }), step({ text, toolCalls }), reward?(), close?() } per rollout, or a map of factories by name (export default { name: factory, … } or export const environments), each row picking one by its env_column column (default environment); reset() may return the prompt (a string, or { prompt, messages?, tools? }): then --prompts may be left out (rows { index } generated, the map's environments in turn; max_steps required); reward() is the reward env (docs/agents.md)")
    .option('--teacher <dir>', `teacher-guided RL (DGPO): a model folder or Hub name with the policy's tokenizer; the loss adds distill_coef (default ${DEFAULT_DISTILL_COEF}) × the per-token KL of the policy to it on the sampled tokens, logged as distill/kl (docs/distill.md)`)
    .option('--teacher-ref <dir>', "AlignDistil: --teacher is a DPO model and this its reference; the teacher's logits are z_ref + teacher_weight·(z_dpo − z_ref) (docs/distill.md)")
    .requiredOption('-o, --out <dir>', 'run folder: config.json, artifacts/, checkpoints/, metrics.jsonl, completions.jsonl, final/')
    .option('--param <key=value>', 'a setting (repeatable): GRPO settings, loss parameters and trainer settings listed below', collect, [] as string[])
    .option('--config <file>', 'JSON object of settings')
    .option('--resume', 'continue the run in --out from its newest checkpoint (bit-exact: same samples, same updates)')
    .option('--overwrite', 'replace the run already in --out')
    .option('--device <device>', `${DEVICE_HELP}; same as --param device=…`)
    .option('--quiet', 'no progress output')
    .option('--json', 'print a one-line JSON summary')
    .addHelpText('after', settingsHelp())
    .action(async (o: { model: string; teacher?: string; teacherRef?: string; prompts?: string; reward: string[]; tools: string[]; mcp: string[]; mcpConfig?: string; env?: string; agent?: string; out: string; param: string[]; config?: string; resume?: boolean; overwrite?: boolean; device?: string; quiet?: boolean; json?: boolean }) => {
      const params = o.device ? [...o.param, `device=${device(o.device)}`] : o.param;
      const r = await grpo({ model: o.model, teacher: o.teacher, teacherRef: o.teacherRef, hub: hubRecord(), prompts: o.prompts, rewards: o.reward, tools: o.tools, mcp: o.mcp, mcpConfig: o.mcpConfig, env: o.env, agent: o.agent, out: o.out, params, configFile: o.config, resume: o.resume, overwrite: o.overwrite, reporter: terminalReporter(o.quiet || o.json) });
      if (o.json) process.stdout.write(JSON.stringify({ final: r.finalDir, steps: r.steps, seconds: r.seconds, last: r.last, eval: r.eval }) + '\n');
      else process.stdout.write(`${r.steps} GRPO steps in ${r.seconds}s; reward ${r.last.reward?.toFixed(3) ?? '?'} at the last step; final policy in ${r.finalDir}; metrics in ${o.out}/metrics.jsonl, samples in ${o.out}/completions.jsonl\n`);
    });
}
