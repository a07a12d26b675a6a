/**
 * `prefzoo distill --param seq_kd=true` (sequence-level KD): the generations cached in the run are the
 * ids the teacher's generation session draws for the data's prompts from the run's seed (regenerated
 * here), the teacher's top K is cached on them (checked against a float64 forward of the teacher),
 * and the step's loss is gkd's float64 reference on prompt + generation — the student trains on the
 * teacher's sequences, not the data's; with lmbda = 0.5 an interrupted run resumes to the same
 * weights, reading the generations back; the refusals. Tiny models made here; runs of one to six steps.
 */
import { describe, it, expect, beforeAll } from 'vitest';
import { mkdtempSync, readFileSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import * as arrow from 'apache-arrow';
import { loadModel } from '../src/models/load.ts';
import type { ModelConfig } from '../src/models/config.ts';
import { Decoder, generateIds } from '../src/models/generate.ts';
import { sampleRandom } from '../src/models/sampling.ts';
import { f16BitsToFloat } from '../src/models/safetensors.ts';
import { loadTokenizer } from '../src/tokenize/index.ts';
import { loadData, tokenizeExamples, type TokenizedExample } from '../datasets/examples.ts';
import { DEFAULT_CONFIG } from '../src/train/config.ts';
import { distill } from '../src/train/distill.ts';
import { resolveLoss } from '../losses/index.ts';
import { runLossReference } from '../losses/core/engine.ts';
import { referenceLogits, type RefWeights } from './helpers/reference-forward.ts';
import { distillModel, logSoftmax, withNanAt } from './helpers/distill-fixtures.ts';

const K = 6;
const NEW = 7;
let dir: string;
let teacher: string;
let student: string;
let pairs: string;

beforeAll(() => {
  dir = mkdtempSync(join(tmpdir(), 'pz-distill-seqkd-'));
  teacher = distillModel(join(dir, 'teacher'), 1);
  student = distillModel(join(dir, 'student'), 2, { tied: false, layers: 1 });
  pairs = join(dir, 'pairs.jsonl');
  writeFileSync(pairs, Array.from({ length: 6 }, (_, i) => JSON.stringify({ prompt: `What is ${i} plus ${i + 2}?`, chosen: `It is ${2 * i + 2}.`, rejected: 'No idea.' })).join('\n') + '\n');
});

const weightsOf = (d: string) => loadModel(d) as { config: ModelConfig; weights: RefWeights };

async function tokenized(): Promise<TokenizedExample[]> {
  const d = await loadData(pairs, join(dir, 'work'));
  return tokenizeExamples(d.examples, loadTokenizer(student), DEFAULT_CONFIG).rows;
}

/** A run's Parquet file read with Arrow (not with the code under test): column `name` of every row. */
async function column(file: string, name: string): Promise<ArrayLike<number>[]> {
  const pw = await import('parquet-wasm');
  const t = arrow.tableFromIPC(pw.readParquet(readFileSync(file)).intoIPCStream());
  return Array.from({ length: t.numRows }, (_, i) => (t.getChild(name)!.get(i) as arrow.Vector).toArray() as ArrayLike<number>);
}

const ONE_SGD_STEP = ['max_steps=1', 'batch_size=6', 'optimizer=sgd', 'momentum=0', 'max_grad_norm=0', 'lr_scheduler=constant', 'learning_rate=1', `distill_topk=${K}`, 'beta=0'];

describe('prefzoo distill, seq_kd', () => {
  it("trains on the teacher's generations of the run's seed: cached, scored by the teacher's top K, the loss gkd's float64 reference on them", async () => {
    const seed = 5;
    const run = join(dir, 'run-seqkd');
    const r = await distill({ teacher, model: student, data: pairs, out: run, params: [...ONE_SGD_STEP, 'seq_kd=true', `max_completion_length=${NEW}`, 'sampling_temperature=0.8', `seed=${seed}`] });
    expect(r.seqKd?.cached).toBe(false);
    expect(r.onPolicy).toBeUndefined();

    // 1. The generations: the teacher's, drawn afresh here, row i from stream (seed, i, 0).
    const rows = await tokenized();
    const gens = (await column(join(run, 'data', 'teacher-generations.parquet'), 'response_ids')).map((x) => Array.from(x));
    const T = weightsOf(teacher);
    const tok = loadTokenizer(teacher);
    const decoder = await Decoder.create(T.config, T.weights as never);
    const again = await generateIds([{ decoder, weight: 1 }], rows.map((row, i) => ({ promptIds: row.promptIds, rng: sampleRandom(seed, i, 0) })), {
      maxNewTokens: NEW, temperature: 0.8, stopIds: tok.stopIds.length ? tok.stopIds : [tok.eosId!], padId: tok.padId ?? tok.eosId ?? 0, vocabLimit: tok.vocabSize,
    });
    await decoder.release();
    expect(gens).toEqual(again.map((g) => g.ids));
    expect(new Set(gens.map((x) => x.join(','))).size).toBeGreaterThan(1);
    // Not the data's responses.
    gens.forEach((g, i) => expect(g).not.toEqual(rows[i].responseIds[0]));

    // 2. The teacher's top K on prompt + generation (float16 in the cache), and the step's loss over exactly those tokens.
    const topIds = await column(join(run, 'data', 'teacher.parquet'), 'topk_ids');
    const topLogps = (await column(join(run, 'data', 'teacher.parquet'), 'topk_logps')).map((x) => Float64Array.from(x as Uint16Array, f16BitsToFloat));
    const rest = (await column(join(run, 'data', 'teacher.parquet'), 'rest_logp')).map((x) => Float64Array.from(x as Uint16Array, f16BitsToFloat));
    const S = weightsOf(student);
    const V = S.config.vocab_size;
    const b = { logits: [] as number[], ids: [] as number[], logps: [] as number[], rest: [] as number[] };
    rows.forEach((row, i) => {
      const ids = [...row.promptIds, ...gens[i]];
      const tl = referenceLogits(T.config, T.weights, ids);
      const sl = referenceLogits(S.config, S.weights, ids);
      expect(rest[i].length).toBe(gens[i].length);
      for (let k = 0; k < gens[i].length; k++) {
        const p = row.promptIds.length - 1 + k; // predicts generated token k
        const lp = logSoftmax(tl[p]);
        const picked = Array.from(topIds[i]).slice(k * K, (k + 1) * K);
        const sorted = [...lp].sort((x, y) => y - x);
        picked.forEach((id, j) => {
          expect(Math.abs(topLogps[i][k * K + j] - lp[id])).toBeLessThanOrEqual(Math.abs(lp[id]) * 2 ** -11 + 1e-5);
          expect(lp[id]).toBeGreaterThanOrEqual(sorted[K - 1] - 1e-5);
        });
        b.logits.push(...sl[p]);
        b.ids.push(...picked);
        b.logps.push(...topLogps[i].subarray(k * K, (k + 1) * K));
        b.rest.push(rest[i][k]);
      }
    });
    const M = b.rest.length;
    const ref = runLossReference(resolveLoss('gkd', { beta: 0 }), {
      student_logits: { dims: [1, M, V], data: Float64Array.from(b.logits) },
      teacher_topk_ids: { dims: [1, M, K], data: Float64Array.from(b.ids) },
      teacher_topk_logps: { dims: [1, M, K], data: Float64Array.from(b.logps) },
      teacher_rest_logps: { dims: [1, M], data: Float64Array.from(b.rest) },
      completion_mask: { dims: [1, M], data: new Float64Array(M).fill(1) },
    });
    const row = JSON.parse(readFileSync(join(run, 'metrics.jsonl'), 'utf8').trim().split('\n')[0]) as Record<string, number>;
    expect(ref.loss).toBeGreaterThan(1e-3);
    expect(Math.abs(row.loss - ref.loss)).toBeLessThanOrEqual(1e-4 * ref.loss);
    expect(r.seqKd?.meanLength).toBeCloseTo(M / rows.length, 2);
  });

  it('with lmbda = 0.5, an interrupted run resumes to the same weights, reading the generations back', async () => {
    const params = ['max_steps=6', 'save_steps=3', 'batch_size=2', 'gradient_accumulation_steps=2', 'learning_rate=1e-2', `distill_topk=${K}`, 'lmbda=0.5', 'seq_kd=true', 'max_completion_length=5', 'seed=9'];
    const straight = await distill({ teacher, model: student, data: pairs, out: join(dir, 'run-mix'), params });
    expect(straight.onPolicy!.sampled).toBeGreaterThan(0);
    expect(straight.onPolicy!.sampled).toBeLessThan(straight.onPolicy!.microBatches);
    const broken = join(dir, 'run-mix-broken');
    await withNanAt(5, () => expect(distill({ teacher, model: student, data: pairs, out: broken, params })).rejects.toThrow(/loss is NaN at step 5/));
    const r = await distill({ teacher, model: student, data: pairs, out: broken, params, resume: true });
    expect(r.seqKd?.cached).toBe(true);
    expect(r.cached).toBe(true);
    expect(Buffer.compare(readFileSync(join(straight.finalDir, 'model.safetensors')), readFileSync(join(r.finalDir, 'model.safetensors')))).toBe(0);
  });

  it('refuses seq_kd at lmbda = 1, and an ambiguous temperature', async () => {
    await expect(distill({ teacher, model: student, data: pairs, out: join(dir, 'run-r1'), params: ['seq_kd=true', 'lmbda=1'] }))
      .rejects.toThrow(/^seq_kd with lmbda=1: every micro-batch is the student's own samples/);
    await expect(distill({ teacher, model: student, data: pairs, out: join(dir, 'run-r2'), params: ['seq_kd=true', 'temperature=2'] }))
      .rejects.toThrow(/^temperature with seq_kd is ambiguous/);
  });
});
