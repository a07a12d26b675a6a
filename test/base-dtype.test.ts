/**
 * LoRA with float16 base weights (TrainConfig.base_dtype): the graph widens each frozen weight where
 * it is used; log-probs equal the float64 reference forward on the float16-rounded weights, the
 * adapters' gradients are the same with the widening recomputed in the backward, and the backward
 * keeps no widened copy.
 */
import { describe, expect, it } from 'vitest';
import { gradients } from '../src/autodiff/index.ts';
import { recomputeSegments } from '../src/autodiff/recompute.ts';
import { f16BitsToFloat, float32ToF16 } from '../src/models/safetensors.ts';
import { buildCausalLM, initLora, modelParameterShapes } from '../src/models/index.ts';
import { sequenceLogps } from '../src/models/logps.ts';
import { Normal } from '../src/random.ts';
import { Graph, type Tensor } from '../src/onnx/graph.ts';
import { serializeModel } from '../src/onnx/proto.ts';
import { Session, toOrt, type Feeds } from '../src/runtime/session.ts';
import { resolveConfig } from '../src/train/config.ts';
import { widenSegment } from '../src/train/graph.ts';
import { referenceLogps } from './helpers/reference-forward.ts';
import { pad, randomIds, randomWeights, testConfig } from './helpers/model-fixtures.ts';

describe.each(['qwen2', 'phi3'] as const)('%s with float16 base weights and LoRA', (arch) => {
  const c = testConfig(arch);
  const targets = arch === 'phi3' ? ['qkv_proj', 'down_proj'] : ['q_proj', 'v_proj', 'up_proj'];
  const lora = { rank: 2, alpha: 4, targets };
  const w = randomWeights(c, 7);
  const rng = new Normal(3);
  for (const [k, v] of initLora(c, lora, 1)) w.set(k, { shape: v.shape, data: k.includes('lora_B') ? rng.fill(v.data.length, 0.2) : v.data });
  const isAdapter = (n: string) => n.includes('.lora_');
  const rows = [6, 4, 7].map((n) => ({ ids: randomIds(n, c.vocab_size, rng), loss: Array.from({ length: n }, (_, t) => (t >= 1 ? 1 : 0)) }));
  const batch = pad(rows, 7, ['left', 'right', 'left']);

  async function run(recompute: boolean) {
    const g = new Graph('half');
    const inputIds = g.input('input_ids', 'int64', ['batch', 'seq']);
    const attentionMask = g.input('attention_mask', 'int64', ['batch', 'seq']);
    const lossMask = g.input('loss_mask', 'float32', ['batch', 'seq']);
    const params = new Map<string, Tensor>();
    for (const [n, shape] of modelParameterShapes(c, { lora })) params.set(n, g.input(n, isAdapter(n) ? 'float32' : 'float16', shape));
    const model = buildCausalLM(g, c, params, { inputIds, attentionMask }, { lora });
    const { logp } = sequenceLogps(g, model, lossMask);
    g.output(logp, 'logp');
    const loss = g.output(g.reduceSum(g.mul(logp, g.constant([0.3, -0.7, 1.1], 'float32', [3])), undefined, false), 'loss');
    const adapters = [...params.keys()].filter(isAdapter);
    const first = g.nodes.length;
    gradients(g, loss, adapters.map((n) => params.get(n)!)).forEach((d, i) => g.output(d!, `grad:${adapters[i]}`));
    const widened = new Set(g.nodes.slice(0, first).filter((n) => widenSegment(n) !== null).flatMap((n) => n.outputs));
    if (recompute) recomputeSegments(g, first, widenSegment);
    const keptWidened = g.nodes.slice(first).filter((n) => !n.name.startsWith('recompute/')).some((n) => n.inputs.some((i) => widened.has(i)));
    const s = await Session.create(serializeModel(g));
    const B = rows.length;
    const feeds: Feeds = {
      input_ids: toOrt('int64', BigInt64Array.from(batch.ids.flat().map(BigInt)), [B, 7]),
      attention_mask: toOrt('int64', BigInt64Array.from(batch.attention.flat().map(BigInt)), [B, 7]),
      loss_mask: toOrt('float32', Float32Array.from(batch.loss.flat()), [B, 7]),
    };
    for (const [n, t] of params) feeds[n] = isAdapter(n) ? toOrt('float32', w.get(n)!.data, t.staticShape!) : toOrt('float16', float32ToF16(w.get(n)!.data), t.staticShape!);
    const out = await s.run(feeds);
    await s.release();
    return { out, adapters, keptWidened, widenedCount: widened.size };
  }

  it('scores like the float64 forward of the rounded weights; recomputed widening: same gradients, no copy kept', async () => {
    const plain = await run(false);
    const rc = await run(true);
    expect(plain.widenedCount).toBeGreaterThan(2 * 3); // 2 layers, several weights each
    expect(plain.keptWidened).toBe(true);
    expect(rc.keptWidened).toBe(false);
    const rounded = new Map([...w].map(([k, t]) => [k, isAdapter(k) ? t : { shape: t.shape, data: Float32Array.from(float32ToF16(t.data), f16BitsToFloat) }]));
    let moved = 0;
    rows.forEach((r, b) => {
      const ref = referenceLogps(c, rounded, r.ids, r.loss, { rank: lora.rank, alpha: lora.alpha, modules: [...new Set(plain.adapters.map((n) => n.replace(/\.lora_[AB]\.weight$/, '')))] });
      const got = plain.out.logp.data[b] as number;
      expect(Math.abs(got - ref.logp)).toBeLessThan(1e-5 * Math.abs(ref.logp));
      // The rounding matters: the unrounded weights score measurably differently.
      moved = Math.max(moved, Math.abs(referenceLogps(c, w, r.ids, r.loss, { rank: lora.rank, alpha: lora.alpha, modules: [...new Set(plain.adapters.map((n) => n.replace(/\.lora_[AB]\.weight$/, '')))] }).logp - ref.logp));
    });
    expect(moved).toBeGreaterThan(1e-4);
    for (const n of plain.adapters) expect(Array.from(rc.out[`grad:${n}`].data as Float32Array)).toEqual(Array.from(plain.out[`grad:${n}`].data as Float32Array));
  });
});

it('base_dtype=float16 needs LoRA', () => {
  expect(() => resolveConfig({ params: ['base_dtype=float16'] })).toThrow(/base_dtype=float16 needs LoRA \(lora_r > 0\)/);
  expect(resolveConfig({ params: ['base_dtype=float16', 'lora_r=8'] }).config.base_dtype).toBe('float16');
});
