/**
 * The endpoint's overhead on a GRPO step: the same task trained two ways in one process, alternating
 * `--rounds` times, with the same model, prompts, settings and steps —
 *
 * - `grpo --agent`: an `openai`-SDK agent making 2 calls per rollout against the run's endpoint
 *   (src/serve over the live weights): a chat with a `lookup` tool; the tool's answer, or else a
 *   user follow-up, then the second call (test/fixtures/agents/openai-tool-loop.mjs's loop);
 * - `grpo --tools` with an environment: the same tool in process and the same follow-up from the
 *   environment's `step`, the rollout on the generation session (2 turns: max_turns=2, the
 *   environment done after its second step).
 *
 * A random model seldom draws its end-of-turn id (2 ids of the generated tokenizer's 461), so a turn
 * would run to its budget and the `--tools` rollout would end after one. The model is made to end
 * turns: every token embedding gets a constant first element (1), and the stop ids' head rows read it
 * (`--stop-bias`, default 2: turns of about 11 tokens on `small`), so both paths sample turns that end
 * on the stop id with the same length distribution. Each step is timed from one progress update to
 * the next (the first step, which builds the graphs, is left out); prints the median step seconds of
 * each, their ratio, and the sampled tokens and calls per rollout of each (the two paths draw from
 * different random streams, so their tokens differ; the counts say the work is alike).
 *
 *   node --import tsx scripts/bench/agent-step.ts [--preset small] [--steps 3] [--rounds 1] [--generations 4] [--batch 8] [--max-tokens 48] [--stop-bias 2] [--threads 2] [--json]
 */
import { mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import os, { tmpdir } from 'node:os';
import { join } from 'node:path';
import { parseArgs } from 'node:util';
import OpenAI from 'openai';
import { grpo } from '../../src/index.ts';
import { saveCheckpoint } from '../../src/models/checkpoint.ts';
import { presetArch } from '../../src/models/config.ts';
import { initModelFolder } from '../../src/models/init.ts';
import { loadModel } from '../../src/models/load.ts';
import { loadTokenizer } from '../../src/tokenize/index.ts';
import type { AgentContext } from '../../src/online/grpo/agent-harness.ts';
import type { Environment, ToolDef } from '../../src/agents/types.ts';

const { values: a } = parseArgs({
  options: {
    preset: { type: 'string', default: 'small' },
    steps: { type: 'string', default: '3' },
    rounds: { type: 'string', default: '1' },
    generations: { type: 'string', default: '4' },
    batch: { type: 'string', default: '8' },
    'max-tokens': { type: 'string', default: '48' },
    'stop-bias': { type: 'string', default: '2' },
    threads: { type: 'string', default: '2' },
    json: { type: 'boolean', default: false },
  },
});
const steps = Number(a.steps);
const T = Number(a['max-tokens']);
const log = (line: string) => process.stderr.write(`agent-step: ${line}\n`);

const LOOKUP = { name: 'lookup', description: 'Looks a key up.', parameters: { type: 'object', properties: { key: { type: 'string' } }, required: ['key'] } };
const FOLLOW_UP = 'Once more, with a digit.';
const answerOf = (seed: number) => `the value is ${seed % 10}`;
const reward = (text: string) => (/\d/.test(text) ? 1 : 0);

/** The agent: two calls, a tool answered or a follow-up asked in between (the test fixture's loop). */
async function agent(task: Record<string, unknown>, ctx: AgentContext) {
  const client = new OpenAI({ baseURL: ctx.baseURL, apiKey: ctx.apiKey, maxRetries: 0 });
  const messages: OpenAI.Chat.Completions.ChatCompletionMessageParam[] = [{ role: 'user', content: String(task.question) }];
  let text = '';
  for (let turn = 0; turn < 2; turn++) {
    const r = await client.chat.completions.create({ model: ctx.model, messages, tools: [{ type: 'function', function: LOOKUP }], max_tokens: T }, { signal: ctx.signal });
    const m = r.choices[0].message;
    messages.push({ role: 'assistant', content: m.content, ...(m.tool_calls?.length ? { tool_calls: m.tool_calls } : {}) });
    text = m.content ?? '';
    if (m.tool_calls?.length) for (const c of m.tool_calls) messages.push({ role: 'tool', tool_call_id: c.id, content: answerOf(ctx.seed) });
    else messages.push({ role: 'user', content: FOLLOW_UP });
  }
  return { reward: reward(text) };
}

/** The same in process: the tool, and an environment asking the follow-up after a turn without calls. */
const lookup: ToolDef = { ...LOOKUP, run: (_args, ctx) => answerOf(ctx.seed) };
class FollowUp implements Environment {
  private turns = 0;
  private last = '';
  reset() {
    return { messages: [] };
  }
  step({ text, toolCalls }: { text: string; toolCalls: unknown[] }) {
    this.turns++;
    this.last = text;
    return { messages: toolCalls.length ? [] : [{ role: 'user' as const, content: FOLLOW_UP }], done: this.turns >= 2 };
  }
  reward() {
    return reward(this.last);
  }
}

const dir = mkdtempSync(join(tmpdir(), 'prefzoo-agent-step-'));
try {
  const model = join(dir, 'model');
  initModelFolder(model, presetArch(a.preset!) ?? 'llama', a.preset!, 0);
  const tok = loadTokenizer(model);
  const m = loadModel(model);
  // Turns that end: a constant first element in every embedding, read by the stop ids' head rows.
  const E = m.weights.get('model.embed_tokens.weight')!;
  const H = m.weights.get('lm_head.weight') ?? E;
  const D = E.shape[1];
  for (let v = 0; v < E.shape[0]; v++) E.data[v * D] = 1;
  for (const s of tok.stopIds) H.data[s * D] = (H === E ? 1 : 0) + Number(a['stop-bias']);
  saveCheckpoint(model, m.weights, { config: m.config });
  const prompts = join(dir, 'tasks.jsonl');
  writeFileSync(prompts, Array.from({ length: 16 }, (_, i) => JSON.stringify({ question: `Look up the key k${i} and tell me its value.` }) + '\n').join(''));
  const common = {
    max_steps: steps + 1,
    batch_size: Number(a.batch),
    num_generations: Number(a.generations),
    logging_steps: 1,
    save_steps: 1_000_000,
    learning_rate: 1e-6,
    threads: Number(a.threads),
  };
  type Way = 'agent' | 'tools';
  const times: Record<Way, number[]> = { agent: [], tools: [] };
  // Per timed step: the tokens trained (prompts and completions of the step's rows), the share of completions cut at their budget, calls (turns) per rollout.
  const counts: Record<Way, { tokens: number[]; clipped: number[]; calls: number[] }> = { agent: { tokens: [], clipped: [], calls: [] }, tools: { tokens: [], clipped: [], calls: [] } };
  const run = async (way: Way, r: number) => {
    const out = join(dir, `${way}-${r}`);
    const marks: number[] = [];
    const progress = (label: string) => ({ update: () => label === 'grpo' && marks.push(performance.now()), stop() {} });
    const settings = way === 'agent' ? { ...common, max_completion_length: T } : { ...common, max_completion_length: 2 * T + 32, max_turns: 2 };
    await grpo({ model, prompts, out, rewards: [], settings, progress, ...(way === 'agent' ? { agent } : { tools: [lookup], env: () => new FollowUp() }) });
    const secs = marks.slice(1).map((t, k) => (t - marks[k]) / 1000);
    times[way].push(...secs);
    const rows = readFileSync(join(out, 'metrics.jsonl'), 'utf8').trim().split('\n').map((l) => JSON.parse(l) as Record<string, number>).slice(1);
    for (const row of rows) {
      counts[way].tokens.push(row.tokens);
      counts[way].clipped.push(row['completions/clipped_ratio']);
      counts[way].calls.push(way === 'agent' ? row['agent/calls_per_rollout'] : row['num_turns/mean']);
    }
    log(`round ${r + 1}, ${way}: ${secs.map((s) => s.toFixed(2)).join(', ')} s per step (load ${os.loadavg()[0].toFixed(1)})`);
  };
  for (let r = 0; r < Number(a.rounds); r++) {
    await run('agent', r);
    await run('tools', r);
  }
  const median = (xs: number[]) => [...xs].sort((x, y) => x - y)[(xs.length - 1) >> 1];
  const mean = (xs: number[]) => (xs.length ? Math.round((xs.reduce((s, x) => s + x, 0) / xs.length) * 100) / 100 : null);
  const r = {
    preset: a.preset,
    threads: Number(a.threads),
    steps_timed: steps * Number(a.rounds),
    batch_size: common.batch_size,
    num_generations: common.num_generations,
    agent_step_s: Math.round(median(times.agent) * 1000) / 1000,
    tools_step_s: Math.round(median(times.tools) * 1000) / 1000,
    ratio: Math.round((median(times.agent) / median(times.tools)) * 100) / 100,
    agent_steps_s: times.agent.map((t) => Math.round(t * 1000) / 1000),
    tools_steps_s: times.tools.map((t) => Math.round(t * 1000) / 1000),
    agent_tokens_per_step: mean(counts.agent.tokens),
    tools_tokens_per_step: mean(counts.tools.tokens),
    agent_clipped: mean(counts.agent.clipped),
    tools_clipped: mean(counts.tools.clipped),
    agent_calls: mean(counts.agent.calls),
    tools_turns: mean(counts.tools.calls),
    load_average: Math.round(os.loadavg()[0] * 100) / 100,
  };
  console.log(a.json ? JSON.stringify(r) : Object.entries(r).map(([k, v]) => `${k.padEnd(22)} ${Array.isArray(v) ? v.join(', ') : v}`).join('\n'));
} finally {
  rmSync(dir, { recursive: true, force: true });
}
