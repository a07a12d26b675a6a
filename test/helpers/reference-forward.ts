/**
 * An independent float64 forward pass of the HF architectures, one unpadded sequence at a time, in
 * plain loops written from HF's conventions (positions 0…T−1, rotate-half RoPE, repeated KV heads,
 * explicit causal softmax). Tests hold the ONNX graphs against it; it shares no code with src/models.
 */
import type { ModelConfig, LlamaConfig, Gpt2Config } from '../../src/models/config.ts';

export type RefWeights = Map<string, { shape: number[]; data: ArrayLike<number> }>;

export interface RefLora {
  rank: number;
  alpha: number;
  /** Module paths carrying adapters (e.g. `model.layers.0.self_attn.q_proj`). */
  modules: string[];
}

type Vec = Float64Array;

function tensor(w: RefWeights, name: string): ArrayLike<number> {
  const t = w.get(name);
  if (!t) throw new Error(`reference: missing ${name}`);
  return t.data;
}

/** y = W x (+ b) for W stored [out, in] (Linear) or [in, out] (Conv1D), plus a LoRA update. */
function dense(w: RefWeights, module: string, x: Vec, out: number, layout: 'linear' | 'conv1d', bias: boolean, lora?: RefLora): Vec {
  const W = tensor(w, module + '.weight');
  const n = x.length;
  const y = new Float64Array(out);
  for (let o = 0; o < out; o++) {
    let s = 0;
    for (let i = 0; i < n; i++) s += (layout === 'linear' ? W[o * n + i] : W[i * out + o]) * x[i];
    y[o] = s;
  }
  if (bias) {
    const b = tensor(w, module + '.bias');
    for (let o = 0; o < out; o++) y[o] += b[o];
  }
  if (lora && lora.modules.includes(module)) {
    const A = tensor(w, module + '.lora_A.weight');
    const B = tensor(w, module + '.lora_B.weight');
    const r = lora.rank;
    const ax = new Float64Array(r);
    for (let k = 0; k < r; k++) for (let i = 0; i < n; i++) ax[k] += A[k * n + i] * x[i];
    for (let o = 0; o < out; o++) {
      let s = 0;
      for (let k = 0; k < r; k++) s += B[o * r + k] * ax[k];
      y[o] += (lora.alpha / r) * s;
    }
  }
  return y;
}

function rmsnorm(x: Vec, w: ArrayLike<number>, eps: number): Vec {
  let ms = 0;
  for (const v of x) ms += v * v;
  const inv = 1 / Math.sqrt(ms / x.length + eps);
  return x.map((v, i) => v * inv * w[i]);
}

function layernorm(x: Vec, w: ArrayLike<number>, b: ArrayLike<number>, eps: number): Vec {
  const n = x.length;
  const mean = x.reduce((a, v) => a + v, 0) / n;
  const variance = x.reduce((a, v) => a + (v - mean) ** 2, 0) / n;
  const inv = 1 / Math.sqrt(variance + eps);
  return x.map((v, i) => (v - mean) * inv * w[i] + b[i]);
}

function act(name: string, x: number): number {
  switch (name) {
    case 'silu':
      return x / (1 + Math.exp(-x));
    case 'relu':
      return Math.max(0, x);
    case 'quick_gelu':
      return x / (1 + Math.exp(-1.702 * x));
    case 'gelu_new':
    case 'gelu_pytorch_tanh':
    case 'gelu_fast':
      return 0.5 * x * (1 + Math.tanh(Math.sqrt(2 / Math.PI) * (x + 0.044715 * x ** 3)));
    default:
      throw new Error(`reference: activation ${name} not implemented`);
  }
}

/**
 * Causal attention for one sequence: q [T][H][hd], k/v [T][KV][hd] → context [T][H·hd]. With a
 * sliding window W, token t reads keys t−W+1 … t.
 */
function causalAttention(q: Vec[][], k: Vec[][], v: Vec[][], H: number, KV: number, hd: number, scale = 1 / Math.sqrt(hd), window = Infinity): Vec[] {
  const T = q.length;
  const out: Vec[] = [];
  for (let t = 0; t < T; t++) {
    const ctx = new Float64Array(H * hd);
    const first = Math.max(0, t - window + 1);
    for (let h = 0; h < H; h++) {
      const kvh = Math.floor(h / (H / KV)); // repeat_kv: head h reads KV head h // (H/KV)
      const scores: number[] = [];
      for (let s = 0; s < first; s++) scores.push(-Infinity);
      for (let s = first; s <= t; s++) {
        let dot = 0;
        for (let d = 0; d < hd; d++) dot += q[t][h][d] * k[s][kvh][d];
        scores.push(dot * scale);
      }
      const m = Math.max(...scores);
      const e = scores.map((x) => Math.exp(x - m));
      const z = e.reduce((a, x) => a + x, 0);
      for (let s = first; s <= t; s++) for (let d = 0; d < hd; d++) ctx[h * hd + d] += (e[s] / z) * v[s][kvh][d];
    }
    out.push(ctx);
  }
  return out;
}

function heads(x: Vec, n: number, hd: number): Vec[] {
  return Array.from({ length: n }, (_, h) => x.slice(h * hd, (h + 1) * hd));
}

/** Phi-3 rotates only the first partial_rotary_factor·head_dim dims of a head. */
function rotaryWidth(c: LlamaConfig): number {
  return c.model_type === 'phi3' ? Math.floor(c.head_dim * ((c.partial_rotary_factor as number | undefined) ?? 1)) : c.head_dim;
}

/** Rotary angle rates per pair i < d/2: θ^(−2i/d), then HF's linear or llama3 frequency rescaling. */
function rotaryRates(c: LlamaConfig): number[] {
  const d = rotaryWidth(c);
  const rates: number[] = [];
  for (let i = 0; i < d; i += 2) rates.push(Math.pow(c.rope_theta, -i / d));
  const sc = c.rope_scaling as { rope_type?: string; type?: string; factor: number; low_freq_factor?: number; high_freq_factor?: number; original_max_position_embeddings?: number } | null | undefined;
  if (!sc) return rates;
  const kind = sc.rope_type ?? sc.type;
  if (kind === 'linear') return rates.map((r) => r / sc.factor);
  if (kind === 'llama3') {
    const ctx = sc.original_max_position_embeddings ?? 8192;
    const lo = sc.low_freq_factor ?? 1;
    const hi = sc.high_freq_factor ?? 4;
    return rates.map((r) => {
      const wave = (2 * Math.PI) / r;
      if (wave > ctx / lo) return r / sc.factor;
      if (wave < ctx / hi) return r;
      const t = (ctx / wave - lo) / (hi - lo);
      return t * r + (1 - t) * (r / sc.factor);
    });
  }
  return rates;
}

function ropeApply(x: Vec, pos: number, rates: number[]): Vec {
  const d = 2 * rates.length; // dims past d pass through unrotated
  const half = d / 2;
  const y = Float64Array.from(x);
  for (let i = 0; i < d; i++) {
    const f = pos * rates[i % half];
    const rot = i < half ? -x[i + half] : x[i - half];
    y[i] = x[i] * Math.cos(f) + rot * Math.sin(f);
  }
  return y;
}

/**
 * The llama family, member by member as HF writes each: qwen3 normalises every q and k head
 * (q_norm, k_norm) before RoPE; mistral and phi3 attend within sliding_window; gemma scales the
 * embeddings by √D, normalises with (1 + w) and gates with tanh-GELU; phi3 slices fused qkv_proj and
 * gate_up_proj outputs and rotates part of each head.
 */
function llamaHidden(c: LlamaConfig, w: RefWeights, ids: number[], lora?: RefLora): Vec[] {
  const D = c.hidden_size;
  const H = c.num_attention_heads;
  const KV = c.num_key_value_heads;
  const hd = c.head_dim;
  const F = c.intermediate_size;
  const type = c.model_type;
  const qkvBias = type === 'qwen2' || (type !== 'phi3' && c.attention_bias);
  const oBias = type !== 'qwen2' && type !== 'phi3' && c.attention_bias;
  const window = (type === 'mistral' || type === 'phi3') && typeof c.sliding_window === 'number' ? c.sliding_window : Infinity;
  const norm = (x: Vec, name: string) => {
    const g = tensor(w, name);
    return rmsnorm(x, type === 'gemma' ? Array.from(g, (v) => 1 + v) : g, c.rms_norm_eps);
  };
  const mlpAct = (x: number) => act(type === 'gemma' ? ((c.hidden_activation as string | undefined) ?? 'gelu_pytorch_tanh') : c.hidden_act, x);
  const E = tensor(w, 'model.embed_tokens.weight');
  const rates = rotaryRates(c);
  const embedScale = type === 'gemma' ? Math.sqrt(D) : 1;
  let h = ids.map((id) => Float64Array.from({ length: D }, (_, j) => E[id * D + j] * embedScale));
  for (let l = 0; l < c.num_hidden_layers; l++) {
    const p = `model.layers.${l}.`;
    const x = h.map((r) => norm(r, p + 'input_layernorm.weight'));
    let qs: Vec[];
    let ks: Vec[];
    let vs: Vec[];
    if (type === 'phi3') {
      const qkv = x.map((r) => dense(w, p + 'self_attn.qkv_proj', r, (H + 2 * KV) * hd, 'linear', false, lora));
      qs = qkv.map((r) => r.slice(0, H * hd));
      ks = qkv.map((r) => r.slice(H * hd, (H + KV) * hd));
      vs = qkv.map((r) => r.slice((H + KV) * hd));
    } else {
      qs = x.map((r) => dense(w, p + 'self_attn.q_proj', r, H * hd, 'linear', qkvBias, lora));
      ks = x.map((r) => dense(w, p + 'self_attn.k_proj', r, KV * hd, 'linear', qkvBias, lora));
      vs = x.map((r) => dense(w, p + 'self_attn.v_proj', r, KV * hd, 'linear', qkvBias, lora));
    }
    const headNorm = (v: Vec, which: 'q' | 'k') => (type === 'qwen3' ? rmsnorm(v, tensor(w, `${p}self_attn.${which}_norm.weight`), c.rms_norm_eps) : v);
    const q = qs.map((r, t) => heads(r, H, hd).map((v) => ropeApply(headNorm(v, 'q'), t, rates)));
    const k = ks.map((r, t) => heads(r, KV, hd).map((v) => ropeApply(headNorm(v, 'k'), t, rates)));
    const v = vs.map((r) => heads(r, KV, hd));
    const ctx = causalAttention(q, k, v, H, KV, hd, 1 / Math.sqrt(hd), window);
    h = h.map((r, t) => {
      const o = dense(w, p + 'self_attn.o_proj', ctx[t], D, 'linear', oBias, lora);
      return r.map((a, j) => a + o[j]);
    });
    h = h.map((r) => {
      const xn = norm(r, p + 'post_attention_layernorm.weight');
      let gate: Vec;
      let up: Vec;
      if (type === 'phi3') {
        const gu = dense(w, p + 'mlp.gate_up_proj', xn, 2 * F, 'linear', false, lora);
        gate = gu.slice(0, F);
        up = gu.slice(F);
      } else {
        gate = dense(w, p + 'mlp.gate_proj', xn, F, 'linear', c.mlp_bias, lora);
        up = dense(w, p + 'mlp.up_proj', xn, F, 'linear', c.mlp_bias, lora);
      }
      const m = dense(w, p + 'mlp.down_proj', gate.map((g, i) => mlpAct(g) * up[i]), D, 'linear', c.mlp_bias && type !== 'phi3', lora);
      return r.map((a, j) => a + m[j]);
    });
  }
  return h.map((r) => norm(r, 'model.norm.weight'));
}

function gpt2Hidden(c: Gpt2Config, w: RefWeights, ids: number[], lora?: RefLora): Vec[] {
  const D = c.n_embd;
  const H = c.n_head;
  const hd = D / H;
  const inner = c.n_inner ?? 4 * D;
  const eps = c.layer_norm_epsilon;
  const wte = tensor(w, 'transformer.wte.weight');
  const wpe = tensor(w, 'transformer.wpe.weight');
  let h = ids.map((id, t) => Float64Array.from({ length: D }, (_, j) => wte[id * D + j] + wpe[t * D + j]));
  for (let l = 0; l < c.n_layer; l++) {
    const p = `transformer.h.${l}.`;
    const qkv = h.map((r) => dense(w, p + 'attn.c_attn', layernorm(r, tensor(w, p + 'ln_1.weight'), tensor(w, p + 'ln_1.bias'), eps), 3 * D, 'conv1d', true, lora));
    const q = qkv.map((r) => heads(r.slice(0, D), H, hd));
    const k = qkv.map((r) => heads(r.slice(D, 2 * D), H, hd));
    const v = qkv.map((r) => heads(r.slice(2 * D), H, hd));
    const scale = (c.scale_attn_weights === false ? 1 : 1 / Math.sqrt(hd)) / (c.scale_attn_by_inverse_layer_idx ? l + 1 : 1);
    const ctx = causalAttention(q, k, v, H, H, hd, scale);
    h = h.map((r, t) => {
      const o = dense(w, p + 'attn.c_proj', ctx[t], D, 'conv1d', true, lora);
      return r.map((a, j) => a + o[j]);
    });
    h = h.map((r) => {
      const xn = layernorm(r, tensor(w, p + 'ln_2.weight'), tensor(w, p + 'ln_2.bias'), eps);
      const f = dense(w, p + 'mlp.c_fc', xn, inner, 'conv1d', true, lora).map((a) => act(c.activation_function, a));
      const m = dense(w, p + 'mlp.c_proj', f, D, 'conv1d', true, lora);
      return r.map((a, j) => a + m[j]);
    });
  }
  return h.map((r) => layernorm(r, tensor(w, 'transformer.ln_f.weight'), tensor(w, 'transformer.ln_f.bias'), eps));
}

/** Final hidden states of one sequence, [T][D]. */
export function referenceHidden(c: ModelConfig, w: RefWeights, ids: number[], lora?: RefLora): Vec[] {
  return c.model_type === 'gpt2' ? gpt2Hidden(c, w, ids, lora) : llamaHidden(c, w, ids, lora);
}

/** Logits of one sequence, [T][V]. */
export function referenceLogits(c: ModelConfig, w: RefWeights, ids: number[], lora?: RefLora): Vec[] {
  const head =
    c.model_type === 'gpt2'
      ? c.tie_word_embeddings ? 'transformer.wte.weight' : 'lm_head.weight'
      : c.tie_word_embeddings ? 'model.embed_tokens.weight' : 'lm_head.weight';
  const W = tensor(w, head);
  const V = c.vocab_size;
  return referenceHidden(c, w, ids, lora).map((hid) => {
    const D = hid.length;
    return Float64Array.from({ length: V }, (_, o) => {
      let s = 0;
      for (let j = 0; j < D; j++) s += W[o * D + j] * hid[j];
      return s;
    });
  });
}

/** Σ_{t ≥ 1, mask[t] = 1} log softmax(logits[t−1])[ids[t]], and the count of such t. */
export function referenceLogps(c: ModelConfig, w: RefWeights, ids: number[], lossMask: number[], lora?: RefLora): { logp: number; tokens: number } {
  const logits = referenceLogits(c, w, ids, lora);
  let logp = 0;
  let tokens = 0;
  for (let t = 1; t < ids.length; t++) {
    if (!lossMask[t]) continue;
    const row = logits[t - 1];
    const m = Math.max(...row);
    const lse = m + Math.log(row.reduce((a, x) => a + Math.exp(x - m), 0));
    logp += row[ids[t]] - lse;
    tokens++;
  }
  return { logp, tokens };
}
