/**
 * Which fused decoding ops the installed ONNX Runtime runs, on which provider, and whether they give
 * our unfused subgraphs' numbers (issue 45, item 2). Each case is a tiny standalone graph run on the
 * CPU provider (and, with `--webgpu`, on WebGPU: under SwiftShader give it
 * VK_ICD_FILENAMES=/usr/lib/chromium/vk_swiftshader_icd.json), compared with a float64 computation
 * written here from the defining formula, beside the same comparison for prefzoo's unfused subgraph
 * (src/models/layers.ts). A case the provider lacks prints its error.
 *
 *   - SimplifiedLayerNormalization (ONNX domain, ORT's), RMSNormalization (ONNX opset 23),
 *     SkipSimplifiedLayerNormalization (com.microsoft): y = x / √(mean(x²) + ε) · w (with x = a + b and
 *     the sum returned for the skip form) against layers.ts's rmsNorm.
 *   - RotaryEmbedding (com.microsoft): rotate-half RoPE at per-row position_ids from a cos/sin cache,
 *     whole and partial (rotary_embedding_dim < head size).
 *   - GroupQueryAttention (com.microsoft): one new token per row over a preallocated cache
 *     `[B, KV, capacity, hd]` whose rows are at different fills with left-padding holes (SlotCache's
 *     layout): seqlens_k = the row's fill, attention_bias hiding the holes, present bound to the very
 *     past buffer (ORT's shared-buffer mode: the new key/value written into slot `fill` in place), and
 *     with do_rotary + position_ids; then a left-padded prefill.
 *   - MultiHeadAttention (com.microsoft): a step over past ++ new with the padding as attention_bias.
 *
 *   node --import tsx scripts/bench/fused-ops.ts [--webgpu]
 */
import { parseArgs } from 'node:util';
import ort from 'onnxruntime-node';
import { Graph, type Tensor } from '../../src/onnx/graph.ts';
import { serializeModel } from '../../src/onnx/proto.ts';
import { toOrt, sessionOptions, type Feeds } from '../../src/runtime/session.ts';
import { rmsNorm } from '../../src/models/layers.ts';
import { uniform } from '../../src/random.ts';

const { values: a } = parseArgs({ options: { webgpu: { type: 'boolean', default: false } } });
const providers: ('cpu' | 'webgpu')[] = a.webgpu ? ['cpu', 'webgpu'] : ['cpu'];
const MS = 'com.microsoft';

function rand(n: number, seed: number): Float32Array {
  const u = uniform(seed);
  return Float32Array.from({ length: n }, () => 2 * u() - 1);
}

async function run(g: Graph, feeds: Feeds, ep: 'cpu' | 'webgpu', opset = 17, fetches?: Record<string, ort.Tensor>): Promise<Record<string, ort.Tensor>> {
  const s = await ort.InferenceSession.create(serializeModel(g, { opset }), sessionOptions({ ep }));
  try {
    return fetches ? await s.run(feeds, fetches as never) : await s.run(feeds);
  } finally {
    await s.release();
  }
}

function maxDiff(x: ArrayLike<number>, ref: ArrayLike<number>): number {
  let m = 0;
  for (let i = 0; i < ref.length; i++) m = Math.max(m, Math.abs(x[i] - ref[i]));
  return m;
}

const rows: string[][] = [];
async function report(op: string, ep: string, what: string, f: () => Promise<string>): Promise<void> {
  try {
    rows.push([op, ep, what, await f()]);
  } catch (e) {
    rows.push([op, ep, what, `not run: ${String((e as Error).message ?? e).split('\n')[0].slice(0, 140)}`]);
  }
}

// ---- RMSNorm ----
const N = 6;
const D = 64;
const EPS = 1e-6;
const x1 = rand(N * D, 1);
const x2 = rand(N * D, 2);
const w = rand(D, 3);
function rmsRef(x: Float32Array): Float64Array {
  const y = new Float64Array(x.length);
  for (let n = 0; n < N; n++) {
    let s = 0;
    for (let d = 0; d < D; d++) s += x[n * D + d] ** 2;
    const r = 1 / Math.sqrt(s / D + EPS);
    for (let d = 0; d < D; d++) y[n * D + d] = x[n * D + d] * r * w[d];
  }
  return y;
}
const sum = Float32Array.from(x1, (v, i) => v + x2[i]);
const refNorm = rmsRef(sum);

function normGraph(kind: 'unfused' | 'simplified' | 'rms23' | 'skip'): Graph {
  const g = new Graph('norm');
  const a1 = g.input('a', 'float32', [N, D]);
  const a2 = g.input('b', 'float32', [N, D]);
  const wt = g.input('w', 'float32', [D]);
  if (kind === 'skip') {
    const [y, , , s] = g.op('SkipSimplifiedLayerNormalization', [a1, a2, wt], { epsilon: { kind: 'float', value: EPS } }, [
      { dtype: 'float32', shape: [N, D] },
      { dtype: 'float32', shape: null },
      { dtype: 'float32', shape: null },
      { dtype: 'float32', shape: [N, D] },
    ], undefined, MS);
    g.output(y, 'y');
    g.output(s, 'sum');
    return g;
  }
  const s = g.add(a1, a2);
  g.output(s, 'sum');
  let y: Tensor;
  if (kind === 'unfused') y = rmsNorm(g, s, wt, EPS);
  else if (kind === 'simplified') y = g.op('SimplifiedLayerNormalization', [s, wt], { axis: { kind: 'int', value: -1 }, epsilon: { kind: 'float', value: EPS }, stash_type: { kind: 'int', value: 1 } }, [{ dtype: 'float32', shape: [N, D] }])[0];
  else y = g.op('RMSNormalization', [s, wt], { axis: { kind: 'int', value: -1 }, epsilon: { kind: 'float', value: EPS } }, [{ dtype: 'float32', shape: [N, D] }])[0];
  g.output(y, 'y');
  return g;
}
const normFeeds = (): Feeds => ({ a: toOrt('float32', x1, [N, D]), b: toOrt('float32', x2, [N, D]), w: toOrt('float32', w, [D]) });

// ---- Rotary ----
const B = 3;
const H = 4;
const KV = 2;
const HD = 16;
const MAXPOS = 64;
const THETA = 10000;
/** cos/sin tables `[MAXPOS, rd/2]` as the unfused graph computes them: float32 position × float32 frequency, then cos/sin. */
function ropeCache(rd: number): { cos: Float32Array; sin: Float32Array } {
  const half = rd / 2;
  const cos = new Float32Array(MAXPOS * half);
  const sin = new Float32Array(MAXPOS * half);
  for (let p = 0; p < MAXPOS; p++) {
    for (let i = 0; i < half; i++) {
      const ang = Math.fround(p * Math.fround(1 / Math.pow(THETA, (2 * i) / rd)));
      cos[p * half + i] = Math.cos(ang);
      sin[p * half + i] = Math.sin(ang);
    }
  }
  return { cos, sin };
}
/** Rotate-half RoPE of `x` `[B, S, heads, hd]` at `pos` `[B, S]` on the first `rd` dims, in float64. */
function ropeRef(x: Float32Array, pos: number[], S: number, heads: number, rd: number): Float64Array {
  const y = Float64Array.from(x);
  const half = rd / 2;
  for (let b = 0; b < B; b++) {
    for (let s = 0; s < S; s++) {
      const p = pos[b * S + s];
      for (let h = 0; h < heads; h++) {
        const o = ((b * S + s) * heads + h) * HD;
        for (let i = 0; i < half; i++) {
          const ang = Math.fround(p * Math.fround(1 / Math.pow(THETA, (2 * i) / rd)));
          const [c, sn] = [Math.cos(ang), Math.sin(ang)];
          y[o + i] = x[o + i] * c - x[o + i + half] * sn;
          y[o + i + half] = x[o + i + half] * c + x[o + i] * sn;
        }
      }
    }
  }
  return y;
}

// ---- Attention over a slot cache ----
const CAP = 8;
/** Per row: its filled slots' mask (left-padding holes are 0); the new token goes into slot `fill`. */
const MASKS = [
  [0, 0, 1, 1, 1],
  [1, 1],
  [0, 1, 1, 1, 1, 1, 1],
];
const FILL = MASKS.map((m) => m.length);
const TOTAL = Math.max(...FILL) + 1;
const POS = MASKS.map((m) => m.reduce((s, v) => s + v, 0)); // the new token's position: real tokens before it

/** Attention of one query per row over the cache's real slots plus the new key, in float64. q `[B, H·hd]` (unscaled). */
function attnRef(q: ArrayLike<number>, cacheK: Float32Array, cacheV: Float32Array, kNew: ArrayLike<number>, vNew: ArrayLike<number>): Float64Array {
  const out = new Float64Array(B * H * HD);
  const G = H / KV;
  for (let b = 0; b < B; b++) {
    for (let h = 0; h < H; h++) {
      const kv = Math.floor(h / G);
      const keys: [ArrayLike<number>, number, ArrayLike<number>, number][] = [];
      for (let t = 0; t < FILL[b]; t++) if (MASKS[b][t]) keys.push([cacheK, ((b * KV + kv) * CAP + t) * HD, cacheV, ((b * KV + kv) * CAP + t) * HD]);
      keys.push([kNew, (b * KV + kv) * HD, vNew, (b * KV + kv) * HD]);
      const sc = keys.map(([K, ko]) => {
        let s = 0;
        for (let d = 0; d < HD; d++) s += q[(b * H + h) * HD + d] * K[ko + d];
        return s / Math.sqrt(HD);
      });
      const m = Math.max(...sc);
      const e = sc.map((s) => Math.exp(s - m));
      const z = e.reduce((s, v) => s + v, 0);
      for (let j = 0; j < keys.length; j++) {
        const [, , V, vo] = keys[j];
        for (let d = 0; d < HD; d++) out[(b * H + h) * HD + d] += (e[j] / z) * V[vo + d];
      }
    }
  }
  return out;
}

function attentionBias(): Float32Array {
  const bias = new Float32Array(B * TOTAL).fill(-1e9);
  for (let b = 0; b < B; b++) {
    for (let t = 0; t < FILL[b]; t++) if (MASKS[b][t]) bias[b * TOTAL + t] = 0;
    bias[b * TOTAL + FILL[b]] = 0;
  }
  return bias;
}

function gqaGraph(rotary: boolean): Graph {
  const g = new Graph('gqa');
  const q = g.input('q', 'float32', [B, 1, H * HD]);
  const k = g.input('k', 'float32', [B, 1, KV * HD]);
  const v = g.input('v', 'float32', [B, 1, KV * HD]);
  const pk = g.input('past_key', 'float32', [B, KV, CAP, HD]);
  const pv = g.input('past_value', 'float32', [B, KV, CAP, HD]);
  const sl = g.input('seqlens_k', 'int32', [B]);
  const tot = g.input('total', 'int32', []);
  const bias = g.input('bias', 'float32', [B, 1, 1, TOTAL]);
  const extra: (Tensor | null)[] = rotary ? [g.input('cos', 'float32', [MAXPOS, HD / 2]), g.input('sin', 'float32', [MAXPOS, HD / 2]), g.input('pos', 'int64', [B, 1])] : [null, null, null];
  const attrs = { num_heads: { kind: 'int' as const, value: H }, kv_num_heads: { kind: 'int' as const, value: KV }, ...(rotary ? { do_rotary: { kind: 'int' as const, value: 1 } } : {}) };
  const [o, kk, vv] = g.op('GroupQueryAttention', [q, k, v, pk, pv, sl, tot, ...extra, bias], attrs, [
    { dtype: 'float32', shape: [B, 1, H * HD] },
    { dtype: 'float32', shape: [B, KV, CAP, HD] },
    { dtype: 'float32', shape: [B, KV, CAP, HD] },
  ], undefined, MS);
  g.output(o, 'out');
  g.output(kk, 'present_key');
  g.output(vv, 'present_value');
  return g;
}

async function main(): Promise<void> {
  for (const ep of providers) {
    // RMSNorm: the unfused subgraph first, as the bar the fused ones are held to.
    for (const [op, kind, opset] of [
      ['rmsNorm (unfused, layers.ts)', 'unfused', 17],
      ['SimplifiedLayerNormalization (onnx domain, ORT)', 'simplified', 17],
      ['RMSNormalization (onnx, opset 23)', 'rms23', 23],
      ['SkipSimplifiedLayerNormalization', 'skip', 17],
    ] as const) {
      await report(op, ep, 'max |y − float64|, sum', async () => {
        const out = await run(normGraph(kind), normFeeds(), ep, opset);
        return `${maxDiff(out.y.data as Float32Array, refNorm).toExponential(2)}, sum ${maxDiff(out.sum.data as Float32Array, sum) === 0 ? 'exact' : 'differs'}`;
      });
    }
    // RotaryEmbedding on [B, S, heads·hd] at per-row positions, whole and partial.
    for (const rd of [HD, HD / 2]) {
      await report('RotaryEmbedding', ep, `rd ${rd}/${HD}: max |y − float64|`, async () => {
        const S = 2;
        const x = rand(B * S * H * HD, 4);
        const pos = [3, 4, 0, 1, 9, 10];
        const { cos, sin } = ropeCache(rd);
        const g = new Graph('rope');
        const xi = g.input('x', 'float32', [B, S, H * HD]);
        const y = g.op('RotaryEmbedding', [xi, g.input('pos', 'int64', [B, S]), g.input('cos', 'float32', [MAXPOS, rd / 2]), g.input('sin', 'float32', [MAXPOS, rd / 2])],
          { num_heads: { kind: 'int', value: H }, rotary_embedding_dim: { kind: 'int', value: rd } }, [{ dtype: 'float32', shape: [B, S, H * HD] }], undefined, MS)[0];
        g.output(y, 'y');
        const out = await run(g, { x: toOrt('float32', x, [B, S, H * HD]), pos: toOrt('int64', BigInt64Array.from(pos, BigInt), [B, S]), cos: toOrt('float32', cos, [MAXPOS, rd / 2]), sin: toOrt('float32', sin, [MAXPOS, rd / 2]) }, ep);
        return maxDiff(out.y.data as Float32Array, ropeRef(x, pos, S, H, rd)).toExponential(2);
      });
    }
    // GroupQueryAttention: a step over SlotCache's layout, present bound to past (shared buffer).
    for (const rotary of [false, true]) {
      for (const shared of [true, false]) {
        await report('GroupQueryAttention', ep, `step, ragged fills + holes${rotary ? ', do_rotary + position_ids' : ''}, ${shared ? 'present = past buffer' : 'present separate'}`, async () => {
          const q = rand(B * H * HD, 5);
          const k = rand(B * KV * HD, 6);
          const v = rand(B * KV * HD, 7);
          const cacheK = rand(B * KV * CAP * HD, 8);
          const cacheV = rand(B * KV * CAP * HD, 9);
          const [K0, V0] = [cacheK.slice(), cacheV.slice()];
          const { cos, sin } = ropeCache(HD);
          const feeds: Feeds = {
            q: toOrt('float32', q, [B, 1, H * HD]),
            k: toOrt('float32', k, [B, 1, KV * HD]),
            v: toOrt('float32', v, [B, 1, KV * HD]),
            past_key: toOrt('float32', cacheK, [B, KV, CAP, HD]),
            past_value: toOrt('float32', cacheV, [B, KV, CAP, HD]),
            seqlens_k: toOrt('int32', Int32Array.from(FILL), [B]),
            total: toOrt('int32', Int32Array.of(TOTAL), []),
            bias: toOrt('float32', attentionBias(), [B, 1, 1, TOTAL]),
          };
          if (rotary) Object.assign(feeds, { cos: toOrt('float32', cos, [MAXPOS, HD / 2]), sin: toOrt('float32', sin, [MAXPOS, HD / 2]), pos: toOrt('int64', BigInt64Array.from(POS, BigInt), [B, 1]) });
          const pkOut = shared ? cacheK : new Float32Array(cacheK.length);
          const pvOut = shared ? cacheV : new Float32Array(cacheV.length);
          const outBuf = new Float32Array(B * H * HD);
          await run(gqaGraph(rotary), feeds, ep, 17, {
            out: toOrt('float32', outBuf, [B, 1, H * HD]),
            present_key: toOrt('float32', pkOut, [B, KV, CAP, HD]),
            present_value: toOrt('float32', pvOut, [B, KV, CAP, HD]),
          });
          const qr = rotary ? ropeRef(q, POS, 1, H, HD) : q;
          const kr = rotary ? ropeRef(k, POS, 1, KV, HD) : k;
          const ref = attnRef(qr, K0, V0, kr, v);
          // The new key must sit in slot FILL[b] of the present buffer, the filled slots untouched.
          let slotErr = 0;
          let kept = true;
          for (let b = 0; b < B; b++) {
            for (let h = 0; h < KV; h++) {
              const o = ((b * KV + h) * CAP + FILL[b]) * HD;
              slotErr = Math.max(slotErr, maxDiff(pkOut.subarray(o, o + HD), Array.from(kr.subarray((b * KV + h) * HD, (b * KV + h + 1) * HD))));
              const f = (b * KV + h) * CAP * HD;
              if (maxDiff(pkOut.subarray(f, f + FILL[b] * HD), K0.subarray(f, f + FILL[b] * HD)) !== 0) kept = false;
            }
          }
          return `out ${maxDiff(outBuf, ref).toExponential(2)}, new key in slot fill ${slotErr.toExponential(2)}, filled slots ${kept ? 'kept' : 'CHANGED'}`;
        });
      }
    }
    // GroupQueryAttention: a prefill of left-padded prompts (the first-prompt path).
    await report('GroupQueryAttention', ep, 'prefill, left-padded rows via attention_bias', async () => {
      const S = 5;
      const pads = [2, 0, 1];
      const q = rand(B * S * H * HD, 10);
      const k = rand(B * S * KV * HD, 11);
      const v = rand(B * S * KV * HD, 12);
      const g = new Graph('gqa_prefill');
      const [o] = g.op('GroupQueryAttention', [
        g.input('q', 'float32', [B, S, H * HD]), g.input('k', 'float32', [B, S, KV * HD]), g.input('v', 'float32', [B, S, KV * HD]), null, null,
        g.input('seqlens_k', 'int32', [B]), g.input('total', 'int32', []), null, null, null, g.input('bias', 'float32', [B, 1, S, S]),
      ], { num_heads: { kind: 'int', value: H }, kv_num_heads: { kind: 'int', value: KV } }, [
        { dtype: 'float32', shape: [B, S, H * HD] }, { dtype: 'float32', shape: null }, { dtype: 'float32', shape: null },
      ], undefined, MS);
      g.output(o, 'out');
      const bias = new Float32Array(B * S * S);
      for (let b = 0; b < B; b++) for (let i = 0; i < S; i++) for (let j = 0; j < S; j++) bias[(b * S + i) * S + j] = j < pads[b] && i >= pads[b] ? -1e9 : 0;
      const out = await run(g, {
        q: toOrt('float32', q, [B, S, H * HD]), k: toOrt('float32', k, [B, S, KV * HD]), v: toOrt('float32', v, [B, S, KV * HD]),
        seqlens_k: toOrt('int32', Int32Array.from([S - 1, S - 1, S - 1]), [B]), total: toOrt('int32', Int32Array.of(S), []), bias: toOrt('float32', bias, [B, 1, S, S]),
      }, ep);
      // float64 reference over the real (non-pad) rows: causal, pads hidden.
      const G = H / KV;
      let err = 0;
      const y = out.out.data as Float32Array;
      for (let b = 0; b < B; b++) {
        for (let i = pads[b]; i < S; i++) {
          for (let h = 0; h < H; h++) {
            const kv = Math.floor(h / G);
            const js = Array.from({ length: i - pads[b] + 1 }, (_, t) => pads[b] + t);
            const sc = js.map((j) => {
              let s = 0;
              for (let d = 0; d < HD; d++) s += q[((b * S + i) * H + h) * HD + d] * k[((b * S + j) * KV + kv) * HD + d];
              return s / Math.sqrt(HD);
            });
            const m = Math.max(...sc);
            const e = sc.map((s) => Math.exp(s - m));
            const z = e.reduce((s2, x) => s2 + x, 0);
            for (let d = 0; d < HD; d++) {
              let r = 0;
              js.forEach((j, t) => (r += (e[t] / z) * v[((b * S + j) * KV + kv) * HD + d]));
              err = Math.max(err, Math.abs(y[((b * S + i) * H + h) * HD + d] - r));
            }
          }
        }
      }
      return `out (real rows) ${err.toExponential(2)}`;
    });
    // MultiHeadAttention: past ++ new (a copy of the cache), H = KV (no grouped heads), padding as bias.
    await report('MultiHeadAttention', ep, 'step, past ++ new, padding as attention_bias (H = KV only)', async () => {
      const Hm = KV;
      const q = rand(B * Hm * HD, 13);
      const k = rand(B * KV * HD, 6);
      const v = rand(B * KV * HD, 7);
      const cacheK = rand(B * KV * CAP * HD, 8);
      const cacheV = rand(B * KV * CAP * HD, 9);
      const g = new Graph('mha');
      const bias = new Float32Array(B * (CAP + 1)).fill(-1e9);
      for (let b = 0; b < B; b++) {
        for (let t = 0; t < FILL[b]; t++) if (MASKS[b][t]) bias[b * (CAP + 1) + t] = 0;
        bias[b * (CAP + 1) + CAP] = 0;
      }
      const [o] = g.op('MultiHeadAttention', [
        g.input('q', 'float32', [B, 1, Hm * HD]), g.input('k', 'float32', [B, 1, KV * HD]), g.input('v', 'float32', [B, 1, KV * HD]), null, null,
        g.input('bias', 'float32', [B, 1, 1, CAP + 1]), g.input('past_key', 'float32', [B, KV, CAP, HD]), g.input('past_value', 'float32', [B, KV, CAP, HD]),
      ], { num_heads: { kind: 'int', value: Hm } }, [{ dtype: 'float32', shape: [B, 1, Hm * HD] }, { dtype: 'float32', shape: null }, { dtype: 'float32', shape: null }], undefined, MS);
      g.output(o, 'out');
      const out = await run(g, {
        q: toOrt('float32', q, [B, 1, Hm * HD]), k: toOrt('float32', k, [B, 1, KV * HD]), v: toOrt('float32', v, [B, 1, KV * HD]),
        bias: toOrt('float32', bias, [B, 1, 1, CAP + 1]), past_key: toOrt('float32', cacheK, [B, KV, CAP, HD]), past_value: toOrt('float32', cacheV, [B, KV, CAP, HD]),
      }, ep);
      // Reference: attnRef with one query head per KV head.
      const qFull = new Float32Array(B * H * HD);
      for (let b = 0; b < B; b++) for (let h = 0; h < H; h++) if (h % (H / KV) === 0) qFull.set(q.subarray((b * Hm + h / (H / KV)) * HD, (b * Hm + h / (H / KV) + 1) * HD), (b * H + h) * HD);
      const ref = attnRef(qFull, cacheK, cacheV, k, v);
      const y = out.out.data as Float32Array;
      let err = 0;
      for (let b = 0; b < B; b++) for (let h = 0; h < Hm; h++) for (let d = 0; d < HD; d++) err = Math.max(err, Math.abs(y[(b * Hm + h) * HD + d] - ref[(b * H + h * (H / KV)) * HD + d]));
      return `out ${err.toExponential(2)}`;
    });
  }
  const width = [0, 1, 2].map((c) => Math.max(...rows.map((r) => r[c].length)));
  for (const r of rows) console.log(r.map((c, i) => (i < 3 ? c.padEnd(width[i]) : c)).join('  '));
}

await main();
