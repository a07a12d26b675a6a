// In-process tools, the executor's faults, the tool metrics and environments (src/agents).
import { describe, expect, it } from 'vitest';
import { join } from 'node:path';
import { z } from 'zod';
import { SeededRandom } from '../src/random.ts';
import { turnMetrics, stopReasonMetrics } from '../src/agents/index.ts';
import { ToolExecutor, loadToolsModule, toolsFromValues, toolMetrics, loadEnvironment, environmentFrom, EnvironmentError, episodeSeed, mixSeed, type CallRecord, type RolloutContext } from '../src/agents/index.ts';
import type { ToolCall } from '../src/chat.ts';

const FIX = join(__dirname, 'fixtures/agents');
const call = (name: string, args: unknown, id?: string): ToolCall => ({ ...(id ? { id } : {}), type: 'function', function: { name, arguments: args as Record<string, unknown> } });
const ctx = (over: Partial<RolloutContext> = {}): RolloutContext => ({ row: { prompt: 'p' }, seed: 1234, step: 0, rollout: 0, turn: 0, where: 'prompts.jsonl:3', ...over });

describe('tools modules', () => {
  it('reads JSON-schema tools and skips exports that are no tool', async () => {
    const tools = await loadToolsModule(join(FIX, 'tools.mjs'));
    expect(tools.map((t) => t.name)).toEqual(['add', 'dice', 'counter', 'explode', 'refuse', 'sleep']);
    expect(tools[0].spec).toEqual({
      type: 'function',
      function: { name: 'add', description: 'Adds two integers.', parameters: { type: 'object', properties: { a: { type: 'integer' }, b: { type: 'integer' } }, required: ['a', 'b'], additionalProperties: false } },
    });
  });

  it('converts AI SDK zod tools with zod\'s own JSON Schema export (input side) and names them by export', async () => {
    const tools = await loadToolsModule(join(FIX, 'zod-tools.ts'));
    expect(tools.map((t) => t.name)).toEqual(['weather', 'shout_text']);
    // The same conversion zod gives, without $schema (the template gets the rest).
    const { $schema, ...expected } = z.toJSONSchema(z.object({ city: z.string().min(2).describe('The city'), unit: z.enum(['C', 'F']).default('C') }), { target: 'draft-7', io: 'input' }) as Record<string, unknown>;
    expect($schema).toContain('draft-07');
    expect(tools[0].spec.function.parameters).toEqual(expected);
    expect(tools[0].spec.function.parameters.required).toEqual(['city']);
  });

  it('refuses a module with no tool, a bad name and a duplicate name in one line each', async () => {
    await expect(loadToolsModule(join(FIX, 'guess-env.mjs'))).rejects.toThrow(/exports no tool/);
    expect(() => toolsFromValues([{ name: 'has space', parameters: {}, run: () => '' }])).toThrow(/tool name "has space" must be/);
    const t = { name: 'same', parameters: { type: 'object' }, run: () => '' };
    expect(() => toolsFromValues([t, { ...t }])).toThrow(/two tools are named "same"/);
    await expect(loadToolsModule('nope.mjs')).rejects.toThrow(/does not exist/);
  });
});

describe('the executor', () => {
  it('answers calls in order with tool messages, ids and names; ok calls are counted as such', async () => {
    const ex = new ToolExecutor({ tools: await loadToolsModule(join(FIX, 'tools.mjs')) });
    const r = await ex.execute([call('add', { a: 2, b: 40 }, 'c1'), call('add', '{"a": -1, "b": 1}')], ctx());
    expect(r.messages).toEqual([
      { role: 'tool', content: '42', name: 'add', tool_call_id: 'c1' },
      { role: 'tool', content: '0', name: 'add' },
    ]);
    expect(r.records.map(({ name, ok }) => ({ name, ok }))).toEqual([
      { name: 'add', ok: true },
      { name: 'add', ok: true },
    ]);
    expect(ex.specs.map((s) => s.function.name)).toEqual(['add', 'dice', 'counter', 'explode', 'refuse', 'sleep']);
  });

  it('turns every fault into an error message and a failed record', async () => {
    const ex = new ToolExecutor({ tools: [...(await loadToolsModule(join(FIX, 'tools.mjs'))), ...(await loadToolsModule(join(FIX, 'zod-tools.ts')))], toolTimeout: 0.2 });
    const calls = [
      call('add', { a: 1 }), // schema: missing b
      call('add', { a: 1, b: 'two' }), // schema: wrong type
      call('add', '{"a": 1, "b":'), // not JSON
      call('nosuch', {}), // unknown
      call('explode', {}), // throws
      call('refuse', {}), // returns an error
      call('sleep', { seconds: 30 }), // past tool_timeout
      call('weather', { city: 'X' }), // zod min(2) (also in the JSON Schema)
      call('shout_text', { text: 'r2d2' }), // zod refinement JSON Schema cannot say
      call('weather', { city: 'Oslo' }), // fine: default filled in by zod
    ];
    const r = await ex.execute(calls, ctx());
    const errors = r.messages.map((m) => (m.content.startsWith('{"error"') ? JSON.parse(m.content).error : null));
    expect(errors[0]).toBe("invalid arguments for add: arguments must have required property 'b'");
    expect(errors[1]).toBe('invalid arguments for add: argument b must be integer');
    expect(errors[2]).toMatch(/^the arguments of add are not JSON/);
    expect(errors[3]).toMatch(/^unknown tool "nosuch"; the tools are: add, dice, counter/);
    expect(errors[4]).toBe('explode failed: the fuse was lit');
    expect(errors[5]).toBe('no such city');
    expect(errors[6]).toBe('sleep ran past tool_timeout (0.2 s) and was stopped');
    expect(errors[7]).toBe('invalid arguments for weather: argument city must NOT have fewer than 2 characters');
    expect(errors[8]).toBe('invalid arguments for shout_text: argument text: no digits allowed');
    expect(errors[9]).toBeNull();
    expect(JSON.parse(r.messages[9].content)).toEqual({ city: 'Oslo', unit: 'C', temperature: 21 });
    expect(r.records.map((x) => x.ok)).toEqual([false, false, false, false, false, false, false, false, false, true]);
    expect(r.records[5].error).toBe('refuse returned an error: no such city');
    expect(r.messages.map((m) => m.name)).toEqual(calls.map((c) => c.function.name));
  });

  it('gives each call a generator from the seed, turn and index, and per-rollout state', async () => {
    const ex = new ToolExecutor({ tools: await loadToolsModule(join(FIX, 'tools.mjs')) });
    const seed = episodeSeed(7, 3, 1);
    const run = () => ex.execute([call('dice', {}), call('dice', {}), call('counter', {}), call('counter', {})], ctx({ seed, turn: 2 }));
    const a = await run();
    const b = await run();
    expect(a.messages.slice(0, 2)).toEqual(b.messages.slice(0, 2));
    const rolls = a.messages.slice(0, 2).map((m) => JSON.parse(m.content));
    // The documented derivation: xoshiro seeded with mixSeed(seed, turn, call, 0x700c).
    expect(rolls).toEqual([0, 1].map((i) => ({ roll: 1 + new SeededRandom(mixSeed(seed, 2, i, 0x700c)).int(6), seed, turn: 2, call: i })));
    // The state lives across the rollout's turns, apart from other rollouts, and starts afresh each step.
    expect(a.messages.slice(2).map((m) => m.content)).toEqual(['1', '2']);
    expect(b.messages.slice(2).map((m) => m.content)).toEqual(['3', '4']);
    const next = await ex.execute([call('counter', {})], ctx({ seed, turn: 3 }));
    const other0 = await ex.execute([call('counter', {})], ctx({ seed, rollout: 1 }));
    const newStep = await ex.execute([call('counter', {})], ctx({ seed, step: 1 }));
    expect([next, other0, newStep].map((r) => r.messages[0].content)).toEqual(['5', '1', '1']);
    // Another episode seed draws differently somewhere over a few calls.
    const other = await ex.execute(Array.from({ length: 8 }, () => call('dice', {})), ctx({ seed: seed + 1 }));
    const mine = await ex.execute(Array.from({ length: 8 }, () => call('dice', {})), ctx({ seed }));
    expect(other.messages.map((m) => JSON.parse(m.content).roll)).not.toEqual(mine.messages.map((m) => JSON.parse(m.content).roll));
  });

  it('stops on the run\'s abort signal instead of answering', async () => {
    const ex = new ToolExecutor({ tools: await loadToolsModule(join(FIX, 'tools.mjs')) });
    const ac = new AbortController();
    setTimeout(() => ac.abort(), 50);
    await expect(ex.execute([call('sleep', { seconds: 30 })], ctx({ signal: ac.signal }))).rejects.toThrow(/AbortSignal/);
  });
});

describe('tool metrics', () => {
  const rec = (ok: boolean): CallRecord => ({ name: 't', ok, ms: 0 });
  it('follows TRL: calls per rollout, failures per call', () => {
    // TRL's test_training_with_tools: 3 completions, 2 calls, 1 failed → 2/3 and 1/2.
    expect(toolMetrics([[rec(true)], [rec(false)], []])).toEqual({ 'tools/call_frequency': 2 / 3, 'tools/failure_frequency': 1 / 2 });
    expect(toolMetrics([[], []])).toEqual({ 'tools/call_frequency': 0, 'tools/failure_frequency': 0 });
    expect(toolMetrics([[rec(false), rec(false), rec(true), rec(true)]])).toEqual({ 'tools/call_frequency': 4, 'tools/failure_frequency': 0.5 });
  });

  it('verl\'s num_turns over trajectories and stop-reason fractions', () => {
    expect(turnMetrics([1, 3, 2, 2])).toEqual({ 'num_turns/mean': 2, 'num_turns/min': 1, 'num_turns/max': 3 });
    expect(turnMetrics([])).toEqual({});
    expect(stopReasonMetrics(['stop', 'max_turns', 'stop', 'length'])).toEqual({ 'stop_reason/length': 0.25, 'stop_reason/max_turns': 0.25, 'stop_reason/stop': 0.5 });
  });

  it('counts what the executor recorded, faults included', async () => {
    const ex = new ToolExecutor({ tools: await loadToolsModule(join(FIX, 'tools.mjs')) });
    const r1 = await ex.execute([call('add', { a: 1, b: 2 }), call('nosuch', {})], ctx({ rollout: 0 }));
    const r2 = await ex.execute([call('explode', {})], ctx({ rollout: 1 }));
    expect(toolMetrics([r1.records, r2.records, []])).toEqual({ 'tools/call_frequency': 1, 'tools/failure_frequency': 2 / 3 });
  });
});

describe('environments', () => {
  it('runs a game from the episode seed; the members of a group start alike', async () => {
    const mod = await loadEnvironment(join(FIX, 'guess-env.mjs'));
    const seed = episodeSeed(0, 0, 5);
    const play = async (guesses: number[]) => {
      const s = await mod.open('prompts.jsonl:1');
      const opening = await s.reset({ prompt: 'hi' }, seed);
      const hints: string[] = [];
      for (const g of guesses) {
        const st = await s.step({ text: `${g}`, toolCalls: [] });
        hints.push(st.messages[0].content);
        if (st.done) break;
      }
      return { opening, hints, reward: await s.reward() };
    };
    const a = await play([4, 2, 6]);
    const b = await play([4, 2, 6]);
    expect(a).toEqual(b);
    expect(a.opening).toEqual([{ role: 'user', content: 'Guess my number from 1 to 7 (hi).' }]);
    // Binary search on the hints finds the secret within 3 guesses.
    const s = await mod.open();
    await s.reset({}, seed);
    let lo = 1;
    let hi = 7;
    let won = false;
    for (let t = 0; t < 3 && !won; t++) {
      const g = (lo + hi) >> 1;
      const st = await s.step({ text: `I guess ${g}`, toolCalls: [] });
      if (st.messages[0].content === 'correct') won = true;
      else if (st.messages[0].content === 'higher') lo = g + 1;
      else hi = g - 1;
    }
    expect(won).toBe(true);
    expect(await s.reward()).toBe(1);
  });

  it('a throwing step stops the run with one line naming the module, the function and the prompt', async () => {
    const spec = join(FIX, 'broken-env.mjs');
    const s = await (await loadEnvironment(spec)).open('data/prompts.jsonl:12');
    await s.reset({}, 1);
    await s.step({ text: 'a', toolCalls: [] });
    const e = await s.step({ text: 'b', toolCalls: [] }).catch((x) => x);
    expect(e).toBeInstanceOf(EnvironmentError);
    expect(e.message).toBe(`--env ${spec}: step() threw for the prompt at data/prompts.jsonl:12: board is undefined`);
    expect(e.message.split('\n')).toHaveLength(1);
    expect(e.fn).toBe('step');
    await expect(s.reward()).rejects.toThrow(`--env ${spec}: reward() answered in the wrong shape for the prompt at data/prompts.jsonl:12: expected a finite number or null, got "lots"`);
  });

  it('refuses one shared environment object and a throwing reset names reset', async () => {
    expect(() => environmentFrom({ reset() {}, step() {} }, 'e.mjs')).toThrow(/export a factory/);
    const s = await environmentFrom(() => ({ reset: () => { throw new Error('no board'); }, step: () => ({ messages: [], done: true }) }), 'e.mjs').open('p.jsonl:2');
    await expect(s.reset({}, 0)).rejects.toThrow('--env e.mjs: reset() threw for the prompt at p.jsonl:2: no board');
  });
});
