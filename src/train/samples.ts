/**
 * Sample generations during evaluation (`eval_generate=N`): the first N prompts of the eval data,
 * completed greedily by the policy being trained and by the reference, one JSON line per prompt in
 * `RUN/samples/step-K.jsonl` (K zero-padded to 8 digits):
 *   {"step", "index", "prompt", "policy", "reference", "policy_tokens", "reference_tokens",
 *    "policy_stopped", "reference_stopped"}
 * The reference's completions do not change during a run, so they are generated once.
 */
import { existsSync, mkdirSync, readdirSync, readFileSync, renameSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import type { ModelConfig } from '../models/config.ts';
import type { FloatTensor } from '../models/checkpoint.ts';
import type { RuntimeOptions } from '../runtime/session.ts';
import type { LoadedTokenizer } from '../tokenize/index.ts';
import { maxPositions } from '../models/config.ts';
import { Decoder, generateIds, responseText, type Generated } from '../models/generate.ts';
import { SeededRandom } from '../random.ts';
import type { Text } from '../../datasets/schema.ts';
import { UserError } from '../errors.ts';

export const SAMPLES_DIR = 'samples';

export interface SampleRow {
  step: number;
  index: number;
  prompt: Text;
  policy: string;
  reference: string;
  policy_tokens: number;
  reference_tokens: number;
  policy_stopped: boolean;
  reference_stopped: boolean;
}

export function samplesFile(run: string, step: number): string {
  return join(run, SAMPLES_DIR, `step-${String(step).padStart(8, '0')}.jsonl`);
}

/** A prompt as text (for the file) and as the truncated ids the model sees (as in training). */
export interface SamplePrompt {
  prompt: Text;
  ids: number[];
}

async function greedy(model: { config: ModelConfig; weights: Map<string, FloatTensor> }, tok: LoadedTokenizer, prompts: readonly SamplePrompt[], maxNewTokens: number, runtime: RuntimeOptions): Promise<Generated[]> {
  const d = await Decoder.create(model.config, model.weights, { runtime, bake: true });
  try {
    const reqs = prompts.map((p) => ({ promptIds: p.ids, rng: new SeededRandom(0) }));
    const stopIds = tok.stopIds.length ? tok.stopIds : tok.eosId !== null ? [tok.eosId] : [];
    return await generateIds([{ decoder: d, weight: 1 }], reqs, { temperature: 0, maxNewTokens, stopIds, padId: tok.padId ?? tok.eosId ?? 0, vocabLimit: tok.vocabSize });
  } finally {
    await d.release();
  }
}

export class EvalSampler {
  private reference: Generated[] | null = null;
  private readonly prompts: SamplePrompt[];

  constructor(
    private readonly o: {
      run: string;
      prompts: readonly SamplePrompt[];
      tok: LoadedTokenizer;
      ref: { config: ModelConfig; weights: Map<string, FloatTensor> };
      maxNewTokens: number;
      runtime: RuntimeOptions;
    },
  ) {
    // A prompt keeps its end so that prompt + completion fit the model's positions.
    const room = maxPositions(o.ref.config) - o.maxNewTokens;
    if (room < 1) throw new UserError(`eval_generate_max_new_tokens (${o.maxNewTokens}) leaves no room for a prompt in the model's ${maxPositions(o.ref.config)} positions`);
    this.prompts = o.prompts.map((p) => ({ prompt: p.prompt, ids: p.ids.length > room ? p.ids.slice(-room) : p.ids }));
  }

  /** Generates with the policy's current weights and writes the step's file (temporary name, then renamed). */
  async write(step: number, policy: { config: ModelConfig; weights: Map<string, FloatTensor> }): Promise<string> {
    const { tok, maxNewTokens, runtime } = this.o;
    const prompts = this.prompts;
    this.reference ??= await greedy(this.o.ref, tok, prompts, maxNewTokens, runtime);
    const ref = this.reference;
    const pol = await greedy(policy, tok, prompts, maxNewTokens, runtime);
    const rows: SampleRow[] = prompts.map((p, i) => ({
      step,
      index: i,
      prompt: p.prompt,
      policy: responseText(tok, pol[i].ids, pol[i].stopped),
      reference: responseText(tok, ref[i].ids, ref[i].stopped),
      policy_tokens: pol[i].ids.length,
      reference_tokens: ref[i].ids.length,
      policy_stopped: pol[i].stopped,
      reference_stopped: ref[i].stopped,
    }));
    const file = samplesFile(this.o.run, step);
    mkdirSync(join(this.o.run, SAMPLES_DIR), { recursive: true });
    const tmp = `${file}.tmp-${process.pid}`;
    writeFileSync(tmp, rows.map((r) => JSON.stringify(r) + '\n').join(''));
    renameSync(tmp, file);
    return file;
  }
}

/** Every samples file of a run, by step (for the HTML report). */
export function readSamples(run: string): { step: number; rows: SampleRow[] }[] {
  const dir = join(run, SAMPLES_DIR);
  if (!existsSync(dir)) return [];
  return readdirSync(dir)
    .filter((f) => /^step-\d{8}\.jsonl$/.test(f))
    .sort()
    .map((f) => ({
      step: Number(f.slice(5, 13)),
      rows: readFileSync(join(dir, f), 'utf8')
        .split('\n')
        .flatMap((l, i) => {
          if (!l.trim()) return [];
          try {
            return [JSON.parse(l) as SampleRow];
          } catch {
            throw new UserError(`${join(dir, f)}:${i + 1}: invalid JSON`);
          }
        }),
    }));
}
