/**
 * Mistral (HF `MistralForCausalLM`): llama's decoder with sliding-window attention — with
 * `sliding_window` W set, a token attends to at most the last W positions, itself included (HF's
 * mask: key position > query position − W). The window is part of the attention mask in the
 * training forward (src/models/layers.ts `windowed`) and of the cache mask in decoding; `null`
 * (Mistral v0.2 onwards) means plain causal attention.
 */
import type { LlamaConfig } from './family.ts';
import { llamaFamily } from './llama.ts';

export const MISTRAL = llamaFamily({
  model_type: 'mistral',
  hfClass: 'MistralForCausalLM',
  defaults: { vocab_size: 32000, intermediate_size: 14336, max_position_embeddings: 4096 * 32, num_key_value_heads: 8 },
  // llama.cpp runs Mistral as `llama`, without the window: the GGUF context is cut to it.
  gguf: { arch: 'llama', permuteQK: true, windowAsContext: true, activations: ['silu'], seventyBLayers: 80 },
  fields(r, _c, _where) {
    // HF's MistralConfig default is 4096; an explicit null turns the window off.
    return { sliding_window: r.raw.sliding_window === null ? null : r.int('sliding_window', 4096) };
  },
  // A window shorter than the demo and test sequences, so that it matters there.
  preset: (tiny) => ({ sliding_window: tiny ? 6 : 256 }),
  window: (c: LlamaConfig) => (c.sliding_window as number | null) ?? null,
});
