/**
 * `prefzoo grpo --agent`: an agent written with the `openai` SDK (test/fixtures/agents), knowing
 * nothing of prefzoo, trained through the run's endpoint:
 *
 * - 2 steps log the agent metrics, and every trained row holds exactly the ids the endpoint returned
 *   to the agent (the agent writes what it got; RUN/agent_calls.jsonl what was trained);
 * - killed with SIGKILL after its first checkpoint and resumed: the same metrics, calls and weights;
 * - faults: an agent that throws on every task stops the run in one line naming the module, the task's
 *   file:line and the error; one failing on some rollouts is counted and left out.
 */
import { spawnSync } from 'node:child_process';
import { existsSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join, resolve } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { initModelFolder } from '../src/models/init.ts';
import { killWhen } from './helpers/faults.ts';

const ROOT = resolve(import.meta.dirname, '..');
const bin = join(ROOT, 'bin', 'prefzoo.mjs');
const AGENT = join(ROOT, 'test/fixtures/agents/openai-tool-loop.mjs');
const dir = mkdtempSync(join(tmpdir(), 'prefzoo-grpo-agent-'));
afterAll(() => rmSync(dir, { recursive: true, force: true }));
const model = join(dir, 'model');
const SET = ['max_steps=2', 'save_steps=1', 'batch_size=4', 'num_generations=2', 'max_completion_length=10', 'logging_steps=1', 'threads=1', 'learning_rate=1e-3', 'beta=0.05'];
const tasks = (log: string) => {
  const f = join(dir, `tasks-${Math.random().toString(36).slice(2)}.jsonl`);
  writeFileSync(f, ['What is the key of a?', 'Say a digit.', 'Look b up.'].map((q) => JSON.stringify({ question: q, log }) + '\n').join(''));
  return f;
};
const args = (prompts: string, out: string, extra: string[] = []) => ['grpo', '--model', model, '--prompts', prompts, '--agent', AGENT, '-o', out, '--quiet', ...SET.flatMap((s) => ['--param', s]), ...extra];
const TIMINGS = new Set(['tokens/s', 'agent/agent_seconds', 'agent/decode_seconds']);
const rows = (out: string) => readFileSync(join(out, 'metrics.jsonl'), 'utf8').trim().split('\n').map((l) => Object.fromEntries(Object.entries(JSON.parse(l) as Record<string, number>).filter(([k]) => !TIMINGS.has(k))));
const jsonl = (f: string) => readFileSync(f, 'utf8').trim().split('\n').map((l) => JSON.parse(l));

beforeAll(() => initModelFolder(model, 'llama', 'tiny', 3));

describe('grpo --agent (an openai-SDK agent through the endpoint)', () => {
  it('2 steps: agent metrics; the trained rows hold the ids the endpoint returned; kill -9 and --resume give the same run', async () => {
    const log = join(dir, 'straight-agent.jsonl');
    const straight = join(dir, 'straight');
    const a = spawnSync(process.execPath, [bin, ...args(tasks(log), straight)], { encoding: 'utf8' });
    expect(a.status, a.stderr).toBe(0);
    const want = rows(straight);
    expect(want.map((r) => r.step)).toEqual([1, 2]);
    for (const r of want) {
      expect(r['agent/calls_per_rollout']).toBe(2);
      expect(r['agent/errors']).toBe(0);
      expect(r['agent/merged_calls'] + r['agent/forked_calls']).toBe(4);
      expect(r['agent/rows_per_rollout']).toBeGreaterThanOrEqual(1);
      expect(Number.isFinite(r['rewards/agent/mean'])).toBe(true);
    }
    const calls = jsonl(join(straight, 'agent_calls.jsonl'));
    expect(calls).toHaveLength(4 * 2);
    // What the agent was answered, call by call, is what the run recorded and trained on.
    const seen = jsonl(log);
    expect(seen).toHaveLength(16);
    const recorded = calls.flatMap((c) => c.calls);
    const key = (p: number[], c: number[]) => JSON.stringify([p, c]);
    expect(new Set(seen.map((s) => key(s.prompt_token_ids, s.token_ids)))).toEqual(new Set(recorded.map((c: { prompt_ids: number[]; completion_ids: number[] }) => key(c.prompt_ids, c.completion_ids))));
    for (const r of calls) {
      for (const c of r.calls) {
        const row = r.rows[c.row];
        const full = [...row.prompt_ids, ...row.ids];
        const mask = [...row.prompt_ids.map(() => 0), ...row.loss_mask];
        // The call's prompt is a prefix of its row's tokens, and its completion follows it with mask 1.
        expect(full.slice(0, c.prompt_ids.length)).toEqual(c.prompt_ids);
        expect(full.slice(c.prompt_ids.length, c.prompt_ids.length + c.completion_ids.length)).toEqual(c.completion_ids);
        expect(mask.slice(c.prompt_ids.length, c.prompt_ids.length + c.completion_ids.length).every((m: number) => m === 1)).toBe(true);
      }
      // Every masked-in token of a row is a sampled one.
      for (const row of r.rows) expect(row.loss_mask.reduce((s: number, m: number) => s + m, 0)).toBe(r.calls.filter((c: { row: number }) => r.rows[c.row] === row).reduce((s: number, c: { completion_ids: number[] }) => s + c.completion_ids.length, 0));
    }
    // The G rollouts of a task share its seed.
    const seeds = new Map<string, Set<number>>();
    for (const s of seen) {
      const k = s.baseURL.replace(/-\d+-[a-z0-9]+\/v1$/, '');
      seeds.set(k, (seeds.get(k) ?? new Set()).add(s.seed));
    }
    for (const v of seeds.values()) expect(v.size).toBe(1);

    const broken = join(dir, 'broken');
    const brokenTasks = tasks(join(dir, 'broken-agent.jsonl'));
    await killWhen(args(brokenTasks, broken), () => existsSync(join(broken, 'checkpoints', 'step-00000001', 'state.json')));
    expect(existsSync(join(broken, 'final'))).toBe(false);
    const b = spawnSync(process.execPath, [bin, ...args(brokenTasks, broken, ['--resume'])], { encoding: 'utf8' });
    expect(b.status, b.stderr).toBe(0);
    expect(rows(broken)).toEqual(want);
    const strip = (x: { task: string }[]) => x.map(({ task: _, ...r }) => r);
    expect(strip(jsonl(join(broken, 'agent_calls.jsonl')))).toEqual(strip(calls));
    expect(Buffer.compare(readFileSync(join(straight, 'final', 'model.safetensors')), readFileSync(join(broken, 'final', 'model.safetensors')))).toBe(0);
  });

  it('an agent that always throws stops the run in one line naming the module, the task and the error', () => {
    const throws = join(dir, 'throws.mjs');
    writeFileSync(throws, 'export default async () => { throw new Error("the simulator is down"); };\n');
    const out = join(dir, 'throws');
    const r = spawnSync(process.execPath, [bin, ...args(tasks(''), out).map((x) => (x === AGENT ? throws : x))], { encoding: 'utf8' });
    expect(r.status).toBe(1);
    const lines = r.stderr.trim().split('\n');
    expect(lines, r.stderr).toHaveLength(1);
    expect(lines[0]).toMatch(/^prefzoo: --agent .*throws\.mjs: 4 of 4 rollouts failed \(past max_agent_error_rate=0\.25\); the first, on the task at .*tasks-\w+\.jsonl:\d: the simulator is down$/);
    expect(existsSync(join(out, 'final'))).toBe(false);
  });

  it('rollouts that fail now and then are counted and left out; a number-less return and a timeout count as failures', () => {
    const flaky = join(dir, 'flaky.mjs');
    // Rollouts start in order: of every 4, the second returns no number, the third makes a malformed
    // call (n = 2 on a rollout's path: a 400 the SDK throws on) and the fourth never ends.
    writeFileSync(flaky, [
      `import real from ${JSON.stringify(AGENT)};`,
      'let k = 0;',
      'export default async (task, ctx) => {',
      '  const n = k++ % 4;',
      '  if (n === 1) return "no reward here";',
      "  if (n === 2) { const r = await fetch(ctx.baseURL + '/chat/completions', { method: 'POST', headers: { 'content-type': 'application/json' }, body: JSON.stringify({ model: ctx.model, messages: [{ role: 'user', content: 'hi' }], n: 2 }) }); throw new Error((await r.json()).error.message); }",
      '  if (n === 3) return new Promise(() => {});',
      '  return real(task, ctx);',
      '};',
    ].join('\n'));
    const out = join(dir, 'flaky');
    const r = spawnSync(process.execPath, [bin, ...args(tasks(''), out, ['--param', 'max_agent_error_rate=0.75', '--param', 'agent_timeout=2']).map((x) => (x === AGENT ? flaky : x))], { encoding: 'utf8' });
    expect(r.status, r.stderr).toBe(0);
    const m = rows(out);
    // Each step: 4 rollouts, 3 failed — counted, their rewards left out (no function scored them).
    for (const row of m) {
      expect(row['agent/errors']).toBe(3);
      expect(row['frac_reward_none']).toBe(0.75);
    }
    const calls = jsonl(join(out, 'agent_calls.jsonl'));
    expect(calls.filter((c) => c.error).every((c) => c.rows.length === 0)).toBe(true);
    expect(calls.some((c) => /timed out after agent_timeout=2 s/.test(c.error ?? ''))).toBe(true);
    expect(calls.some((c) => /returned "no reward here" and no --reward scores it/.test(c.error ?? ''))).toBe(true);
    expect(calls.some((c) => /"n" must be 1 on a rollout's path/.test(c.error ?? ''))).toBe(true);
  });

  it('train_calls picks the calls trained on: last, or a predicate module; the others stay in their rows with mask 0', () => {
    const pick = join(dir, 'pick.mjs');
    writeFileSync(pick, 'export default (call) => call.index === 0 && call.calls === 2;\n');
    for (const [which, trained] of [['last', 1], [pick, 0]] as const) {
      const out = join(dir, `calls-${trained}`);
      const r = spawnSync(process.execPath, [bin, ...args(tasks(''), out, ['--param', 'max_steps=1', '--param', `train_calls=${which}`])], { encoding: 'utf8' });
      expect(r.status, r.stderr).toBe(0);
      for (const x of jsonl(join(out, 'agent_calls.jsonl'))) {
        expect(x.calls).toHaveLength(2);
        for (const [k, c] of (x.calls as { row: number | null; prompt_ids: number[]; completion_ids: number[] }[]).entries()) {
          // A row holding no trained call is not kept.
          if (c.row === null) {
            expect(k).not.toBe(trained);
            continue;
          }
          const row = x.rows[c.row];
          const at = c.prompt_ids.length - row.prompt_ids.length;
          const mask = row.loss_mask.slice(at, at + c.completion_ids.length);
          expect(mask.every((v: number) => v === (k === trained ? 1 : 0)), `${which} call ${k}`).toBe(true);
        }
      }
    }
  });

  it('--help lists --agent and its settings; its settings without --agent, and --tools beside it, are refused', () => {
    const h = spawnSync(process.execPath, [bin, 'grpo', '--help'], { encoding: 'utf8' }).stdout;
    expect(h).toContain('--agent <module>');
    for (const k of ['agent_timeout=300', 'max_agent_error_rate=0.25', 'train_calls=all']) expect(h).toContain(`    ${k}  `);
    const p = tasks('');
    const r = spawnSync(process.execPath, [bin, 'grpo', '--model', model, '--prompts', p, '--reward', 'format:x', '-o', join(dir, 'refused'), '--param', 'agent_timeout=3'], { encoding: 'utf8' });
    expect(r.stderr.trim()).toBe('prefzoo: grpo: agent_timeout=3 applies to --agent runs; give --agent or leave agent_timeout out');
    const t = spawnSync(process.execPath, [bin, 'grpo', '--model', model, '--prompts', p, '--agent', AGENT, '--tools', AGENT, '-o', join(dir, 'refused2')], { encoding: 'utf8' });
    expect(t.stderr.trim()).toBe('prefzoo: grpo: --agent runs its own tools and talks to the endpoint; --tools cannot be given beside it');
  });
});
