/**
 * Whole baked step graphs of `small` side by side in one process, alternating: variants of
 * buildDecodeGraph's options (JSON, name → options) at batch B, row b over P − b filled slots of a
 * cache aligned as SlotCache aligns it, sampled head. Prints whether each variant draws the first's
 * tokens, the largest log-probability and new-value differences, and the median wall and process CPU
 * ms a run (with 1 thread the CPU figure is the steady one on a shared machine).
 *
 *   node --import tsx scripts/bench/decode-step-ab.ts [B=16] [P=330] [threads=2] [reps=8] ['{"base":{},"rows":{"rowProducts":true}}']
 */
import os from 'node:os';
import { presetArch, presetConfig } from '../../src/models/config.ts';
import { initWeights } from '../../src/models/init.ts';
import { buildDecodeGraph, cacheShape, type DecodeGraphOptions } from '../../src/models/decode.ts';
import { type Feeds, Session, toOrt } from '../../src/runtime/session.ts';
const B = Number(process.argv[2] ?? 16), P = Number(process.argv[3] ?? 330), threads = Number(process.argv[4] ?? 2), reps = Number(process.argv[5] ?? 8);
const variants: Record<string, Partial<DecodeGraphOptions>> = JSON.parse(process.argv[6] ?? '{"base":{},"rows":{"rowProducts":true}}');
const config = presetConfig(presetArch('small') ?? 'llama', 'small', {});
const weights = initWeights(config, 0);
const { layers, kvHeads: KV, headDim: hd } = cacheShape(config);
const cap = Math.ceil((P + 1) / 32) * 32;
const feeds: Feeds = {};
feeds.input_ids = toOrt('int64', BigInt64Array.from({ length: B }, (_, i) => BigInt(100 + i)), [B, 1]);
const m = new BigInt64Array(B * (cap + 1));
for (let b = 0; b < B; b++) { for (let t = 0; t < P - b; t++) m[b * (cap + 1) + t] = 1n; m[b * (cap + 1) + cap] = 1n; }
feeds.attention_mask = toOrt('int64', m, [B, cap + 1]);
for (let i = 0; i < layers; i++) for (const kv of ['key', 'value']) feeds[`past.${i}.${kv}`] = toOrt('float32', Float32Array.from({ length: B * KV * cap * hd }, () => Math.random() - 0.5), [B, KV, cap, hd]);
feeds.vocab_limit = toOrt('int64', BigInt64Array.of(32000n), [1]);
feeds.uniform = toOrt('float64', Float64Array.from({ length: B }, (_, i) => (i + 0.5) / B), [B, 1]);
const names = Object.keys(variants);
const sessions: Session[] = [];
for (const n of names) sessions.push(await Session.fromGraph(buildDecodeGraph(config, { past: true, weights, head: 'sample-t1', fused: true, ...variants[n] }), { threads }));
const outs: Record<string, { data: unknown }>[] = [];
for (const s of sessions) { await s.run(feeds); outs.push(await s.run(feeds)); }
for (let j = 1; j < names.length; j++) {
  if (!outs[j].logprob) continue;
  const same = (outs[0].token.data as BigInt64Array).every((x, i) => x === (outs[j].token.data as BigInt64Array)[i]);
  let d = 0; const a = outs[0].logprob.data as Float64Array, b = outs[j].logprob.data as Float64Array; for (let i = 0; i < a.length; i++) d = Math.max(d, Math.abs(a[i] - b[i]));
  let dk = 0; const ka = outs[0]['present.7.value'].data as Float32Array, kb = outs[j]['present.7.value'].data as Float32Array; for (let i = 0; i < ka.length; i++) dk = Math.max(dk, Math.abs(ka[i] - kb[i]));
  console.log(`${names[j]} vs ${names[0]}: same tokens ${same}, max |Δlogprob| ${d.toExponential(2)}, max |Δpresent.7.value| ${dk.toExponential(2)}`);
}
const wall = names.map(() => [] as number[]), cpu = names.map(() => [] as number[]);
for (let r = 0; r < reps; r++) for (let j = 0; j < names.length; j++) {
  const c0 = process.cpuUsage(); const t0 = performance.now();
  for (let i = 0; i < 10; i++) await sessions[j].run(feeds);
  const c = process.cpuUsage(c0); wall[j].push((performance.now() - t0) / 10); cpu[j].push((c.user + c.system) / 1000 / 10);
}
const med = (x: number[]) => [...x].sort((a, b) => a - b)[x.length >> 1];
console.log(`B ${B}, P ${P}, cap ${cap}, threads ${threads}, load ${os.loadavg()[0].toFixed(2)}: ` + names.map((n, j) => `${n} ${med(wall[j]).toFixed(2)} ms wall (min ${Math.min(...wall[j]).toFixed(2)}), ${med(cpu[j]).toFixed(2)} ms cpu`).join(' | '));
