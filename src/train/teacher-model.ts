/**
 * The teacher of `distill` and `grpo --teacher`: one model folder, or AlignDistil's teacher (Zhang et
 * al., "AlignDistil: Token-Level Language Model Alignment as Adaptive Policy Distillation", ACL 2025):
 * a DPO model and its reference combined in logit space,
 *
 *   z* = z_ref + w·(z_dpo − z_ref) = (1 − w)·z_ref + w·z_dpo,   π* = softmax(z*)
 *
 * with w the paper's β₀/β (the DPO model's β over the RLHF objective's); w = 1 is the DPO model, w > 1
 * extrapolates past it. (The paper's token-adaptive w and its contrastive reverse-DPO pair are not
 * built: w is one number for the run.) It is the geometric mixture the generation engine samples
 * Nash-MD's opponent from, softmax(Σ w_i·z_i), with weights (1 − w, w).
 *
 * In a graph the pair is one `CausalLM` whose hidden rows are [(1 − w)·h_ref, w·h_dpo] and whose head
 * is [W_ref, W_dpo] (concatenated along the model dimension), so hidden·headᵀ = (1 − w)·z_ref + w·z_dpo
 * and everything that reads a model's hidden rows and head (the top-K graph, the per-token log-probs,
 * the temperature) reads the combination unchanged. The reference's parameters are the graph inputs
 * `teacher_ref.<name>`.
 */
import { existsSync } from 'node:fs';
import { join, resolve } from 'node:path';
import { UserError } from '../errors.ts';
import type { FloatTensor } from '../models/checkpoint.ts';
import type { ModelConfig } from '../models/config.ts';
import { Decoder, type MixturePart } from '../models/generate.ts';
import { buildCausalLM, type CausalLM, type CausalLMInputs } from '../models/index.ts';
import { loadModel } from '../models/load.ts';
import { declareParameters, modelParameterShapes } from '../models/params.ts';
import type { Graph } from '../onnx/graph.ts';
import { toOrt, type Feeds, type RuntimeOptions } from '../runtime/session.ts';
import { loadTokenizer, type LoadedTokenizer } from '../tokenize/index.ts';
import { modelStamps, type FileStamp } from './identity.ts';
import { defineSettings } from './settings.ts';
import { checkSameTokenizer } from './teacher-topk.ts';

/** The AlignDistil weight, a setting of `distill` and `grpo` (given without `--teacher-ref`, refused). */
export const TEACHER_SETTINGS = defineSettings({
  teacher_weight: {
    type: 'number', default: 1, min: 0, max: 1000, group: 'Teacher', paper: 'AlignDistil (Zhang et al. 2025): β₀/β',
    doc: "with --teacher-ref: w in the teacher's logits z_ref + w·(z_dpo − z_ref), --teacher the DPO model and --teacher-ref its reference (1: the DPO model; > 1 extrapolates)",
  },
});

/** Prefix of the AlignDistil reference's parameters in a teacher graph. */
const REF_PREFIX = 'teacher_ref.';

/** A loaded model: its config and weights. */
interface Loaded {
  config: ModelConfig;
  weights: Map<string, FloatTensor>;
}

/** How a teacher is named: `--teacher`, and for AlignDistil `--teacher-ref` and `teacher_weight`. */
export class TeacherSpec {
  private constructor(
    readonly dir: string,
    readonly ref: string | null,
    readonly weight: number,
  ) {}

  /**
   * The teacher of a run, checked: folders with a config.json, a weight only with a reference, and
   * (for AlignDistil) a reference with the teacher's tokenizer and embedding rows. `weight` is
   * teacher_weight when it was named, else undefined (1: the DPO model).
   */
  static of(dir: string, ref: string | undefined, weight: number | undefined): TeacherSpec {
    if (!existsSync(join(dir, 'config.json'))) throw new UserError(`--teacher ${dir}: not a model folder (no config.json)`, { setting: 'teacher' });
    if (ref === undefined) {
      if (weight !== undefined) throw new UserError(`teacher_weight=${weight}: weighs an AlignDistil teacher's DPO model against its reference; give --teacher-ref (the DPO model's reference), or leave teacher_weight out`, { setting: 'teacher_weight' });
      return new TeacherSpec(dir, null, 1);
    }
    if (!existsSync(join(ref, 'config.json'))) throw new UserError(`--teacher-ref ${ref}: not a model folder (no config.json)`, { setting: 'teacher_ref' });
    return new TeacherSpec(dir, ref, weight ?? 1);
  }

  /** Refuses a teacher (and reference) whose tokenizer is not the student's, in one line naming both folders. */
  checkTokenizer(student: string, tok: LoadedTokenizer, use?: string): void {
    checkSameTokenizer(this.dir, student, tok, use);
    if (this.ref !== null) {
      const t = loadTokenizer(this.dir);
      const r = loadTokenizer(this.ref);
      const differ = (why: string) => new UserError(`--teacher-ref ${this.ref} and --teacher ${this.dir} have different tokenizers (${why}); AlignDistil combines the two models' logits id by id: use the DPO model's own reference`, { setting: 'teacher_ref' });
      if (r.vocabSize !== t.vocabSize) throw differ(`${r.vocabSize} ids against ${t.vocabSize}`);
      for (let id = 0; id < t.vocabSize; id++) if (r.idToToken(id) !== t.idToToken(id)) throw differ(`id ${id} is ${JSON.stringify(r.idToToken(id))} in the reference, ${JSON.stringify(t.idToToken(id))} in the teacher`);
    }
  }

  /** What names the teacher in a cache's record: the folder and its files, and the reference's and the weight for a pair. */
  identity(): { model: string; files: FileStamp[]; ref?: string; ref_files?: FileStamp[]; weight?: number } {
    const one = { model: `model:${resolve(this.dir)}`, files: modelStamps(this.dir) };
    return this.ref === null ? one : { ...one, ref: `model:${resolve(this.ref)}`, ref_files: modelStamps(this.ref), weight: this.weight };
  }

  /** For messages and the run's record. */
  describe(): string {
    return this.ref === null ? this.dir : `${this.ref} + ${this.weight}·(${this.dir} − ${this.ref}) (AlignDistil)`;
  }

  /** The weights, checked: an AlignDistil pair must have the same embedding rows (their logits are added id by id). */
  load(): LoadedTeacher {
    const dpo = loadModel(this.dir) as Loaded;
    if (this.ref === null) return new LoadedTeacher(dpo, null, 1);
    const ref = loadModel(this.ref) as Loaded;
    if (ref.config.vocab_size !== dpo.config.vocab_size) {
      throw new UserError(`--teacher-ref ${this.ref}: ${ref.config.vocab_size} embedding rows, --teacher ${this.dir} ${dpo.config.vocab_size}; AlignDistil adds the two models' logits id by id: use the DPO model's own reference`, { setting: 'teacher_ref' });
    }
    return new LoadedTeacher(dpo, ref, this.weight);
  }
}

/** A teacher's weights: the graph forward, its parameter feeds and its decoders. */
export class LoadedTeacher {
  constructor(
    private readonly dpo: Loaded,
    private readonly ref: Loaded | null,
    readonly weight: number,
  ) {}

  /** The teacher's config (the DPO model's for a pair); its vocab_size is the pair's. */
  get config(): ModelConfig {
    return this.dpo.config;
  }

  /** The teacher's forward over declared parameter inputs; a pair's hidden rows and head as the module comment says. */
  forward(g: Graph, inputs: CausalLMInputs): CausalLM {
    const dpo = buildCausalLM(g, this.dpo.config, declareParameters(g, this.dpo.config), inputs);
    if (!this.ref) return dpo;
    const c = this.ref.config;
    const params = new Map([...modelParameterShapes(c)].map(([name, shape]) => [name, g.input(REF_PREFIX + name, 'float32', shape)]));
    const ref = buildCausalLM(g, c, params, inputs, { batch: dpo.batch });
    const w = this.weight;
    const hidden = g.concat([g.mul(ref.hidden, 1 - w), g.mul(dpo.hidden, w)], 1); // [N, D_ref + D_dpo]
    const headWeight = g.concat([ref.headWeight, dpo.headWeight], 1); // [V, D_ref + D_dpo]
    let logits: ReturnType<CausalLM['logits']> | undefined;
    return { config: dpo.config, batch: dpo.batch, hidden, headWeight, logits: () => (logits ??= g.gemm(hidden, headWeight, null, { transB: true })) };
  }

  /** The parameter feeds of `forward`'s graph, from the weight arrays (no copy). */
  feeds(): Feeds {
    const out: Feeds = {};
    const add = (m: Loaded, prefix: string) => {
      for (const [name, shape] of modelParameterShapes(m.config)) {
        const w = m.weights.get(name);
        if (!w) throw new Error(`teacher weights lack ${name}`);
        out[prefix + name] = toOrt('float32', w.data, shape);
      }
    };
    add(this.dpo, '');
    if (this.ref) add(this.ref, REF_PREFIX);
    return out;
  }

  /** Decoders for the generation engine: one, or the pair as the geometric mixture with weights (1 − w, w). */
  async decoders(runtime: RuntimeOptions): Promise<{ parts: MixturePart[]; release: () => Promise<void> }> {
    const dpo = await Decoder.create(this.dpo.config, this.dpo.weights, { runtime, bake: true });
    const parts: MixturePart[] = [{ decoder: dpo, weight: 1 }];
    if (this.ref) {
      parts[0].weight = this.weight;
      parts.unshift({ decoder: await Decoder.create(this.ref.config, this.ref.weights, { runtime, bake: true }), weight: 1 - this.weight });
    }
    return { parts, release: async () => { for (const p of parts) await p.decoder.release(); } };
  }
}
