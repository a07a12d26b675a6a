/**
 * examples/agent-openai/: the tools demo's task as an agent written with the `openai` SDK's own tool
 * loop, kept from rotting:
 *
 * - its tool `get` reads the task's table (and answers bad keys with an error the model reads);
 * - `prefzoo grpo --agent examples/agent-openai/agent.mjs --reward accuracy` runs 1 step on a tiny
 *   model: at most 2 calls a rollout, no failure, `accuracy` scoring the agent's text, every recorded
 *   call in RUN/agent_calls.jsonl;
 * - run-agent.mjs (the per-rollout process of docs/trl-handoff.md) runs scored.mjs against
 *   `prefzoo serve`: the reward it prints is the example's rule applied to the text it prints, and with
 *   AGL_EVENT_URL the same reward is posted as Agent Lightning's reward event with the bearer key.
 */
import { execFile, spawnSync } from 'node:child_process';
import { createServer, type IncomingMessage } from 'node:http';
import type { AddressInfo } from 'node:net';
import { mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join, resolve } from 'node:path';
import { promisify } from 'node:util';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { initModelFolder } from '../src/models/init.ts';
import { serve } from '../src/index.ts';

const ROOT = resolve(import.meta.dirname, '..');
const bin = join(ROOT, 'bin', 'prefzoo.mjs');
const EX = join(ROOT, 'examples', 'agent-openai');
const dir = mkdtempSync(join(tmpdir(), 'prefzoo-agent-openai-'));
afterAll(() => rmSync(dir, { recursive: true, force: true }));
const model = join(dir, 'model');
const run = promisify(execFile);

beforeAll(() => initModelFolder(model, 'llama', 'tiny', 11));

const jsonl = (f: string) => readFileSync(f, 'utf8').trim().split('\n').map((l) => JSON.parse(l));

describe('examples/agent-openai', () => {
  it('the tool reads the key out of the table; a bad key or bad arguments are answered with an error', async () => {
    const { get } = (await import(join(EX, 'agent.mjs'))) as { get: (table: string, args: string) => string };
    const table = '31759270';
    expect('abcdefgh'.split('').map((k) => get(table, JSON.stringify({ k })))).toEqual(table.split(''));
    expect(get(table, '{"k": "z"}')).toMatch(/^error: no key "z"/);
    expect(get(table, '{"k": ')).toMatch(/^error: the arguments are not JSON/);
    // tasks.mjs: each row's answer is its table's digit at its key.
    const rows = spawnSync(process.execPath, [join(EX, 'tasks.mjs'), '50', '3'], { encoding: 'utf8' }).stdout.trim().split('\n').map((l) => JSON.parse(l) as { prompt: string; answer: string; table: string });
    expect(rows).toHaveLength(50);
    for (const r of rows) {
      expect(r.prompt).toMatch(/^[a-h]\?$/);
      expect(r.table).toMatch(/^\d{8}$/);
      expect(r.answer).toBe(get(r.table, JSON.stringify({ k: r.prompt[0] })));
    }
  });

  it('1 GRPO step with --agent agent.mjs --reward accuracy: at most 2 calls a rollout, all recorded, no failure', () => {
    const tasks = join(dir, 'tasks.jsonl');
    writeFileSync(tasks, spawnSync(process.execPath, [join(EX, 'tasks.mjs'), '8'], { encoding: 'utf8' }).stdout);
    const out = join(dir, 'run');
    const set = ['max_steps=1', 'batch_size=4', 'num_generations=2', 'max_completion_length=12', 'threads=1', 'learning_rate=1e-3'];
    const r = spawnSync(process.execPath, [bin, 'grpo', '--model', model, '--prompts', tasks, '--agent', join(EX, 'agent.mjs'), '--reward', 'accuracy', '-o', out, '--quiet', ...set.flatMap((s) => ['--param', s])], { encoding: 'utf8' });
    expect(r.status, r.stderr).toBe(0);
    const [m] = jsonl(join(out, 'metrics.jsonl'));
    expect(m.step).toBe(1);
    expect(m['agent/errors']).toBe(0);
    expect(m['agent/calls_per_rollout']).toBeGreaterThanOrEqual(1);
    expect(m['agent/calls_per_rollout']).toBeLessThanOrEqual(2);
    expect(m['rewards/accuracy/mean']).toBeGreaterThanOrEqual(0);
    expect(m['rewards/accuracy/mean']).toBeLessThanOrEqual(1);
    const rollouts = jsonl(join(out, 'agent_calls.jsonl'));
    expect(rollouts).toHaveLength(4);
    const calls = rollouts.reduce((s: number, x: { calls: unknown[] }) => s + x.calls.length, 0);
    expect(calls / 4).toBe(m['agent/calls_per_rollout']);
    expect(m['agent/merged_calls'] + m['agent/forked_calls']).toBe(calls - 4);
    for (const x of rollouts) {
      expect(x.error).toBeUndefined();
      expect(x.calls.length).toBeGreaterThanOrEqual(1);
      expect(x.calls.length).toBeLessThanOrEqual(2);
    }
  });

  it('run-agent.mjs runs scored.mjs against prefzoo serve and posts its reward as an Agent Lightning event', async () => {
    const server = await serve({ model, port: 0, servedModelName: 'tiny' });
    const events: { auth: string | undefined; body: unknown }[] = [];
    const agl = createServer((req: IncomingMessage, res) => {
      let body = '';
      req.on('data', (c) => (body += c));
      req.on('end', () => {
        events.push({ auth: req.headers.authorization, body: JSON.parse(body) });
        res.writeHead(200, { 'content-type': 'application/json' }).end('{}');
      });
    });
    await new Promise<void>((r) => agl.listen(0, '127.0.0.1', r));
    try {
      const task = { prompt: 'c?', answer: '7', table: '31759270' };
      const env = { ...process.env, TASK: JSON.stringify(task), OPENAI_BASE_URL: server.url, SEED: '5' };
      // The model's name from GET /models (no MODEL given).
      const plain = JSON.parse((await run(process.execPath, [join(EX, 'run-agent.mjs'), join(EX, 'scored.mjs')], { env })).stdout) as { reward: number; text: string };
      const numbers = plain.text.match(/-?\d+(?:\.\d+)?/g);
      expect(plain.reward).toBe(numbers && Number(numbers[numbers.length - 1]) === 7 ? 1 : 0);

      const eventUrl = `http://127.0.0.1:${(agl.address() as AddressInfo).port}/api/rollouts/r1/attempt/a1/events`;
      const withAgl = { ...env, OPENAI_BASE_URL: '', AGL_OPENAI_BASE_URL: server.url, AGL_EVENT_URL: eventUrl, AGL_KEY: 'k3y', MODEL: 'tiny' };
      const reported = JSON.parse((await run(process.execPath, [join(EX, 'run-agent.mjs'), join(EX, 'scored.mjs')], { env: withAgl })).stdout) as { reward: number };
      expect(events).toEqual([{ auth: 'Bearer k3y', body: { event_type: 'reward', data: { value: reported.reward } } }]);

      // agent.mjs gives text only: no reward to post, so the process fails in one line.
      const textOnly = await run(process.execPath, [join(EX, 'run-agent.mjs'), join(EX, 'agent.mjs')], { env: withAgl }).then(
        () => null,
        (e: { code: number; stderr: string }) => e,
      );
      expect(textOnly?.code).toBe(1);
      expect(textOnly?.stderr.trim()).toMatch(/^run-agent: .*agent\.mjs gave no reward, and Agent Lightning reads it from the agent: return a number or \{ reward \}$/);
      expect(events).toHaveLength(1);
    } finally {
      await new Promise<void>((r) => agl.close(() => r()));
      await server.close();
    }
  });
});
