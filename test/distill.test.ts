/**
 * `prefzoo distill`: the teacher's cached top K against a float64 forward of the teacher, a KD
 * step's loss and output-head gradient against gkd's float64 reference on a float64 forward of the
 * student, the refusals (a stale cache, another tokenizer), and an interrupted run resumed to the
 * same weights. Tiny models made here; every run is one to four steps.
 */
import { describe, it, expect, beforeAll } from 'vitest';
import { mkdtempSync, readFileSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import * as arrow from 'apache-arrow';
import { initModelFolder } from '../src/models/init.ts';
import { loadModel } from '../src/models/load.ts';
import { saveCheckpoint } from '../src/models/checkpoint.ts';
import type { ModelConfig } from '../src/models/config.ts';
import { f16BitsToFloat, readSafetensors, tensorToFloat32 } from '../src/models/safetensors.ts';
import { loadTokenizer } from '../src/tokenize/index.ts';
import { loadData, tokenizeExamples, type TokenizedExample } from '../datasets/examples.ts';
import { DEFAULT_CONFIG } from '../src/train/config.ts';
import { distill } from '../src/train/distill.ts';
import { resolveLoss } from '../losses/index.ts';
import { runLossReference } from '../losses/core/engine.ts';
import { referenceHidden, referenceLogits, type RefWeights } from './helpers/reference-forward.ts';
import { randomWeights } from './helpers/model-fixtures.ts';
import { prefzoo } from './helpers/cli.ts';
import { distillModel, logSoftmax } from './helpers/distill-fixtures.ts';

const K = 6;
let dir: string;
let teacher: string;
let student: string;
let chats: string;
let pairs: string;


function jsonl(file: string, rows: unknown[]): string {
  writeFileSync(file, rows.map((r) => JSON.stringify(r)).join('\n') + '\n');
  return file;
}

/** Short runs: every row in one micro-batch, plain SGD without clipping (the update is −lr·gradient). */
// teacher_dtype=f32: these hold the float32 teacher to float64 (the int8 default has its own tests).
const ONE_SGD_STEP = ['teacher_dtype=f32', 'max_steps=1', 'batch_size=16', 'optimizer=sgd', 'momentum=0', 'max_grad_norm=0', 'lr_scheduler=constant', 'learning_rate=1', `distill_topk=${K}`, 'pad_to_multiple_of=16', 'beta=0.3'];

beforeAll(() => {
  dir = mkdtempSync(join(tmpdir(), 'pz-distill-'));
  teacher = distillModel(join(dir, 'teacher'), 1);
  student = distillModel(join(dir, 'student'), 2, { tied: false, layers: 1 });
  // SFT conversations: the second turn of a two-turn chat is trained, the user turns between are masked.
  chats = jsonl(join(dir, 'chats.jsonl'), [
    { messages: [{ role: 'user', content: 'What is two plus two?' }, { role: 'assistant', content: 'Four.' }] },
    { messages: [{ role: 'user', content: 'Name a colour.' }, { role: 'assistant', content: 'Blue.' }, { role: 'user', content: 'Another?' }, { role: 'assistant', content: 'Green, then red.' }] },
    { messages: [{ role: 'user', content: 'Say hello.' }, { role: 'assistant', content: 'Hello there, friend.' }] },
  ]);
  pairs = jsonl(join(dir, 'pairs.jsonl'), Array.from({ length: 8 }, (_, i) => ({ prompt: `What is ${i} plus ${i + 1}?`, chosen: `It is ${2 * i + 1}.`, rejected: 'No idea.' })));
});

const weightsOf = (dir: string) => loadModel(dir) as { config: ModelConfig; weights: RefWeights };

/** Rows as distill tokenizes them (train's path), each one response with its mask. */
async function tokenized(data: string, work: string): Promise<TokenizedExample[]> {
  const d = await loadData(data, work);
  return tokenizeExamples(d.examples, loadTokenizer(student), DEFAULT_CONFIG).rows;
}

/** The positions whose next token is counted (t predicts t + 1), one row's, in order. */
function positions(r: TokenizedExample): { ids: number[]; at: number[] } {
  const ids = [...r.promptIds, ...r.responseIds[0]];
  const mask = r.responseMasks?.[0];
  const at: number[] = [];
  r.responseIds[0].forEach((_, j) => {
    const t = r.promptIds.length + j;
    if ((!mask || mask[j]) && t >= 1) at.push(t - 1);
  });
  return { ids, at };
}


/** The cache as written (read here with Arrow, not with the code under test). */
async function readCache(run: string): Promise<{ ids: Int32Array; logps: Float64Array; rest: Float64Array }[]> {
  const pw = await import('parquet-wasm');
  const t = arrow.tableFromIPC(pw.readParquet(readFileSync(join(run, 'data', 'teacher.parquet'))).intoIPCStream());
  const col = (n: string, i: number) => (t.getChild(n)!.get(i) as arrow.Vector).toArray();
  return Array.from({ length: t.numRows }, (_, i) => ({
    ids: col('topk_ids', i) as Int32Array,
    logps: Float64Array.from(col('topk_logps', i) as Uint16Array, f16BitsToFloat),
    rest: Float64Array.from(col('rest_logp', i) as Uint16Array, f16BitsToFloat),
  }));
}

describe('prefzoo distill', () => {
  it("caches the teacher's float64 top K, and a KD step's loss and head gradient are gkd's float64 reference", async () => {
    const run = join(dir, 'run-check');
    const r = await distill({ teacher, model: student, data: chats, out: run, params: ONE_SGD_STEP });
    expect(r.cached).toBe(false);
    const rows = await tokenized(chats, join(dir, 'work'));
    const cache = await readCache(run);
    expect(cache.length).toBe(rows.length);

    // 1. The cache: the teacher's K most likely ids at each counted token, their log-probs and the log of the rest.
    const T = weightsOf(teacher);
    const S = weightsOf(student);
    const V = S.config.vocab_size;
    const batch = { logits: [] as number[], ids: [] as number[], logps: [] as number[], rest: [] as number[], hidden: [] as Float64Array[] };
    let masked = 0;
    rows.forEach((row, i) => {
      const { ids, at } = positions(row);
      if (row.responseMasks) masked++;
      const c = cache[i];
      expect(c.rest.length).toBe(at.length);
      const tl = referenceLogits(T.config, T.weights, ids);
      const sl = referenceLogits(S.config, S.weights, ids);
      const sh = referenceHidden(S.config, S.weights, ids);
      at.forEach((p, m) => {
        const lp = logSoftmax(tl[p]);
        const sorted = [...lp].sort((a, b) => b - a);
        const picked = Array.from(c.ids.subarray(m * K, (m + 1) * K));
        expect(new Set(picked).size).toBe(K);
        picked.forEach((id, k) => {
          // float16 log-probs: within half a float16 ulp (2⁻¹¹ relative), plus float32's forward.
          expect(Math.abs(c.logps[m * K + k] - lp[id])).toBeLessThanOrEqual(Math.abs(lp[id]) * 2 ** -11 + 1e-5);
          // One of the top K: no token outside them is more likely (beyond float32 ties).
          expect(lp[id]).toBeGreaterThanOrEqual(sorted[K - 1] - 1e-5);
        });
        const inTop = new Set(picked);
        const rest = Math.log(lp.reduce((a, v, id) => a + (inTop.has(id) ? 0 : Math.exp(v)), 0));
        expect(Math.abs(c.rest[m] - rest)).toBeLessThanOrEqual(Math.abs(rest) * 2 ** -11 + 1e-4);
        batch.logits.push(...sl[p]);
        batch.ids.push(...picked);
        batch.logps.push(...c.logps.subarray(m * K, (m + 1) * K));
        batch.rest.push(c.rest[m]);
        batch.hidden.push(sh[p]);
      });
    });
    expect(masked).toBeGreaterThan(0);

    // 2. The step: gkd's float64 reference on the student's float64 logits at those positions, against the cached targets.
    const M = batch.rest.length;
    const ref = runLossReference(resolveLoss('gkd', { beta: 0.3 }), {
      student_logits: { dims: [1, M, V], data: Float64Array.from(batch.logits) },
      teacher_topk_ids: { dims: [1, M, K], data: Float64Array.from(batch.ids) },
      teacher_topk_logps: { dims: [1, M, K], data: Float64Array.from(batch.logps) },
      teacher_rest_logps: { dims: [1, M], data: Float64Array.from(batch.rest) },
      completion_mask: { dims: [1, M], data: new Float64Array(M).fill(1) },
    }, { grad: true });
    const row = JSON.parse(readFileSync(join(run, 'metrics.jsonl'), 'utf8').trim().split('\n')[0]);
    expect(ref.loss).toBeGreaterThan(1e-3);
    // float32's forward of spread-out weights against float64's.
    expect(Math.abs(row.loss - ref.loss)).toBeLessThanOrEqual(1e-4 * ref.loss);
    // The output head's gradient Σ_m dℓ/dz_m ⊗ h_m, read back from one SGD step of learning rate 1.
    const g = ref.grad.student_logits;
    const D = batch.hidden[0].length;
    const before = S.weights.get('lm_head.weight')!.data;
    const after = tensorToFloat32(readSafetensors(join(run, 'final', 'model.safetensors')).tensors.get('lm_head.weight')!);
    let worst = 0;
    let largest = 0;
    for (let v = 0; v < V; v++) {
      for (let j = 0; j < D; j++) {
        let want = 0;
        for (let m = 0; m < M; m++) want += g[m * V + v] * batch.hidden[m][j];
        const got = before[v * D + j] - after[v * D + j];
        worst = Math.max(worst, Math.abs(got - want));
        largest = Math.max(largest, Math.abs(want));
      }
    }
    expect(largest).toBeGreaterThan(1e-4);
    expect(worst).toBeLessThanOrEqual(2e-3 * largest + 1e-6);
  });

  it('a teacher that is the student gives a loss of float16 rounding only', async () => {
    const r = await distill({ teacher: student, model: student, data: chats, out: join(dir, 'run-self'), params: ONE_SGD_STEP });
    expect(Math.abs(r.last.loss)).toBeLessThan(1e-5);
    expect(r.last['distill/teacher_topk_mass']).toBeCloseTo(r.last['distill/student_topk_mass'], 3);
  });

  it('refuses a cache made by another teacher, and a teacher with another tokenizer', async () => {
    const other = distillModel(join(dir, 'teacher-b'), 5);
    const run = join(dir, 'run-stale');
    await distill({ teacher: other, model: student, data: pairs, out: run, params: ONE_SGD_STEP });
    // The teacher's weights change under the run: its cache no longer says what the teacher says.
    saveCheckpoint(other, randomWeights(loadModel(other).config, 6), { config: loadModel(other).config });
    await expect(distill({ teacher: other, model: student, data: pairs, out: run, resume: true, params: [...ONE_SGD_STEP, 'max_steps=2'] }))
      .rejects.toThrow(/teacher\.parquet: cached by a run with different teacher files; a run keeps its teacher's targets/);

    const foreign = join(dir, 'foreign');
    initModelFolder(foreign, 'llama', 'tiny', 3, { merges: 60 });
    const cli = await prefzoo('distill', '--teacher', foreign, '--model', student, '--data', pairs, '-o', join(dir, 'run-foreign'));
    expect(cli.code).toBe(1);
    const lines = cli.stderr.trim().split('\n');
    expect(lines.length).toBe(1);
    expect(lines[0]).toMatch(new RegExp(`--teacher ${foreign} and --model ${student} have different tokenizers \\(\\d+ ids against \\d+\\)`));
  });

  it('an interrupted run resumed from its checkpoint ends with the weights of an uninterrupted one', async () => {
    const params = ['max_steps=4', 'save_steps=2', 'batch_size=3', 'learning_rate=1e-2', `distill_topk=${K}`, 'pad_to_multiple_of=16'];
    const straight = await distill({ teacher, model: student, data: pairs, out: join(dir, 'run-straight'), params });
    const broken = join(dir, 'run-broken');
    process.env.PREFZOO_FAULT_NAN_AT_STEP = '3';
    try {
      await expect(distill({ teacher, model: student, data: pairs, out: broken, params })).rejects.toThrow(/loss is NaN at step 3/);
    } finally {
      delete process.env.PREFZOO_FAULT_NAN_AT_STEP;
    }
    const resumed = await distill({ teacher, model: student, data: pairs, out: broken, params, resume: true });
    expect(resumed.cached).toBe(true);
    expect(Buffer.compare(readFileSync(join(straight.finalDir, 'model.safetensors')), readFileSync(join(resumed.finalDir, 'model.safetensors')))).toBe(0);
    const steps = readFileSync(join(broken, 'metrics.jsonl'), 'utf8').trim().split('\n').map((l) => JSON.parse(l).step);
    expect(steps).toEqual([1, 2, 3, 4]);
  });
});
