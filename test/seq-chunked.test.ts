/**
 * The training forward in pieces (issue 46): built for a batch shape (`CausalLMOptions.chunking`), the
 * MLP runs over runs of rows and attention over blocks of queries, as many as keep each tensor under a
 * bound (here forced small). Chunked and whole give the same logits, log-probs and gradients to float32
 * rounding, the log-probs match a float64 forward written on the host, and a batch shorter than the one
 * the graph was built for runs too, one with fewer rows and positions than pieces (empty runs and blocks) included.
 */
import { describe, expect, it } from 'vitest';
import { sequenceLogps } from '../src/models/logps.ts';
import { buildCausalLM, declareParameters } from '../src/models/index.ts';
import type { Chunking } from '../src/models/layers.ts';
import { type GradientOptions, gradients } from '../src/autodiff/index.ts';
import { Graph } from '../src/onnx/graph.ts';
import { serializeModel } from '../src/onnx/proto.ts';
import { Session } from '../src/runtime/session.ts';
import { Normal } from '../src/random.ts';
import type { Arch, ModelConfig } from '../src/models/config.ts';
import { feedsOf, pad, randomIds, randomWeights, testConfig, worst, type PaddedBatch } from './helpers/model-fixtures.ts';
import { referenceLogps } from './helpers/reference-forward.ts';

const rng = new Normal(11);

/** Loss Σ c_b·logp_b, its gradients by every parameter, and the logits; with the Split nodes each scope holds. */
async function run(config: ModelConfig, b: PaddedBatch, chunking?: Chunking, grad: GradientOptions = {}) {
  const weights = randomWeights(config, 5);
  const g = new Graph('seq-chunked');
  const inputIds = g.input('input_ids', 'int64', ['batch', 'seq']);
  const attentionMask = g.input('attention_mask', 'int64', ['batch', 'seq']);
  const lossMask = g.input('loss_mask', 'float32', ['batch', 'seq']);
  const params = declareParameters(g, config, { dtype: 'float32' });
  const model = buildCausalLM(g, config, params, { inputIds, attentionMask }, { attentionPieces: 4, chunking });
  const { logp } = sequenceLogps(g, model, lossMask);
  const B = b.ids.length;
  const coef = Array.from({ length: B }, (_, i) => [0.5, -1.1, 0.8, 0.3][i % 4]);
  const loss = g.output(g.reduceSum(g.mul(logp, g.constant(coef, 'float32', [B])), undefined, false), 'loss');
  g.output(logp, 'logp');
  g.output(model.logits(), 'logits');
  const names = [...params.keys()];
  gradients(g, loss, names.map((n) => params.get(n)!), grad).forEach((d, i) => g.output(d!, `grad:${names[i]}`));
  // The chunking's own Splits: their first piece's dim is named `rows_0` or `query_0` (layers.ts splitEven).
  const splits = (dim: string) => g.nodes.filter((n) => n.op === 'Split' && g.tensor(n.outputs[0]).shape?.includes(dim)).length;
  const s = await Session.create(serializeModel(g));
  const out = await s.run(feedsOf(g, b, weights, names));
  await s.release();
  // Gemms summing into a running gradient (GradientOptions.gemmSums): the ones with a C input.
  const gemmSums = g.nodes.filter((n) => n.op === 'Gemm' && (n.inputs[2] ?? '') !== '').length;
  return { out, names, weights, mlpSplits: splits('rows_0'), attnSplits: splits('query_0'), gemmSums, attended: b.attention.flat() };
}

/**
 * The logits at the positions that attend a key. A left pad's query attends none: its row is the
 * finite MASK_VALUE fallback, the mean of whatever keys it is scored against, which the blocks of
 * queries trim to the keys up to their last query; no other position and no loss reads it.
 */
function attendedLogits(r: Awaited<ReturnType<typeof run>>): Float32Array {
  const all = r.out.logits.data as Float32Array;
  const V = all.length / r.attended.length;
  return Float32Array.from(r.attended.flatMap((a, i) => (a ? Array.from(all.subarray(i * V, (i + 1) * V)) : [])));
}

/** Chunked against whole: logits, log-probs and every gradient to float32 rounding. */
function expectSame(chunked: Awaited<ReturnType<typeof run>>, whole: Awaited<ReturnType<typeof run>>) {
  expect(worst(attendedLogits(chunked), attendedLogits(whole))).toBeLessThan(1e-5);
  expect(worst(chunked.out.logp.data as Float32Array, whole.out.logp.data as Float32Array)).toBeLessThan(1e-5);
  let compared = 0;
  for (const n of whole.names) {
    const a = whole.out[`grad:${n}`].data as Float32Array;
    const b = chunked.out[`grad:${n}`].data as Float32Array;
    expect(b.length).toBe(a.length);
    expect(a.some((x) => x !== 0), n).toBe(true);
    expect(worst(b, a), n).toBeLessThan(1e-4);
    compared++;
  }
  expect(compared).toBe(whole.names.length);
}

function batchOf(config: ModelConfig, lengths: number[], T: number): { b: PaddedBatch; rows: { ids: number[]; loss: number[] }[] } {
  const rows = lengths.map((n) => ({ ids: randomIds(n, config.vocab_size, rng), loss: Array.from({ length: n }, (_, t) => (t >= 2 ? 1 : 0)) }));
  return { b: pad(rows, T, lengths.map((_, i) => (i % 2 ? 'right' : 'left'))), rows };
}

describe('the training forward in pieces under a tensor bound', () => {
  for (const arch of ['qwen2', 'phi3', 'gpt2'] as Arch[]) {
    it(`${arch}: same logits, log-probs and gradients as whole; log-probs as a float64 host forward`, async () => {
      const config = testConfig(arch);
      const { b, rows } = batchOf(config, [9, 5, 8], 9);
      const whole = await run(config, b);
      // A bound of 500 bytes: a few uneven runs of the 27 rows and blocks of queries.
      const few = await run(config, b, { rows: 3, len: 9, bound: 500 });
      expect(whole.mlpSplits + whole.attnSplits).toBe(0);
      expect(few.mlpSplits).toBeGreaterThanOrEqual(2); // one per layer (phi3's gate_up Split in each run is counted too)
      expect(few.attnSplits).toBeGreaterThanOrEqual(2 * 2); // q and the mask, per layer
      expectSame(few, whole);
      // A bound of 100 bytes: one row per run, one query per block.
      if (arch === 'qwen2') expectSame(await run(config, b, { rows: 3, len: 9, bound: 100 }), whole);
      const ref = rows.map((r) => referenceLogps(config, few.weights, r.ids, r.loss).logp);
      expect(worst(few.out.logp.data as Float32Array, ref)).toBeLessThan(1e-4);
      expect(Math.min(...ref.map(Math.abs))).toBeGreaterThan(1);
    });
  }

  it('runs a batch shorter than the one it was built for: the same number of pieces, each smaller', async () => {
    const config = testConfig('qwen2');
    const { b } = batchOf(config, [6, 4], 6);
    // Built for 3 × 8 (4 runs of 6 rows, 2 blocks of 4 queries), run over 2 × 6: runs of 3 rows, blocks of 3.
    const chunked = await run(config, b, { rows: 3, len: 9, bound: 300 });
    expect([chunked.mlpSplits, chunked.attnSplits]).toEqual([2, 4]);
    expectSame(chunked, await run(config, b));
  });

  it('runs a batch with fewer rows and positions than pieces: empty runs and blocks add nothing', async () => {
    const config = testConfig('qwen2');
    const { b } = batchOf(config, [3, 2], 3);
    // Built for 3 × 9 under a 300-byte bound: 15 runs of rows and 7 blocks of queries, of which a
    // 2 × 3 batch fills 6 runs and 3 blocks and leaves the others empty. Before the blocks guarded
    // their keys and values, the embedding's gradient came out 38× too large here.
    const chunked = await run(config, b, { rows: 3, len: 9, bound: 300 });
    expect([chunked.mlpSplits, chunked.attnSplits]).toEqual([2, 4]);
    expectSame(chunked, await run(config, b));
  });

  it('sums the pieces\' weight gradients in place (each Gemm onto the running sum): the same gradients', async () => {
    const config = testConfig('qwen2');
    const { b } = batchOf(config, [9, 5, 8], 9);
    const chunking = { rows: 3, len: 9, bound: 500 };
    const added = await run(config, b, chunking, { eagerSums: true });
    const folded = await run(config, b, chunking, { eagerSums: true, gemmSums: true });
    // The forward's own (biased projections) in both; folded, at least the MLP's three weights per layer.
    expect(folded.gemmSums - added.gemmSums).toBeGreaterThanOrEqual(3 * Number(config.num_hidden_layers));
    expectSame(folded, await run(config, b));
  });

  it('leaves the graph byte for byte as without chunking where every tensor fits under the bound', () => {
    const config = testConfig('qwen2');
    const bytes = (chunking?: Chunking) => {
      const g = new Graph('fits');
      const inputIds = g.input('input_ids', 'int64', ['batch', 'seq']);
      const attentionMask = g.input('attention_mask', 'int64', ['batch', 'seq']);
      const model = buildCausalLM(g, config, declareParameters(g, config, { dtype: 'float32' }), { inputIds, attentionMask }, { attentionPieces: 4, chunking });
      g.output(model.hidden, 'hidden');
      return serializeModel(g);
    };
    expect(Buffer.compare(bytes({ rows: 4, len: 64 }), bytes())).toBe(0);
    expect(Buffer.compare(bytes({ rows: 4, len: 64, bound: 1000 }), bytes())).not.toBe(0);
  });
});
