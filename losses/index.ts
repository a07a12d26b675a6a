/**
 * The loss zoo's registry: every loss by name, weighted mixtures (`dpo:0.8,bco_pair:0.2,sft:1`),
 * and `resolveLoss`, which binds parameters and gives the one object trainers and the CLI use.
 */
import type { Graph, Tensor } from '../src/onnx/graph.ts';
import { UserError } from '../src/errors.ts';
import { parseParams, findSpec } from './core/params.ts';
import { rows } from './core/batch.ts';
import { mean } from './core/ops.ts';
import { dpo } from './dpo.ts';
import { ipo } from './ipo.ts';
import { rdpo } from './rdpo.ts';
import { dro } from './dro.ts';
import { mpo } from './mpo.ts';
import { lipo } from './lipo.ts';
import { sppo, sppoHard } from './sppo.ts';
import { nashMd } from './nash_md.ts';
import { hinge } from './hinge.ts';
import { exoPair } from './exo_pair.ts';
import { ncaPair } from './nca_pair.ts';
import { bcoPair } from './bco_pair.ts';
import { aot, aotUnpaired } from './aot.ts';
import { apoDown, apoZero } from './apo.ts';
import { discopop } from './discopop.ts';
import { sigmoidNorm } from './sigmoid_norm.ts';
import { sft } from './sft.ts';
import { simpo } from './simpo.ts';
import { orpo } from './orpo.ts';
import { kto } from './kto.ts';
import { grpo } from './grpo.ts';
import { gkd } from './gkd.ts';
import { bradleyTerry } from './bradley_terry.ts';
import type { BatchTensors, HostBatch, Kind, KeySet, LossModule, Params, Schedule } from './core/types.ts';

export type { Kind, LossModule, Schedule, Params, HostBatch, HostTensor, BatchTensors, ParamSpec, KeySet } from './core/types.ts';
export { mpoSplit, quantile } from './mpo.ts';
export { GRPO_LOSS_TYPES, type GrpoParams } from './grpo.ts';

// eslint-disable-next-line @typescript-eslint/no-explicit-any
type AnyLoss = LossModule<any>;

/** Tier 1 first, then Tier 2, as in docs/losses.md. */
const REGISTRY: readonly AnyLoss[] = [
  dpo, ipo, rdpo, dro, mpo, lipo, sppo, sppoHard, nashMd,
  hinge, exoPair, ncaPair, bcoPair, aot, aotUnpaired, apoZero, apoDown, discopop, sigmoidNorm, sft, simpo, orpo, kto,
  grpo, gkd, bradleyTerry,
];

export function listLosses(): readonly LossModule[] {
  return REGISTRY as readonly LossModule[];
}

export function getLoss(name: string): LossModule {
  const l = REGISTRY.find((m) => m.name === name);
  if (!l) throw new UserError(`unknown loss "${name}"; available: ${REGISTRY.map((m) => m.name).join(', ')}`);
  return l as LossModule;
}

/**
 * The schedule a loss spec trains under: a lone loss name's own (`LossModule.schedule`); a mixture,
 * or a name the registry lacks (the run itself reports it), trains as one run.
 */
export function scheduleOf(spec: string): Schedule {
  return REGISTRY.find((m) => m.name === spec.trim())?.schedule ?? 'single';
}

export interface LossTerm {
  name: string;
  weight: number;
}

/** Parses `name` or `name:weight,name:weight,...` (weights finite and > 0; names unique). */
export function parseLossSpec(spec: string): LossTerm[] {
  const parts = spec.split(',').map((s) => s.trim());
  if (parts.length === 0 || parts.some((s) => s === '')) throw new UserError(`loss spec "${spec}" has an empty term; expected e.g. dpo or dpo:0.8,sft:1`);
  const terms = parts.map((part) => {
    const m = /^([a-z0-9_]+)(?::(.+))?$/.exec(part);
    if (!m) throw new UserError(`loss spec term "${part}" must be name or name:weight`);
    const weight = m[2] === undefined ? 1 : Number(m[2]);
    if (!Number.isFinite(weight) || weight <= 0) throw new UserError(`weight of loss ${m[1]} in "${spec}" must be a number > 0, got "${m[2]}"`);
    getLoss(m[1]);
    return { name: m[1], weight };
  });
  const dup = terms.find((t, i) => terms.findIndex((u) => u.name === t.name) !== i);
  if (dup) throw new UserError(`loss ${dup.name} appears twice in "${spec}"`);
  return terms;
}

export interface BoundTerm {
  loss: LossModule;
  weight: number;
  params: Params;
}

/** Float64 result on one batch: weighted mean loss, per-row values, gradients of the mean. */
export interface ReferenceOutput {
  loss: number;
  perExample: number[];
  grad: Record<string, Float64Array>;
  metrics: Record<string, number>;
}

export interface EmitOutput {
  /** Scalar (weighted) mean loss — what training differentiates. */
  loss: Tensor;
  /** Per-row loss [B] (the mixture's weighted sum). */
  perExample: Tensor;
  metrics: Record<string, Tensor>;
}

/** Picks the kind of a batch from its keys (SPPO reads pairs or lists). */
export function kindOfKeys(kinds: readonly Kind[], has: (k: string) => boolean, policyRank: number | undefined): Kind {
  if (kinds.length === 1) return kinds[0];
  if (has('policy_chosen_logps') && kinds.includes('pairwise')) return 'pairwise';
  if (policyRank === 2 && kinds.includes('listwise')) return 'listwise';
  return kinds.find((k) => k === 'single' || k === 'nash_md') ?? kinds[0];
}

/** A loss (or mixture) with its parameters bound: what the trainer and the CLI call. */
export class BoundLoss {
  constructor(readonly spec: string, readonly terms: readonly BoundTerm[]) {}

  /** Kinds every term accepts. */
  get kinds(): Kind[] {
    return this.terms[0].loss.kinds.filter((k) => this.terms.every((t) => t.loss.kinds.includes(k)));
  }

  get rowwise(): boolean {
    return this.terms.every((t) => t.loss.rowwise);
  }

  keys(kind: Kind): KeySet {
    const sets = this.terms.map((t) => t.loss.keys(t.params, kind));
    const required = [...new Set(sets.flatMap((s) => s.required))];
    const optional = [...new Set(sets.flatMap((s) => s.optional))].filter((k) => !required.includes(k));
    const oneOf = sets.find((s) => s.oneOf)?.oneOf;
    return oneOf ? { required, optional, oneOf } : { required, optional };
  }

  /** Differentiable keys of this kind (union over the terms, in a stable order). */
  grads(kind: Kind): string[] {
    return [...new Set(this.terms.flatMap((t) => t.loss.grads(t.params, kind)))];
  }

  kindOf(batch: HostBatch): Kind {
    return kindOfKeys(this.kinds, (k) => k in batch, batch.policy_logps?.dims.length);
  }

  private coef(batch: HostBatch): Float64Array {
    const B = rows(batch);
    if (!batch.weight) return new Float64Array(B).fill(1 / B);
    if (!this.rowwise) throw new UserError(`loss ${this.spec} sorts the batch, so rows cannot carry a "weight"`);
    const w = batch.weight.data;
    const s = w.reduce((a, b) => a + b, 0);
    return w.map((v) => v / s);
  }

  /** Float64 reference on a validated batch. */
  reference(batch: HostBatch): ReferenceOutput {
    const kind = this.kindOf(batch);
    const coef = this.coef(batch);
    const B = coef.length;
    const per = new Array<number>(B).fill(0);
    const grad: Record<string, Float64Array> = {};
    const metrics: Record<string, number> = {};
    for (const t of this.terms) {
      const r = t.loss.ref(batch, t.params, coef, kind);
      r.perExample.forEach((v, i) => (per[i] += t.weight * v));
      for (const [k, gk] of Object.entries(r.grad)) {
        const acc = (grad[k] ??= new Float64Array(gk.length));
        gk.forEach((v, i) => (acc[i] += t.weight * v));
      }
      for (const [k, v] of Object.entries(r.metrics ?? {})) if (!(k in metrics)) metrics[k] = v;
    }
    const loss = per.reduce((a, v, i) => a + coef[i] * v, 0);
    return { loss, perExample: per, grad, metrics: { loss, ...metrics } };
  }

  /** Appends the loss to a graph whose batch tensors are `inputs` (float32 or float64, [B] / [B, K]). */
  emit(g: Graph, inputs: BatchTensors, kind?: Kind): EmitOutput {
    const k = kind ?? kindOfKeys(this.kinds, (key) => key in inputs, inputs.policy_logps?.shape?.length);
    if (inputs.weight && !this.rowwise) throw new UserError(`loss ${this.spec} sorts the batch, so rows cannot carry a "weight"`);
    let per: Tensor | undefined;
    const metrics: Record<string, Tensor> = {};
    for (const t of this.terms) {
      const r = t.loss.emit(g, inputs, t.params, k);
      const scaled = t.weight === 1 ? r.perExample : g.mul(r.perExample, t.weight);
      per = per ? g.add(per, scaled) : scaled;
      for (const [name, v] of Object.entries(r.metrics ?? {})) if (!(name in metrics)) metrics[name] = v;
    }
    const w = inputs.weight;
    const loss = w ? g.div(g.reduceSum(g.mul(per!, w), undefined, false), g.reduceSum(w, undefined, false)) : mean(g, per!);
    return { loss, perExample: per!, metrics };
  }
}

/**
 * Binds a loss spec and raw parameters (CLI strings or config values). In a mixture, `name.param`
 * sets one term's parameter and a plain `param` every term that has it.
 */
export function resolveLoss(spec: string, raw: Record<string, unknown> = {}): BoundLoss {
  const terms = parseLossSpec(spec);
  const perTerm = new Map<string, Record<string, unknown>>(terms.map((t) => [t.name, {}]));
  for (const [key, value] of Object.entries(raw)) {
    const dot = key.indexOf('.');
    if (dot > 0) {
      const target = perTerm.get(key.slice(0, dot));
      if (!target) throw new UserError(`parameter ${key} names loss ${key.slice(0, dot)}, which is not in "${spec}"`);
      target[key.slice(dot + 1)] = value;
      continue;
    }
    const takers = terms.filter((t) => findSpec(getLoss(t.name).params, key));
    if (takers.length === 0 && terms.length > 1) {
      const valid = terms.map((t) => `${t.name}: ${getLoss(t.name).params.map((p) => p.name).join(', ') || '(none)'}`).join('; ');
      throw new UserError(`unknown parameter "${key}" for ${spec}; valid parameters — ${valid}`);
    }
    for (const t of takers.length ? takers : terms) perTerm.get(t.name)![key] = value;
  }
  const bound = terms.map((t) => {
    const loss = getLoss(t.name);
    const params = parseParams(t.name, loss.params, perTerm.get(t.name)!);
    loss.check?.(params);
    return { loss, weight: t.weight, params };
  });
  const b = new BoundLoss(spec, bound);
  if (b.kinds.length === 0) {
    throw new UserError(`losses in "${spec}" read different kinds of data (${terms.map((t) => `${t.name}: ${getLoss(t.name).kinds.join('/')}`).join(', ')})`);
  }
  return b;
}
