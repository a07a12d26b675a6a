/**
 * What teacher_dtype does to a teacher's targets (`node --import tsx scripts/bench/teacher-dtype-gap.ts
 * TEACHER DATA [K] [dtypes]`): the teacher's top K on DATA's responses (read and tokenized as distill
 * reads them, default settings) at f32 and at each other precision (default q8,q4; blocks of 32),
 * each compared with f32's token by token (scripts/bench/distill-bench.ts's `topkGap`: mean and max
 * |Δ log p| at the ids both hold, the share of f32's K ids it holds) and the max |Δ| of the rest's
 * log-mass; one JSON line per precision, with the scoring's wall seconds.
 */
import { mkdtempSync, rmSync } from 'node:fs';
import os from 'node:os';
import { join } from 'node:path';
import { loadData, tokenizeExamples } from '../../datasets/examples.ts';
import { productQuant } from '../../src/models/quantize.ts';
import { loadTokenizer } from '../../src/tokenize/index.ts';
import { DEFAULT_CONFIG } from '../../src/train/config.ts';
import { TeacherSpec } from '../../src/train/teacher-model.ts';
import { scoringRuntime, TeacherTopK, type TeacherRow } from '../../src/train/teacher-topk.ts';
import { topkGap } from './distill-bench.ts';

const [teacherDir, data, k, list] = process.argv.slice(2);
if (!teacherDir || !data) throw new Error('usage: teacher-dtype-gap.ts TEACHER DATA [K] [dtypes]');
const K = Number(k ?? 16);
const work = mkdtempSync(join(os.tmpdir(), 'prefzoo-dtype-gap-'));
try {
  const tok = loadTokenizer(teacherDir);
  const loaded = await loadData(data, work, { seed: 0 });
  const rows = tokenizeExamples(loaded.examples, tok, DEFAULT_CONFIG, loaded.tokens).rows.map((r) => ({ ...r, responseIds: [r.responseIds[0]] }));
  const teacher = TeacherSpec.of(teacherDir, undefined, undefined).load();
  const score = async (dtype: string): Promise<{ rows: TeacherRow[]; seconds: number }> => {
    const quant = productQuant(dtype, 32, 'cpu', { dtype: 'dtype', block: 'block' });
    const s = await TeacherTopK.create(teacher, { K, limit: teacher.config.vocab_size, runtime: scoringRuntime({}), padId: tok.padId ?? 0, quant });
    try {
      const t0 = performance.now();
      const out = await s.score(rows, { batchSize: 64, padTo: 1 });
      return { rows: out, seconds: (performance.now() - t0) / 1000 };
    } finally {
      await s.release();
    }
  };
  const f32 = await score('f32');
  const tokens = f32.rows.reduce((a, r) => a + r.rest.length, 0);
  console.log(JSON.stringify({ teacher_dtype: 'f32', rows: rows.length, tokens, K, seconds: +f32.seconds.toFixed(3) }));
  for (const dtype of (list ?? 'q8,q4').split(',')) {
    const q = await score(dtype);
    const rest = Math.max(...q.rows.map((r, i) => Math.max(...r.rest.map((v, t) => Math.abs(v - f32.rows[i].rest[t])))));
    console.log(JSON.stringify({ teacher_dtype: dtype, ...topkGap(f32.rows, q.rows, K), max_abs_rest: +rest.toFixed(5), seconds: +q.seconds.toFixed(3) }));
  }
} finally {
  rmSync(work, { recursive: true, force: true });
}
