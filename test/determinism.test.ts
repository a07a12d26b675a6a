/**
 * Runs repeat to the bit with the default threads: the gathered-rows gradient (embeddings, the
 * output head's target rows) against a float64 sum with several intra-op threads, and two
 * `prefzoo train --loss dpo` runs and two `prefzoo grpo` runs writing the same metrics rows (the
 * wall-clock field aside) and byte-identical weights.
 */
import { spawnSync } from 'node:child_process';
import { mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join, resolve } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { Graph } from '../src/onnx/graph.ts';
import { gradients } from '../src/autodiff/index.ts';
import { Session, toOrt } from '../src/runtime/session.ts';
import { initModelFolder } from '../src/models/init.ts';
import { SeededRandom } from '../src/random.ts';

const bin = resolve(import.meta.dirname, '..', 'bin', 'prefzoo.mjs');
const shared = resolve(import.meta.dirname, '..', '..', 'shared', 'data');
const dir = mkdtempSync(join(tmpdir(), 'prefzoo-determinism-'));
afterAll(() => rmSync(dir, { recursive: true, force: true }));

describe('the gradient of gathered rows', () => {
  it('with two threads is the float64 sum over repeated indices rounded once, bit for bit, run after run', async () => {
    // Large enough that ONNX Runtime splits a scatter-add over its threads (ScatterND(add) did, and
    // then the rows of a repeated index were added in varying order, some lost). A quarter of the rows carry
    // index 0, as pad tokens do; the rest are skewed towards low indices. N is symbolic.
    const V = 200, N = 16384, H = 256;
    const g = new Graph('gather');
    const W = g.input('W', 'float32', [V, H]);
    const idx = g.input('idx', 'int64', ['N']);
    const U = g.input('U', 'float32', ['N', H]);
    const loss = g.reduceSum(g.mul(g.gather(W, idx, 0), U), undefined, false);
    g.output(loss, 'loss');
    g.output(gradients(g, loss, [W])[0]!, 'dW');
    const rand = new SeededRandom(1);
    const ids = BigInt64Array.from({ length: N }, () => BigInt(rand.next() < 0.25 ? 0 : Math.floor(rand.next() ** 2 * V)));
    const u = Float32Array.from({ length: N * H }, () => rand.next() - 0.5);
    const feeds = { W: toOrt('float32', new Float32Array(V * H), [V, H]), idx: toOrt('int64', ids, [N]), U: toOrt('float32', u, [N, H]) };
    // d loss / dW[v] = Σ of U's rows whose index is v, in float64; Σ|U| per column bounds the error
    // of the float64 running sum the scatter takes differences of (N · 2⁻⁵³ · Σ|U| at most).
    const want = new Float64Array(V * H);
    const abs = new Float64Array(H);
    for (let i = 0; i < N; i++) {
      for (let h = 0; h < H; h++) {
        want[Number(ids[i]) * H + h] += u[i * H + h];
        abs[h] += Math.abs(u[i * H + h]);
      }
    }
    expect(ids.filter((v) => v === 0n).length).toBeGreaterThan(N / 5);
    const s = await Session.fromGraph(g, { threads: 2 });
    try {
      const first = (await s.run(feeds)).dW.data as Float32Array;
      let worst = 0;
      first.forEach((v, k) => {
        // Within half a float32 ulp of the exact sum, plus the running sum's float64 error.
        const tol = Math.abs(want[k]) * 2 ** -24 + N * 2 ** -53 * abs[k % H];
        worst = Math.max(worst, Math.abs(v - want[k]) / tol);
      });
      expect(worst).toBeLessThanOrEqual(1);
      for (let run = 0; run < 3; run++) {
        const got = (await s.run(feeds)).dW.data as Float32Array;
        expect(Buffer.compare(Buffer.from(got.buffer, got.byteOffset, got.byteLength), Buffer.from(first.buffer, first.byteOffset, first.byteLength))).toBe(0);
      }
    } finally {
      await s.release();
    }
  });
});

/** metrics.jsonl rows without the wall-clock field. */
function rows(out: string): Record<string, unknown>[] {
  return readFileSync(join(out, 'metrics.jsonl'), 'utf8').trim().split('\n').map((l) => {
    const { 'tokens/s': _, ...r } = JSON.parse(l);
    return r;
  });
}

function run(args: string[]): void {
  // The default threads as a user gets them (one per core), not the suite's PREFZOO_THREADS=1.
  const { PREFZOO_THREADS: _, ...env } = process.env;
  const r = spawnSync(process.execPath, [bin, ...args, '--quiet'], { encoding: 'utf8', env });
  expect(r.status, r.stderr).toBe(0);
}

/** Two runs of the same command into two folders: the same rows and the same final weights. */
function twice(name: string, args: (out: string) => string[]): void {
  const [a, b] = [join(dir, `${name}-a`), join(dir, `${name}-b`)];
  run(args(a));
  run(args(b));
  expect(rows(b)).toEqual(rows(a));
  expect(rows(a).every((r) => typeof r.grad_norm === 'number' && (r.grad_norm as number) > 0)).toBe(true);
  const weights = (out: string) => readFileSync(join(out, 'final', 'model.safetensors'));
  expect(Buffer.compare(weights(a), weights(b))).toBe(0);
}

describe('two runs with the default threads', () => {
  const model = join(dir, 'model');
  beforeAll(() => initModelFolder(model, 'llama', 'tiny', 11));
  const params = (settings: string[]) => settings.flatMap((s) => ['--param', s]);

  it('prefzoo train --loss dpo: the same metrics rows and byte-identical weights', () => {
    // Real conversations long enough (about 4,000 tokens a step) for ONNX Runtime to spread work over its threads.
    const data = join(dir, 'pairs.json');
    writeFileSync(data, JSON.stringify(JSON.parse(readFileSync(join(shared, 'dpo_en_demo.json'), 'utf8')).slice(0, 32)));
    twice('dpo', (out) => ['train', '--model', model, '--data', data, '--loss', 'dpo', '-o', out, ...params(['batch_size=8', 'max_steps=2', 'max_length=256', 'max_prompt_length=128', 'learning_rate=3e-3', 'logging_steps=1'])]);
  });

  it('prefzoo grpo: the same metrics rows and byte-identical weights', () => {
    const prompts = join(dir, 'gsm8k.jsonl');
    writeFileSync(prompts, readFileSync(join(shared, 'gsm8k_test.jsonl'), 'utf8').split('\n').slice(0, 16).join('\n') + '\n');
    const rewards = join(dir, 'rewards.mjs');
    // Shorter completions score higher: a gradient even for an untrained model.
    writeFileSync(rewards, 'export function short(completions) { return completions.map((c) => -c.length / 10); }\n');
    twice('grpo', (out) => ['grpo', '--model', model, '--prompts', prompts, '--reward', `${rewards}:short`, '-o', out, ...params(['max_steps=2', 'batch_size=32', 'num_generations=4', 'max_completion_length=16', 'learning_rate=1e-3', 'logging_steps=1'])]);
  });
});
