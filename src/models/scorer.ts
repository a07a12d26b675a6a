/**
 * Scores tokenized examples under fixed weights: per-response summed log-probs and token counts.
 * Serves the reference cache (the starting weights, LoRA off) and `prefzoo eval` (policy and
 * reference models). Parameters are graph inputs fed from the weight arrays, so no copy is made.
 */
import type { Kind } from '../../datasets/schema.ts';
import type { ModelConfig } from './config.ts';
import type { FloatTensor } from './checkpoint.ts';
import { buildLogpsGraph } from './logps.ts';
import { modelParameterShapes } from './params.ts';
import { forwardRuntime, Session, toOrt, type Feeds, type RuntimeOptions } from '../runtime/session.ts';
import { collate, longestBatch, sequenceIndex } from './batch.ts';
import type { TokenizedExample } from '../../datasets/examples.ts';
import { type ProgressFactory, startProgress } from '../progress.ts';

export interface ScoreResult {
  /** Per example, per response: Σ log p over the response tokens. */
  logps: number[][];
  tokens: number[][];
}

/** What `score` takes by default: examples per forward pass, and the padding of a row's length. */
const BATCH = 8;
const PAD_TO = 64;

/** The largest batch `score(kind, rows, o)` runs, for Scorer.create's `longest`. */
export function scoredLongest(kind: Kind, rows: readonly TokenizedExample[], o: { batchSize?: number; padTo?: number } = {}): { rows: number; len: number } {
  return longestBatch(rows, o.batchSize ?? BATCH, { kind, padTo: o.padTo ?? PAD_TO });
}

export class Scorer {
  private constructor(
    private readonly session: Session,
    private readonly params: Feeds,
    readonly padId: number,
  ) {}

  /**
   * With `longest` (the largest batch it will score: `longestBatch` of the rows at the batch size and
   * padding `score` will be given), on the CPU the forward is built in pieces that keep each tensor
   * under glibc's mmap bound at that shape (the MLP over runs of rows, attention over blocks of
   * queries: layers.ts `chunkRows`, `blockedAttention`), as the training forward is; where every
   * tensor already fits, the graph is the one built without it.
   */
  static async create(config: ModelConfig, weights: Map<string, FloatTensor>, runtime: RuntimeOptions, padId: number, longest?: { rows: number; len: number }): Promise<Scorer> {
    const cpu = (runtime.ep ?? 'cpu') === 'cpu';
    const g = buildLogpsGraph(config, { dtype: 'float32', dense: runtime.ep === 'webgpu', ...(longest && cpu ? { chunking: { ...longest } } : {}) });
    const params: Feeds = {};
    for (const [name, shape] of modelParameterShapes(config)) {
      const w = weights.get(name);
      if (!w) throw new Error(`weights lack ${name}`);
      params[name] = toOrt('float32', w.data, shape);
    }
    // A forward: ONNX Runtime's arena kept even under the memory-saving runtime (runtime/session.ts).
    return new Scorer(await Session.fromGraph(g, forwardRuntime(runtime)), params, padId);
  }

  /** Scores every example, `batchSize` examples per forward pass, in sorted-by-length order. */
  async score(kind: Kind, rows: TokenizedExample[], o: { batchSize?: number; padTo?: number; label?: string; progress?: ProgressFactory } = {}): Promise<ScoreResult> {
    const batchSize = o.batchSize ?? BATCH;
    const logps: number[][] = new Array(rows.length);
    const tokens: number[][] = new Array(rows.length);
    // Length-sorted batches waste less padding; results go back to their original positions.
    const len = (r: TokenizedExample) => r.promptIds.length + Math.max(...r.responseIds.map((x) => x.length));
    const order = rows.map((_, i) => i).sort((a, b) => len(rows[a]) - len(rows[b]));
    const progress = startProgress(o.progress, o.label ?? 'scoring', rows.length);
    for (let s = 0; s < order.length; s += batchSize) {
      const idx = order.slice(s, s + batchSize);
      const batch = idx.map((i) => rows[i]);
      const c = collate(batch, { kind, padTo: o.padTo ?? PAD_TO, padId: this.padId, dtype: 'float32' });
      const out = await this.session.run({
        ...this.params,
        input_ids: c.feeds.input_ids,
        attention_mask: c.feeds.attention_mask,
        loss_mask: c.feeds.loss_mask,
      });
      const lp = out.logp.data as Float32Array;
      const tk = out.tokens.data as Float32Array;
      const B = batch.length;
      idx.forEach((orig, b) => {
        const K = kind === 'pairwise' ? 2 : kind === 'listwise' ? c.k : 1;
        const at = (k: number) => sequenceIndex(kind, B, K, b, k);
        const n = batch[b].responseIds.length;
        logps[orig] = Array.from({ length: n }, (_, k) => lp[at(k)]);
        tokens[orig] = Array.from({ length: n }, (_, k) => tk[at(k)]);
      });
      progress.update(Math.min(s + batchSize, rows.length));
    }
    progress.stop();
    return { logps, tokens };
  }

  async release(): Promise<void> {
    await this.session.release();
  }
}
