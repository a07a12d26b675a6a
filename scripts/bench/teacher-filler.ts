/**
 * The teacher of `prefzoo bench --distill` (the small preset widened 2×, about 4× its parameters) with
 * cheap seeded filler weights, for the scripts that time its top-K scoring alone (teacher-topk-ab.ts,
 * teacher-cut-ab.ts, teacher-profile.ts): only the time is measured, so no model folder is written.
 */
import { presetConfig, type ModelConfig } from '../../src/models/config.ts';
import type { FloatTensor } from '../../src/models/checkpoint.ts';
import { modelParameterShapes } from '../../src/models/params.ts';
import { LoadedTeacher } from '../../src/train/teacher-model.ts';
import { teacherShape } from './distill-bench.ts';
import type { TokenizedExample } from '../../datasets/examples.ts';

export function fillerTeacher(): LoadedTeacher {
  const student = presetConfig('llama', 'small');
  const config = { ...presetConfig('llama', 'small'), ...teacherShape(student, 'llama', 'small').shape } as ModelConfig;
  let x = 12345;
  const weights = new Map<string, FloatTensor>();
  for (const [name, shape] of modelParameterShapes(config)) {
    const n = shape.reduce((a, b) => a * b, 1);
    const data = new Float32Array(n);
    if (/norm\.weight$/.test(name)) data.fill(1);
    else for (let i = 0; i < n; i++) data[i] = (((x = (x * 1103515245 + 12345) >>> 0) >>> 8) / 2 ** 24 - 0.5) * 0.04;
    weights.set(name, { shape, data });
  }
  return new LoadedTeacher({ config, weights }, null, 1);
}

/**
 * `R` rows of `P` prompt tokens and `N` response tokens of seeded ids (with `ragged`, row r's response
 * `N − r mod 5` long: samples of several lengths, as the stop id makes them).
 */
export function fillerRows(R: number, P: number, N: number, ragged = false): TokenizedExample[] {
  return Array.from({ length: R }, (_, r) => ({
    promptIds: Array.from({ length: P }, (_, t) => 16 + ((r * 7919 + t * 104729) % 4000)),
    responseIds: [Array.from({ length: ragged ? N - (r % 5) : N }, (_, t) => 16 + ((r * 31 + t * 7477) % 4000))],
    src: r,
  }) as unknown as TokenizedExample);
}
