/**
 * `prefzoo demo --method tools` and `--method env`: the env demo end to end with tiny budgets (2
 * warm-start steps, 1 GRPO step, 2 held-out prompts; the tools demo shares src/demos/agent-shared.ts,
 * so one run holds the JSON fields and the run folder for both), and that each ceiling's evaluation
 * really withholds the information — the lookup tool answers the same whatever the table, the game
 * says "no" whatever the secret. Whether the demos learn is measured by the seed tables of
 * docs/agents.md (scripts/bench/agent-demos.sh), not here.
 */
import { describe, it, expect } from 'vitest';
import { mkdtempSync, readFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { SeededRandom } from '../src/random.ts';
import type { ToolContext } from '../src/agents/types.ts';
import { DEMO_TEMPLATE, LOOKUP_TOOL, USELESS_TOOL } from '../src/demos/tools.ts';
import { loadTokenizer, writeTokenizer } from '../src/tokenize/index.ts';
import { renderChat } from '../src/tokenize/conversation.ts';
import { parseToolCalls, toolCallFormatOf } from '../src/tokenize/tool-calls.ts';
import { toolsFromValues } from '../src/agents/tools.ts';
import type { ToolDef } from '../src/agents/types.ts';
import { GUESSES, guessingGame, HIGHEST, runEnvDemo, warmStartGame } from '../src/demos/env.ts';
import type { AgentDemoResult } from '../src/demos/agent-shared.ts';
import { readDemoEval } from '../src/train/demo-eval.ts';
import { runAgentDemo } from '../src/demos/agent.ts';

const ctx = (table: string, seed: number) => ({ row: { table }, rng: new SeededRandom(seed), seed, turn: 0, call: 0, state: {}, signal: new AbortController().signal }) as ToolContext;

function checkResult(r: AgentDemoResult, method: string): void {
  expect(r.method).toBe(method);
  for (const k of ['heldout_accuracy_start', 'heldout_accuracy_final', 'ceiling_without_tools'] as const) {
    expect(r[k]).toBeGreaterThanOrEqual(0);
    expect(r[k]).toBeLessThanOrEqual(1);
  }
  expect(r.tool_call_frequency_final).toBeGreaterThanOrEqual(0);
  expect(r.num_turns_final).toBeGreaterThanOrEqual(1);
  expect(r.steps).toBe(1);
  expect(r.heldout_prompts).toBe(2);
  const ev = readDemoEval(r.run)!;
  expect(ev.demo).toBe(method);
  expect(ev.metrics.heldout_accuracy).toEqual({ before: r.heldout_accuracy_start, after: r.heldout_accuracy_final });
  expect(ev.values!.ceiling_without_tools).toBe(r.ceiling_without_tools);
  // metrics.jsonl starts and ends with the held-out evaluations (step 0 and the last step).
  const rows = readFileSync(join(r.run, 'metrics.jsonl'), 'utf8').trim().split('\n').map((l) => JSON.parse(l) as Record<string, unknown>);
  expect(rows[0]).toMatchObject({ step: 0, split: 'eval' });
  expect(rows.at(-1)).toMatchObject({ step: 1, split: 'eval' });
}

describe('prefzoo demo --method tools', () => {
  it('the lookup tool reads the prompt\'s own table; the ceiling\'s tool answers the same whatever the table', () => {
    expect(LOOKUP_TOOL.run({ k: 'a' }, ctx('30000009', 1))).toBe('3');
    expect(LOOKUP_TOOL.run({ k: 'h' }, ctx('30000009', 1))).toBe('9');
    expect(LOOKUP_TOOL.run({ k: 'z' }, ctx('30000009', 1))).toBeInstanceOf(Error);
    const answers = (table: string) => Array.from({ length: 40 }, (_, i) => USELESS_TOOL.run({ k: 'c' }, ctx(table, i)));
    expect(answers('00000000')).toEqual(answers('99999999'));
    expect(new Set(answers('00000000')).size).toBeGreaterThan(5);
  });
  it("the demo model's chat template names the tools in a short header, and its calls are Hermes calls that parse back", () => {
    const dir = mkdtempSync(join(tmpdir(), 'prefzoo-tools-template-'));
    writeTokenizer(dir, { chatTemplate: DEMO_TEMPLATE });
    const tok = loadTokenizer(dir);
    expect(tok.chatTemplate).toBe(DEMO_TEMPLATE);
    expect(toolCallFormatOf(tok.chatTemplate)).toBe('hermes');
    const spec = toolsFromValues([LOOKUP_TOOL as unknown as ToolDef])[0].spec;
    const prompt = renderChat(tok, [{ role: 'user', content: 'c?' }], { tools: [spec], addGenerationPrompt: true });
    expect(prompt).toBe('<|bos|><|im_start|>system\n<tools> get </tools><|im_end|>\n<|im_start|>user\nc?<|im_end|>\n<|im_start|>assistant\n');
    const whole = renderChat(tok, [{ role: 'user', content: 'c?' }, { role: 'assistant', content: '', tool_calls: [{ type: 'function', function: { name: 'get', arguments: { k: 'c' } } }] }], { tools: [spec] });
    expect(whole.startsWith(prompt)).toBe(true);
    const turn = whole.slice(prompt.length).replace(/<\|im_end\|>\n$/, '');
    const parsed = parseToolCalls(turn, 'hermes');
    expect(parsed.errors).toEqual([]);
    expect(parsed.toolCalls.map((c) => [c.function.name, c.function.arguments])).toEqual([['get', { k: 'c' }]]);
  });
});

describe('prefzoo demo --method env', () => {
  it('the game answers higher/lower, or "no" with the feedback withheld, and ends after the third guess', async () => {
    const play = async (feedback: boolean, guesses: number[]) => {
      const env = await guessingGame(feedback)();
      await env.reset({}, { seed: 5 });
      const said: string[] = [];
      for (const g of guesses) {
        const st = await env.step({ text: String(g), toolCalls: [] });
        said.push(st.messages.map((m) => m.content).join('') + (st.done ? `|done ${st.reward}` : ''));
        if (st.done) break;
      }
      return said;
    };
    // The secret of seed 5, found by playing every number once.
    const all = await Promise.all([1, 2, 3, 4, 5, 6, 7].map((g) => play(true, [g])));
    const hit = all.findIndex((s) => s[0] === '|done 1') + 1;
    expect(hit).toBeGreaterThan(0);
    for (let g = 1; g <= 7; g++) {
      if (g === hit) continue;
      expect(all[g - 1]).toEqual([g < hit ? 'higher' : 'lower']);
      expect(await play(false, [g])).toEqual(['no']);
    }
    const miss = hit === 1 ? 2 : 1;
    expect(await play(true, Array(GUESSES + 1).fill(miss))).toHaveLength(GUESSES);
    expect((await play(true, Array(GUESSES).fill(miss))).at(-1)).toBe('|done 0');
  });

  it('the warm start\'s games read the feedback and hold no strategy: each guess is drawn among the numbers the feedback allows, every one of them as often', () => {
    const r = new SeededRandom(3);
    // counts[turn][allowed range "lo-hi"][guess]
    const counts = new Map<string, number[]>();
    for (let k = 0; k < 20000; k++) {
      const secret = 1 + r.int(HIGHEST);
      const game = warmStartGame(r, secret);
      let lo = 1;
      let hi = HIGHEST;
      for (let i = 0; i < game.length; i += 2) {
        const guess = Number(game[i].content);
        expect(game[i].role).toBe('assistant');
        expect(guess).toBeGreaterThanOrEqual(lo);
        expect(guess).toBeLessThanOrEqual(hi);
        const key = `${i / 2}:${lo}-${hi}`;
        const c = counts.get(key) ?? counts.set(key, new Array(HIGHEST + 1).fill(0)).get(key)!;
        c[guess]++;
        if (i + 1 === game.length) {
          // The game ends on a hit or on the last guess.
          expect(guess === secret || i / 2 === GUESSES - 1).toBe(true);
          break;
        }
        // The feedback is the truth about the secret.
        expect(game[i + 1]).toEqual({ role: 'user', content: guess < secret ? 'higher' : 'lower' });
        if (guess < secret) lo = guess + 1;
        else hi = guess - 1;
      }
    }
    // The first guess is uniform over 1–7 (no opening is preferred), and so is the second within what
    // the feedback left (after 4 higher: 5, 6 and 7 alike, not the middle one).
    const uniform = (key: string, lo: number, hi: number) => {
      const c = counts.get(key)!;
      const n = c.reduce((a, b) => a + b, 0);
      for (let g = lo; g <= hi; g++) expect(Math.abs(c[g] / n - 1 / (hi - lo + 1))).toBeLessThan(4 * Math.sqrt(1 / (hi - lo + 1) / n));
    };
    uniform('0:1-7', 1, 7);
    uniform('1:5-7', 5, 7);
    uniform('1:1-3', 1, 3);
  });

  it('runs end to end with tiny budgets and prints the fields', async () => {
    const dir = mkdtempSync(join(tmpdir(), 'pz-demo-env-'));
    const r = await runEnvDemo({ seed: 0, out: dir, params: ['max_steps=1'], warmStartSteps: 2, heldoutPrompts: 2 });
    checkResult(r, 'env');
    expect(r.tool_call_frequency_final).toBe(0);
  });
});

describe('prefzoo demo --method agent', () => {
  it('its agent is an app\'s code: it imports the AI SDK and nothing of prefzoo', () => {
    const src = readFileSync(join(import.meta.dirname, '../src/demos/lookup-agent.mjs'), 'utf8');
    const imports = [...src.matchAll(/^import .* from '([^']+)';$/gm)].map((m) => m[1]);
    expect(imports.sort()).toEqual(['@ai-sdk/openai-compatible', 'ai']);
  });

  it('runs end to end with tiny budgets through the endpoint and prints the tools demo\'s fields', async () => {
    const dir = mkdtempSync(join(tmpdir(), 'pz-demo-agent-'));
    const r = await runAgentDemo({ seed: 0, out: dir, params: ['max_steps=1'], warmStartSteps: 2, heldoutPrompts: 2 });
    checkResult(r, 'agent');
    // Every call of the agent in training went through the endpoint and was recorded.
    const calls = readFileSync(join(r.run, 'agent_calls.jsonl'), 'utf8').trim().split('\n').map((l) => JSON.parse(l) as { calls: unknown[] });
    expect(calls).toHaveLength(128);
    expect(calls.every((c) => c.calls.length >= 1 && c.calls.length <= 2)).toBe(true);
  });
});
