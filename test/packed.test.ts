/**
 * Shared-prompt (packed) batches: one row per example, prompt ++ response_1 ++ response_2 ++ …, must
 * give the same sequence log-probs, token counts and gradients as one sequence per response.
 * The reference is the unpacked graph, itself checked against a float64 forward and finite
 * differences in models.test.ts.
 */
import { describe, it, expect, afterAll } from 'vitest';
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { Graph, type Tensor } from '../src/onnx/graph.ts';
import { serializeModel } from '../src/onnx/proto.ts';
import { Session, toOrt, type Feeds } from '../src/runtime/session.ts';
import { gradients } from '../src/autodiff/index.ts';
import { buildCausalLM, declareParameters } from '../src/models/index.ts';
import { scoredLogps, sequenceLogps } from '../src/models/logps.ts';
import { Normal } from '../src/random.ts';
import { canPack, collate } from '../src/models/batch.ts';
import type { TokenizedExample } from '../datasets/examples.ts';
import { prepareBench } from '../scripts/bench/step.ts';
import { TrainingArtifacts } from '../src/artifacts/index.ts';
import { randomIds, randomWeights, testConfig } from './helpers/model-fixtures.ts';
import type { Kind } from '../datasets/schema.ts';

const root = mkdtempSync(join(tmpdir(), 'pz-packed-'));
afterAll(() => rmSync(root, { recursive: true, force: true }));

function example(prompt: number[], responses: number[][]): TokenizedExample {
  return { promptIds: prompt, responseIds: responses, src: { prompt: '', responses: responses.map(() => '') } } as TokenizedExample;
}

describe('collate with shared prompts', () => {
  it('lays out prompt ++ responses with their own positions, segments and scored positions', () => {
    const rows = [example([5, 6], [[7, 8, 9], [10]]), example([11], [[12], [13, 14]])];
    const c = collate(rows, { kind: 'pairwise', padTo: 4, padId: 0, dtype: 'float32', packed: true });
    const ints = (k: string) => Array.from(c.feeds[k].data as BigInt64Array, Number);
    expect(c.feeds.input_ids.dims).toEqual([2, 8]);
    expect(ints('input_ids')).toEqual([5, 6, 7, 8, 9, 10, 0, 0, 11, 12, 13, 14, 0, 0, 0, 0]);
    expect(ints('position_ids')).toEqual([0, 1, 2, 3, 4, 2, 0, 0, 0, 1, 1, 2, 0, 0, 0, 0]);
    expect(ints('segment_ids')).toEqual([1, 1, 2, 2, 2, 3, 0, 0, 1, 2, 3, 3, 0, 0, 0, 0]);
    // Each response's first token is predicted from the last prompt position (1, and 8 + 0).
    expect(ints('score_index')).toEqual([1, 2, 3, 1, 8, 8, 10]);
    expect(ints('score_target')).toEqual([7, 8, 9, 10, 12, 13, 14]);
    // Sequences response-major: chosen_1, chosen_2, rejected_1, rejected_2.
    const sel = Array.from(c.feeds.score_select.data as Float32Array);
    expect(c.feeds.score_select.dims).toEqual([4, 7]);
    expect(sel).toEqual([
      [1, 1, 1, 0, 0, 0, 0],
      [0, 0, 0, 0, 1, 0, 0],
      [0, 0, 0, 1, 0, 0, 0],
      [0, 0, 0, 0, 0, 1, 1],
    ].flat());
    expect(c.sequences).toBe(4);
    expect(c.tokens).toBe(2 + 3 + 2 + 1 + 1 + 1 + 1 + 2); // every sequence counts its prompt
    expect(c.computed).toBe(6 + 4);
  });

  it('refuses kinds whose rows have one response', () => {
    expect(canPack('single')).toBe(false);
    expect(canPack('pairwise', true)).toBe(false);
    expect(() => collate([example([1], [[2]])], { kind: 'single', padTo: 4, padId: 0, dtype: 'float32', packed: true })).toThrow(/cannot share prompts/);
  });
});

/** Random examples: prompt lengths include 0 and 1 (a response's first token then has no or one predictor). */
function randomExamples(kind: Kind, vocab: number, seed: number): TokenizedExample[] {
  const rng = new Normal(seed);
  const n = (lo: number, hi: number) => lo + Math.floor(rng.uniform() * (hi - lo + 1));
  const prompts = [3, 0, 1, 5];
  return prompts.map((p, i) => {
    const K = kind === 'pairwise' ? 2 : i === 2 ? 2 : 3; // listwise: one row lists fewer responses
    return example(randomIds(p, vocab, rng), Array.from({ length: K }, () => randomIds(n(1, 5), vocab, rng)));
  });
}

describe.each([
  ['llama', 'pairwise'],
  ['qwen2', 'listwise'],
  ['gpt2', 'pairwise'],
  ['gpt2', 'listwise'],
] as const)('%s, %s batches: packed = one sequence per response (float64)', (arch, kind) => {
  it('gives the same log-probs, token counts and parameter gradients', async () => {
    const c = testConfig(arch);
    const w = randomWeights(c, 31);
    const rows = randomExamples(kind, c.vocab_size, 7);
    const run = async (packed: boolean) => {
      const b = collate(rows, { kind, padTo: 4, padId: 2, dtype: 'float64', packed });
      const g = new Graph('packed');
      const inputs = Object.fromEntries(
        Object.entries(b.feeds)
          .filter(([k]) => k !== 'weight')
          .map(([k, t]) => [k, g.input(k, t.type === 'int64' ? 'int64' : 'float64', t.dims.map((_, i) => `${k}_${i}`))]),
      ) as Record<string, Tensor>;
      const params = declareParameters(g, c, { dtype: 'float64' });
      const model = packed
        ? buildCausalLM(g, c, params, { inputIds: inputs.input_ids, packed: { positionIds: inputs.position_ids, segmentIds: inputs.segment_ids } })
        : buildCausalLM(g, c, params, { inputIds: inputs.input_ids, attentionMask: inputs.attention_mask });
      const r = packed ? scoredLogps(g, model, inputs.score_index, inputs.score_target, inputs.score_select) : sequenceLogps(g, model, inputs.loss_mask);
      g.output(r.logp, 'logp');
      g.output(r.tokens, 'tokens');
      // A scalar mixing the sequences with fixed, distinct weights, so every gradient path is tested.
      const mix = g.constant(Array.from({ length: b.sequences }, (_, s) => 0.3 + 0.17 * s * (s % 2 ? -1 : 1)), 'float64', [b.sequences]);
      const loss = g.output(g.reduceSum(g.mul(r.logp, mix), undefined, false), 'loss');
      const names = [...params.keys()];
      gradients(g, loss, names.map((n) => params.get(n)!)).forEach((d, i) => g.output(d!, `grad:${names[i]}`));
      const feeds: Feeds = { ...b.feeds };
      delete feeds.weight;
      for (const n of names) feeds[n] = toOrt('float64', Float64Array.from(w.get(n)!.data), params.get(n)!.staticShape!);
      const session = await Session.create(serializeModel(g));
      const out = await session.run(feeds);
      await session.release();
      return { out, names, computed: b.computed, tokens: b.tokens };
    };
    const flat = await run(false);
    const packed = await run(true);
    expect(packed.tokens).toBe(flat.tokens);
    expect(packed.computed).toBeLessThan(flat.computed);
    expect(Array.from(packed.out.tokens.data as Float64Array)).toEqual(Array.from(flat.out.tokens.data as Float64Array));
    const lpA = flat.out.logp.data as Float64Array;
    const lpB = packed.out.logp.data as Float64Array;
    expect(lpA.length).toBe(kind === 'pairwise' ? 8 : 12);
    for (let s = 0; s < lpA.length; s++) expect(Math.abs(lpA[s] - lpB[s]), `logp[${s}]`).toBeLessThan(1e-11 * Math.max(1, Math.abs(lpA[s])));
    let nonzero = 0;
    for (const n of flat.names) {
      const a = flat.out[`grad:${n}`].data as Float64Array;
      const b = packed.out[`grad:${n}`].data as Float64Array;
      let scale = 0;
      let diff = 0;
      for (let i = 0; i < a.length; i++) {
        scale = Math.max(scale, Math.abs(a[i]));
        diff = Math.max(diff, Math.abs(a[i] - b[i]));
      }
      if (scale > 0) nonzero++;
      expect(diff, `gradient of ${n}`).toBeLessThanOrEqual(1e-11 * Math.max(1, scale));
    }
    expect(nonzero).toBe(flat.names.length);
  });
});

describe('training artifacts with shared prompts', () => {
  it('evaluate and train like the unpacked artifacts (bench llama, DPO, float32)', async () => {
    const sides = await Promise.all(
      [false, true].map(async (packed) => {
        const setup = prepareBench(join(root, `bench-${packed}`), 'tiny', 3, 24, packed);
        const art = await TrainingArtifacts.load(setup.artDir, {}, { checkpoint: false });
        for (const [name, value] of setup.initial) art.setParam(name, value);
        // Uneven responses, so the packed rows differ in shape from the unpacked ones.
        const rows = setup.rows.map((r, i) => ({ ...r, responseIds: [r.responseIds[0].slice(0, 12 - 3 * i), r.responseIds[1]] }));
        const c = collate(rows, { kind: 'pairwise', padTo: 8, padId: setup.padId, dtype: 'float32', packed });
        const ev = await art.evaluate(c.feeds);
        const logp = Float32Array.from(ev.logp.data as Float32Array);
        const ref = Float32Array.from(logp, (x, i) => x + 0.5 * Math.sin(i + 1)); // a reference that differs
        c.feeds.ref_logps = toOrt('float32', ref, [ref.length]);
        const steps = [];
        for (let s = 0; s < 3; s++) steps.push(await art.trainStep(c.feeds, { lr: 1e-3 }));
        await art.release();
        return { logp, steps };
      }),
    );
    const [flat, packed] = sides;
    for (let s = 0; s < flat.logp.length; s++) expect(Math.abs(flat.logp[s] - packed.logp[s])).toBeLessThan(2e-4);
    for (let s = 0; s < 3; s++) {
      expect(Math.abs(flat.steps[s].loss - packed.steps[s].loss)).toBeLessThan(1e-5);
      expect(Math.abs(flat.steps[s].grad_norm - packed.steps[s].grad_norm) / flat.steps[s].grad_norm).toBeLessThan(1e-4);
      expect(packed.steps[s]['rewards/margins']).toBeCloseTo(flat.steps[s]['rewards/margins'], 4);
    }
  });
});
