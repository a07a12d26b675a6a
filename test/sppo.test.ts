/**
 * SPPO on the online loop (src/online/sppo.ts): K samples per prompt and their judged win-rates, the
 * reference switching to π_t at each iteration (checked through the loss at each iteration's first
 * step, recomputed in float64 from the stored win-rates, and π_0's log-probs scored apart), the step
 * plan, refusals, and a run killed with SIGKILL and continued with --resume writing the same rows,
 * samples and weights as an uninterrupted run.
 */
import { spawnSync } from 'node:child_process';
import { existsSync, mkdtempSync, readdirSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { initModelFolder } from '../src/models/init.ts';
import { loadModel } from '../src/models/load.ts';
import { Scorer } from '../src/models/scorer.ts';
import { loadTokenizer } from '../src/tokenize/index.ts';
import type { Judge } from '../src/online/judges.ts';
import { runSppo } from '../src/online/sppo.ts';
import { bin, killWhen } from './helpers/faults.ts';
import { metricsRows } from './helpers/metrics-rows.ts';

const dir = mkdtempSync(join(tmpdir(), 'prefzoo-sppo-'));
afterAll(() => rmSync(dir, { recursive: true, force: true }));
const model = join(dir, 'model');
const promptsFile = join(dir, 'prompts.txt');
const judgeFile = join(dir, 'judge.mjs');
const list = ['1+2=', '3+4=', '5+6=', '7+8='];

const prefer = (a: string, b: string) => (a.length < b.length ? 1 : a.length > b.length ? 0 : 0.5);
/** Prefers the shorter text: a signal even for an untrained model's samples. */
const shorter: Judge = {
  name: 'shorter',
  async compare(items) {
    return items.map((c) => prefer(String(c.a), String(c.b)));
  },
  async release() {},
};

beforeAll(() => {
  initModelFolder(model, 'llama', 'tiny', 5);
  writeFileSync(promptsFile, list.join('\n') + '\n');
  writeFileSync(
    judgeFile,
    `import { createInterface } from 'node:readline';
for await (const line of createInterface({ input: process.stdin })) {
  const c = JSON.parse(line);
  const a = String(c.a).length, b = String(c.b).length;
  process.stdout.write(JSON.stringify({ p: a < b ? 1 : a > b ? 0 : 0.5 }) + '\\n');
}
`,
  );
});

const rows = metricsRows;

function lists(out: string, t: number): { prompt: string; responses: string[]; win_probs: number[]; ref_logps: number[] }[] {
  return readFileSync(join(out, `iter-${t}`, 'samples.jsonl'), 'utf8').trim().split('\n').map((l) => JSON.parse(l));
}

const base = { learning_rate: 3e-3, batch_size: 4, pad_to_multiple_of: 16, logging_steps: 1, warmup_steps: 0 };

describe('SPPO on the online loop', () => {
  it('samples K per prompt, judges win-rates, and trains each iteration against π_t: the loss of its first step is exact', async () => {
    const out = join(dir, 'lib');
    const beta = 0.1;
    const r = await runSppo({ model, prompts: list, judge: shorter, out, iterations: 2, samples: 3, maxNewTokens: 3, params: ['max_steps=2', 'save_steps=2', `beta=${beta}`], base });
    expect(r.iterations.map((i) => [i.iteration, i.steps])).toEqual([[1, 2], [2, 2]]);
    const got = rows(out);
    expect(got.map((x) => [x.step, x.iteration])).toEqual([[1, 1], [2, 1], [3, 2], [4, 2]]);
    expect(readdirSync(out).sort()).toEqual(['artifacts', 'checkpoints', 'config.json', 'final', 'iter-1', 'iter-2', 'metrics.jsonl', 'sppo.json']);
    const tok = loadTokenizer(model);
    const start = loadModel(model);
    const scorer = await Scorer.create(start.config, start.weights, {}, tok.padId ?? 0);
    for (const t of [1, 2]) {
      const l = lists(out, t);
      expect(l.map((x) => x.prompt)).toEqual(list);
      for (const x of l) {
        expect(x.responses).toHaveLength(3);
        // P̂_k = mean over the other two samples of P(y_k ≻ y_j).
        x.win_probs.forEach((p, k) => expect(p).toBe([0, 1, 2].filter((j) => j !== k).reduce((s, j) => s + prefer(x.responses[k], x.responses[j]), 0) / 2));
      }
      // At an iteration's first step the policy is π_t, its own reference: ℓ = 0 and the loss is the
      // batch mean of Σ_k ((P̂_k − ½)/β)², in float64 from the stored win-rates.
      const want = l.reduce((a, x) => a + x.win_probs.reduce((s, p) => s + ((p - 0.5) / beta) ** 2, 0), 0) / l.length;
      const first = got.find((x) => x.iteration === t)!;
      expect(Math.abs((first.loss as number) - want)).toBeLessThan(1e-6 * Math.max(1, want));
    }
    // π_0's log-probs of iteration 1's samples, scored apart from the run (the token ids are the sampled ones, kept in the checkpoint state).
    const state = JSON.parse(readFileSync(join(out, 'checkpoints', 'step-00000002', 'state.json'), 'utf8')).online.method;
    expect(state.current.t).toBe(1);
    const ex = state.current.ids.map((ids: number[][], i: number) => ({ promptIds: state.current.promptIds[i], responseIds: ids, src: { prompt: list[i], responses: state.current.responses[i] } }));
    const scored = (await scorer.score('listwise', ex, { batchSize: 4, padTo: 16 })).logps;
    await scorer.release();
    const ref1 = lists(out, 1).map((x) => x.ref_logps);
    scored.forEach((row, i) => row.forEach((v, k) => expect(Math.abs(v - ref1[i][k])).toBeLessThan(1e-4)));
    const ref2 = lists(out, 2).map((x) => x.ref_logps);
    expect(ref2.flat().every((v) => Number.isFinite(v))).toBe(true);
    const summary = JSON.parse(readFileSync(join(out, 'sppo.json'), 'utf8')).summary;
    expect(summary.map((s: { loss: number }) => s.loss)).toEqual([got[1].loss, got[3].loss]);
    // A finished run's folder is refused without --resume or --overwrite; --overwrite replaces it.
    await expect(runSppo({ model, prompts: list, judge: shorter, out, iterations: 1, samples: 2, maxNewTokens: 3 })).rejects.toThrow(/not empty .*--resume.*--overwrite/);
  });

  it('refuses, in one line and before writing anything, a setting SPPO cannot honour, and a resume with other iterations', async () => {
    const out = join(dir, 'refused');
    for (const p of ['eval_data=held.jsonl', 'sync_ref_model=true', 'max_length=64']) {
      await expect(runSppo({ model, prompts: list, judge: shorter, out, maxNewTokens: 3, params: [p] })).rejects.toThrow(/^setting \w+ cannot be honoured by prefzoo sppo \(it honours learning_rate, .*\)$/);
    }
    expect(existsSync(out)).toBe(false);
    await expect(runSppo({ model, prompts: list, judge: shorter, out: join(dir, 'lib'), iterations: 3, samples: 3, maxNewTokens: 3, params: ['max_steps=2', 'beta=0.1'], base, resume: true })).rejects.toThrow(
      /^--resume: .* was started with --iterations 2 --samples 3 and 2 steps per iteration/,
    );
  });
});

describe('sppo --resume (CLI)', () => {
  // 4 prompts in one round of 2 micro-batches of 2: 3 steps per iteration (num_epochs 3), a checkpoint every 2 steps.
  const SETTINGS = ['num_epochs=3', 'save_steps=2', 'batch_size=2', 'gradient_accumulation_steps=2', 'learning_rate=3e-3', 'warmup_steps=1', 'lr_scheduler=cosine', 'pad_to_multiple_of=16', 'logging_steps=1', 'beta=0.1'];
  const args = (out: string) => ['sppo', '--model', model, '--prompts', promptsFile, '--judge', `cmd:node ${judgeFile}`, '-o', out, '--iterations', '2', '--samples', '2', '--max-new-tokens', '3', '--quiet', ...SETTINGS.flatMap((s) => ['--param', s])];

  it('a run killed with SIGKILL after its first checkpoint and resumed writes the same rows, samples and weights', async () => {
    const straight = join(dir, 'straight');
    const a = spawnSync(process.execPath, [bin, ...args(straight)], { encoding: 'utf8' });
    expect(a.status, a.stderr).toBe(0);
    const want = rows(straight);
    expect(want.map((x) => [x.step, x.iteration])).toEqual([[1, 1], [2, 1], [3, 1], [4, 2], [5, 2], [6, 2]]);
    expect(readdirSync(join(straight, 'checkpoints'))).toEqual(['step-00000002', 'step-00000004', 'step-00000006']);
    // Each iteration restarts its learning-rate schedule (warmup 1 step, then cosine over 3).
    expect(want.map((x) => x.learning_rate)).toEqual([want[0].learning_rate, want[1].learning_rate, want[2].learning_rate, want[0].learning_rate, want[1].learning_rate, want[2].learning_rate]);

    const broken = join(dir, 'broken');
    await killWhen(args(broken), () => existsSync(join(broken, 'checkpoints', 'step-00000002', 'state.json')));
    expect(existsSync(join(broken, 'final'))).toBe(false);
    const b = spawnSync(process.execPath, [bin, ...args(broken), '--resume'], { encoding: 'utf8' });
    expect(b.status, b.stderr).toBe(0);
    expect(rows(broken)).toEqual(want);
    for (const t of [1, 2]) expect(readFileSync(join(broken, `iter-${t}`, 'samples.jsonl'), 'utf8')).toBe(readFileSync(join(straight, `iter-${t}`, 'samples.jsonl'), 'utf8'));
    expect(Buffer.compare(readFileSync(join(straight, 'final', 'model.safetensors')), readFileSync(join(broken, 'final', 'model.safetensors')))).toBe(0);
  });
});
