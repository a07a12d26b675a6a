/**
 * The online loop (src/online/loop.ts) through `prefzoo nash-md`: checkpoints every save_steps, a run
 * killed with SIGKILL and continued with --resume writing the same metrics rows and final weights as
 * an uninterrupted run, the NaN stop, and the refusal of a setting nash-md does not honour.
 */
import { spawn, spawnSync } from 'node:child_process';
import { existsSync, mkdtempSync, readdirSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join, resolve } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { initModelFolder } from '../src/models/init.ts';

const bin = resolve(import.meta.dirname, '..', 'bin', 'prefzoo.mjs');
const dir = mkdtempSync(join(tmpdir(), 'prefzoo-online-loop-'));
afterAll(() => rmSync(dir, { recursive: true, force: true }));
const model = join(dir, 'model');
const prompts = join(dir, 'prompts.txt');
const judge = join(dir, 'judge.mjs');

// 6 prompts, rounds of 2 × 2: one round per epoch (a new shuffle every round), two micro-batches per update.
const SETTINGS = ['max_steps=12', 'save_steps=3', 'batch_size=2', 'gradient_accumulation_steps=2', 'learning_rate=3e-3', 'warmup_steps=2', 'lr_scheduler=cosine', 'pad_to_multiple_of=16', 'logging_steps=1', 'threads=1', 'beta=0.1', 'mixture_coef=0.5'];

function args(out: string, extra: string[] = []): string[] {
  return [bin, 'nash-md', '--model', model, '--prompts', prompts, '--judge', `cmd:node ${judge}`, '-o', out, '--max-new-tokens', '4', '--quiet', ...SETTINGS.flatMap((s) => ['--param', s]), ...extra];
}

function runSync(out: string, extra: string[] = [], env: Record<string, string> = {}) {
  return spawnSync(process.execPath, args(out, extra), { encoding: 'utf8', env: { ...process.env, ...env } });
}

/** metrics.jsonl rows without the wall-clock field. */
function rows(out: string): Record<string, unknown>[] {
  return readFileSync(join(out, 'metrics.jsonl'), 'utf8')
    .trim()
    .split('\n')
    .map((l) => {
      const { 'tokens/s': _, ...r } = JSON.parse(l);
      return r;
    });
}

beforeAll(() => {
  initModelFolder(model, 'llama', 'tiny', 5);
  writeFileSync(prompts, ['1+2=', '3+4=', '5+6=', '7+8=', '9+0=', '2+2='].join('\n') + '\n');
  // An external judge that prefers the shorter response: a signal even for an untrained model.
  writeFileSync(
    judge,
    `import { createInterface } from 'node:readline';
const text = (t) => (typeof t === 'string' ? t : JSON.stringify(t));
for await (const line of createInterface({ input: process.stdin })) {
  const c = JSON.parse(line);
  const a = text(c.a).length, b = text(c.b).length;
  process.stdout.write(JSON.stringify({ p: a < b ? 1 : a > b ? 0 : 0.5 }) + '\\n');
}
`,
  );
});

describe('online loop (nash-md)', () => {
  it('checkpoints every save_steps; a run killed with SIGKILL and resumed writes the same rows and weights', async () => {
    const straight = join(dir, 'straight');
    const a = runSync(straight);
    expect(a.status, a.stderr).toBe(0);
    expect(readdirSync(join(straight, 'checkpoints'))).toEqual(['step-00000003', 'step-00000006', 'step-00000009', 'step-00000012']);
    const want = rows(straight);
    expect(want.map((r) => r.step)).toEqual(Array.from({ length: 12 }, (_, i) => i + 1));
    // The judge's signal reaches the rows (not every comparison a tie), and the updates move the policy.
    expect(want.some((r) => r['objective/win_rate_vs_mixture'] !== 0.5)).toBe(true);
    expect(new Set(want.map((r) => r.loss)).size).toBeGreaterThan(1);

    const broken = join(dir, 'broken');
    await new Promise<void>((done, fail) => {
      const child = spawn(process.execPath, args(broken), { stdio: 'ignore' });
      const ckpt = join(broken, 'checkpoints', 'step-00000003', 'state.json');
      const timer = setInterval(() => {
        if (existsSync(ckpt)) {
          child.kill('SIGKILL');
          clearInterval(timer);
        }
      }, 2);
      child.on('exit', (code, signal) => {
        clearInterval(timer);
        if (signal === 'SIGKILL') done();
        else fail(new Error(`the run ended (code ${code}) before it could be killed; make it longer`));
      });
    });
    expect(existsSync(join(broken, 'final'))).toBe(false);
    const b = runSync(broken, ['--resume']);
    expect(b.status, b.stderr).toBe(0);
    expect(rows(broken)).toEqual(want);
    const left = readFileSync(join(straight, 'final', 'model.safetensors'));
    const right = readFileSync(join(broken, 'final', 'model.safetensors'));
    expect(Buffer.compare(left, right)).toBe(0);
  });

  it('a NaN loss stops the run in one line, keeping the last good checkpoint, which resumes', () => {
    const out = join(dir, 'nan');
    const r = runSync(out, [], { PREFZOO_FAULT_NAN_AT_STEP: '5' });
    expect(r.status).toBe(1);
    expect(r.stderr.trim().split('\n')).toHaveLength(1);
    expect(r.stderr.trim()).toMatch(/^prefzoo: nash-md: loss is NaN at step 5: stopping without applying the update\. .*checkpoints\/step-00000003/);
    expect(readdirSync(join(out, 'checkpoints'))).toEqual(['step-00000003']);
    expect(existsSync(join(out, 'final'))).toBe(false);
    const again = runSync(out, ['--resume']);
    expect(again.status, again.stderr).toBe(0);
    expect(rows(out)).toEqual(rows(join(dir, 'straight')));
  });

  it('refuses a setting nash-md does not honour, in one line, before writing anything', () => {
    const out = join(dir, 'refused');
    const r = runSync(out, ['--param', 'eval_data=held.jsonl']);
    expect(r.status).toBe(1);
    expect(r.stderr.trim().split('\n')).toHaveLength(1);
    expect(r.stderr.trim()).toMatch(/^prefzoo: setting eval_data cannot be honoured by prefzoo nash-md \(it honours learning_rate, .*save_steps/);
    expect(existsSync(out)).toBe(false);
  });
});
