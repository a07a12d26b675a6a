/**
 * The teacher's top-K scoring of on-policy samples, its variants side by side in one process
 * (`node --import tsx scripts/bench/teacher-topk-ab.ts [rows] [prompt] [new] [rounds]`): the
 * teacher of `prefzoo bench --distill` (the small preset widened 2×, about 4× its parameters; weights
 * from a cheap seeded filler, since only the time is measured), `rows` rows of `prompt` + `new`
 * tokens, the `new` ones scored at K = 32. Each variant: one untimed run, then `rounds` timed, the
 * median wall and process CPU (user + system) seconds, and whether its top-K equals the first's.
 */
import os from 'node:os';
import { LOW_MEMORY_RUNTIME } from '../../src/train/run.ts';
import { scoringRuntime, TeacherTopK, type TeacherRow } from '../../src/train/teacher-topk.ts';
import type { RuntimeOptions } from '../../src/runtime/session.ts';
import type { ProductQuant } from '../../src/models/quantize.ts';
import { fillerRows, fillerTeacher } from './teacher-filler.ts';

const [rows, prompt, fresh, rounds] = process.argv.slice(2).map(Number);
const R = rows || 8;
const P = prompt || 32;
const N = fresh || 64;
const ROUNDS = rounds || 2;

const teacher = fillerTeacher();
const config = teacher.config;
const examples = fillerRows(R, P, N);

const variants: { name: string; runtime: RuntimeOptions; quant?: ProductQuant }[] = process.env.AB === 'dtype'
  ? [
      { name: 'f32 (scoringRuntime)', runtime: scoringRuntime({}) },
      { name: 'q8, int8 activations (teacher_dtype=q8)', runtime: scoringRuntime({}), quant: { bits: 8, block: 32 } },
      { name: 'q8, float32 activations (accuracy_level 0)', runtime: scoringRuntime({}), quant: { bits: 8, block: 32, accuracy: 0 } },
      { name: 'q4, int8 activations (teacher_dtype=q4)', runtime: scoringRuntime({}), quant: { bits: 4, block: 32 } },
    ]
  : [
      { name: 'low-memory runtime: no arena, no memory pattern (before)', runtime: { ...LOW_MEMORY_RUNTIME } },
      { name: 'arena, memory pattern', runtime: {} },
      { name: 'arena, no memory pattern (after: scoringRuntime)', runtime: scoringRuntime({}) },
    ];
const median = (xs: number[]) => [...xs].sort((a, b) => a - b)[xs.length >> 1];
let first: TeacherRow[] | null = null;
for (const v of variants) {
  const t = await TeacherTopK.create(teacher, { K: 32, limit: config.vocab_size, runtime: v.runtime, padId: 0, quant: v.quant });
  const run = () => t.score(examples, { batchSize: 2 * R, padTo: 1 });
  await run();
  const wall: number[] = [];
  const cpu: number[] = [];
  let out: TeacherRow[] = [];
  for (let i = 0; i < ROUNDS; i++) {
    const c0 = process.cpuUsage();
    const t0 = performance.now();
    out = await run();
    wall.push((performance.now() - t0) / 1000);
    const c = process.cpuUsage(c0);
    cpu.push((c.user + c.system) / 1e6);
  }
  await t.release();
  first ??= out;
  const sameIds = out.every((r, i) => r.ids.every((id, j) => id === first![i].ids[j]));
  const maxDiff = Math.max(...out.map((r, i) => Math.max(...r.logps.map((l, j) => Math.abs(l - first![i].logps[j])))));
  console.log(JSON.stringify({ variant: v.name, wall_s: +median(wall).toFixed(3), cpu_s: +median(cpu).toFixed(3), rounds: wall.map((w) => +w.toFixed(3)), same_ids: sameIds, max_logp_diff: maxDiff, load: os.loadavg()[0] }));
}
