/**
 * Activation recomputation (src/autodiff/recompute.ts): the rewritten training graph gives the same
 * gradients as the plain one, bit for bit in float64, and its backward no longer reads the layers'
 * inner activations from the forward.
 */
import { describe, expect, it } from 'vitest';
import { gradients } from '../src/autodiff/index.ts';
import { recomputeSegments } from '../src/autodiff/recompute.ts';
import { buildCausalLM, declareParameters } from '../src/models/index.ts';
import { sequenceLogps } from '../src/models/logps.ts';
import { Graph } from '../src/onnx/graph.ts';
import { serializeModel } from '../src/onnx/proto.ts';
import { Session, toOrt, type Feeds } from '../src/runtime/session.ts';
import { modelSegment } from '../src/train/graph.ts';
import { Normal } from '../src/random.ts';
import { pad, randomIds, randomWeights, testConfig } from './helpers/model-fixtures.ts';

async function gradsOf(arch: 'llama' | 'qwen3' | 'phi3' | 'gpt2', recompute: boolean, headChunks = 1) {
  const c = testConfig(arch);
  const w = randomWeights(c, 5);
  const rng = new Normal(2);
  const rows = [7, 4, 6].map((n) => ({ ids: randomIds(n, c.vocab_size, rng), loss: Array.from({ length: n }, (_, t) => (t >= 2 ? 1 : 0)) }));
  const batch = pad(rows, 7, ['left', 'right', 'left']);
  const g = new Graph('recompute');
  const inputIds = g.input('input_ids', 'int64', ['batch', 'seq']);
  const attentionMask = g.input('attention_mask', 'int64', ['batch', 'seq']);
  const lossMask = g.input('loss_mask', 'float64', ['batch', 'seq']);
  const params = declareParameters(g, c, { dtype: 'float64' });
  const model = buildCausalLM(g, c, params, { inputIds, attentionMask });
  const { logp } = sequenceLogps(g, model, lossMask, { headChunks });
  const loss = g.output(g.reduceSum(g.mul(logp, g.constant([0.5, -1.1, 0.8], 'float64', [3])), undefined, false), 'loss');
  const names = [...params.keys()];
  const first = g.nodes.length;
  const grads = gradients(g, loss, names.map((n) => params.get(n)!), { eagerSums: recompute });
  grads.forEach((d, i) => g.output(d!, `grad:${names[i]}`));
  let stats = { segments: 0, nodes: 0 };
  if (recompute) stats = recomputeSegments(g, first, modelSegment);
  // Which forward tensors of the layers the backward still reads.
  const fwdLayerTensors = new Set(g.nodes.slice(0, first).filter((n) => modelSegment(n) !== null).flatMap((n) => n.outputs));
  const readFromForward = new Set(g.nodes.slice(first).filter((n) => !n.name.startsWith('recompute/')).flatMap((n) => n.inputs.filter((i) => fwdLayerTensors.has(i))));
  const s = await Session.create(serializeModel(g));
  const B = rows.length;
  const feeds: Feeds = {
    input_ids: toOrt('int64', BigInt64Array.from(batch.ids.flat().map(BigInt)), [B, 7]),
    attention_mask: toOrt('int64', BigInt64Array.from(batch.attention.flat().map(BigInt)), [B, 7]),
    loss_mask: toOrt('float64', Float64Array.from(batch.loss.flat()), [B, 7]),
  };
  for (const n of names) feeds[n] = toOrt('float64', Float64Array.from(w.get(n)!.data), params.get(n)!.staticShape!);
  const out = await s.run(feeds);
  await s.release();
  return { out, names, stats, readFromForward, layers: c.model_type === 'gpt2' ? c.n_layer : c.num_hidden_layers };
}

describe.each(['llama', 'qwen3', 'phi3', 'gpt2'] as const)('%s: gradient checkpointing', (arch) => {
  it('gives the same loss and gradients bit for bit (float64), reading only layer boundaries from the forward', async () => {
    const plain = await gradsOf(arch, false);
    const rc = await gradsOf(arch, true);
    expect(rc.stats.segments).toBe(rc.layers);
    expect(rc.stats.nodes).toBeGreaterThan(10 * rc.layers);
    expect(plain.readFromForward.size).toBeGreaterThan(10 * rc.layers);
    // What the rewritten backward still reads from the layers' forward: their outputs (the checkpoints), one per layer at most.
    expect(rc.readFromForward.size).toBeLessThanOrEqual(rc.layers);
    expect(rc.out.loss.data[0]).toBe(plain.out.loss.data[0]);
    let nonzero = 0;
    for (const n of plain.names) {
      const a = plain.out[`grad:${n}`].data as Float64Array;
      const b = rc.out[`grad:${n}`].data as Float64Array;
      expect(b.length).toBe(a.length);
      for (let i = 0; i < a.length; i++) if (a[i] !== b[i]) throw new Error(`${n}[${i}]: ${b[i]} recomputed vs ${a[i]}`);
      if (a.some((x) => x !== 0)) nonzero++;
    }
    expect(nonzero).toBe(plain.names.length);
  });
});

describe.each(['llama', 'gpt2'] as const)('%s: the output head in recomputed slices', (arch) => {
  it('gives the same gradients (to rounding: the weight gradient is summed slice by slice)', async () => {
    const plain = await gradsOf(arch, false);
    const rc = await gradsOf(arch, true, 3);
    expect(rc.stats.segments).toBe(rc.layers + 3);
    expect(rc.readFromForward.size).toBeLessThanOrEqual(rc.layers);
    let worst = 0;
    for (const n of plain.names) {
      const a = plain.out[`grad:${n}`].data as Float64Array;
      const b = rc.out[`grad:${n}`].data as Float64Array;
      for (let i = 0; i < a.length; i++) worst = Math.max(worst, Math.abs(a[i] - b[i]) / Math.max(1e-3, Math.abs(a[i])));
    }
    expect(worst).toBeLessThan(1e-12);
    expect(Math.abs((rc.out.loss.data[0] as number) - (plain.out.loss.data[0] as number))).toBeLessThan(1e-12);
  });
});
