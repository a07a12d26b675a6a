/**
 * Gemma, version 1 (HF `GemmaForCausalLM`): llama's decoder with the token embeddings multiplied by
 * √hidden_size, RMSNorm scaling by (1 + w) (its weights start at zero), a GeGLU MLP
 * down(gelu_tanh(gate(x)) · up(x)), `head_dim` from the config (Gemma-7B: 16 × 256 ≠ 3072), and the
 * head tied to the embedding. The MLP's activation is `hidden_activation` when the config names one,
 * else the tanh-approximated GELU: released Gemma configs say `"hidden_act": "gelu"`, which HF
 * overrides with the tanh approximation the models were trained with.
 */
import type { Activation, LlamaConfig } from './family.ts';
import { activation } from './layers.ts';
import { llamaFamily } from './llama.ts';

function mlpActivation(c: LlamaConfig): Activation {
  return c.hidden_activation as Activation;
}

export const GEMMA = llamaFamily({
  model_type: 'gemma',
  hfClass: 'GemmaForCausalLM',
  defaults: {
    vocab_size: 256000,
    intermediate_size: 24576,
    max_position_embeddings: 8192,
    num_hidden_layers: 28,
    num_attention_heads: 16,
    head_dim: 256,
    hidden_act: 'gelu_pytorch_tanh',
    tie_word_embeddings: true,
  },
  fields: (r) => ({ hidden_activation: r.activation('hidden_activation', 'gelu_pytorch_tanh') }),
  // llama.cpp's gemma: tanh-GELU, norms stored as 1 + w, the head always tied.
  gguf: { arch: 'gemma', normPlusOne: true, activations: ['gelu_pytorch_tanh', 'gelu_new', 'gelu_fast'], activation: mlpActivation },
  normInit: 0,
  embed: (g, c, P, flatIds) => g.mul(P.rows('model.embed_tokens.weight', flatIds), Math.sqrt(c.hidden_size)),
  normWeight: (g, w) => g.add(w, 1),
  mlp(g, c, _p, x, proj) {
    const gate = activation(g, mlpActivation(c), proj('mlp.gate_proj', x, c.mlp_bias));
    return proj('mlp.down_proj', g.mul(gate, proj('mlp.up_proj', x, c.mlp_bias)), c.mlp_bias);
  },
});
