/**
 * LoRA ("LoRA: Low-Rank Adaptation of Large Language Models", Hu et al. 2021): a projection W gains
 * W·x + (α/r)·B·A·x with A `[r, in]` random and B `[out, r]` zero, so training starts at the base
 * model. Adapter tensors are named `<module>.lora_A.weight` / `<module>.lora_B.weight` next to the
 * module's own weight. The base weights stay frozen; with adapters off the same weights give the
 * reference model, and `mergeLora` folds the adapters in for saving.
 */
import { UserError } from '../errors.ts';
import type { LoraModule } from './family.ts';

export type { LoraModule };
import type { FloatTensor } from './checkpoint.ts';
import type { ModelConfig } from './config.ts';
import { familyFor } from './families.ts';
import { Normal } from '../random.ts';

export interface LoraConfig {
  /** Rank r of the update. */
  rank: number;
  /** Scaling numerator: the update is multiplied by alpha / rank. */
  alpha: number;
  /**
   * Modules by name, matched against the end of the module path as PEFT does (`q_proj` matches every
   * layer's `self_attn.q_proj`, `c_proj` both of GPT-2's), or `all-linear` for every projection.
   */
  targets: string[];
}

export function loraScale(lora: LoraConfig): number {
  return lora.alpha / lora.rank;
}

/** Every projection of the architecture (the LM head and embeddings are not adapter targets). */
export function projectionModules(c: ModelConfig): LoraModule[] {
  return familyFor(c).projections(c);
}

/** Checks a LoRA config and returns the modules it adapts; an unmatched target is a user error. */
export function loraModules(c: ModelConfig, lora: LoraConfig): LoraModule[] {
  if (!Number.isInteger(lora.rank) || lora.rank < 1) throw new UserError(`lora rank must be a positive integer, got ${lora.rank}`);
  if (!Number.isFinite(lora.alpha) || lora.alpha <= 0) throw new UserError(`lora alpha must be a positive number, got ${lora.alpha}`);
  if (lora.targets.length === 0) throw new UserError('lora targets: name at least one module (e.g. q_proj,v_proj)');
  const all = projectionModules(c);
  if (lora.targets.includes('all-linear')) return all;
  const matches = (m: LoraModule, t: string) => m.name === t || m.name.endsWith('.' + t);
  for (const t of lora.targets) {
    if (!all.some((m) => matches(m, t))) {
      const leaves = [...new Set(all.map((m) => m.name.split('.').slice(-1)[0]))];
      throw new UserError(`lora target "${t}" matches no module of this ${c.model_type} model (modules: ${leaves.join(', ')}, or all-linear)`);
    }
  }
  return all.filter((m) => lora.targets.some((t) => matches(m, t)));
}

/** Names and shapes of the adapter tensors. */
export function loraParameterShapes(c: ModelConfig, lora: LoraConfig): Map<string, number[]> {
  const s = new Map<string, number[]>();
  for (const m of loraModules(c, lora)) {
    s.set(`${m.name}.lora_A.weight`, [lora.rank, m.in]);
    s.set(`${m.name}.lora_B.weight`, [m.out, lora.rank]);
  }
  return s;
}

/** Fresh adapters: A uniform in ±1/√in (PEFT's Kaiming-uniform bound), B zero. */
export function initLora(c: ModelConfig, lora: LoraConfig, seed: number): Map<string, FloatTensor> {
  const rng = new Normal(seed);
  const out = new Map<string, FloatTensor>();
  for (const m of loraModules(c, lora)) {
    const bound = 1 / Math.sqrt(m.in);
    const a = new Float32Array(lora.rank * m.in);
    for (let i = 0; i < a.length; i++) a[i] = (2 * rng.uniform() - 1) * bound;
    out.set(`${m.name}.lora_A.weight`, { shape: [lora.rank, m.in], data: a });
    out.set(`${m.name}.lora_B.weight`, { shape: [m.out, lora.rank], data: new Float32Array(m.out * lora.rank) });
  }
  return out;
}

/**
 * Folds adapters into their base weights (W += (α/r)·B·A, transposed for Conv1D), accumulating in
 * float64; returns new weights without adapter tensors. Inputs are not modified.
 */
export function mergeLora(weights: Map<string, FloatTensor>, c: ModelConfig, lora: LoraConfig): Map<string, FloatTensor> {
  const scale = loraScale(lora);
  const out = new Map<string, FloatTensor>();
  for (const [name, t] of weights) if (!name.includes('.lora_A.') && !name.includes('.lora_B.')) out.set(name, t);
  for (const m of loraModules(c, lora)) {
    const get = (n: string) => {
      const t = weights.get(n);
      if (!t) throw new UserError(`mergeLora: tensor "${n}" is missing`);
      return t;
    };
    const base = get(`${m.name}.weight`);
    const A = get(`${m.name}.lora_A.weight`).data;
    const B = get(`${m.name}.lora_B.weight`).data;
    const r = lora.rank;
    const merged = new Float32Array(base.data.length);
    for (let o = 0; o < m.out; o++) {
      for (let i = 0; i < m.in; i++) {
        let s = 0;
        for (let k = 0; k < r; k++) s += B[o * r + k] * A[k * m.in + i];
        const at = m.layout === 'linear' ? o * m.in + i : i * m.out + o;
        merged[at] = base.data[at] + scale * s;
      }
    }
    out.set(`${m.name}.weight`, { shape: base.shape, data: merged });
  }
  return out;
}
