/**
 * A model folder ready to sample from (`ModelSampler`: its tokenizer and a decoder with the weights
 * baked in; not the live policy of a training run, which is `OnlineContext.policy()`'s Decoder). `sample` draws n responses
 * per prompt (from the model, or from the geometric mixture with another model) and returns them as
 * ids and text, each sample's random stream fixed by (seed, prompt index, sample index).
 */
import type { LoadedTokenizer } from '../tokenize/index.ts';
import { loadTokenizer } from '../tokenize/index.ts';
import { loadModel } from '../models/load.ts';
import type { ModelConfig } from '../models/config.ts';
import type { RuntimeOptions } from '../runtime/session.ts';
import type { Text } from '../../datasets/schema.ts';
import type { ProductQuant } from '../models/quantize.ts';
import { Decoder, generateIds, responseText, type MixturePart } from '../models/generate.ts';
import { promptIds } from './prompts.ts';
import { sampleRandom, type SamplingOptions } from '../models/sampling.ts';

export interface Sample {
  prompt: Text;
  /** Index of the prompt in the input list and of the sample among its n. */
  promptIndex: number;
  sample: number;
  promptIds: number[];
  /** Generated ids (ending with the stop id when `stopped`). */
  ids: number[];
  response: string;
  stopped: boolean;
  /** With `logprobs`: each id's log-probability under the distribution it was drawn from. */
  logps?: number[];
}

export interface SampleOptions extends SamplingOptions {
  /** Responses per prompt (default 1). */
  n?: number;
  seed: number;
  maxNewTokens: number;
  batchSize?: number;
  /** Sample from softmax((1−m)·logits_θ + m·logits_other) with this other model and m. */
  mixture?: { decoder: Decoder; coef: number };
  /** Return each sampled id's log-probability under the distribution it was drawn from (`Sample.logps`). */
  logprobs?: boolean;
}

export class ModelSampler {
  private constructor(
    readonly dir: string,
    readonly config: ModelConfig,
    readonly tok: LoadedTokenizer,
    readonly decoder: Decoder,
  ) {}

  /** Loads a model folder; weights are baked into the decode graphs (a fixed model), with `quant` as quantized blocks. */
  static async load(dir: string, runtime?: RuntimeOptions, chatTemplateFile?: string, quant?: ProductQuant | null): Promise<ModelSampler> {
    const m = loadModel(dir);
    const tok = loadTokenizer(dir, { chatTemplateFile });
    return new ModelSampler(dir, m.config, tok, await Decoder.create(m.config, m.weights, quant ? { runtime, quant } : { runtime, bake: true }));
  }

  async sample(prompts: readonly Text[], o: SampleOptions): Promise<Sample[]> {
    return sampleWith(this.tok, this.decoder, prompts, o);
  }

  async release(): Promise<void> {
    await this.decoder.release();
  }
}

/** n samples per prompt, in prompt-major order (prompt 0's samples first). */
export async function sampleWith(tok: LoadedTokenizer, decoder: Decoder, prompts: readonly Text[], o: SampleOptions): Promise<Sample[]> {
  const n = o.n ?? 1;
  const ids = prompts.map((p) => promptIds(tok, p));
  const reqs = prompts.flatMap((_, i) => Array.from({ length: n }, (_, k) => ({ promptIds: ids[i], rng: sampleRandom(o.seed, i, k) })));
  const parts: MixturePart[] = o.mixture
    ? [
        { decoder, weight: 1 - o.mixture.coef },
        { decoder: o.mixture.decoder, weight: o.mixture.coef },
      ]
    : [{ decoder, weight: 1 }];
  const stopIds = tok.stopIds.length ? tok.stopIds : tok.eosId !== null ? [tok.eosId] : [];
  const out = await generateIds(parts, reqs, { ...o, stopIds, padId: tok.padId ?? tok.eosId ?? 0, vocabLimit: tok.vocabSize });
  return out.map((g, j) => {
    const i = Math.floor(j / n);
    const s: Sample = { prompt: prompts[i], promptIndex: i, sample: j % n, promptIds: ids[i], ids: g.ids, response: responseText(tok, g.ids, g.stopped), stopped: g.stopped };
    if (g.logps) s.logps = Array.from(g.logps);
    return s;
  });
}
