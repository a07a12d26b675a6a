/**
 * Shared machinery of the pairwise losses: the batch views (host and graph), the options that sit
 * on top of any pairwise loss, and the factory that turns a small core into a LossModule.
 *
 * Options (each loss lists the ones it supports):
 * - `f_divergence` — the divergence of the KL-constrained objective, after "Beyond Reverse KL:
 *   Generalizing Direct Preference Optimization with Diverse Divergence Constraints" (2023). The
 *   log-ratio ℓ of each response is replaced by the score u = f′(π/π_ref) (constants dropped):
 *   reverse_kl u = ℓ (DPO); forward_kl u = −e^(−ℓ); js u = log σ(ℓ); alpha_divergence
 *   u = −e^(−αℓ)/α with α = `f_alpha` ∈ (0, 1). Exponents are capped (as TRL caps them at 80)
 *   at 300 in float64 and 40 in float32, so even the squared losses stay finite.
 * - `wpo` — "WPO: Enhancing RLHF with Weighted Preference Optimization" (2024): each pair's loss is
 *   multiplied by the stop-gradient weight exp(a_w/n_w + a_l/n_l), a = the sampling-aligned
 *   log-probs `chosen_wpo_logps`/`rejected_wpo_logps` when the trainer supplies them (they need the
 *   logits), else the policy log-probs (the paper's length-normalised sequence probability).
 * - `rpo_alpha` — "Iterative Reasoning Preference Optimization" (2024): adds α·(−logp(w)/n(w)),
 *   the per-token NLL of the chosen response.
 * - `rationale_weight` — "Data-Centric Human Preference Optimization with Rationales" (2024): adds
 *   γ·(−log π(r | x, y_w, y_l)), the summed NLL of the pair's rationale r (`policy_rationale_logps`),
 *   on rows whose `rationale_mask` is 1; rows without a rationale add nothing. Every loss built here
 *   takes it; the trainer lays out the rationale's prompt (src/train/rationale.ts).
 * - TR-DPO ("Learn Your Reference Model for Real Good Alignment", 2024) updates π_ref during
 *   training; that is the trainer's reference syncing (`sync_ref_model`), not a loss term.
 * - LD-DPO's `ld_alpha` changes how the policy log-probs are summed over tokens, so it is a trainer
 *   setting too (src/models/batch.ts), not a loss term.
 */
import type { Graph, Tensor } from '../../src/onnx/graph.ts';
import { UserError } from '../../src/errors.ts';
import { col, rows } from './batch.ts';
import { pairMetrics, pairMetricsRef, tieTolGraph, tieTolRef } from './metrics.ts';
import { logSigmoid as logSigmoidT, negLogSigmoid, softplus as softplusT } from './ops.ts';
import { logSigmoid, sigmoid, softplus } from './math.ts';
import type { BatchTensors, HostBatch, KeySet, LossModule, ParamSpec, Params, RefResult, EmitResult, Schedule } from './types.ts';

/**
 * Caps of the exponents of the f-divergence scores, per dtype: squared losses (IPO, SPPO) of e^cap
 * must stay finite (float32: (e^40)² ≈ 5.5e34; float64: (e^300)² ≈ 3.8e260). The float64
 * reference uses the float64 cap.
 */
export const F_EXP_CAP = { float32: 40, float64: 300 } as const;
const capOf = (dtype: string) => (dtype === 'float64' ? F_EXP_CAP.float64 : F_EXP_CAP.float32);

export const F_DIVERGENCES = ['reverse_kl', 'forward_kl', 'js', 'alpha_divergence'] as const;

export const OPTION_SPECS = {
  f_divergence: {
    name: 'f_divergence', type: 'enum', default: 'reverse_kl', choices: F_DIVERGENCES,
    doc: 'divergence of the constraint: the log-ratio ℓ becomes the score f′(π/π_ref)',
  },
  f_alpha: {
    name: 'f_alpha', type: 'number', default: 0.5, min: 0, max: 1, minOpen: true, maxOpen: true,
    doc: 'α of the alpha_divergence score −e^(−αℓ)/α',
  },
  wpo: { name: 'wpo', type: 'boolean', default: false, doc: 'weight each pair by exp(a_w/n_w + a_l/n_l) (WPO)' },
  rpo_alpha: {
    name: 'rpo_alpha', type: 'number', default: 0, min: 0, doc: 'adds α·(−logp(w)/n(w)), the NLL of the chosen response (RPO)',
  },
  rationale_weight: {
    name: 'rationale_weight', type: 'number', default: 0, min: 0,
    doc: 'adds γ·(−log π(rationale | prompt, chosen, rejected)) on rows that have a rationale',
  },
} satisfies Record<string, ParamSpec>;

/** The option parameters of a loss that supports all of them (its Params interface extends this). */
export interface PairOptions extends Params {
  f_divergence: string;
  f_alpha: number;
  wpo: boolean;
  rpo_alpha: number;
}

/** Batch keys of the rationale term: the policy's summed log-prob of each row's rationale, and 1 where a row has one. */
export const RATIONALE_KEYS = ['policy_rationale_logps', 'rationale_mask'] as const;

/** Parameters the pairwise options read (present when the loss supports them). */
interface OptionParams {
  f_divergence?: string;
  f_alpha?: number;
  wpo?: boolean;
  rpo_alpha?: number;
  rationale_weight?: number;
  beta?: number;
}

const LOGP_KEYS = ['policy_chosen_logps', 'policy_rejected_logps'];
const REF_KEYS = ['ref_chosen_logps', 'ref_rejected_logps'];

// ---- host (float64) view ----------------------------------------------------------------------

/** Float64 score u = f(ℓ) and its slope du/dℓ. */
export function scoreRef(p: OptionParams, l: number): [number, number] {
  switch (p.f_divergence ?? 'reverse_kl') {
    case 'forward_kl': {
      const t = -l;
      const e = Math.exp(Math.min(t, F_EXP_CAP.float64));
      return [-e, t < F_EXP_CAP.float64 ? e : 0];
    }
    case 'js':
      return [logSigmoid(l), sigmoid(-l)];
    case 'alpha_divergence': {
      const a = p.f_alpha!;
      const t = -a * l;
      const e = Math.exp(Math.min(t, F_EXP_CAP.float64));
      return [-e / a, t < F_EXP_CAP.float64 ? e : 0];
    }
    default:
      return [l, 1];
  }
}

/** Columns of a pairwise batch plus derived log-ratios and scores (computed on first use). */
export class PairHost {
  readonly B: number;
  private memo = new Map<string, Float64Array>();
  constructor(readonly batch: HostBatch, readonly p: OptionParams) {
    this.B = rows(batch);
  }
  key(k: string): Float64Array { return col(this.batch, k); }
  has(k: string): boolean { return k in this.batch; }
  get pw() { return this.key('policy_chosen_logps'); }
  get pl() { return this.key('policy_rejected_logps'); }
  get nw() { return this.key('chosen_tokens'); }
  get nl() { return this.key('rejected_tokens'); }
  private cached(name: string, f: () => Float64Array): Float64Array {
    let v = this.memo.get(name);
    if (!v) this.memo.set(name, (v = f()));
    return v;
  }
  /** ℓ(w) = logp(w) − ref(w). */
  get lw() { return this.cached('lw', () => this.pw.map((x, i) => x - this.key('ref_chosen_logps')[i])); }
  get ll() { return this.cached('ll', () => this.pl.map((x, i) => x - this.key('ref_rejected_logps')[i])); }
  /** Scores u = f(ℓ) (= ℓ under reverse KL) and slopes du/dℓ. */
  get uw() { return this.cached('uw', () => this.lw.map((l) => scoreRef(this.p, l)[0])); }
  get ul() { return this.cached('ul', () => this.ll.map((l) => scoreRef(this.p, l)[0])); }
  get duw() { return this.cached('duw', () => this.lw.map((l) => scoreRef(this.p, l)[1])); }
  get dul() { return this.cached('dul', () => this.ll.map((l) => scoreRef(this.p, l)[1])); }
}

/** Per-pair loss values and their derivatives w.r.t. the chosen/rejected policy log-probs. */
export interface PairCoreRef {
  value: Float64Array;
  dw: Float64Array;
  dl: Float64Array;
  /** Implicit rewards for the metrics (default β·ℓ). */
  /** Implicit rewards for the metrics; `tol`: per-pair tie tolerance of the accuracy (metrics.ts). */
  rewards?: { chosen: Float64Array; rejected: Float64Array; tol?: Float64Array };
}

/**
 * The reference of a loss whose value on pair i depends on pair i alone: `row(i)` gives
 * [value, ∂value/∂(chosen log-prob), ∂value/∂(rejected log-prob)].
 */
export function perPairRef(B: number, row: (i: number) => readonly [number, number, number]): PairCoreRef {
  const value = new Float64Array(B);
  const dw = new Float64Array(B);
  const dl = new Float64Array(B);
  for (let i = 0; i < B; i++) [value[i], dw[i], dl[i]] = row(i);
  return { value, dw, dl };
}

/**
 * The reference of a loss f(x, y) of each response's own scaled score, x = βu_w and y = βu_l:
 * `f` gives [value, ∂f/∂x, ∂f/∂y], and the chain rule through β and the scores is applied here.
 */
export function responseScoresRef(h: PairHost, beta: number, f: (x: number, y: number) => readonly [number, number, number]): PairCoreRef {
  return perPairRef(h.B, (i) => {
    const [value, dx, dy] = f(beta * h.uw[i], beta * h.ul[i]);
    return [value, beta * h.duw[i] * dx, beta * h.dul[i] * dy];
  });
}

// ---- graph view --------------------------------------------------------------------------------

/** Batch tensors of a pairwise batch plus derived log-ratios and scores (emitted on first use). */
export class PairGraph {
  private memo = new Map<string, Tensor>();
  constructor(readonly g: Graph, readonly inputs: BatchTensors, readonly p: OptionParams) {}
  key(k: string): Tensor {
    const t = this.inputs[k];
    if (!t) throw new Error(`pairwise emitter: batch tensor ${k} missing`);
    return t;
  }
  has(k: string): boolean { return k in this.inputs; }
  get pw() { return this.key('policy_chosen_logps'); }
  get pl() { return this.key('policy_rejected_logps'); }
  get nw() { return this.key('chosen_tokens'); }
  get nl() { return this.key('rejected_tokens'); }
  private cached(name: string, f: () => Tensor): Tensor {
    let v = this.memo.get(name);
    if (!v) this.memo.set(name, (v = f()));
    return v;
  }
  get lw() { return this.cached('lw', () => this.g.sub(this.pw, this.key('ref_chosen_logps'))); }
  get ll() { return this.cached('ll', () => this.g.sub(this.pl, this.key('ref_rejected_logps'))); }
  get uw() { return this.cached('uw', () => scoreGraph(this.g, this.p, this.lw)); }
  get ul() { return this.cached('ul', () => scoreGraph(this.g, this.p, this.ll)); }
}

/** The score u = f(ℓ) in the graph. */
export function scoreGraph(g: Graph, p: OptionParams, l: Tensor): Tensor {
  switch (p.f_divergence ?? 'reverse_kl') {
    case 'forward_kl':
      return g.neg(g.exp(g.clip(g.neg(l), undefined, capOf(l.dtype))));
    case 'js':
      return logSigmoidT(g, l);
    case 'alpha_divergence': {
      const a = p.f_alpha!;
      return g.mul(g.exp(g.clip(g.mul(l, -a), undefined, capOf(l.dtype))), -1 / a);
    }
    default:
      return l;
  }
}

export interface PairCoreEmit {
  perExample: Tensor;
  rewards?: { chosen: Tensor; rejected: Tensor; tol?: Tensor };
}

// ---- the factory -------------------------------------------------------------------------------

export interface PairwiseDef<P extends Params> {
  name: string;
  paper: string;
  params: readonly ParamSpec[];
  /** Which options apply (f_divergence only where the loss is written on scores, as in TRL). */
  options: readonly ('f_divergence' | 'wpo' | 'rpo_alpha')[];
  /** Base keys; default the four log-prob columns. */
  keys?: (p: P) => string[];
  /** False when a pair's loss depends on other pairs (AOT). */
  rowwise?: boolean;
  schedule?: Schedule;
  check?: (p: P) => void;
  ref: (h: PairHost, p: P) => PairCoreRef;
  emit: (t: PairGraph, p: P) => PairCoreEmit;
}

function requiredKeys(def: PairwiseDef<Params>, p: Params): string[] {
  const base = def.keys ? def.keys(p) : [...LOGP_KEYS, ...REF_KEYS];
  const extra: string[] = [];
  if (p.wpo) extra.push(...LOGP_KEYS, 'chosen_tokens', 'rejected_tokens');
  if (((p.rpo_alpha as number | undefined) ?? 0) > 0) extra.push('policy_chosen_logps', 'chosen_tokens');
  if (((p.rationale_weight as number | undefined) ?? 0) > 0) extra.push(...RATIONALE_KEYS);
  return [...new Set([...base, ...extra])];
}

/** Builds a pairwise LossModule from its core: options, row weights and metrics are added here. */
export function pairwiseLoss<P extends Params>(def: PairwiseDef<P>): LossModule<P> {
  const params: ParamSpec[] = [
    ...def.params,
    ...def.options.flatMap((o): ParamSpec[] => (o === 'f_divergence' ? [OPTION_SPECS.f_divergence, OPTION_SPECS.f_alpha] : [OPTION_SPECS[o]])),
    OPTION_SPECS.rationale_weight,
  ];
  const d = def as unknown as PairwiseDef<Params>;
  return {
    name: def.name,
    paper: def.paper,
    kind: 'pairwise',
    kinds: ['pairwise'],
    params,
    rowwise: def.rowwise ?? true,
    schedule: def.schedule,
    check(p: P) {
      if (p.wpo && def.rowwise === false) throw new UserError(`loss ${def.name}: wpo weighting is not defined for a loss that sorts the batch`);
      def.check?.(p);
    },
    keys(p: P): KeySet {
      const optional = ['weight'];
      if (p.wpo) optional.push('chosen_wpo_logps', 'rejected_wpo_logps');
      return { required: requiredKeys(d, p), optional };
    },
    grads(p: P): string[] {
      return [...LOGP_KEYS, 'policy_rationale_logps'].filter((k) => requiredKeys(d, p).includes(k));
    },
    ref(batch: HostBatch, p: P, coef: Float64Array): RefResult {
      const h = new PairHost(batch, p);
      const core = def.ref(h, p);
      const value = Float64Array.from(core.value);
      const dw = Float64Array.from(core.dw);
      const dl = Float64Array.from(core.dl);
      if (p.wpo) {
        const aw = h.has('chosen_wpo_logps') ? h.key('chosen_wpo_logps') : h.pw;
        const al = h.has('rejected_wpo_logps') ? h.key('rejected_wpo_logps') : h.pl;
        for (let i = 0; i < h.B; i++) {
          const w = Math.exp(aw[i] / h.nw[i] + al[i] / h.nl[i]);
          value[i] *= w;
          dw[i] *= w;
          dl[i] *= w;
        }
      }
      const alpha = (p.rpo_alpha as number | undefined) ?? 0;
      if (alpha > 0) {
        for (let i = 0; i < h.B; i++) {
          value[i] += (alpha * -h.pw[i]) / h.nw[i];
          dw[i] += -alpha / h.nw[i];
        }
      }
      const grad: Record<string, Float64Array> = {};
      const keys = requiredKeys(d, p);
      if (keys.includes('policy_chosen_logps')) grad.policy_chosen_logps = dw.map((v, i) => v * coef[i]);
      if (keys.includes('policy_rejected_logps')) grad.policy_rejected_logps = dl.map((v, i) => v * coef[i]);
      const gamma = (p.rationale_weight as number | undefined) ?? 0;
      let rationaleNll: number | undefined;
      if (gamma > 0) {
        const lr = h.key('policy_rationale_logps');
        const m = h.key('rationale_mask');
        for (let i = 0; i < h.B; i++) value[i] += gamma * m[i] * -lr[i];
        grad.policy_rationale_logps = m.map((v, i) => -gamma * v * coef[i]);
        const n = m.reduce((a, v) => a + v, 0);
        rationaleNll = m.reduce((a, v, i) => a + v * -lr[i], 0) / Math.max(n, 1);
      }
      const rewards = core.rewards ?? defaultRewardsRef(h, p);
      const metrics = rewards
        ? pairMetricsRef(rewards.chosen, rewards.rejected, h.has('policy_chosen_logps') ? h.pw : undefined, h.has('policy_rejected_logps') ? h.pl : undefined, rewards.tol)
        : undefined;
      return { perExample: Array.from(value), grad, metrics: rationaleNll !== undefined ? { ...metrics, 'nll/rationale': rationaleNll } : metrics };
    },
    emit(g: Graph, inputs: BatchTensors, p: P): EmitResult {
      return g.scope(def.name, () => {
        const t = new PairGraph(g, inputs, p);
        const core = def.emit(t, p);
        let per = core.perExample;
        if (p.wpo) {
          const aw = t.has('chosen_wpo_logps') ? t.key('chosen_wpo_logps') : t.pw;
          const al = t.has('rejected_wpo_logps') ? t.key('rejected_wpo_logps') : t.pl;
          const w = g.stopGradient(g.exp(g.add(g.div(aw, t.nw), g.div(al, t.nl))));
          per = g.mul(per, w);
        }
        const alpha = (p.rpo_alpha as number | undefined) ?? 0;
        if (alpha > 0) per = g.add(per, g.mul(g.div(t.pw, t.nw), -alpha));
        const gamma = (p.rationale_weight as number | undefined) ?? 0;
        let rationaleNll: Tensor | undefined;
        if (gamma > 0) {
          // mask · (−logp(r)); masked rows read a log-prob of 0 but are multiplied out anyway.
          const nll = g.mul(t.key('rationale_mask'), g.neg(t.key('policy_rationale_logps')));
          per = g.add(per, g.mul(nll, gamma));
          const n = g.max(g.reduceSum(t.key('rationale_mask'), undefined, false), g.constant(1, nll.dtype));
          rationaleNll = g.stopGradient(g.div(g.reduceSum(nll, undefined, false), n));
        }
        const rewards = core.rewards ?? defaultRewardsGraph(t, p);
        const metrics = rewards
          ? pairMetrics(g, rewards.chosen, rewards.rejected, t.has('policy_chosen_logps') ? t.pw : undefined, t.has('policy_rejected_logps') ? t.pl : undefined, rewards.tol)
          : undefined;
        return { perExample: per, metrics: rationaleNll ? { ...metrics, 'nll/rationale': rationaleNll } : metrics };
      });
    },
  };
}

/** β·ℓ (TRL's implicit rewards) when the batch has the reference columns. */
function defaultRewardsRef(h: PairHost, p: OptionParams): PairCoreRef['rewards'] {
  if (!REF_KEYS.every((k) => h.has(k)) || !LOGP_KEYS.every((k) => h.has(k))) return undefined;
  const b = p.beta ?? 1;
  return { chosen: h.lw.map((v) => b * v), rejected: h.ll.map((v) => b * v), tol: tieTolRef(b, h.pw, h.key('ref_chosen_logps'), h.pl, h.key('ref_rejected_logps')) };
}

function defaultRewardsGraph(t: PairGraph, p: OptionParams): PairCoreEmit['rewards'] {
  if (![...REF_KEYS, ...LOGP_KEYS].every((k) => t.has(k))) return undefined;
  const b = p.beta ?? 1;
  return { chosen: t.g.mul(t.lw, b), rejected: t.g.mul(t.ll, b), tol: tieTolGraph(t.g, b, t.pw, t.key('ref_chosen_logps'), t.pl, t.key('ref_rejected_logps')) };
}

/** Per-pair result of a loss written on one margin z per pair: value f(z), slope f′(z), and dz/dinputs. */
export function marginRef(
  B: number, z: (i: number) => number, f: (z: number) => [number, number], dzw: (i: number) => number, dzl: (i: number) => number,
): PairCoreRef {
  const value = new Float64Array(B);
  const dw = new Float64Array(B);
  const dl = new Float64Array(B);
  for (let i = 0; i < B; i++) {
    const [v, s] = f(z(i));
    value[i] = v;
    dw[i] = s * dzw(i);
    dl[i] = s * dzl(i);
  }
  return { value, dw, dl };
}


/** (1−ε)·(−log σ(z)) + ε·(−log σ(−z)) (logistic loss with label smoothing ε) and its slope in z. */
export function logisticRef(z: number, eps: number): [number, number] {
  return [(1 - eps) * softplus(-z) + eps * softplus(z), -(1 - eps) * sigmoid(-z) + eps * sigmoid(z)];
}

export function logisticGraph(g: Graph, z: Tensor, eps: number): Tensor {
  const main = negLogSigmoid(g, z);
  if (eps === 0) return main;
  return g.add(g.mul(main, 1 - eps), g.mul(softplusT(g, z), eps));
}
