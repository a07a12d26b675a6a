/**
 * The reference scorer of the online methods: log-probs of sampled completions under fixed weights
 * (the starting model, adapters off), per token and summed per completion, from one session whose
 * parameters are fed from the weight arrays (no copy). GRPO reads the per-token values (its k3 KL),
 * Nash-MD the sums. Log-probs under the live weights (GRPO's old log-probs, SPPO's π_t) are not a
 * reference of this kind: they come from the training artifacts' own eval graph, so that at the first
 * step of a round the policy's and the stored log-probs are the same numbers.
 */
import type { ModelConfig } from '../models/config.ts';
import type { FloatTensor } from '../models/checkpoint.ts';
import { buildCausalLM, type CausalLM, type CausalLMInputs } from '../models/index.ts';
import { headChunksOf, sequenceLogps } from '../models/logps.ts';
import { declareParameters, modelParameterShapes } from '../models/params.ts';
import { collate } from '../models/batch.ts';
import { Graph } from '../onnx/graph.ts';
import { forwardRuntime, Session, toOrt, type Feeds, type RuntimeOptions } from '../runtime/session.ts';
import type { TokenizedExample } from '../../datasets/examples.ts';
import type { TeacherForward } from '../train/teacher-topk.ts';

/** The model's hidden rows scaled by 1/temperature: the head then gives logits / temperature. */
export function tempered(g: Graph, model: CausalLM, temperature: number): CausalLM {
  return temperature === 1 ? model : { ...model, hidden: g.mul(model.hidden, 1 / temperature) };
}

/** A completion to score: its prompt's ids and its own. */
export interface ScoredRow {
  promptIds: number[];
  ids: number[];
}

/** Collates completions (prompt ids + completion ids) as the training graphs of the online methods read them. */
export function collateRows(rows: readonly ScoredRow[], o: { padId: number; padTo: number }) {
  const ex: TokenizedExample[] = rows.map((r) => ({ promptIds: r.promptIds, responseIds: [r.ids], src: { prompt: '', responses: [''] } }));
  return collate(ex, { kind: 'single', padTo: o.padTo, padId: o.padId, dtype: 'float32' });
}

/** Per-token values [B, T] → each row's values at its completion tokens (loss_mask = 1), in order. */
export function gatherTokens(values: Float32Array, mask: Float32Array, B: number, T: number): number[][] {
  return Array.from({ length: B }, (_, b) => {
    const out: number[] = [];
    for (let t = 0; t < T; t++) if (mask[b * T + t] > 0) out.push(values[b * T + t]);
    return out;
  });
}

export class ReferenceScorer {
  private constructor(
    private readonly session: Session,
    private readonly params: Feeds,
  ) {}

  /**
   * `temperature`: the logits are divided by it, as the sampler's and the training graph's are (default
   * 1); `vocabLimit`: ids from it on are left out of the distribution, as the sampler leaves them.
   */
  static async create(config: ModelConfig, weights: Map<string, FloatTensor>, runtime: RuntimeOptions, o: { temperature?: number; vocabLimit?: number } = {}): Promise<ReferenceScorer> {
    const model = {
      config,
      forward: (g: Graph, inputs: CausalLMInputs) => buildCausalLM(g, config, declareParameters(g, config), inputs),
      feeds: () => {
        const params: Feeds = {};
        for (const [name, shape] of modelParameterShapes(config)) {
          const w = weights.get(name);
          if (!w) throw new Error(`reference weights lack ${name}`);
          params[name] = toOrt('float32', w.data, shape);
        }
        return params;
      },
    };
    return ReferenceScorer.forModel(model, runtime, o);
  }

  /** The scorer over any forward and its parameter feeds: a teacher of train/teacher-model.ts (one model or an AlignDistil pair). */
  static async forModel(m: TeacherForward, runtime: RuntimeOptions, o: { temperature?: number; vocabLimit?: number } = {}): Promise<ReferenceScorer> {
    const g = new Graph('prefzoo_reference_logps');
    const inputIds = g.input('input_ids', 'int64', ['batch', 'seq']);
    const attentionMask = g.input('attention_mask', 'int64', ['batch', 'seq']);
    const lossMask = g.input('loss_mask', 'float32', ['batch', 'seq']);
    const model = m.forward(g, { inputIds, attentionMask });
    const seq = sequenceLogps(g, tempered(g, model, o.temperature ?? 1), lossMask, { perToken: true, dense: runtime.ep === 'webgpu', vocabLimit: o.vocabLimit, headChunks: headChunksOf(m.config) });
    g.output(seq.tokenLogps!, 'token_logps');
    g.output(seq.logp, 'logp');
    // A forward: ONNX Runtime's arena kept even under the memory-saving runtime (runtime/session.ts).
    return new ReferenceScorer(await Session.fromGraph(g, forwardRuntime(runtime)), m.feeds());
  }

  /** Both outputs of one collated batch (input_ids, attention_mask, loss_mask): [B, T] per token and [B] sums. */
  async run(feeds: Feeds): Promise<{ tokenLogps: Float32Array; logps: Float32Array }> {
    const out = await this.session.run({ ...this.params, input_ids: feeds.input_ids, attention_mask: feeds.attention_mask, loss_mask: feeds.loss_mask });
    return { tokenLogps: out.token_logps.data as Float32Array, logps: out.logp.data as Float32Array };
  }

  /** Each row's per-token log-probs (its completion tokens, in order) and their sum, `batchSize` rows per run in the given order. */
  async score(rows: readonly ScoredRow[], o: { padId: number; padTo: number; batchSize: number }): Promise<{ tokens: number[][]; sums: number[] }> {
    const tokens: number[][] = [];
    const sums: number[] = [];
    for (let at = 0; at < rows.length; at += o.batchSize) {
      const c = collateRows(rows.slice(at, at + o.batchSize), o);
      const [n, T] = c.feeds.input_ids.dims as number[];
      const r = await this.run(c.feeds);
      tokens.push(...gatherTokens(r.tokenLogps, c.feeds.loss_mask.data as Float32Array, n, T));
      sums.push(...r.logps);
    }
    return { tokens, sums };
  }

  async release(): Promise<void> {
    await this.session.release();
  }
}
