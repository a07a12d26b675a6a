/**
 * The output head in slices over the scored rows (src/models/logps.ts): the scoring graph the
 * reference cache and `prefzoo eval` run (`buildLogpsGraph`) slices it by default, so a long batch's
 * `[rows, V]` logits are never alive at once. Sliced and unsliced give the same log-probs and
 * gradients to float32 rounding, and both match a float64 forward written independently on the host.
 */
import { describe, expect, it } from 'vitest';
import { buildLogpsGraph, headChunksOf, sequenceLogps } from '../src/models/logps.ts';
import { buildCausalLM, declareParameters } from '../src/models/index.ts';
import { gradients } from '../src/autodiff/index.ts';
import { Graph } from '../src/onnx/graph.ts';
import { serializeModel } from '../src/onnx/proto.ts';
import { Session, toOrt, type Feeds } from '../src/runtime/session.ts';
import { Normal } from '../src/random.ts';
import type { ModelConfig } from '../src/models/config.ts';
import type { FloatTensor } from '../src/models/checkpoint.ts';
import { feedsOf, pad, randomIds, randomWeights, testConfig, worst } from './helpers/model-fixtures.ts';
import { referenceLogps } from './helpers/reference-forward.ts';

// A vocabulary of three slices' worth (headChunksOf: 8,192 entries a slice).
const config = testConfig('qwen2', { extra: { vocab_size: 2 * 8192 + 700 } });
const weights = randomWeights(config, 3);
const rng = new Normal(4);
const rows = [9, 5, 8].map((n) => ({ ids: randomIds(n, config.vocab_size, rng), loss: Array.from({ length: n }, (_, t) => (t >= 3 ? 1 : 0)) }));
const batch = pad(rows, 9, ['left', 'right', 'left']);

/** The scoring graph with `headChunks` (undefined: its default): outputs, and how many head slices it holds. */
async function score(c: ModelConfig, headChunks?: number) {
  const g = buildLogpsGraph(c, { perToken: true, headChunks });
  const slices = new Set(g.nodes.map((n) => /^logps\/head\.(\d+)\//.exec(n.name)?.[1]).filter((k) => k !== undefined)).size;
  const s = await Session.create(serializeModel(g));
  const params = g.inputs.map((i) => i.name).filter((n) => !['input_ids', 'attention_mask', 'loss_mask'].includes(n));
  const out = await s.run(feedsOf(g, batch, weights, params));
  await s.release();
  return { logp: Float64Array.from(out.logp.data as Float32Array), tokenLogps: Float64Array.from(out.token_logps.data as Float32Array), slices };
}

describe('the output head in slices over the scored rows', () => {
  it('is how the scoring graph runs by default: same log-probs as all rows at once, and as a float64 host forward', async () => {
    expect(headChunksOf(config)).toBe(3);
    expect(headChunksOf(testConfig('qwen2', { extra: { vocab_size: 151936 } }))).toBe(19);
    const sliced = await score(config);
    const whole = await score(config, 1);
    expect(sliced.slices).toBe(3);
    expect(whole.slices).toBe(0);
    expect(worst(sliced.logp, whole.logp)).toBeLessThan(1e-5);
    expect(worst(sliced.tokenLogps, whole.tokenLogps)).toBeLessThan(1e-5);
    // The float64 reference: each row alone, unpadded (test/helpers/reference-forward.ts).
    const ref = rows.map((r) => referenceLogps(config, weights, r.ids, r.loss).logp);
    expect(worst(sliced.logp, ref)).toBeLessThan(1e-4);
    // Far from trivial: the rows' log-probs differ and are not near zero.
    expect(Math.min(...ref.map(Math.abs))).toBeGreaterThan(1);
  });

  it('gives the same gradients as all rows at once, to float32 rounding', async () => {
    const run = async (headChunks: number) => {
      const g = new Graph('chunked-grads');
      const inputIds = g.input('input_ids', 'int64', ['batch', 'seq']);
      const attentionMask = g.input('attention_mask', 'int64', ['batch', 'seq']);
      const lossMask = g.input('loss_mask', 'float32', ['batch', 'seq']);
      const params = declareParameters(g, config, { dtype: 'float32' });
      const model = buildCausalLM(g, config, params, { inputIds, attentionMask });
      const { logp } = sequenceLogps(g, model, lossMask, { headChunks });
      const loss = g.output(g.reduceSum(g.mul(logp, g.constant([0.5, -1.1, 0.8], 'float32', [3])), undefined, false), 'loss');
      const names = [...params.keys()];
      gradients(g, loss, names.map((n) => params.get(n)!)).forEach((d, i) => g.output(d!, `grad:${names[i]}`));
      const s = await Session.create(serializeModel(g));
      const out = await s.run(feedsOf(g, batch, weights, names));
      await s.release();
      return { out, names };
    };
    const whole = await run(1);
    const sliced = await run(3);
    expect(worst(sliced.out.loss.data as Float32Array, whole.out.loss.data as Float32Array)).toBeLessThan(1e-5);
    let compared = 0;
    for (const n of whole.names) {
      const a = whole.out[`grad:${n}`].data as Float32Array;
      const b = sliced.out[`grad:${n}`].data as Float32Array;
      expect(b.length).toBe(a.length);
      if (!a.some((x) => x !== 0)) continue;
      expect(worst(b, a), n).toBeLessThan(1e-4);
      compared++;
    }
    expect(compared).toBe(whole.names.length);
  });
});
