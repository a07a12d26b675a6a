/**
 * Teacher-guided RL (`grpo --teacher`, DGPO): the teacher's per-token log-probs of sampled rows
 * (tool tokens masked) against a float64 forward of the teacher, and the loss's teacher term
 * against λ·Σ k3(q − p)/Σ m computed in float64 from independent forwards of both models; with the
 * teacher the starting policy, distill/kl is 0 at step 1 and distill_coef takes its documented
 * default; distill_coef = 0 trains the same weights as plain GRPO, bit for bit; a run killed inside
 * a round and resumed ends as an uninterrupted one; a teacher with another tokenizer, and
 * distill_coef without a teacher, are refused in one line.
 */
import { existsSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { initModelFolder } from '../src/models/init.ts';
import { parseConfig } from '../src/models/config.ts';
import { saveCheckpoint } from '../src/models/checkpoint.ts';
import { loadModel } from '../src/models/load.ts';
import { ReferenceScorer } from '../src/online/reference.ts';
import { microBatches, roundLogps, type GrpoRound } from '../src/online/grpo/round.ts';
import type { Columns } from '../src/online/grpo/graph.ts';
import { DEFAULT_DISTILL_COEF, grpo } from '../src/online/grpo/index.ts';
import type { TrainingArtifacts } from '../src/artifacts/training.ts';
import { resolveLoss } from '../losses/index.ts';
import { runLossOnnx, runLossReference } from '../losses/core/engine.ts';
import type { HostBatch } from '../losses/core/types.ts';
import { randomWeights } from './helpers/model-fixtures.ts';
import { referenceLogits } from './helpers/reference-forward.ts';
import { cli, expectOneLineError, killWhen } from './helpers/faults.ts';

const dir = mkdtempSync(join(tmpdir(), 'prefzoo-grpo-teacher-'));
afterAll(() => rmSync(dir, { recursive: true, force: true }));
const policy = join(dir, 'policy');
const teacher = join(dir, 'teacher');
const prompts = join(dir, 'prompts.jsonl');
const rewardsMjs = join(dir, 'rewards.mjs');

/** A tiny model folder with the generated tokenizer and spread-out random weights (peaked distributions). */
function model(out: string, seed: number): string {
  initModelFolder(out, 'llama', 'tiny', seed);
  const raw = JSON.parse(readFileSync(join(out, 'config.json'), 'utf8'));
  const config = parseConfig(raw);
  saveCheckpoint(out, randomWeights(config, seed), { config });
  return out;
}

beforeAll(() => {
  model(policy, 5);
  model(teacher, 9);
  writeFileSync(prompts, ['1+2=', '3+4=', '5+6=', '7+1='].map((p) => JSON.stringify({ prompt: p }) + '\n').join(''));
  writeFileSync(rewardsMjs, 'export function short(completions) { return completions.map((c) => -c.length / 10); }\n');
});

/** Per-token log-probs of `ids` after `promptIds` in float64: log softmax(logits / τ) of each completion token. */
function float64Logps(dirOf: string, promptIds: number[], ids: number[], tau: number): number[] {
  const m = loadModel(dirOf);
  const seq = [...promptIds, ...ids];
  const logits = referenceLogits(m.config, m.weights, seq);
  return ids.map((id, j) => {
    const row = Array.from(logits[promptIds.length + j - 1], (x) => x / tau);
    const mx = Math.max(...row);
    const lse = mx + Math.log(row.reduce((a, x) => a + Math.exp(x - mx), 0));
    return row[id] - lse;
  });
}

const k3 = (q: number, p: number) => Math.exp(q - p) - (q - p) - 1;

describe('grpo --teacher: the teacher term', () => {
  it("the loss's teacher KL equals λ·Σ k3/Σ m in float64 from independent forwards; tool tokens masked; beside beta", async () => {
    const tau = 0.7;
    const lambda = 0.3;
    const beta = 0.05;
    // Three sampled completions; the second's middle token came from a tool (masked out of the loss).
    const round: GrpoRound = {
      promptIds: [[3, 4, 5], [6, 7], [8, 9, 10, 11]],
      ids: [[12, 13, 14], [15, 16, 17, 18], [19, 20]],
      counted: [1, 1, 1],
      masks: [[1, 1, 1], [1, 0, 0, 1], [1, 1]],
      advantages: [0, 0, 0],
      old: null, ref: null, teacher: null, sampling: null, metrics: {},
    };
    const cols: Columns = { old: false, ref: false, teacher: true, items: false, entropies: false, bonus: false, adaptive: false, sampling: false };
    const batching = { batchSize: 2, padTo: 1, padId: 0 };
    const t = loadModel(teacher);
    const p = loadModel(policy);
    const runtime = { ep: 'cpu' as const };
    const tScorer = await ReferenceScorer.create(t.config, t.weights, runtime, { temperature: tau, vocabLimit: t.config.vocab_size });
    const pScorer = await ReferenceScorer.create(p.config, p.weights, runtime, { temperature: tau, vocabLimit: p.config.vocab_size });
    try {
      await roundLogps(round, cols, batching, null as unknown as TrainingArtifacts, null, tScorer);
      const pol = (await pScorer.score(round.ids.map((ids, i) => ({ promptIds: round.promptIds[i], ids })), batching)).tokens;
      const q64 = round.ids.map((ids, i) => float64Logps(teacher, round.promptIds[i], ids, tau));
      const p64 = round.ids.map((ids, i) => float64Logps(policy, round.promptIds[i], ids, tau));
      // The round holds the teacher's log-prob of every completion token (masked ones too, as the reference's).
      round.teacher!.forEach((row, i) => row.forEach((v, j) => expect(Math.abs(v - q64[i][j]), `${i},${j}`).toBeLessThan(2e-5)));
      // The micro-batches place them at the completion positions, and the tool token leaves the loss mask.
      const mbs = microBatches(round, cols, batching);
      const mb = mbs[1].feeds;
      const [, T1] = mb.loss_mask.dims as number[];
      const tl = mb.teacher_token_logps.data as Float32Array;
      const lm = mb.loss_mask.data as Float32Array;
      // Row 1 of the round is row 1 of the first micro-batch; row 2 is row 0 of the second.
      const at0 = (mbs[0].feeds.loss_mask.dims as number[])[1];
      const first = mbs[0].feeds.loss_mask.data as Float32Array;
      expect(Array.from(first.slice(at0, 2 * at0)).filter((x) => x > 0)).toHaveLength(2);
      expect(Array.from(tl.slice(0, T1)).filter((_, k) => lm[k] > 0)).toEqual(round.teacher![2].map((v) => Math.fround(v)));

      // The loss on [B, Tc] rows: advantages 0 (the policy term is 0), the reference another fixed column.
      const Tc = Math.max(...round.ids.map((x) => x.length));
      const grid = (f: (i: number, j: number) => number) => ({ dims: [3, Tc], data: Float64Array.from({ length: 3 * Tc }, (_, k) => (k % Tc < round.ids[Math.floor(k / Tc)].length ? f(Math.floor(k / Tc), k % Tc) : 0)) });
      const refOf = (i: number, j: number) => pol[i][j] - 0.25 * Math.sin(i + j);
      const batch: HostBatch = {
        policy_token_logps: grid((i, j) => pol[i][j]),
        old_token_logps: grid((i, j) => pol[i][j]),
        ref_token_logps: grid(refOf),
        teacher_token_logps: grid((i, j) => round.teacher![i][j]),
        completion_mask: grid((i, j) => round.masks![i][j]),
        advantages: { dims: [3], data: Float64Array.of(0, 0, 0) },
      };
      // float64 from the independent forwards: the teacher's KL mean over the counted tokens.
      let kl64 = 0;
      let refKl = 0;
      let n = 0;
      round.ids.forEach((ids, i) => ids.forEach((_, j) => {
        if (!round.masks![i][j]) return;
        kl64 += k3(q64[i][j], p64[i][j]);
        refKl += k3(refOf(i, j), pol[i][j]);
        n++;
      }));
      kl64 /= n;
      refKl /= n;
      expect(kl64).toBeGreaterThan(1e-3);
      const bound = resolveLoss('grpo', { loss_type: 'bnpo', distill_coef: lambda, beta, vllm_importance_sampling_correction: false });
      const onnx = await runLossOnnx(bound, batch);
      const ref = runLossReference(bound, batch);
      expect(Math.abs(onnx.metrics['distill/kl'] - kl64) / kl64).toBeLessThan(1e-4);
      expect(Math.abs(onnx.loss - (lambda * kl64 + beta * refKl)) / onnx.loss).toBeLessThan(1e-4);
      expect(ref.loss).toBeCloseTo(onnx.loss, 12);
      expect(ref.metrics['distill/kl']).toBeCloseTo(onnx.metrics['distill/kl'], 12);
      expect(onnx.metrics.kl).toBeCloseTo(refKl, 12);
      // Its gradient: λ·(1 − e^(q − p))/Σ m per counted token, as the reference's β term.
      const g = runLossReference(bound, batch, { grad: true }).grad.policy_token_logps;
      const i = 1;
      const j = 3;
      const q = round.teacher![i][j];
      const pp = pol[i][j];
      expect(g[i * Tc + j]).toBeCloseTo((lambda * (1 - Math.exp(q - pp)) + beta * (1 - Math.exp(refOf(i, j) - pp))) / n, 12);
      expect(g[i * Tc + 1]).toBe(0);
    } finally {
      await tScorer.release();
      await pScorer.release();
    }
  });

  it('the loss refuses distill_coef with luspo, and asks for teacher_token_logps', () => {
    expect(() => resolveLoss('grpo', { loss_type: 'luspo', importance_sampling_level: 'sequence', distill_coef: 0.1 })).toThrow(/luspo takes no per-token KL term \(distill_coef must be 0/);
    const term = resolveLoss('grpo', { distill_coef: 0.1 }).terms[0];
    expect(term.loss.keys(term.params, 'grpo').required).toContain('teacher_token_logps');
  });
});

// Rounds of 2 prompts × 2 completions, one micro-batch; two updates a round, so step 1's checkpoint falls inside it.
const SETTINGS = ['max_steps=2', 'save_steps=1', 'batch_size=4', 'num_generations=2', 'num_iterations=2', 'max_completion_length=3', 'loss_type=grpo', 'learning_rate=3e-3', 'logging_steps=1', 'log_completions=0', 'seed=3'];

function args(out: string, extra: string[] = []): string[] {
  return ['grpo', '--model', policy, '--prompts', prompts, '--reward', `${rewardsMjs}:short`, '-o', out, '--quiet', ...SETTINGS.flatMap((s) => ['--param', s]), ...extra];
}

function rows(out: string): Record<string, number>[] {
  return readFileSync(join(out, 'metrics.jsonl'), 'utf8').trim().split('\n').map((l) => JSON.parse(l)).map(({ 'tokens/s': _, ...r }) => r);
}

const weights = (out: string) => readFileSync(join(out, 'final', 'model.safetensors'));

/** A run of `SETTINGS` and `params` in this process (no CLI start-up): the library's grpo(). */
function run(out: string, o: { teacher?: string; params?: string[]; resume?: boolean } = {}) {
  return grpo({ model: policy, prompts, rewards: [`${rewardsMjs}:short`], out, params: [...SETTINGS, ...(o.params ?? [])], teacher: o.teacher, resume: o.resume });
}

describe('prefzoo grpo --teacher', () => {
  it('with the starting policy as teacher, distill/kl is 0 at step 1; distill_coef unset takes its documented default', async () => {
    const out = join(dir, 'self');
    await run(out, { teacher: policy, params: ['beta=0'] });
    const m = rows(out);
    expect(m[0]['distill/kl']).toBeLessThan(1e-6);
    expect(m[0]['distill/kl']).toBeGreaterThanOrEqual(0);
    // The second update of the round moved the policy away from its start, the teacher.
    expect(m[1]['distill/kl']).toBeGreaterThan(m[0]['distill/kl']);
    expect(m[1].kl).toBeUndefined();
    const config = JSON.parse(readFileSync(join(out, 'config.json'), 'utf8'));
    expect(config.loss_params.distill_coef).toBe(DEFAULT_DISTILL_COEF);
    expect(config.teacher).toBe(policy);
    const docs = readFileSync(join(import.meta.dirname, '..', 'docs', 'distill.md'), 'utf8');
    expect(docs).toContain(`distill_coef=${DEFAULT_DISTILL_COEF}`);
  });

  it('distill_coef=0 trains the same weights as plain GRPO, to the bit', async () => {
    const plain = join(dir, 'plain');
    const zero = join(dir, 'zero');
    await run(plain);
    await run(zero, { teacher, params: ['distill_coef=0'] });
    expect(Buffer.compare(weights(plain), weights(zero))).toBe(0);
    expect(rows(zero)[0]['distill/kl']).toBeUndefined();
  });

  it('killed inside a round and resumed, it ends as an uninterrupted run (the teacher and the reference both on)', async () => {
    const params = ['distill_coef=0.5', 'beta=0.05'];
    const straight = join(dir, 'straight');
    await run(straight, { teacher, params });
    const want = rows(straight);
    expect(want.every((r) => r['distill/kl'] > 0 && Number.isFinite(r.kl))).toBe(true);
    const broken = join(dir, 'broken');
    await killWhen([...args(broken, ['--teacher', teacher]), ...params.flatMap((p) => ['--param', p])], () => existsSync(join(broken, 'checkpoints', 'step-00000001', 'state.json')));
    expect(existsSync(join(broken, 'final'))).toBe(false);
    // Resumed without the teacher it started with: refused.
    await expect(run(broken, { params, resume: true })).rejects.toThrow(/^grpo: distill_coef=0\.5 weighs the KL to a teacher/);
    await expect(run(broken, { resume: true })).rejects.toThrow(/^--resume: .* was started with --teacher /);
    await run(broken, { teacher, params, resume: true });
    expect(rows(broken)).toEqual(want);
    expect(Buffer.compare(weights(straight), weights(broken))).toBe(0);
  });

  it('refuses in one line: a teacher with another tokenizer; distill_coef without a teacher', async () => {
    const foreign = join(dir, 'foreign');
    initModelFolder(foreign, 'llama', 'tiny', 3, { merges: 60 });
    expectOneLineError(cli(args(join(dir, 'run-foreign'), ['--teacher', foreign])), new RegExp(`--teacher ${foreign} and --model ${policy} have different tokenizers \\(\\d+ ids against \\d+\\); grpo --teacher`));
    expect(existsSync(join(dir, 'run-foreign'))).toBe(false);
    await expect(run(join(dir, 'run-lonely'), { params: ['distill_coef=0.2'] })).rejects.toThrow(/^grpo: distill_coef=0\.2 weighs the KL to a teacher: give --teacher, or leave distill_coef out$/);
  });
});
