/**
 * Agent tools from code, without a model: tools in the two shapes `--tools` reads (a JSON Schema
 * tool, and a zod tool in the Vercel AI SDK's `tool({ description, inputSchema, execute })` shape),
 * the specs a chat template receives, one assistant turn's calls answered (a bad one included), the
 * TRL tool metrics, and an environment (a number-guessing game) played by a scripted policy.
 *
 *   npx tsx examples/agent-tools.mts
 *
 * Then GRPO with the same tools and the same game (`grpo({ tools, … })`, `grpo({ env, … })`) on a tiny
 * random model for two steps each: multi-turn rollouts, the tool and turn metrics in metrics.jsonl.
 */
import { z } from 'zod';
import { mkdtempSync, readFileSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { ToolExecutor, environmentFrom, episodeSeed, grpo, initModel, toolMetrics, toolsFromValues, type Environment, type ToolCall, type ToolDef } from 'prefzoo';

// A tool with a JSON Schema; `ctx.rng` and `ctx.seed` are the rollout's, so a resumed run draws the same.
const lookup: ToolDef<{ key: string }> = {
  name: 'lookup',
  description: 'The value stored under a key in this episode\'s table.',
  parameters: { type: 'object', properties: { key: { type: 'string', enum: ['a', 'b', 'c'] } }, required: ['key'] },
  run: ({ key }, ctx) => String((ctx.seed % 97) + key.charCodeAt(0)),
};

// The AI SDK's shape (its `tool()` helper returns its argument): converted with z.toJSONSchema.
const convert = {
  description: 'Converts Celsius to Fahrenheit.',
  inputSchema: z.object({ celsius: z.number().min(-273.15) }),
  execute: async ({ celsius }: { celsius: number }) => ({ fahrenheit: (celsius * 9) / 5 + 32 }),
};

const tools = new ToolExecutor({ tools: toolsFromValues([lookup, { name: 'convert', ...convert }]), toolTimeout: 10 });
console.log('tools offered:', JSON.stringify(tools.specs, null, 1));

// One assistant turn's calls, as the chat-template parser returns them.
const calls: ToolCall[] = [
  { id: 'call_1', type: 'function', function: { name: 'lookup', arguments: { key: 'b' } } },
  { id: 'call_2', type: 'function', function: { name: 'convert', arguments: '{"celsius": 21}' } },
  { id: 'call_3', type: 'function', function: { name: 'convert', arguments: { celsius: 'warm' } } },
  { id: 'call_4', type: 'function', function: { name: 'weather', arguments: {} } },
];
const seed = episodeSeed(42, 0, 0);
const round = await tools.execute(calls, { row: { prompt: 'demo' }, seed, step: 0, rollout: 0, turn: 0 });
for (const m of round.messages) console.log(`${m.tool_call_id} ${m.name}: ${m.content}`);
console.log(toolMetrics([round.records, []]));
await tools.close();

// An environment: a factory making one game per rollout; reset gets the episode seed.
class Guess implements Environment {
  private secret = 0;
  private turns = 0;
  private won = false;
  reset(_row: Record<string, unknown>, { seed }: { seed: number }) {
    this.secret = 1 + (seed % 7);
    return { messages: [{ role: 'user' as const, content: 'Guess my number from 1 to 7.' }] };
  }
  step({ text }: { text: string }) {
    const g = Number(/\d+/.exec(text)?.[0]);
    this.turns++;
    this.won = g === this.secret;
    const content = this.won ? 'correct' : g < this.secret ? 'higher' : 'lower';
    return { messages: [{ role: 'user' as const, content }], done: this.won || this.turns === 3 };
  }
  reward() {
    return this.won ? 1 : 0;
  }
}
const game = await environmentFrom(Guess, 'Guess').open();
await game.reset({}, seed);
let [lo, hi] = [1, 7];
for (let done = false; !done; ) {
  const guess = (lo + hi) >> 1;
  const step = await game.step({ text: `${guess}`, toolCalls: [] });
  console.log(`guess ${guess}: ${step.messages[0].content}`);
  if (step.messages[0].content === 'higher') lo = guess + 1;
  else hi = guess - 1;
  done = step.done;
}
console.log('environment reward:', await game.reward());

// GRPO with tools, then with the game: every rollout is multi-turn (a tiny random model rarely
// writes a call; the demos warm-start one that does).
const dir = mkdtempSync(join(tmpdir(), 'prefzoo-agent-tools-'));
initModel({ output: join(dir, 'model'), preset: 'tiny' });
writeFileSync(join(dir, 'prompts.jsonl'), ['What is stored under b?', 'Look up a.'].map((p) => JSON.stringify({ prompt: p }) + '\n').join(''));
const settings = { max_steps: 2, batch_size: 4, num_generations: 2, max_completion_length: 24, max_turns: 3, threads: 1 };
await grpo({ model: join(dir, 'model'), prompts: join(dir, 'prompts.jsonl'), rewards: ['format:\\d'], tools: [lookup], out: join(dir, 'tools-run'), settings });
await grpo({ model: join(dir, 'model'), prompts: join(dir, 'prompts.jsonl'), rewards: [], env: () => new Guess(), out: join(dir, 'env-run'), settings });
for (const run of ['tools-run', 'env-run']) {
  const last = JSON.parse(readFileSync(join(dir, run, 'metrics.jsonl'), 'utf8').trim().split('\n').at(-1)!);
  console.log(run, { calls: last['tools/call_frequency'], turns: last['num_turns/mean'], env: last['rewards/env/mean'] });
}
