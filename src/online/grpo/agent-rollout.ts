/**
 * The multi-turn rollout: each prompt's num_generations rows decode on one generation session
 * (src/models/generate.ts), each to the end of its assistant turn (a stop id of the template); the
 * turn's tool calls are read back in the template's own format (tokenize/tool-calls.ts) and answered
 * by the tool executor (src/agents) or the environment's `step`; the answers enter the row as
 * bridge ids (tokenize/conversation.ts: the template's render with them minus the render without)
 * through `row.extend`, and the row decodes on. Rows are driven as concurrent promises, so a row
 * waiting on a tool or finished leaves its slot in the session's batch to the others.
 *
 * Token layout of a completion (everything after the prompt, the ids the training graph reads):
 *
 *   [turn 1 sampled … <stop>] [bridge: tool/env messages + generation prompt] [turn 2 sampled … <stop>] …
 *    lossMask 1                 lossMask 0                                      lossMask 1
 *
 * The rollout ends when a turn calls no tool (and the environment, if any, says done), after
 * max_turns turns, when a turn calls past max_tool_calling_iterations, when the model runs out of
 * max_completion_length (all tokens after the prompt, the tools' included, as TRL counts), or when the
 * bridge would pass that budget (TRL's rollback: the results are not appended and the completion
 * counts as truncated).
 */
import type { Message, ToolCall, ToolSpec } from '../../chat.ts';
import { UserError } from '../../errors.ts';
import { GenerationSession, type GenerationRow } from '../../models/generate.ts';
import { sampleRandom, samplingOptions } from '../../models/sampling.ts';
import type { LoadedTokenizer } from '../../tokenize/index.ts';
import { bridgeIds, chatPromptIds } from '../../tokenize/conversation.ts';
import { parseToolCalls, toolCallFormatOf, type ToolCallFormat } from '../../tokenize/tool-calls.ts';
import { errorContent, ToolExecutor } from '../../agents/executor.ts';
import { EnvironmentError, type Environments, type EnvSession } from '../../agents/env.ts';
import { episodeSeed } from '../../agents/seeds.ts';
import type { CallRecord } from '../../agents/types.ts';
import type { Completion, Rollout, RolloutRequest, SamplingSettings } from './rollout.ts';

/** Why a rollout ended (the `stop_reason/<reason>` metrics). */
export const STOP_REASONS = ['stop', 'env_done', 'max_turns', 'max_tool_calling_iterations', 'max_completion_length'] as const;
export type AgentStopReason = (typeof STOP_REASONS)[number];

export interface AgentRolloutSettings extends SamplingSettings {
  max_turns: number;
  max_tool_calling_iterations: number;
  max_tool_response_tokens: number;
}

/** What answers a rollout's turns: a tool executor, an environment, or both. */
export interface AgentSources {
  /** The run's tools (`--tools`, `--mcp`, `--mcp-config`, `cmd:`), or null. Read at each rollout (it is opened with the run). */
  executor: () => ToolExecutor | null;
  /** One environment factory for every row, or a map of them, each row picking one (`Environments.pick`). */
  env: Environments | null;
}

/** What a rollout records about itself: `Completion.info` of an agent rollout, and the rewards' third argument. */
export interface AgentRolloutInfo {
  /** The prompt the rollout answered: its environment's (from `reset`) or the row's. */
  prompt?: string | Message[];
  /** The whole conversation: the prompt's messages, the environment's opening ones, then each turn and what answered it. */
  messages: Message[];
  /** Every tool call of the rollout, in order, with how it went. */
  tool_calls: (CallRecord & { arguments?: unknown })[];
  /** Assistant turns sampled. */
  turns: number;
  stop_reason: AgentStopReason;
  /** Tokens the policy sampled (the loss mask's ones). */
  model_tokens: number;
  /** The environment's reward for the episode (`reward()`, else its last step's), or null. */
  env_reward: number | null;
  /** What the environment's steps said besides their messages: the rewards and `done` of each. */
  env_steps: { reward?: number; done: boolean }[];
}

/** Messages of a prompt: a conversation as is, a text as one user message. */
function promptMessages(p: string | Message[]): Message[] {
  return typeof p === 'string' ? [{ role: 'user', content: p }] : p.map((m) => ({ ...m }));
}

/** The turn's sampled ids without their stop token, as text. */
function turnText(tok: LoadedTokenizer, ids: readonly number[], stopped: boolean): string {
  return tok.decode(stopped ? ids.slice(0, -1) : ids, { skipSpecialTokens: false });
}

/** A message's content cut to `limit` tokens (0: whole). */
function cutContent(tok: LoadedTokenizer, m: Message, limit: number): Message {
  if (limit <= 0) return m;
  const ids = tok.encode(m.content, { addSpecialTokens: false });
  if (ids.length <= limit) return m;
  return { ...m, content: tok.decode(ids.slice(0, limit), { skipSpecialTokens: false }) + '…' };
}

/**
 * One episode's turn handler: what follows one sampled assistant turn. Kept apart from the decoding
 * so that the masks, metrics and stop rules can be checked on recorded ids (the scripted-policy test).
 */
export class Episode {
  readonly messages: Message[];
  /** The conversation as the template re-renders it for the bridges: assistant turns as sampled text. */
  private readonly rendered: Message[];
  readonly ids: number[] = [];
  readonly lossMask: number[] = [];
  /**
   * Per token of `ids`, the sampler's log-prob (0 for the bridges' tokens, which the policy did not
   * sample); null once a turn came without them (a rollout that does not ask for them).
   */
  logps: number[] | null = [];
  readonly records: (CallRecord & { arguments?: unknown })[] = [];
  turns = 0;
  iterations = 0;
  stopReason: AgentStopReason = 'stop';
  /** Whether the last turn ended on a stop id and nothing cut the rollout short. */
  stopped = true;
  finalAnswer = '';
  envReward: number | null = null;
  readonly envSteps: { reward?: number; done: boolean }[] = [];

  constructor(
    private readonly tok: LoadedTokenizer,
    private readonly s: AgentRolloutSettings,
    private readonly format: ToolCallFormat | null,
    private readonly tools: ToolSpec[],
    start: Message[],
    private readonly answer: {
      executor: ToolExecutor | null;
      env: EnvSession | null;
      /** Where the calls stand, for the executor's seeds and journal keys. */
      where: { row: Record<string, unknown>; seed: number; step: number; rollout: number; at: string };
    },
  ) {
    this.messages = start.map((m) => ({ ...m }));
    this.rendered = start.map((m) => ({ ...m }));
  }

  /** Tokens left of max_completion_length. */
  get budget(): number {
    return this.s.max_completion_length - this.ids.length;
  }

  /**
   * Takes one sampled turn (its ids, ending with the stop id when `endedOnStop`, and the sampler's
   * log-prob of each when it gave them) and returns the ids to extend the row with before the next
   * turn, or null when the rollout is over.
   */
  async take(segment: readonly number[], endedOnStop: boolean, logps?: ArrayLike<number>): Promise<number[] | null> {
    if (logps && logps.length !== segment.length) throw new Error(`agent rollout: a turn of ${segment.length} tokens came with ${logps.length} log-probs`);
    this.ids.push(...segment);
    for (let i = 0; i < segment.length; i++) this.lossMask.push(1);
    if (this.logps && logps) for (let i = 0; i < logps.length; i++) this.logps.push(logps[i]);
    else this.logps = null;
    this.turns++;
    const text = turnText(this.tok, segment, endedOnStop);
    const parsed = this.format ? parseToolCalls(text, this.format) : { content: text.trim(), toolCalls: [] as ToolCall[], errors: [] };
    const assistant: Message = { role: 'assistant', content: parsed.content };
    if (parsed.toolCalls.length) assistant.tool_calls = parsed.toolCalls;
    this.messages.push(assistant);
    this.rendered.push({ role: 'assistant', content: text });
    this.finalAnswer = parsed.content;
    if (!endedOnStop) {
      this.stopReason = 'max_completion_length';
      this.stopped = false;
      return null;
    }
    const calls = parsed.toolCalls.length + parsed.errors.length;
    const env = this.answer.env;
    if (calls === 0 && !env) return this.end('stop');
    // The last turn's calls are not run (nothing would read their results); an environment still steps.
    const last = this.turns >= this.s.max_turns;
    if (last && !env) return this.end('max_turns');
    if (calls > 0 && !last) {
      this.iterations++;
      if (this.s.max_tool_calling_iterations > 0 && this.iterations > this.s.max_tool_calling_iterations) return this.end('max_tool_calling_iterations');
    }
    const added: Message[] = [];
    // Calls that could not be read are answered with what is wrong with them, and count as failed.
    for (const e of last ? [] : parsed.errors) {
      added.push({ role: 'tool', content: errorContent(e.message), name: '' });
      this.records.push({ name: '', ok: false, error: e.message, ms: 0 });
    }
    const w = this.answer.where;
    const executor = env && env.tools.length ? null : this.answer.executor;
    if (last) {
      // An environment's last turn: its step below, no calls run.
    } else if (parsed.toolCalls.length && executor) {
      const r = await executor.execute(parsed.toolCalls, { row: w.row, seed: w.seed, step: w.step, rollout: w.rollout, turn: this.turns - 1, where: w.at });
      added.push(...r.messages);
      r.records.forEach((rec, k) => this.records.push({ ...rec, arguments: parsed.toolCalls[k].function.arguments }));
    } else if (parsed.toolCalls.length && env && env.tools.length) {
      const own = new ToolExecutor({ tools: env.tools, toolTimeout: executor?.toolTimeout });
      const r = await own.execute(parsed.toolCalls, { row: w.row, seed: w.seed, step: w.step, rollout: w.rollout, turn: this.turns - 1, where: w.at, state: {} });
      added.push(...r.messages);
      r.records.forEach((rec, k) => this.records.push({ ...rec, arguments: parsed.toolCalls[k].function.arguments }));
    } else if (parsed.toolCalls.length && !env) {
      // No tool is offered (a policy writing calls anyway): answered as unknown tools would be.
      for (const c of parsed.toolCalls) {
        const message = `unknown tool "${c.function.name}"; no tools are offered`;
        added.push({ role: 'tool', content: errorContent(message), name: c.function.name });
        this.records.push({ name: c.function.name, ok: false, error: message, ms: 0, arguments: c.function.arguments });
      }
    }
    let done = false;
    if (env) {
      const st = await env.step({ text, toolCalls: parsed.toolCalls });
      added.push(...st.messages);
      this.envSteps.push(st.reward === undefined ? { done: st.done } : { reward: st.reward, done: st.done });
      done = st.done;
    }
    if (done) return this.end('env_done');
    if (this.turns >= this.s.max_turns) return this.end('max_turns');
    const answers = added.map((m) => cutContent(this.tok, m, this.s.max_tool_response_tokens));
    const bridge = bridgeIds(this.tok, this.rendered, answers, { tools: this.tools });
    // TRL's rollback: results that would leave no room for a sampled token are not appended.
    if (bridge.length + 1 > this.budget) {
      this.messages.push(...answers);
      this.stopReason = 'max_completion_length';
      this.stopped = false;
      return null;
    }
    this.messages.push(...answers);
    this.rendered.push(...answers);
    this.ids.push(...bridge);
    for (let i = 0; i < bridge.length; i++) this.lossMask.push(0);
    // Bridge tokens are masked out of every loss term; 0 keeps the row aligned with `ids`.
    if (this.logps) for (let i = 0; i < bridge.length; i++) this.logps.push(0);
    return bridge;
  }

  private end(reason: AgentStopReason): null {
    this.stopReason = reason;
    return null;
  }

  info(): AgentRolloutInfo {
    return {
      messages: this.messages,
      tool_calls: this.records,
      turns: this.turns,
      stop_reason: this.stopReason,
      model_tokens: this.lossMask.reduce((a, m) => a + m, 0),
      env_reward: this.envReward,
      env_steps: this.envSteps,
    };
  }
}

/** The rollout's request: the round's (one-based) optimizer step keys the tool journal and the episode seeds. */
export type AgentRolloutRequest = RolloutRequest & { step?: number };

/**
 * A multi-turn rollout over the policy's generation session. `sources.executor()` answers tool calls;
 * `sources.env` makes one environment per rollout (the G members of a group reset from one seed).
 */
export function agentRollout(s: AgentRolloutSettings, sources: AgentSources): Rollout {
  const sampling = samplingOptions({ temperature: s.temperature, topK: s.top_k, topP: s.top_p });
  return async (ctx, req: AgentRolloutRequest) => {
    const tok = ctx.tok;
    const format = toolCallFormatOf(tok.chatTemplate);
    const executor = sources.executor();
    const step = req.step ?? 0;
    const stopIds = tok.stopIds.length ? tok.stopIds : tok.eosId !== null ? [tok.eosId] : [];
    if (stopIds.length === 0) throw new UserError(`${tok.dir}: the tokenizer has no stop token, so an assistant turn's end cannot be found`);
    const n = req.prompts.length * req.n;
    const out: Completion[] = new Array(n);
    const envs: EnvSession[] = [];
    let failure: unknown = null;
    let session: GenerationSession | null = null;
    try {
      // Each member's start: the prompt's messages, its environment's opening ones, the tools offered.
      const starts = await Promise.all(
        Array.from({ length: n }, async (_, j) => {
          const i = Math.floor(j / req.n);
          const p = req.prompts[i];
          const seed = episodeSeed(req.seed, step, i);
          let env: EnvSession | null = null;
          let prompt = p.prompt;
          let opening: Message[] = [];
          let tools = executor ? [...executor.specs] : [];
          if (sources.env) {
            env = await sources.env.pick(p.row, p.at).open(p.at);
            envs.push(env);
            opening = await env.reset(p.row, seed);
            tools = [...tools, ...env.toolSpecs];
            // The environment's prompt replaces the row's (TRL's reset returning the prompt).
            if (env.prompt !== null) prompt = env.prompt;
            else if (prompt === null) throw new EnvironmentError(`--env ${env.spec}: reset() gave no prompt for the row at ${p.at}, which has none; return it from reset (a string, or { prompt })`, env.spec, 'reset');
          }
          if (prompt === null) throw new UserError(`${p.at}: no prompt; only an --env environment whose reset() returns one can answer a row without`);
          const start = [...promptMessages(prompt), ...opening];
          return { i, seed, env, prompt, start, tools, promptIds: chatPromptIds(tok, start, { tools }) };
        }),
      );
      // A group's members share the row and the seed, so their environments must give one prompt: the advantages compare answers to it.
      for (let j = 0; j < n; j++) {
        const x = starts[j];
        const first = starts[x.i * req.n];
        if (x.env && JSON.stringify(x.prompt) !== JSON.stringify(first.prompt)) {
          throw new EnvironmentError(`--env ${x.env.spec}: reset() gave the rollouts of the row at ${req.prompts[x.i].at} different prompts for the same row and seed; its prompt must be a function of them`, x.env.spec, 'reset');
        }
      }
      const longest = Math.max(...starts.map((x) => x.promptIds.length));
      session = GenerationSession.open(ctx.policy, { ...sampling, logprobs: !!req.logprobs, stopIds, padId: tok.padId ?? tok.eosId ?? 0, vocabLimit: tok.vocabSize, maxBatch: Math.min(32, n), slots: longest + s.max_completion_length });
      for (const x of starts) {
        if (x.promptIds.length + s.max_completion_length > session.maxPositions) {
          throw new UserError(`grpo: the prompt at ${req.prompts[x.i].at} is ${x.promptIds.length} tokens with its tools; with max_completion_length ${s.max_completion_length} it passes the model's ${session.maxPositions} positions`);
        }
      }
      // A group's members fork one row holding the prompt: one prefill, G random streams.
      const bases = new Map<string, GenerationRow>();
      const rows = starts.map((x, j) => {
        const key = `${x.i}:${x.promptIds.join(',')}`;
        let base = bases.get(key);
        if (!base) bases.set(key, (base = session!.start(x.promptIds, sampleRandom(req.seed, x.i, -1), s.max_completion_length)));
        return base.fork(sampleRandom(req.seed, x.i, j % req.n), s.max_completion_length);
      });
      for (const b of bases.values()) b.close();
      await Promise.all(
        starts.map(async (x, j) => {
          const p = req.prompts[x.i];
          const row = rows[j];
          const ep = new Episode(tok, s, format, x.tools, x.start, { executor, env: x.env, where: { row: p.row, seed: x.seed, step, rollout: j, at: p.at } });
          try {
            for (;;) {
              if (failure) return;
              const seg = await row.generate({ maxNewTokens: ep.budget });
              if (req.logprobs && !seg.logps) throw new Error('agent rollout: the generation session gave no log-probs for a turn');
              const next = await ep.take(seg.ids, seg.stop === 'stop-id', seg.logps);
              if (!next) break;
              row.extend(next);
            }
            if (x.env) {
              const r = await x.env.reward();
              const last = [...ep.envSteps].reverse().find((e) => e.reward !== undefined);
              ep.envReward = r ?? last?.reward ?? null;
            }
            const info: AgentRolloutInfo = { prompt: x.prompt, ...ep.info() };
            out[j] = { prompt: x.i, promptIds: x.promptIds, ids: ep.ids, lossMask: ep.lossMask, text: ep.finalAnswer, stopped: ep.stopped, info: info as unknown as Record<string, unknown> };
            if (req.logprobs) out[j].logps = ep.logps!;
          } catch (e) {
            // The first failure stops the round; the other rows stop at their next turn.
            failure ??= e;
          } finally {
            row.close();
          }
        }),
      );
    } finally {
      await session?.close();
      for (const e of envs) await e.close().catch((err) => (failure ??= err));
    }
    if (failure) throw failure;
    return out;
  };
}
