/**
 * Generation that stays on the GPU (src/models/generate-device.ts) against the CPU path: the same
 * tokens for greedy decoding and for seeded samples, rows stopping early, mixtures (picked on the
 * device) and top-k (host sampling from the device's logits), weights handed over from a training session's GPU buffers, and
 * a Nash-MD run whose policy is sampled without its weights crossing to the host. The copies are
 * counted from the tensors' own locations: per step only the picked ids come back.
 *
 * Sampling draws in float32 on the device and in float64 on the CPU (and the logits differ in their
 * last bits between the two): a draw can differ when its uniform lands within about 1e-6 of a
 * boundary between two tokens, so the seeded comparisons here are expected, not guaranteed, to agree
 * (about 1e-6 per token; the runs below draw a few hundred tokens).
 *
 * Runs under SwiftShader in CI (see test/webgpu.test.ts); without an adapter the tests are skipped
 * (failed with PREFZOO_REQUIRE_WEBGPU=1). The models are tiny.
 */
import { afterAll, describe, expect, it } from 'vitest';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { Decoder, GenerationSession, generateIds, type GenerateOptions, type GenerateRequest } from '../src/models/generate.ts';
import { buildDeviceDecodeGraph, deviceTraffic, joinGraph, mixtureGraph, pickToken, resetDeviceTraffic, selectRowsGraph, uploadGraph } from '../src/models/generate-device.ts';
import { lowerForWebGpu } from '../src/onnx/lower.ts';
import { saveModel } from '../src/onnx/proto.ts';
import { placement } from '../src/runtime/placement.ts';
import { Graph } from '../src/onnx/graph.ts';
import { sampleRandom } from '../src/models/sampling.ts';
import { Session, toOrt, type RuntimeOptions } from '../src/runtime/session.ts';
import { modelParameterShapes } from '../src/models/params.ts';
import { writeTokenizer } from '../src/tokenize/test-tokenizer.ts';
import { presetConfig, type Arch, type ModelConfig } from '../src/models/config.ts';
import { initWeights } from '../src/models/init.ts';
import { resolveLoss } from '../losses/index.ts';
import { buildSpec } from '../src/train/graph.ts';
import { buildArtifacts } from '../src/artifacts/build.ts';
import { TrainingArtifacts } from '../src/artifacts/training.ts';
import { collate } from '../src/models/batch.ts';
import { benchPairs } from '../scripts/bench/step.ts';
import { initModelFolder } from '../src/models/init.ts';
import { runNashMd } from '../src/online/nash-md.ts';
import type { Judge } from '../src/online/judges.ts';
import { randomWeights, testConfig } from './helpers/model-fixtures.ts';
import { webgpuMissing, webgpuRequired } from './helpers/webgpu.ts';
import type { FloatTensor } from '../src/models/checkpoint.ts';

const required = webgpuRequired;
const reason = await webgpuMissing('test/webgpu-generate.test.ts');
const GPU: RuntimeOptions = { ep: 'webgpu' };
const CPU: RuntimeOptions = { ep: 'cpu' };
const root = fs.mkdtempSync(path.join(os.tmpdir(), 'pz-webgpu-gen-'));
afterAll(() => fs.rmSync(root, { recursive: true, force: true }));

/** Prompts of unequal lengths (left padding), each row with its own seeded stream. */
const requests = (seed: number): GenerateRequest[] => [[3, 4, 5], [6, 7], [9, 10, 11, 12], [2]].map((p, i) => ({ promptIds: p, rng: sampleRandom(seed, i, 0) }));

/** One generation of `reqs` on the decoders (a mixture when two), with the device's copies counted. */
async function gen(parts: { decoder: Decoder; weight: number }[], o: GenerateOptions, seed = 11) {
  resetDeviceTraffic();
  const r = await generateIds(parts, requests(seed), o);
  return { ids: r.map((x) => x.ids), stopped: r.map((x) => x.stopped), traffic: deviceTraffic() };
}

const paramBytes = (c: ModelConfig) => [...modelParameterShapes(c, {}).values()].reduce((a, s) => a + 4 * s.reduce((x, y) => x * y, 1), 0);
const tokens = (ids: number[][]) => ids.reduce((a, r) => a + r.length, 0);

describe.skipIf(reason !== null && !required)('generation on the GPU (WebGPU)', () => {
  it('finds an adapter', () => {
    expect(reason).toBeNull();
  });

  it('every node of the device graphs (prefill, step and extend with each head, mixture pick, row gather, batch join, weight upload) runs on WebGPU', async () => {
    const c = testConfig('llama');
    const graphs = {
      ...Object.fromEntries((['greedy', 'sample', 'logits'] as const).flatMap((head) => [false, true].map((past) => [`${past ? 'step' : 'prefill'}-${head}`, buildDeviceDecodeGraph(c, { past, head })]))),
      ...Object.fromEntries((['greedy', 'sample', 'logits'] as const).map((head) => [`extend-${head}`, buildDeviceDecodeGraph(c, { past: true, extend: true, head })])),
      'join-padded': joinGraph(c, 'b'),
      join: joinGraph(c, null),
      mixture: mixtureGraph(2, 'sample'),
      rows: selectRowsGraph(c),
      upload: uploadGraph(modelParameterShapes(c, {})),
    };
    for (const [name, g] of Object.entries(graphs)) {
      const file = path.join(root, `device-${name}.onnx`);
      saveModel(lowerForWebGpu(g), file);
      expect((await placement(file, GPU)).fallbacks, name).toEqual([]);
    }
  });

  it('the graph pick on WebGPU: greedy and the sampled id of a float64 reference, the last id when u·total rounds to the total', async () => {
    const V = 6;
    const logits = Float32Array.from([0.3, 2.0, -1.0, 1.2, 0.5, 9.0, /* row 2 */ 1.0, 1.0, 1.0, 1.0, 1.0, 1.0]);
    const feeds = (uniform: number[]) => ({
      logits: toOrt('float32', logits, [2, V]),
      vocab_limit: toOrt('int64', BigInt64Array.of(5n), [1]),
      temperature: toOrt('float32', Float32Array.of(0.5), []),
      uniform: toOrt('float32', Float32Array.from(uniform), [2, 1]),
    });
    // One session per head, run with every input below.
    const sessions = new Map<'greedy' | 'sample', Session>();
    const session = async (head: 'greedy' | 'sample') => {
      let s = sessions.get(head);
      if (!s) {
        const g = new Graph('pick');
        pickToken(g, g.input('logits', 'float32', ['batch', V]), head);
        sessions.set(head, (s = await Session.fromGraph(g, GPU)));
      }
      return s;
    };
    const run = async (head: 'greedy' | 'sample', u: number[]) => {
      const s = await session(head);
      const f: Record<string, ReturnType<typeof toOrt>> = feeds(u);
      if (head === 'greedy') for (const k of ['temperature', 'uniform']) delete f[k];
      return Array.from((await s.run(f)).token.data as BigInt64Array, Number);
    };
    // Below the limit (5): the 9.0 at id 5 is out of reach; row 2 is a tie (the first id wins).
    expect(await run('greedy', [0, 0])).toEqual([1, 0]);
    // float64 reference: the first id whose running sum of e^((l − max)/T) exceeds u times the total.
    const ref = (row: number, u: number) => {
      const l = Array.from(logits.subarray(row * V, row * V + 5));
      const m = Math.max(...l);
      const w = l.map((x) => Math.exp((x - m) / 0.5));
      const total = w.reduce((a, b) => a + b, 0);
      let run = 0;
      for (let i = 0; i < w.length; i++) if ((run += w[i]) > u * total) return i;
      return w.length - 1;
    };
    for (const [u0, u1] of [[0, 0.1], [0.3, 0.5], [0.7, 0.9], [0.95, 0.99]]) expect(await run('sample', [u0, u1]), `${u0} ${u1}`).toEqual([ref(0, u0), ref(1, u1)]);
    // u rounds to 1 in float32: no running sum passes u·total; the last id below the limit, not id 0.
    expect(await run('sample', [0.99999999, 0.99999999])).toEqual([4, 4]);
    for (const s of sessions.values()) await s.release();
  });

  for (const arch of ['llama', 'gpt2'] as Arch[]) {
    it(`${arch}: greedy and seeded samples pick the CPU's tokens, with the cache on the device and only the ids coming back`, async () => {
      const c = testConfig(arch);
      const w = randomWeights(c, 5);
      // Fed weights (as the online loops sample); test/webgpu.test.ts decodes with baked ones.
      const [gpu, cpu] = [await Decoder.create(c, w, { runtime: GPU }), await Decoder.create(c, w, { runtime: CPU })];
      for (const [temperature, first] of [[0, true], [0.7, false]] as const) {
        // Stop on a token that some rows draw, so rows leave the batch (their cache rows are gathered on the device).
        const o = { maxNewTokens: 7, stopIds: [] as number[], padId: 0, temperature };
        o.stopIds = [(await gen([{ decoder: cpu, weight: 1 }], o)).ids[1][2]];
        const want = await gen([{ decoder: cpu, weight: 1 }], o);
        const got = await gen([{ decoder: gpu, weight: 1 }], o);
        expect(got.ids, `${arch} t=${temperature} stop ${o.stopIds[0]}`).toEqual(want.ids);
        expect(got.stopped).toEqual(want.stopped);
        expect(got.stopped.some(Boolean) && got.stopped.some((x) => !x)).toBe(true);
        const t = got.traffic;
        // One run per token of the longest row (the prefill picks the first).
        expect(t.steps).toBe(Math.max(...got.ids.map((x) => x.length)));
        // Back to the host: each picked token once, as int64; no logits, no cache.
        expect(t.downloads).toBe(t.steps);
        expect(t.downloadBytes).toBe(8 * tokens(got.ids));
        // To the device: the weights once (the first generation after setWeights), then small feeds only.
        expect(t.weightUploadBytes).toBe(first ? paramBytes(c) : 0);
        expect(t.uploadBytes - t.weightUploadBytes).toBeLessThan(4 * 16 * (t.runs + 4 * 16));
      }
      await gpu.release();
      await cpu.release();
    });
  }

  it("a mixture of two models (Nash-MD's) is picked on the device, top-k on the host from the device's logits, as the CPU does", async () => {
    const c = testConfig('llama');
    const [w, wr] = [randomWeights(c, 3), randomWeights(c, 9)];
    const parts = async (runtime: RuntimeOptions) => [
      { decoder: await Decoder.create(c, w, { runtime }), weight: 0.6 },
      { decoder: await Decoder.create(c, wr, { runtime, bake: true }), weight: 0.4 },
    ];
    const [gpu, cpu] = [await parts(GPU), await parts(CPU)];
    const o = { maxNewTokens: 6, stopIds: [], padId: 0, temperature: 1 };
    const mix = await gen(gpu, o);
    expect(mix.ids).toEqual((await gen(cpu, o)).ids);
    // The parts' logits stay on the device; a pick graph over their weighted sum returns the ids.
    expect(mix.traffic.downloadBytes).toBe(8 * tokens(mix.ids));
    const greedy = { ...o, temperature: 0 };
    expect((await gen(gpu, greedy)).ids).toEqual((await gen(cpu, greedy)).ids);
    const k = { ...o, temperature: 0.8, topK: 5 };
    expect((await gen(gpu.slice(0, 1).map((p) => ({ ...p, weight: 1 })), k)).ids).toEqual((await gen(cpu.slice(0, 1).map((p) => ({ ...p, weight: 1 })), k)).ids);
    for (const p of [...gpu, ...cpu]) await p.decoder.release();
  });

  it("a generation session on the device: rows paused, extended, forked and joining a running batch draw the CPU's tokens", async () => {
    const c = testConfig('llama');
    const w = randomWeights(c, 8);
    const run = async (runtime: RuntimeOptions, temperature: number) => {
      const dec = await Decoder.create(c, w, { runtime });
      const s = GenerationSession.open(dec, { temperature, maxBatch: 2, stopIds: [] });
      const a = s.start([3, 4, 5, 6], sampleRandom(3, 0, 0));
      const b = s.start([9, 2], sampleRandom(3, 1, 0));
      const late = s.start([17, 1, 8], sampleRandom(3, 2, 0));
      const long = a.generate({ maxNewTokens: 12 });
      const first = await b.generate({ maxNewTokens: 3 });
      // b is paused: `late` takes its slot (prefilled, then joined to a's longer cache).
      const l = await late.generate({ maxNewTokens: 4 });
      b.extend([20, 21, 22]);
      const fork = b.fork(sampleRandom(3, 3, 0), 5);
      const out = [first, l, await b.generate({ maxNewTokens: 5 }), await fork.generate(), await long].map((x) => x.ids);
      await s.close();
      await dec.release();
      return out;
    };
    // Greedy: SwiftShader's logits differ from the CPU's by ~1e-3 here, enough to move a sampled
    // draw across a boundary now and then over these ~30 draws; the sampling heads are compared above.
    expect(await run(GPU, 0)).toEqual(await run(CPU, 0));
  });

  it("a training session's parameters (GPU buffers) feed the decoder as they are: no weight copies, the CPU's tokens", async () => {
    const dir = path.join(root, 'handoff');
    const tok = writeTokenizer(path.join(dir, 'tokenizer'));
    const config = presetConfig('llama', 'tiny', { vocabSize: tok.vocabSize, bosTokenId: tok.bosId, eosTokenId: tok.eosId, padTokenId: tok.padId });
    const problem = { config, kind: 'pairwise' as const, loss: resolveLoss('dpo'), lora: null, valueHead: false, dataKeys: new Set<string>(), packed: true };
    const spec = buildSpec(problem, initWeights(config, 0), { type: 'adamw', betas: [0.9, 0.999], eps: 1e-8, weightDecay: 0, maxGradNorm: 1 });
    buildArtifacts(spec, path.join(dir, 'art'), { target: 'webgpu' });
    const art = await TrainingArtifacts.load(path.join(dir, 'art'), GPU, { checkpoint: false, update: 'graph' });
    const rows = benchPairs(config.vocab_size, 2, 12, 7);
    const opts = { kind: 'pairwise' as const, padTo: 8, padId: tok.padId, dtype: 'float32' as const, packed: true };
    const ref = (await art.evaluate(collate(rows, opts).feeds)).logp.data as Float32Array;
    const batch = collate(rows, { ...opts, refLogps: (_, i) => [ref[i] - 0.05 * (i + 1), ref[rows.length + i]] });
    for (let i = 0; i < 2; i++) await art.trainStep(batch.feeds, { lr: 1e-2 });
    expect(art.store.onDevice('model.embed_tokens.weight')).toBe(true);

    const shapes = modelParameterShapes(config, {});
    const decoder = await Decoder.create(config, new Map([...shapes].map(([n, s]) => [n, { shape: s, data: new Float32Array(s.reduce((a, b) => a * b, 1)) }])), { runtime: GPU });
    decoder.setWeightTensors((name) => art.store.tensor(name));
    const g = { maxNewTokens: 6, stopIds: [], padId: tok.padId, temperature: 1 };
    resetDeviceTraffic();
    const onGpu = await generateIds([{ decoder, weight: 1 }], requests(4), g);
    expect(deviceTraffic().weightUploadBytes).toBe(0);
    expect(art.store.onDevice('model.embed_tokens.weight')).toBe(true);

    await art.toHost();
    const trained = new Map([...shapes].map(([n, s]) => [n, { shape: s, data: art.param(n) as Float32Array }]));
    const cpu = await Decoder.create(config, trained, { runtime: CPU });
    const onCpu = await generateIds([{ decoder: cpu, weight: 1 }], requests(4), g);
    expect(onGpu.map((r) => r.ids)).toEqual(onCpu.map((r) => r.ids));
    // The steps changed the model: its samples differ from the initial weights'.
    const init = await Decoder.create(config, initWeights(config, 0), { runtime: CPU });
    expect((await generateIds([{ decoder: init, weight: 1 }], requests(4), g)).map((r) => r.ids)).not.toEqual(onCpu.map((r) => r.ids));
    for (const d of [decoder, cpu, init]) await d.release();
    await art.release();
  });

  it('nash-md --device webgpu samples its policy from the GPU parameters (no weight copies) and draws what the CPU run draws', async () => {
    const model = path.join(root, 'nash-model');
    initModelFolder(model, 'llama', 'tiny', 2);
    const seen: Record<string, string[]> = { webgpu: [], cpu: [] };
    const run = async (device: string) => {
      const judge: Judge = {
        name: 'shorter',
        async compare(items) {
          for (const c of items) seen[device].push(`${String(c.a)} | ${String(c.b)}`);
          return items.map((c) => (String(c.a).length < String(c.b).length ? 1 : String(c.a).length > String(c.b).length ? 0 : 0.5));
        },
        async release() {},
      };
      resetDeviceTraffic();
      const out = path.join(root, `nash-${device}`);
      await runNashMd({ model, prompts: ['1+2=', '3+4=', '5+6=', '7+8='], judge, out, maxNewTokens: 3, params: ['max_steps=2', 'batch_size=4', 'learning_rate=1e-2', 'warmup_steps=0', 'logging_steps=1', 'pad_to_multiple_of=8', `device=${device}`] });
      return fs.readFileSync(path.join(out, 'metrics.jsonl'), 'utf8').trim().split('\n').map((l) => JSON.parse(l) as { loss: number });
    };
    const gpu = await run('webgpu');
    const traffic = deviceTraffic();
    const cpu = await run('cpu');
    expect(traffic.steps).toBeGreaterThan(0);
    expect(traffic.weightUploadBytes).toBe(0);
    expect(seen.webgpu).toHaveLength(8);
    expect(seen.webgpu).toEqual(seen.cpu);
    for (let i = 0; i < 2; i++) expect(Math.abs(gpu[i].loss - cpu[i].loss)).toBeLessThan(1e-3);
  });
});
