/**
 * Runtime options measured, not assumed: the bench's DPO step under several ONNX Runtime settings,
 * in interleaved rounds (A B C … A B C …) so that load from other processes falls on all of them;
 * prints each setting's median seconds per step and CPU seconds per step.
 *
 *   npx tsx scripts/bench/options.ts [--preset small] [--rounds 3] [--steps 2] [--only default,all,...]
 */
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { parseArgs } from 'node:util';
import { prepareBench } from './step.ts';
import { TrainingArtifacts } from '../../src/artifacts/training.ts';
import type { RuntimeOptions } from '../../src/runtime/session.ts';
import { collate } from '../../src/models/batch.ts';

const SETTINGS: Record<string, RuntimeOptions> = {
  default: {},
  'opt-all': { optLevel: 'all' },
  'opt-basic': { optLevel: 'basic' },
  'no-spin': { spin: false },
  'threads-1': { threads: 1 },
  'no-arena': { arena: false },
};

const { values: a } = parseArgs({
  options: {
    preset: { type: 'string', default: 'small' },
    rounds: { type: 'string', default: '3' },
    steps: { type: 'string', default: '2' },
    only: { type: 'string' },
  },
});
const names = a.only ? a.only.split(',') : Object.keys(SETTINGS);
for (const n of names) if (!SETTINGS[n]) throw new Error(`unknown setting ${n} (known: ${Object.keys(SETTINGS).join(', ')})`);
const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'prefzoo-options-'));
const setup = prepareBench(dir, a.preset as 'tiny' | 'small', 4, 256);
const batch = collate(setup.rows, { kind: 'pairwise', padTo: 64, padId: setup.padId, dtype: 'float32', refLogps: () => [-300, -300], packed: setup.packed });
const wall = new Map<string, number[]>(names.map((n) => [n, []]));
const cpu = new Map<string, number[]>(names.map((n) => [n, []]));
for (let r = 0; r < Number(a.rounds); r++) {
  for (const name of names) {
    const art = await TrainingArtifacts.load(setup.artDir, SETTINGS[name], { checkpoint: false });
    for (const [p, data] of setup.initial) art.setParam(p, data);
    await art.trainStep(batch.feeds, { lr: 1e-5 }); // warm-up
    for (let s = 0; s < Number(a.steps); s++) {
      const c0 = process.cpuUsage();
      const t0 = performance.now();
      await art.trainStep(batch.feeds, { lr: 1e-5 });
      wall.get(name)!.push((performance.now() - t0) / 1000);
      const c = process.cpuUsage(c0);
      cpu.get(name)!.push((c.user + c.system) / 1e6);
    }
    await art.release();
    process.stderr.write(`round ${r + 1} ${name}: ${wall.get(name)!.slice(-Number(a.steps)).map((t) => t.toFixed(2)).join(' ')} s (load ${os.loadavg()[0].toFixed(1)})\n`);
  }
}
const median = (xs: number[]) => [...xs].sort((x, y) => x - y)[Math.floor(xs.length / 2)];
for (const name of names) {
  console.log(`${name.padEnd(10)} ${JSON.stringify(SETTINGS[name]).padEnd(24)} median ${median(wall.get(name)!).toFixed(3)} s/step, min ${Math.min(...wall.get(name)!).toFixed(3)}, cpu ${median(cpu.get(name)!).toFixed(2)} s/step`);
}
fs.rmSync(dir, { recursive: true, force: true });
