/**
 * Phi-3 (HF `Phi3ForCausalLM`): llama's decoder with fused projections — `self_attn.qkv_proj`
 * `[(H + 2·KV)·hd, D]` (q rows, then k, then v) and `mlp.gate_up_proj` `[2·ffn, D]` (gate rows, then
 * up) — rotary embeddings over the first `partial_rotary_factor · head_dim` dims of each head (the
 * rest pass unrotated), and `sliding_window` when set (Phi-3-mini-4k: 2047), as in Mistral. LoRA
 * adapts the fused modules as PEFT does (`qkv_proj`, `o_proj`, `gate_up_proj`, `down_proj`).
 */
import { UserError } from '../errors.ts';
import type { LlamaConfig, LoraModule } from './family.ts';
import { activation } from './layers.ts';
import { llamaFamily } from './llama.ts';

function sizes(c: LlamaConfig) {
  return { d: c.hidden_size, q: c.num_attention_heads * c.head_dim, kv: c.num_key_value_heads * c.head_dim, ffn: c.intermediate_size };
}

export const PHI3 = llamaFamily({
  model_type: 'phi3',
  hfClass: 'Phi3ForCausalLM',
  defaults: { vocab_size: 32064, intermediate_size: 8192, max_position_embeddings: 4096, rms_norm_eps: 1e-5 },
  fields(r, c, where) {
    const factor = r.positive('partial_rotary_factor', 1);
    const rd = Math.floor(c.head_dim * factor);
    if (factor > 1 || rd < 2 || rd % 2 !== 0) throw new UserError(`${where}: partial_rotary_factor ${factor} × head_dim ${c.head_dim} must give an even rotary width between 2 and head_dim`);
    if (c.mlp_bias || c.attention_bias) throw new UserError(`${where}: phi3 projections have no biases ("attention_bias"/"mlp_bias" must be false)`);
    return { partial_rotary_factor: factor, sliding_window: r.raw.sliding_window == null ? null : r.int('sliding_window') };
  },
  preset: (tiny) => ({ partial_rotary_factor: 0.5, sliding_window: tiny ? 6 : 256 }),
  // llama.cpp's phi3 reads the fused qkv_proj and gate_up_proj (gate rows first) as they are and turns
  // the sliding window off: the GGUF context is cut to it.
  gguf: {
    arch: 'phi3',
    layer: { 'self_attn.qkv_proj.weight': 'attn_qkv.weight', 'mlp.gate_up_proj.weight': 'ffn_up.weight' },
    windowAsContext: true,
    activations: ['silu'],
  },
  layerShapes(c, p) {
    const { d, q, kv, ffn } = sizes(c);
    return [
      [p + 'input_layernorm.weight', [d]],
      [p + 'self_attn.qkv_proj.weight', [q + 2 * kv, d]],
      [p + 'self_attn.o_proj.weight', [d, q]],
      [p + 'post_attention_layernorm.weight', [d]],
      [p + 'mlp.gate_up_proj.weight', [2 * ffn, d]],
      [p + 'mlp.down_proj.weight', [d, ffn]],
    ];
  },
  projections(c, p): LoraModule[] {
    const { d, q, kv, ffn } = sizes(c);
    return [
      { name: p + 'self_attn.qkv_proj', in: d, out: q + 2 * kv, layout: 'linear' },
      { name: p + 'self_attn.o_proj', in: q, out: d, layout: 'linear' },
      { name: p + 'mlp.gate_up_proj', in: d, out: 2 * ffn, layout: 'linear' },
      { name: p + 'mlp.down_proj', in: ffn, out: d, layout: 'linear' },
    ];
  },
  biases: () => ({ qkv: false, o: false }),
  qkv(g, c, _p, x, proj) {
    const { q, kv } = sizes(c);
    const [a, b, v] = g.split(proj('self_attn.qkv_proj', x, false), [q, kv, kv], 1);
    return [a, b, v];
  },
  mlp(g, c, _p, x, proj) {
    const { ffn } = sizes(c);
    const [gate, up] = g.split(proj('mlp.gate_up_proj', x, false), [ffn, ffn], 1);
    return proj('mlp.down_proj', g.mul(activation(g, c.hidden_act, gate), up), false);
  },
  rotaryDim: (c) => Math.floor(c.head_dim * ((c.partial_rotary_factor as number | undefined) ?? 1)),
  window: (c) => (c.sliding_window as number | null | undefined) ?? null,
});
