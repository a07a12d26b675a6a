/**
 * The Llama family (Llama, Mistral-style and Qwen2 checkpoints) as an ONNX graph, following HF's
 * modeling code: pre-norm blocks of RMSNorm → attention with rotary embeddings (rotate-half
 * convention, inv_freq = 1/θ^(2i/d)) and grouped-query heads → residual, RMSNorm → SwiGLU MLP
 * down(act(gate(x)) · up(x)) → residual; a final RMSNorm. Parameters are looked up by their HF names.
 * `llamaHidden` is the training forward over a whole batch; `llamaDecode` the same model over S new
 * tokens per row with a key/value cache (keys cached after the rotary embedding).
 */
import type { Graph, Tensor } from '../onnx/graph.ts';
import { UserError } from '../errors.ts';
import { type LlamaConfig, attentionBiases } from './config.ts';
import { type BatchIndex, type DecodeIndex, activation, attention, cachedAttention, decodeHeads, extendCache, project, rmsNorm, splitHeads } from './layers.ts';
import type { Params } from './params.ts';

/** inv_freq[i] = 1/θ^(2i/d), i < d/2 (HF's default rotary frequencies). */
export function ropeInvFreq(theta: number, headDim: number): number[] {
  return Array.from({ length: headDim / 2 }, (_, i) => 1 / Math.pow(theta, (2 * i) / headDim));
}

function scalingNumber(s: Record<string, unknown>, key: string, dflt?: number): number {
  const v = s[key] ?? dflt;
  if (typeof v !== 'number' || !Number.isFinite(v) || v <= 0) {
    throw new UserError(`config.json: rope_scaling.${key} must be a positive number, got ${JSON.stringify(s[key])}`);
  }
  return v;
}

/**
 * Rotary frequencies of a config, with HF's `rope_scaling` variants that only rescale frequencies:
 * `linear` (positions divided by `factor`) and `llama3` (long wavelengths divided by `factor`, short
 * ones kept, a smooth blend between `original_max_position_embeddings / high_freq_factor` and
 * `/ low_freq_factor`). Other variants change attention itself and are refused.
 */
export function rotaryFrequencies(c: LlamaConfig): number[] {
  const base = ropeInvFreq(c.rope_theta, c.head_dim);
  const raw = c.rope_scaling as unknown;
  if (raw === undefined || raw === null) return base;
  if (typeof raw !== 'object' || Array.isArray(raw)) throw new UserError(`config.json: rope_scaling must be an object or null, got ${JSON.stringify(raw)}`);
  const s = raw as Record<string, unknown>;
  const type = s.rope_type ?? s.type;
  if (type === 'default') return base;
  if (type === 'linear') {
    const factor = scalingNumber(s, 'factor');
    return base.map((f) => f / factor);
  }
  if (type === 'llama3') {
    const factor = scalingNumber(s, 'factor');
    const low = scalingNumber(s, 'low_freq_factor', 1);
    const high = scalingNumber(s, 'high_freq_factor', 4);
    const original = scalingNumber(s, 'original_max_position_embeddings', 8192);
    const lowWavelen = original / low;
    const highWavelen = original / high;
    return base.map((f) => {
      const wavelen = (2 * Math.PI) / f;
      if (wavelen < highWavelen) return f;
      if (wavelen > lowWavelen) return f / factor;
      const smooth = (original / wavelen - low) / (high - low);
      return (1 - smooth) * (f / factor) + smooth * f;
    });
  }
  throw new UserError(`config.json: rope_scaling type ${JSON.stringify(type)} is not supported (supported: default, linear, llama3)`);
}

/** Rotate-half RoPE on the last axis (`[B, T, heads, hd]` or `[B, heads, S, hd]`): x·cos + rotate_half(x)·sin, rotate_half(x) = [−x₂, x₁]. */
function rope(g: Graph, x: Tensor, cos: Tensor, sin: Tensor, headDim: number): Tensor {
  const [x1, x2] = g.split(x, [headDim / 2, headDim / 2], -1);
  const rotated = g.concat([g.neg(x2), x1], -1);
  return g.add(g.mul(x, cos), g.mul(rotated, sin));
}

/** Final hidden states `[N, D]` (after the last RMSNorm). */
export function llamaHidden(g: Graph, c: LlamaConfig, P: Params, bi: BatchIndex): Tensor {
  const { dtype } = bi;
  const H = c.num_attention_heads;
  const KV = c.num_key_value_heads;
  const hd = c.head_dim;
  const bias = attentionBiases(c);
  const eps = c.rms_norm_eps;

  // cos/sin `[B, T, 1, hd]` from each token's position; the queries' copy carries the 1/√hd scale.
  const { cos, sin, cosQ, sinQ } = g.scope('rope', () => {
    const invFreq = g.constant(rotaryFrequencies(c), dtype, [hd / 2]);
    const freqs = g.mul(g.unsqueeze(g.cast(bi.positions, dtype), [2]), invFreq); // [B, T, hd/2]
    const emb = g.unsqueeze(g.concat([freqs, freqs], -1), [2]); // [B, T, 1, hd]
    const cos = g.cos(emb);
    const sin = g.sin(emb);
    const scale = 1 / Math.sqrt(hd);
    return { cos, sin, cosQ: g.mul(cos, scale), sinQ: g.mul(sin, scale) };
  });

  let h = g.scope('embed', () => g.gather(P.get('model.embed_tokens.weight'), bi.flatIds, 0)); // [N, D]
  for (let i = 0; i < c.num_hidden_layers; i++) {
    const p = `model.layers.${i}.`;
    h = g.scope(`layers.${i}`, () => {
      const proj = (name: string, x: Tensor, hasBias: boolean) =>
        project(g, x, P.get(p + name + '.weight'), hasBias ? P.get(p + name + '.bias') : null, 'linear', P.adapter(p + name));
      const attnOut = g.scope('attn', () => {
        const x = rmsNorm(g, h, P.get(p + 'input_layernorm.weight'), eps);
        const q = rope(g, splitHeads(g, bi, proj('self_attn.q_proj', x, bias.qkv), H, hd), cosQ, sinQ, hd);
        const k = rope(g, splitHeads(g, bi, proj('self_attn.k_proj', x, bias.qkv), KV, hd), cos, sin, hd);
        const v = splitHeads(g, bi, proj('self_attn.v_proj', x, bias.qkv), KV, hd);
        const ctx = attention(
          g,
          bi,
          g.transpose(q, [0, 2, 1, 3]), // [B, H, T, hd]
          g.transpose(k, [0, 2, 3, 1]), // [B, KV, hd, T]
          g.transpose(v, [0, 2, 1, 3]), // [B, KV, T, hd]
          H,
          KV,
          hd,
        );
        return proj('self_attn.o_proj', ctx, bias.o);
      });
      const h1 = g.add(h, attnOut);
      const mlpOut = g.scope('mlp', () => {
        const x = rmsNorm(g, h1, P.get(p + 'post_attention_layernorm.weight'), eps);
        const gate = activation(g, c.hidden_act, proj('mlp.gate_proj', x, c.mlp_bias));
        return proj('mlp.down_proj', g.mul(gate, proj('mlp.up_proj', x, c.mlp_bias)), c.mlp_bias);
      });
      return g.add(h1, mlpOut);
    });
  }
  return rmsNorm(g, h, P.get('model.norm.weight'), eps);
}

/** The output head's weight `[V, D]`: the embedding when tied. */
export function llamaHeadWeight(c: LlamaConfig, P: Params): Tensor {
  return P.get(c.tie_word_embeddings ? 'model.embed_tokens.weight' : 'lm_head.weight');
}

/** Final hidden states `[B·S, D]` of S new tokens per row, reading and extending the key/value cache `past`. */
export function llamaDecode(g: Graph, c: LlamaConfig, P: Params, ix: DecodeIndex, past: Map<string, Tensor> | null): Tensor {
  const H = c.num_attention_heads;
  const KV = c.num_key_value_heads;
  const hd = c.head_dim;
  const bias = attentionBiases(c);
  const { cos, sin } = g.scope('rope', () => {
    const inv = g.constant(rotaryFrequencies(c), 'float32', [hd / 2]);
    const f = g.mul(g.unsqueeze(g.cast(ix.positions, 'float32'), [2]), inv); // [B, S, hd/2]
    const emb = g.unsqueeze(g.concat([f, f], -1), [1]); // [B, 1, S, hd]
    return { cos: g.cos(emb), sin: g.sin(emb) };
  });
  let h = g.gather(P.get('model.embed_tokens.weight'), ix.flatIds, 0);
  for (let i = 0; i < c.num_hidden_layers; i++) {
    const p = `model.layers.${i}.`;
    const proj = (name: string, x: Tensor, hasBias: boolean) =>
      project(g, x, P.get(p + name + '.weight'), hasBias ? P.get(p + name + '.bias') : null, 'linear', P.adapter(p + name));
    h = g.scope(`layers.${i}`, () => {
      const x = rmsNorm(g, h, P.get(p + 'input_layernorm.weight'), c.rms_norm_eps);
      const q = g.mul(rope(g, decodeHeads(g, proj('self_attn.q_proj', x, bias.qkv), ix, H, hd), cos, sin, hd), 1 / Math.sqrt(hd));
      const kNew = rope(g, decodeHeads(g, proj('self_attn.k_proj', x, bias.qkv), ix, KV, hd), cos, sin, hd);
      const vNew = decodeHeads(g, proj('self_attn.v_proj', x, bias.qkv), ix, KV, hd);
      const [k, v] = extendCache(g, i, kNew, vNew, past);
      const h1 = g.add(h, proj('self_attn.o_proj', cachedAttention(g, ix, q, k, v, H, KV, hd), bias.o));
      const y = rmsNorm(g, h1, P.get(p + 'post_attention_layernorm.weight'), c.rms_norm_eps);
      const gate = activation(g, c.hidden_act, proj('mlp.gate_proj', y, c.mlp_bias));
      return g.add(h1, proj('mlp.down_proj', g.mul(gate, proj('mlp.up_proj', y, c.mlp_bias)), c.mlp_bias));
    });
  }
  return rmsNorm(g, h, P.get('model.norm.weight'), c.rms_norm_eps);
}

/** Cache geometry: layers, key/value heads, head size. */
export function llamaCacheShape(c: LlamaConfig): { layers: number; kvHeads: number; headDim: number } {
  return { layers: c.num_hidden_layers, kvHeads: c.num_key_value_heads, headDim: c.head_dim };
}
