/**
 * Activation recomputation (src/autodiff/recompute.ts): the rewritten training graph gives the same
 * gradients as the plain one, bit for bit in float64, and its backward no longer reads the layers'
 * inner activations from the forward.
 */
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { describe, expect, it } from 'vitest';
import { buildArtifacts } from '../src/artifacts/build.ts';
import { TrainingArtifacts } from '../src/artifacts/training.ts';
import { parseConfig } from '../src/models/config.ts';
import { initWeights } from '../src/models/init.ts';
import { collate } from '../src/models/batch.ts';
import { loadModel } from '../src/onnx/proto.ts';
import { buildSpec } from '../src/train/graph.ts';
import { resolveLoss } from '../losses/index.ts';
import { benchPairs } from '../scripts/bench/step.ts';
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

async function gradsOf(arch: 'llama' | 'qwen3' | 'phi3' | 'gpt2', recompute: boolean, headChunks = 1, attentionPieces?: number) {
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
  const model = buildCausalLM(g, c, params, { inputIds, attentionMask }, { attentionPieces });
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

/** Loss and every gradient agree to float64 rounding (relative, floored at 1e-3). */
function expectSameLossAndGradients(plain: Awaited<ReturnType<typeof gradsOf>>, other: Awaited<ReturnType<typeof gradsOf>>): void {
  let worst = 0;
  for (const n of plain.names) {
    const a = plain.out[`grad:${n}`].data as Float64Array;
    const b = other.out[`grad:${n}`].data as Float64Array;
    for (let i = 0; i < a.length; i++) worst = Math.max(worst, Math.abs(a[i] - b[i]) / Math.max(1e-3, Math.abs(a[i])));
  }
  expect(worst).toBeLessThan(1e-12);
  expect(Math.abs((other.out.loss.data[0] as number) - (plain.out.loss.data[0] as number))).toBeLessThan(1e-12);
}

describe.each(['llama', 'gpt2'] as const)('%s: the output head in recomputed slices', (arch) => {
  it('gives the same gradients (to rounding: the weight gradient is summed slice by slice)', async () => {
    const plain = await gradsOf(arch, false);
    const rc = await gradsOf(arch, true, 3);
    expect(rc.stats.segments).toBe(rc.layers + 3);
    expect(rc.readFromForward.size).toBeLessThanOrEqual(rc.layers);
    expectSameLossAndGradients(plain, rc);
  });
});

describe.each(['llama', 'qwen3', 'gpt2'] as const)('%s: attention in pieces over the key/value heads', (arch) => {
  it('gives the same loss and gradients (float64)', async () => {
    const plain = await gradsOf(arch, false);
    const pieces = await gradsOf(arch, true, 1, 2);
    expectSameLossAndGradients(plain, pieces);
  });
});

/**
 * What ONNX Runtime keeps alive, from its own profile (mem_bytes_in_use after each node). Its node
 * order is a depth-first walk from the outputs, which left every weight gradient and every slice's
 * statistics for the very end: each head slice's `[V, D]` weight gradient and `[rows, V]` logits
 * were then alive at once. With the slices chained, at most a few `[V, D]` tensors are.
 */
describe('recomputation under ONNX Runtime\'s schedule', () => {
  it('keeps one output-head slice at a time, and its graphs hold no dead nodes', async () => {
    const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'pz-rc-sched-'));
    try {
      // A vocabulary of 6 head slices, its [V, D] head 6 MB: what the head holds dominates the step.
      const config = parseConfig({ model_type: 'llama', vocab_size: 6 * 8192, hidden_size: 32, intermediate_size: 48, num_hidden_layers: 2, num_attention_heads: 4, num_key_value_heads: 2, max_position_embeddings: 64, tie_word_embeddings: true });
      const headBytes = config.vocab_size * 32 * 4;
      const weights = initWeights(config, 0);
      const spec = buildSpec({ config, kind: 'pairwise', loss: resolveLoss('dpo'), lora: null, valueHead: false, dataKeys: new Set(), packed: true, recompute: true, baseDtype: 'float32' }, weights, { type: 'adamw', betas: [0.9, 0.999], eps: 1e-8, weightDecay: 0, maxGradNorm: 1 });
      const initial = new Map(spec.params.map((p) => [p.name, p.data!]));
      spec.params = spec.params.map((p) => ({ ...p, data: undefined }));
      buildArtifacts(spec, path.join(dir, 'a'));
      for (const f of ['training_model.onnx', 'eval_model.onnx', 'train_step_model.onnx']) {
        const { graph } = loadModel(path.join(dir, 'a', f));
        const read = new Set([...graph.nodes.flatMap((n) => n.inputs), ...graph.outputs.map((o) => o.name)]);
        const dead = graph.nodes.filter((n) => !n.outputs.some((o) => o && read.has(o)));
        expect(dead.map((n) => `${f}: ${n.op} ${n.name}`)).toEqual([]);
      }
      const art = await TrainingArtifacts.load(path.join(dir, 'a'), { profilePrefix: path.join(dir, 'prof') }, { checkpoint: false, update: 'host' });
      for (const [name, data] of initial) art.setParam(name, data);
      const rows = benchPairs(config.vocab_size, 2, 32);
      const batch = collate(rows, { kind: 'pairwise', padTo: 8, padId: 0, dtype: 'float32', packed: true, refLogps: () => [-1, -1] });
      const m = await art.trainStep(batch.feeds, { lr: 1e-3 });
      expect(Number.isFinite(m.loss)).toBe(true);
      await art.release(); // writes the profiles
      const profiles = fs.readdirSync(dir).filter((f) => f.startsWith('prof') && f.endsWith('.json'));
      expect(profiles.length).toBeGreaterThan(0);
      let peak = 0;
      let nodes = 0;
      for (const f of profiles) {
        for (const e of JSON.parse(fs.readFileSync(path.join(dir, f), 'utf8')) as { cat?: string; args?: Record<string, string> }[]) {
          if (e.cat !== 'Node' || !e.args?.mem_bytes_in_use) continue;
          nodes++;
          peak = Math.max(peak, Number(e.args.mem_bytes_in_use));
        }
      }
      expect(nodes).toBeGreaterThan(100);
      // The head's gradient output and running sum, one slice's new term, the embedding's scatter and
      // the copy out: about 5 heads' worth (22 before the slices were chained).
      expect(peak / headBytes).toBeLessThan(7);
    } finally {
      fs.rmSync(dir, { recursive: true, force: true });
    }
  });
});
