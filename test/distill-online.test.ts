/**
 * `prefzoo distill` with lmbda > 0 (on-policy distillation): at lmbda = 1 the rows trained are the
 * ids the student's generation session draws for the data's prompts from the run's seed
 * (regenerated here), and the step's loss is gkd's float64 reference against a float64 top K of the
 * teacher on those rows, counted on the sampled tokens only; lmbda = 0 trains as offline distillation
 * does; lmbda = 0.5 mixes micro-batches by the documented rule and resumes to the same weights; the
 * refusals. Multi-turn on-policy micro-batches (--tools, --mcp, --env): distill-tools.test.ts.
 * Tiny models made here; every run is one to six steps.
 */
import { describe, it, expect, beforeAll } from 'vitest';
import { mkdtempSync, readFileSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { loadModel } from '../src/models/load.ts';
import type { ModelConfig } from '../src/models/config.ts';
import { Decoder, generateIds } from '../src/models/generate.ts';
import { sampleRandom } from '../src/models/sampling.ts';
import { SeededRandom } from '../src/random.ts';
import { loadTokenizer } from '../src/tokenize/index.ts';
import { loadData, tokenizeExamples, type TokenizedExample } from '../datasets/examples.ts';
import { DEFAULT_CONFIG } from '../src/train/config.ts';
import { distill } from '../src/train/distill.ts';
import type { RefWeights } from './helpers/reference-forward.ts';
import { distillModel, float64Gkd } from './helpers/distill-fixtures.ts';

const K = 6;
const NEW = 8;
let dir: string;
let teacher: string;
let student: string;
let pairs: string;


beforeAll(() => {
  dir = mkdtempSync(join(tmpdir(), 'pz-distill-online-'));
  teacher = distillModel(join(dir, 'teacher'), 1);
  student = distillModel(join(dir, 'student'), 2, { tied: false, layers: 1 });
  pairs = join(dir, 'pairs.jsonl');
  writeFileSync(pairs, Array.from({ length: 8 }, (_, i) => JSON.stringify({ prompt: `What is ${i} plus ${i + 1}?`, chosen: `It is ${2 * i + 1}.`, rejected: 'No idea.' })).join('\n') + '\n');
});

const weightsOf = (d: string) => loadModel(d) as { config: ModelConfig; weights: RefWeights };

async function tokenized(): Promise<TokenizedExample[]> {
  const d = await loadData(pairs, join(dir, 'work'));
  return tokenizeExamples(d.examples, loadTokenizer(student), DEFAULT_CONFIG).rows;
}


type Samples = { step: number; rows: number[]; promptIds: number[][]; ids: number[][] }[];
const recorder = () => {
  const got: Samples = [];
  return { got, onSamples: (s: { step: number; rows: readonly number[]; promptIds: readonly (readonly number[])[]; ids: readonly (readonly number[])[] }) => got.push({ step: s.step, rows: [...s.rows], promptIds: s.promptIds.map((p) => [...p]), ids: s.ids.map((x) => [...x]) }) };
};

const rowsOf = (run: string) => readFileSync(join(run, 'metrics.jsonl'), 'utf8').trim().split('\n').map((l) => JSON.parse(l) as Record<string, number>);
/** The metrics rows' wall-clock fields. */
const CLOCKS = new Set(['tokens/s', 'distill/sample_seconds', 'distill/teacher_seconds', 'distill/sample_cpu_seconds', 'distill/teacher_cpu_seconds']);
/** A metrics row without its clocks. */
const timeless = (r: Record<string, number>) => Object.fromEntries(Object.entries(r).filter(([k]) => !CLOCKS.has(k)));

describe('prefzoo distill, on-policy (lmbda)', () => {
  it("lmbda = 1: trains the student's own samples of the run's seed, the loss gkd's float64 reference on the sampled tokens", async () => {
    const seed = 3;
    const rec = recorder();
    const params = ['max_steps=1', 'batch_size=8', 'optimizer=sgd', 'momentum=0', 'max_grad_norm=0', 'lr_scheduler=constant', 'learning_rate=1', `distill_topk=${K}`, 'beta=1', 'lmbda=1', `max_completion_length=${NEW}`, `seed=${seed}`];
    const r = await distill({ teacher, model: student, data: pairs, out: join(dir, 'run-one'), params, onSamples: rec.onSamples });
    expect(r.onPolicy).toMatchObject({ lmbda: 1, microBatches: 1, sampled: 1 });
    expect(r.cached).toBe(false);
    expect(rec.got.length).toBe(1);
    const [s] = rec.got;
    expect(s.step).toBe(1);
    expect([...s.rows].sort((a, b) => a - b)).toEqual([0, 1, 2, 3, 4, 5, 6, 7]);

    // 1. The samples: the data's prompts, drawn afresh here from the student's starting weights,
    // row j of the micro-batch from stream (seed₀, j, 0), seed₀ the run's first draw (lmbda = 1: no coin).
    const rows = await tokenized();
    s.rows.forEach((i, j) => expect(s.promptIds[j]).toEqual(rows[i].promptIds));
    const S = weightsOf(student);
    const tok = loadTokenizer(student);
    const seed0 = new SeededRandom(seed).int(2 ** 31);
    const decoder = await Decoder.create(S.config, S.weights as never);
    const again = await generateIds([{ decoder, weight: 1 }], s.rows.map((i, j) => ({ promptIds: rows[i].promptIds, rng: sampleRandom(seed0, j, 0) })), {
      maxNewTokens: NEW, temperature: 1, stopIds: tok.stopIds.length ? tok.stopIds : [tok.eosId!], padId: tok.padId ?? tok.eosId ?? 0, vocabLimit: tok.vocabSize,
    });
    await decoder.release();
    expect(s.ids).toEqual(again.map((g) => g.ids));
    expect(new Set(s.ids.map((x) => x.join(','))).size).toBeGreaterThan(1);

    // 2. The loss: gkd (beta = 1) over the sampled tokens only, against the teacher's top K in float64.
    const T = weightsOf(teacher);
    const { ref, M } = float64Gkd(T, S, s.rows.map((i, j) => ({ promptIds: rows[i].promptIds, ids: s.ids[j] })), K, 1);
    expect(M).toBe(s.ids.reduce((a, x) => a + x.length, 0));
    const row = rowsOf(join(dir, 'run-one'))[0];
    expect(ref.loss).toBeGreaterThan(1e-3);
    expect(Math.abs(row.loss - ref.loss)).toBeLessThanOrEqual(1e-4 * ref.loss);
    expect(row['distill/on_policy']).toBe(1);
    expect(row['distill/completion_length']).toBe(M / 8);
    // The clocks of the step: what the command's last line sums over steps.
    expect(row['distill/sample_seconds']).toBeGreaterThan(0);
    expect(row['distill/teacher_seconds']).toBeGreaterThan(0);
    expect(row['distill/sample_cpu_seconds']).toBeGreaterThan(0);
    expect(row['distill/teacher_cpu_seconds']).toBeGreaterThan(0);
    expect(Math.abs(row['distill/sample_seconds'] - r.onPolicy!.sampleSeconds)).toBeLessThanOrEqual(0.006);
    expect(Math.abs(row['distill/teacher_seconds'] - r.onPolicy!.teacherSeconds)).toBeLessThanOrEqual(0.006);
    // The KLs over the K + 1 outcomes, against the same float64 computation.
    for (const k of ['distill/kl', 'distill/forward_kl']) {
      expect(ref.metrics[k]).toBeGreaterThan(0);
      expect(Math.abs(row[k] - ref.metrics[k]), k).toBeLessThanOrEqual(1e-4 * ref.metrics[k]);
    }
  });

  it('lmbda = 0 trains as offline distillation (the same weights and rows); sampling settings then, and an ambiguous temperature, are refused', async () => {
    const params = ['max_steps=2', 'batch_size=4', 'learning_rate=1e-2', `distill_topk=${K}`, 'pad_to_multiple_of=16'];
    const a = await distill({ teacher, model: student, data: pairs, out: join(dir, 'run-offline'), params });
    const b = await distill({ teacher, model: student, data: pairs, out: join(dir, 'run-lmbda0'), params: [...params, 'lmbda=0'] });
    expect(b.onPolicy).toBeUndefined();
    expect(Buffer.compare(readFileSync(join(a.finalDir, 'model.safetensors')), readFileSync(join(b.finalDir, 'model.safetensors')))).toBe(0);
    expect(rowsOf(join(dir, 'run-lmbda0')).map(timeless)).toEqual(rowsOf(join(dir, 'run-offline')).map(timeless));
    expect(Object.keys(rowsOf(join(dir, 'run-lmbda0'))[0]).some((k) => k.startsWith('distill/on_policy'))).toBe(false);

    await expect(distill({ teacher, model: student, data: pairs, out: join(dir, 'run-r1'), params: [...params, 'max_completion_length=9'] }))
      .rejects.toThrow(/^max_completion_length: read only when something is sampled \(lmbda > 0: the student; seq_kd: the teacher\), and lmbda is 0 without seq_kd/);
    await expect(distill({ teacher, model: student, data: pairs, out: join(dir, 'run-r3'), params: [...params, 'lmbda=1', 'max_new_tokens=9'] }))
      .rejects.toThrow(/^distill: unknown setting 'max_new_tokens'; TRL's max_new_tokens is 'max_completion_length' here/);
    await expect(distill({ teacher, model: student, data: pairs, out: join(dir, 'run-r2'), params: [...params, 'lmbda=0.5', 'temperature=2'] }))
      .rejects.toThrow(/^temperature with lmbda=0.5 is ambiguous: in distill it is gkd's loss τ/);
  });

  it('lmbda = 0.5 mixes micro-batches by the documented draws, and an interrupted run resumes to the same weights', async () => {
    const seed = 11;
    const params = ['max_steps=6', 'save_steps=3', 'batch_size=2', 'gradient_accumulation_steps=2', 'learning_rate=1e-2', `distill_topk=${K}`, 'lmbda=0.5', 'max_completion_length=5', 'beta=0.5', `seed=${seed}`];
    const straight = recorder();
    const s = await distill({ teacher, model: student, data: pairs, out: join(dir, 'run-mix'), params, onSamples: straight.onSamples });

    // The rule: per micro-batch in order, u from the run's stream, on-policy when u < 0.5 (then its seed drawn).
    const rng = new SeededRandom(seed);
    const expected = Array.from({ length: 6 }, () => {
      let on = 0;
      for (let k = 0; k < 2; k++) {
        if (rng.next() < 0.5) {
          on++;
          rng.int(2 ** 31);
        }
      }
      return on;
    });
    const total = expected.reduce((a, v) => a + v, 0);
    expect(total).toBeGreaterThan(0);
    expect(total).toBeLessThan(12);
    expect(rowsOf(join(dir, 'run-mix')).map((r) => r['distill/on_policy'])).toEqual(expected.map((n) => n / 2));
    // The clocks only on steps that sampled.
    expect(rowsOf(join(dir, 'run-mix')).map((r) => r['distill/teacher_seconds'] > 0)).toEqual(expected.map((n) => n > 0));
    expect(rowsOf(join(dir, 'run-mix')).map((r) => r['distill/sample_seconds'] > 0)).toEqual(expected.map((n) => n > 0));
    expect(s.onPolicy).toMatchObject({ lmbda: 0.5, microBatches: 12, sampled: total });
    expect(straight.got.map((x) => x.step)).toEqual(expected.flatMap((n, i) => Array(n).fill(i + 1)));

    const broken = join(dir, 'run-mix-broken');
    const resumed = recorder();
    process.env.PREFZOO_FAULT_NAN_AT_STEP = '5';
    try {
      await expect(distill({ teacher, model: student, data: pairs, out: broken, params })).rejects.toThrow(/loss is NaN at step 5/);
    } finally {
      delete process.env.PREFZOO_FAULT_NAN_AT_STEP;
    }
    const r = await distill({ teacher, model: student, data: pairs, out: broken, params, resume: true, onSamples: resumed.onSamples });
    expect(Buffer.compare(readFileSync(join(s.finalDir, 'model.safetensors')), readFileSync(join(r.finalDir, 'model.safetensors')))).toBe(0);
    expect(resumed.got).toEqual(straight.got.filter((x) => x.step > 3));
    expect(rowsOf(broken).map((x) => x.step)).toEqual([1, 2, 3, 4, 5, 6]);
  });
});
