/**
 * Qwen3 (HF `Qwen3ForCausalLM`): llama's decoder with an RMSNorm over each head of q and k
 * (`self_attn.q_norm`, `self_attn.k_norm`, weight `[head_dim]`) before the rotary embedding, an
 * explicit `head_dim` (Qwen3-0.6B: 16 heads × 128 = 2048 ≠ hidden 1024), no q/k/v biases by default,
 * tied or untied head. Everything else is llama's (src/models/llama.ts), in training and decoding.
 */
import { UserError } from '../errors.ts';
import type { LlamaConfig } from './family.ts';
import { llamaFamily, llamaLayerShapes } from './llama.ts';
import { rmsNorm } from './layers.ts';

export const QWEN3 = llamaFamily({
  model_type: 'qwen3',
  hfClass: 'Qwen3ForCausalLM',
  defaults: { vocab_size: 151936, intermediate_size: 22016, max_position_embeddings: 32768, head_dim: 128, attention_bias: false },
  gguf: { arch: 'qwen3', layer: { 'self_attn.q_norm.weight': 'attn_q_norm.weight', 'self_attn.k_norm.weight': 'attn_k_norm.weight' }, activations: ['silu'] },
  fields(r, _c, where) {
    if (r.bool('use_sliding_window', false)) throw new UserError(`${where}: qwen3 with "use_sliding_window": true is not supported (its windowed layers differ by max_window_layers)`);
    return {};
  },
  released: {
    'qwen3-0.6b': {
      model_type: 'qwen3', vocab_size: 151936, hidden_size: 1024, intermediate_size: 3072, num_hidden_layers: 28, num_attention_heads: 16,
      num_key_value_heads: 8, head_dim: 128, max_position_embeddings: 40960, rms_norm_eps: 1e-6, rope_theta: 1000000, tie_word_embeddings: true,
      attention_bias: false, hidden_act: 'silu',
    },
  },
  layerShapes(c: LlamaConfig, p: string) {
    return [...llamaLayerShapes(c, p), [p + 'self_attn.q_norm.weight', [c.head_dim]], [p + 'self_attn.k_norm.weight', [c.head_dim]]];
  },
  headNorm(g, c, p, q, k, P) {
    return [rmsNorm(g, q, P.get(p + 'self_attn.q_norm.weight'), c.rms_norm_eps), rmsNorm(g, k, P.get(p + 'self_attn.k_norm.weight'), c.rms_norm_eps)];
  },
});
