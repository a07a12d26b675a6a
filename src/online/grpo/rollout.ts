/**
 * A rollout turns a round's prompts into completions: n per prompt, prompt-major (prompt 0's n
 * first), each with the token ids the policy is trained on, a loss mask over those tokens, the text
 * the rewards read and whatever else the rollout knows. GRPO sees nothing else of how they were made,
 * so a multi-turn rollout (tool calls and their results inside the completion, the results' tokens
 * masked out) replaces `samplingRollout` without touching the rest of grpo/.
 */
import type { Decoder } from '../../models/generate.ts';
import { samplingOptions } from '../../models/sampling.ts';
import type { LoadedTokenizer } from '../../tokenize/index.ts';
import { sampleWith } from '../policy.ts';
import { rowPrompt, type PromptRow } from '../prompts.ts';

export interface Completion {
  /** Index of its prompt among the round's prompts. */
  prompt: number;
  promptIds: number[];
  /** The tokens after the prompt, as the training graph reads them (never re-tokenized). */
  ids: number[];
  /** Per token of `ids`: 1 when the policy wrote it and it is trained on, 0 when not (a tool's output). */
  lossMask: number[];
  /** What the reward functions read. */
  text: string;
  /** Whether it ended on a stop token (false: cut at the length limit). */
  stopped: boolean;
  /**
   * With `RolloutRequest.logprobs`: per token of `ids`, the log-probability the sampler drew it with
   * (the tempered distribution the training graph scores it under); 0 where `lossMask` is 0 (tokens
   * the policy did not sample, which no loss term reads).
   */
  logps?: number[];
  /** What else the rollout records about it (turns, tool calls, …); JSON. */
  info: Record<string, unknown>;
}

export interface RolloutRequest {
  prompts: readonly PromptRow[];
  /** Completions per prompt. */
  n: number;
  /** Seed of the round's random streams: the same request gives the same completions. */
  seed: number;
  /** The optimizer step the round feeds (1-based; negative for an evaluation): keys the tool journal. */
  step?: number;
  /** Each completion must carry its sampler log-probs (`Completion.logps`): the sampler–trainer correction reads them. */
  logprobs?: boolean;
}

/** What a rollout runs on: the tokenizer and a decoder over the weights to sample from. */
export interface RolloutContext {
  tok: LoadedTokenizer;
  policy: Decoder;
}

export type Rollout = (ctx: RolloutContext, req: RolloutRequest) => Promise<Completion[]>;

export interface SamplingSettings {
  temperature: number;
  top_p: number;
  top_k: number;
  max_completion_length: number;
}

/** One turn: each completion sampled from the policy until a stop token or max_completion_length tokens. */
export function samplingRollout(s: SamplingSettings): Rollout {
  const sampling = samplingOptions({ temperature: s.temperature, topK: s.top_k, topP: s.top_p });
  return async (ctx, req) => {
    const samples = await sampleWith(ctx.tok, ctx.policy, req.prompts.map(rowPrompt), { n: req.n, seed: req.seed, maxNewTokens: s.max_completion_length, logprobs: req.logprobs, ...sampling });
    return samples.map((x) => ({
      prompt: x.promptIndex, promptIds: x.promptIds, ids: x.ids, lossMask: x.ids.map(() => 1), text: x.response, stopped: x.stopped, info: {},
      ...(x.logps ? { logps: x.logps } : {}),
    }));
  };
}
