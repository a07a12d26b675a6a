/**
 * `prefzoo train` builds its training forward for the longest micro-batch its rows make (issue 46):
 * under recomputation, where a tensor of that batch passes the bound, the MLP and attention run in
 * pieces (`inPieces` in artifacts.json) and the reference log-probs are scored by a scoring graph
 * cut the same way. The bound is lowered here (PREFZOO_TENSOR_BOUND) so that a tiny model's rows pass
 * it; the same run at the real bound is cut nowhere. Both give the same reference log-probs, loss and
 * gradient norm, and their artifacts the same gradient for every parameter, to float32 rounding.
 */
import { execFile } from 'node:child_process';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { promisify } from 'node:util';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { readManifest } from '../src/artifacts/manifest.ts';
import { TrainingArtifacts } from '../src/artifacts/training.ts';
import { batchShapeOf, collate, longestBatch } from '../src/models/batch.ts';
import { readConfig } from '../src/models/config.ts';
import { buildLogpsGraph } from '../src/models/logps.ts';
import { TENSOR_BOUND, tensorBound } from '../src/models/layers.ts';
import { initModelFolder } from '../src/models/init.ts';
import { demoPairs } from '../src/demos/task.ts';
import { readRefColumns } from '../datasets/tokenized.ts';
import { benchPairs } from '../scripts/bench/step.ts';
import { gradName } from '../src/optim/config.ts';
import { LOW_MEMORY_RUNTIME } from '../src/train/run.ts';
import { BIN } from './helpers/cli.ts';
import { worst } from './helpers/model-fixtures.ts';

const run = promisify(execFile);
const root = fs.mkdtempSync(path.join(os.tmpdir(), 'pz-seq-train-'));
afterAll(() => fs.rmSync(root, { recursive: true, force: true }));
const model = path.join(root, 'model');
const data = path.join(root, 'pairs.jsonl');

/** One step of DPO under recomputation; `bound` lowers the bound the forward is cut to. */
async function train(name: string, bound?: number): Promise<{ out: string; stderr: string; metrics: Record<string, number>[] }> {
  const out = path.join(root, name);
  const env = { ...process.env };
  delete env.PREFZOO_TENSOR_BOUND;
  if (bound !== undefined) env.PREFZOO_TENSOR_BOUND = String(bound);
  const params = ['batch_size=4', 'max_steps=1', 'logging_steps=1', 'gradient_checkpointing=true', 'max_length=48', 'max_prompt_length=24', 'pad_to_multiple_of=8'];
  const r = await run(process.execPath, [BIN, 'train', '--model', model, '--data', data, '--loss', 'dpo', '-o', out, '--quiet', ...params.flatMap((p) => ['--param', p])], { encoding: 'utf8', env });
  const metrics = fs.readFileSync(path.join(out, 'metrics.jsonl'), 'utf8').trim().split('\n').map((l) => JSON.parse(l) as Record<string, number>);
  return { out, stderr: r.stderr, metrics };
}

beforeAll(() => {
  initModelFolder(model, 'qwen2', 'tiny', 5);
  fs.writeFileSync(data, demoPairs(3, 8, 0).train.map((p) => JSON.stringify(p)).join('\n') + '\n');
});

describe('prefzoo train builds for its longest micro-batch', () => {
  it('cuts the forward where a tensor passes the bound, with the whole graph\'s numbers', async () => {
    const [cut, whole] = await Promise.all([train('cut', 16384), train('whole')]);
    const art = (r: { out: string }) => path.join(r.out, 'artifacts');
    // The CLI's artifacts say whether the forward was built in pieces.
    expect(readManifest(art(cut)).inPieces).toBe(true);
    expect(readManifest(art(whole)).inPieces).toBeUndefined();
    // The reference cache, scored by the cut scoring graph and the whole one.
    const refCut = (await readRefColumns(path.join(cut.out, 'data', 'reference.parquet'), 'pairwise'))!;
    const refWhole = (await readRefColumns(path.join(whole.out, 'data', 'reference.parquet'), 'pairwise'))!;
    expect(refCut.length).toBe(8);
    const flat = (x: number[][]) => Float64Array.from(x.flat());
    expect(worst(flat(refCut), flat(refWhole))).toBeLessThan(1e-5);
    // Not all equal: a check that could not fail would pass here too.
    expect(new Set(refWhole.flat()).size).toBeGreaterThan(4);
    // The step's loss and pre-clip gradient norm.
    const step = (r: typeof cut) => r.metrics.find((m) => m.step === 1 && m.loss !== undefined)!;
    expect(Math.abs(step(cut).loss - step(whole).loss)).toBeLessThan(1e-5 * Math.max(1, Math.abs(step(whole).loss)));
    expect(Math.abs(step(cut).grad_norm - step(whole).grad_norm)).toBeLessThan(1e-4 * step(whole).grad_norm);

    // Every parameter's gradient from the two runs' artifacts (their starting weights), on one batch
    // of the longest shape the cut graph was built for and on a shorter one.
    const config = readConfig(model);
    const packed = readManifest(art(whole)).batchInputs.some((b) => b.name === 'segment_ids');
    const grads = async (dir: string, rows: ReturnType<typeof benchPairs>) => {
      const batch = collate(rows, { kind: 'pairwise', padTo: 8, padId: 0, dtype: 'float32', packed, refLogps: () => [-3, -4] });
      const a = await TrainingArtifacts.load(dir, { threads: 1, ...LOW_MEMORY_RUNTIME }, { update: 'graph' });
      const m = await a.computeGradients(batch.feeds);
      const g = Object.fromEntries(a.trainableNames.map((n) => [n, Float32Array.from(a.store.data(gradName(n)) as Float32Array)]));
      await a.release();
      return { loss: m.loss, g, shape: batchShapeOf(batch) };
    };
    for (const rows of [benchPairs(config.vocab_size, 4, 20), benchPairs(config.vocab_size, 2, 8)]) {
      const [c, w] = [await grads(art(cut), rows), await grads(art(whole), rows)];
      expect(Math.abs(c.loss - w.loss)).toBeLessThan(1e-5);
      for (const [name, gw] of Object.entries(w.g)) {
        const scale = Math.max(...gw.map(Math.abs));
        expect(scale, name).toBeGreaterThan(0);
        expect(worst(c.g[name], gw) / scale, name).toBeLessThan(1e-4);
      }
    }
  });

  it('scores the reference with a scoring graph cut for the longest batch', () => {
    const config = readConfig(model);
    const shape = { rows: 16, len: 48 };
    const splits = (chunking?: typeof shape & { bound?: number }) => buildLogpsGraph(config, chunking ? { chunking } : {}).nodes.filter((n) => n.op === 'Split').length;
    // At the real bound this model is cut nowhere; at the test's bound its MLP and attention are, in each of its 2 layers.
    expect(splits(shape)).toBe(splits());
    expect(splits({ ...shape, bound: 16384 })).toBeGreaterThanOrEqual(splits() + 2 * 2);
  });

  it('refuses a bound that is not a whole number of bytes, naming the variable', () => {
    const was = process.env.PREFZOO_TENSOR_BOUND;
    try {
      process.env.PREFZOO_TENSOR_BOUND = '4k';
      expect(() => tensorBound()).toThrow(/^PREFZOO_TENSOR_BOUND=4k: /);
      process.env.PREFZOO_TENSOR_BOUND = '4096';
      expect(tensorBound()).toBe(4096);
    } finally {
      if (was === undefined) delete process.env.PREFZOO_TENSOR_BOUND;
      else process.env.PREFZOO_TENSOR_BOUND = was;
    }
    expect(tensorBound()).toBe(TENSOR_BOUND);
  });

  it('takes the longest micro-batch from the rows without collating them', () => {
    // Prompts and responses of unequal lengths: the longest packed row and the longest sequence are different rows.
    const ids = (n: number, at: number) => Array.from({ length: n }, (_, i) => 16 + ((at + i) % 30));
    const lens: [number, number, number][] = [[3, 4, 2], [12, 3, 3], [2, 9, 9], [5, 1, 14], [7, 6, 5]];
    const rows = lens.map(([p, a, b], i) => ({ promptIds: ids(p, i), responseIds: [ids(a, i + 1), ids(b, i + 2)], src: { prompt: '', responses: ['', ''] } }));
    for (const packed of [false, true]) {
      const o = { kind: 'pairwise' as const, padTo: 1, packed };
      // Every batch of 2 rows collates to at most the bound, and some batch reaches each of its two sizes.
      let most = { rows: 0, len: 0 };
      for (let i = 0; i < rows.length; i++) {
        for (let j = i + 1; j < rows.length; j++) {
          const s = batchShapeOf(collate([rows[i], rows[j]], { ...o, padId: 0, dtype: 'float32' }));
          most = { rows: Math.max(most.rows, s.rows), len: Math.max(most.len, s.len) };
        }
      }
      expect(longestBatch(rows, 2, o)).toEqual(most);
      expect(most).toEqual(packed ? { rows: 2, len: 20 } : { rows: 4, len: 19 });
    }
  });
});
