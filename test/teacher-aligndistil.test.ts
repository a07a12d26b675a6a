/**
 * AlignDistil's teacher (`--teacher DPO --teacher-ref REF --param teacher_weight=w`): the teacher's
 * distribution is softmax(z_ref + w·(z_dpo − z_ref)), checked against that combination computed in
 * float64 from independent forwards of the two models — in distill, the greedy seq_kd generations
 * (the generation engine's mixture) and the cached top K on them; in grpo --teacher, the teacher's
 * per-token log-probs at a temperature (the scorer grpo opens); and a short grpo run. The refusals:
 * a weight without a reference, a reference without a teacher, a reference with another tokenizer.
 * Tiny models made here; runs of one step.
 */
import { describe, it, expect, beforeAll } from 'vitest';
import { mkdtempSync, readFileSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import * as arrow from 'apache-arrow';
import { initModelFolder } from '../src/models/init.ts';
import { loadModel } from '../src/models/load.ts';
import type { ModelConfig } from '../src/models/config.ts';
import { f16BitsToFloat } from '../src/models/safetensors.ts';
import { loadTokenizer } from '../src/tokenize/index.ts';
import { loadData, tokenizeExamples, type TokenizedExample } from '../datasets/examples.ts';
import { DEFAULT_CONFIG } from '../src/train/config.ts';
import { distill } from '../src/train/distill.ts';
import { TeacherSpec } from '../src/train/teacher-model.ts';
import { ReferenceScorer } from '../src/online/reference.ts';
import { grpo } from '../src/online/grpo/index.ts';
import { referenceLogits, type RefWeights } from './helpers/reference-forward.ts';
import { distillModel, logSoftmax } from './helpers/distill-fixtures.ts';

const K = 5;
const NEW = 5;
const W = 1.7;
let dir: string;
let dpo: string;
let ref: string;
let student: string;
let pairs: string;
let prompts: string;

beforeAll(() => {
  dir = mkdtempSync(join(tmpdir(), 'pz-aligndistil-'));
  dpo = distillModel(join(dir, 'dpo'), 1);
  ref = distillModel(join(dir, 'ref'), 3);
  student = distillModel(join(dir, 'student'), 2, { tied: false, layers: 1 });
  pairs = join(dir, 'pairs.jsonl');
  writeFileSync(pairs, Array.from({ length: 4 }, (_, i) => JSON.stringify({ prompt: `What is ${i} plus ${i + 3}?`, chosen: `It is ${2 * i + 3}.`, rejected: 'No idea.' })).join('\n') + '\n');
  prompts = join(dir, 'prompts.jsonl');
  writeFileSync(prompts, ['1+2=', '3+4='].map((p) => JSON.stringify({ prompt: p }) + '\n').join(''));
});

const weightsOf = (d: string) => loadModel(d) as { config: ModelConfig; weights: RefWeights };

/** The AlignDistil teacher's logits at every position of `ids`, in float64: z_ref + w·(z_dpo − z_ref). */
function combined(ids: number[], w: number): Float64Array[] {
  const D = weightsOf(dpo);
  const R = weightsOf(ref);
  const zd = referenceLogits(D.config, D.weights, ids);
  const zr = referenceLogits(R.config, R.weights, ids);
  return zd.map((row, t) => row.map((v, i) => zr[t][i] + w * (v - zr[t][i])));
}

async function column(file: string, name: string): Promise<ArrayLike<number>[]> {
  const pw = await import('parquet-wasm');
  const t = arrow.tableFromIPC(pw.readParquet(readFileSync(file)).intoIPCStream());
  return Array.from({ length: t.numRows }, (_, i) => (t.getChild(name)!.get(i) as arrow.Vector).toArray() as ArrayLike<number>);
}

/** The most likely id below `limit` (generation draws only the tokenizer's ids; the embedding has padding rows past them). */
const argmax = (x: ArrayLike<number>, limit: number) => Array.from(x).slice(0, limit).reduce((b, v, i, a) => (v > a[b] ? i : b), 0);

describe('AlignDistil teacher', () => {
  it("distill: greedy seq_kd generations and the cached top K are those of z_ref + w·(z_dpo − z_ref) in float64", async () => {
    const run = join(dir, 'run-distill');
    const params = ['max_steps=1', 'batch_size=4', `distill_topk=${K}`, 'seq_kd=true', 'sampling_temperature=0', `max_completion_length=${NEW}`, `teacher_weight=${W}`];
    await distill({ teacher: dpo, teacherRef: ref, model: student, data: pairs, out: run, params });
    const d = await loadData(pairs, join(dir, 'work'));
    const rows: TokenizedExample[] = tokenizeExamples(d.examples, loadTokenizer(student), DEFAULT_CONFIG).rows;
    const gens = (await column(join(run, 'data', 'teacher-generations.parquet'), 'response_ids')).map((x) => Array.from(x));
    const topIds = await column(join(run, 'data', 'teacher.parquet'), 'topk_ids');
    const topLogps = (await column(join(run, 'data', 'teacher.parquet'), 'topk_logps')).map((x) => Float64Array.from(x as Uint16Array, f16BitsToFloat));
    const rest = (await column(join(run, 'data', 'teacher.parquet'), 'rest_logp')).map((x) => Float64Array.from(x as Uint16Array, f16BitsToFloat));
    const tok = loadTokenizer(dpo);
    const stop = new Set(tok.stopIds);
    let extrapolated = 0;
    rows.forEach((row, i) => {
      const ids = [...row.promptIds, ...gens[i]];
      const z = combined(ids, W);
      const zDpo = combined(ids, 1);
      gens[i].forEach((id, k) => {
        const p = row.promptIds.length - 1 + k;
        // Greedy: each generated token is the combination's argmax, and the generation stops only at a stop id or the budget.
        expect(id).toBe(argmax(z[p], tok.vocabSize));
        if (argmax(zDpo[p], tok.vocabSize) !== id) extrapolated++;
        const lp = logSoftmax(z[p]);
        const picked = Array.from(topIds[i]).slice(k * K, (k + 1) * K);
        const sorted = [...lp].sort((a, b) => b - a);
        picked.forEach((t, j) => {
          expect(Math.abs(topLogps[i][k * K + j] - lp[t])).toBeLessThanOrEqual(Math.abs(lp[t]) * 2 ** -11 + 1e-4);
          expect(lp[t]).toBeGreaterThanOrEqual(sorted[K - 1] - 1e-4);
        });
        const inTop = new Set(picked);
        const r = Math.log(lp.reduce((a, v, t) => a + (inTop.has(t) ? 0 : Math.exp(v)), 0));
        expect(Math.abs(rest[i][k] - r)).toBeLessThanOrEqual(Math.abs(r) * 2 ** -11 + 1e-4);
      });
      expect(gens[i].length === NEW || stop.has(gens[i][gens[i].length - 1])).toBe(true);
    });
    // The weight matters: somewhere the extrapolated teacher picks another token than the DPO model alone.
    expect(extrapolated).toBeGreaterThan(0);
  });

  it("grpo --teacher's scorer: per-token log-probs of softmax((z_ref + w·(z_dpo − z_ref))/τ) in float64; a grpo run logs distill/kl", async () => {
    const tau = 0.7;
    const t = TeacherSpec.of(dpo, ref, W).load();
    const scorer = await ReferenceScorer.forModel(t, {}, { temperature: tau, vocabLimit: t.config.vocab_size });
    const rows = [{ promptIds: [3, 4, 5], ids: [12, 13, 14] }, { promptIds: [6, 7], ids: [15, 16, 17, 18] }];
    const got = await scorer.score(rows, { padId: 0, padTo: 1, batchSize: 2 });
    await scorer.release();
    rows.forEach((r, b) => {
      const z = combined([...r.promptIds, ...r.ids], W);
      const want = r.ids.map((id, j) => logSoftmax(z[r.promptIds.length + j - 1].map((v) => v / tau))[id]);
      want.forEach((v, j) => expect(Math.abs(got.tokens[b][j] - v)).toBeLessThanOrEqual(1e-4 * (1 + Math.abs(v))));
    });

    const run = join(dir, 'run-grpo');
    const r = await grpo({ model: student, teacher: dpo, teacherRef: ref, prompts, rewards: ['length'], out: run, params: ['max_steps=1', 'batch_size=4', 'num_generations=2', 'max_completion_length=4', `teacher_weight=${W}`] });
    expect(r.last['distill/kl']).toBeGreaterThan(0);
    const config = JSON.parse(readFileSync(join(run, 'config.json'), 'utf8'));
    expect(JSON.stringify(config)).toContain('"teacher_weight":1.7');
  });

  it('refuses a weight without a reference, a reference without a teacher, and a reference with another tokenizer', async () => {
    await expect(distill({ teacher: dpo, model: student, data: pairs, out: join(dir, 'r1'), params: ['teacher_weight=2'] }))
      .rejects.toThrow(/^teacher_weight=2: weighs an AlignDistil teacher's DPO model against its reference; give --teacher-ref/);
    await expect(grpo({ model: student, teacherRef: ref, prompts, rewards: ['length'], out: join(dir, 'r2') }))
      .rejects.toThrow(/^--teacher-ref .*: the reference of an AlignDistil teacher; give --teacher \(the DPO model\) too/);
    await expect(grpo({ model: student, prompts, rewards: ['length'], out: join(dir, 'r3'), params: ['teacher_weight=2'] }))
      .rejects.toThrow(/^teacher_weight=2: weighs an AlignDistil teacher; give --teacher and --teacher-ref/);
    const foreign = join(dir, 'foreign');
    initModelFolder(foreign, 'llama', 'tiny', 3, { merges: 60 });
    await expect(distill({ teacher: dpo, teacherRef: foreign, model: student, data: pairs, out: join(dir, 'r4') }))
      .rejects.toThrow(/^--teacher-ref .*foreign and --teacher .*dpo have different tokenizers \(\d+ ids against \d+\); AlignDistil combines the two models' logits id by id/);
  });
});
