import { describe, it, expect, beforeAll } from 'vitest';
import { spawn, spawnSync } from 'node:child_process';
import { mkdtempSync, writeFileSync, readFileSync, existsSync, readdirSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join, resolve } from 'node:path';
import { initModelFolder } from '../src/models/init.ts';
import { demoPairs } from '../src/demos/task.ts';

const bin = resolve(__dirname, '..', 'bin', 'prefzoo.mjs');
let dir: string;
let model: string;
let data: string;

const SETTINGS = ['batch_size=8', 'max_steps=16', 'save_steps=4', 'learning_rate=3e-3', 'max_length=32', 'max_prompt_length=16', 'pad_to_multiple_of=16', 'gradient_accumulation_steps=2', 'lr_scheduler=cosine', 'warmup_steps=3'];

function args(out: string, extra: string[] = []): string[] {
  return [bin, 'train', '--model', model, '--data', data, '--loss', 'dpo', '-o', out, '--quiet', ...SETTINGS.flatMap((s) => ['--param', s]), ...extra];
}

function runSync(out: string, extra: string[] = [], env: Record<string, string> = {}) {
  return spawnSync(process.execPath, args(out, extra), { encoding: 'utf8', env: { ...process.env, ...env } });
}

beforeAll(() => {
  dir = mkdtempSync(join(tmpdir(), 'pz-resume-'));
  model = join(dir, 'model');
  initModelFolder(model, 'llama', 'tiny', 11);
  data = join(dir, 'pairs.jsonl');
  writeFileSync(data, demoPairs(2, 40, 0).train.map((p) => JSON.stringify(p)).join('\n') + '\n');
});

describe('checkpoints', () => {
  it('a run killed with SIGKILL and resumed ends bit-identical to an uninterrupted run', async () => {
    const straight = join(dir, 'straight');
    const a = runSync(straight);
    expect(a.status, a.stderr).toBe(0);

    const broken = join(dir, 'broken');
    // Kill the run as soon as its second checkpoint (step 8) is complete.
    await new Promise<void>((done, fail) => {
      const child = spawn(process.execPath, args(broken), { stdio: 'ignore' });
      const ckpt = join(broken, 'checkpoints', 'step-00000008', 'state.json');
      const timer = setInterval(() => {
        if (existsSync(ckpt)) {
          child.kill('SIGKILL');
          clearInterval(timer);
        }
      }, 5);
      child.on('exit', (code, signal) => {
        clearInterval(timer);
        if (signal === 'SIGKILL') done();
        else fail(new Error(`the run ended (code ${code}) before it could be killed; make it longer`));
      });
    });
    expect(existsSync(join(broken, 'final'))).toBe(false);
    const b = runSync(broken, ['--resume']);
    expect(b.status, b.stderr).toBe(0);
    const left = readFileSync(join(straight, 'final', 'model.safetensors'));
    const right = readFileSync(join(broken, 'final', 'model.safetensors'));
    expect(Buffer.compare(left, right)).toBe(0);
    // The metrics of the resumed run have each step exactly once.
    const steps = readFileSync(join(broken, 'metrics.jsonl'), 'utf8').trim().split('\n').map((l) => JSON.parse(l).step);
    expect(steps).toEqual(Array.from({ length: 16 }, (_, i) => i + 1));
  });

  it('a NaN loss stops the run with a clear message and keeps the last good checkpoint', () => {
    const out = join(dir, 'nan');
    const r = runSync(out, [], { PREFZOO_FAULT_NAN_AT_STEP: '7' });
    expect(r.status).toBe(1);
    expect(r.stderr.trim().split('\n').pop()).toMatch(/^prefzoo: loss is NaN at step 7: .*checkpoints\/step-00000004/);
    expect(r.stderr).not.toMatch(/\n\s+at /); // no stack trace
    expect(readdirSync(join(out, 'checkpoints'))).toEqual(['step-00000004']);
    expect(existsSync(join(out, 'final'))).toBe(false);
    // The kept checkpoint resumes cleanly once the fault is gone.
    const again = runSync(out, ['--resume']);
    expect(again.status, again.stderr).toBe(0);
    expect(existsSync(join(out, 'final', 'model.safetensors'))).toBe(true);
  });
});
