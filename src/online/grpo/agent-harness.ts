/**
 * `grpo --agent ./agent.mjs`: the agent people already wrote, trained unchanged. The module's default
 * export is
 *
 *   async (task, { baseURL, apiKey, model, seed, signal }) => reward | { reward, ...info } | text | messages
 *
 * and talks to an OpenAI-compatible endpoint (src/serve) that this run starts on 127.0.0.1, serving
 * the live weights of the step. Every rollout gets its own base URL (`/rollouts/ID/v1`), and the
 * endpoint draws that rollout's tokens from the rollout's own generator (whatever `seed` a request
 * names) with the run's sampling settings, recording every call as sampled: prompt ids, completion
 * ids, the sampler's log-probs. After the round the calls become training rows (agent-rows.ts); the
 * rollout's reward — the agent's number, or the `--reward` functions on its final text and the task's
 * columns — gives one advantage per rollout, applied to all its rows, each rollout weighing once.
 *
 * The G rollouts of a task share the task and `seed` (for the agent's own randomness: simulated
 * users, tool results), so their differences are the policy's. A rollout whose agent throws, times out
 * (agent_timeout), returns no reward when no --reward scores it, or is refused by the endpoint (a
 * malformed request) is a counted failure: its calls are not trained and its reward is left out of
 * its group's mean and std (reward NaN, advantage 0 — as an unscorable completion). Past
 * max_agent_error_rate of a round's rollouts failing, the run stops with one line naming the module,
 * the task's file:line and the first error; the last checkpoint is untouched (nothing was saved).
 *
 * Resume: the agent is run again. A resumed step draws the same seeds, the same rollout generators and
 * so the same tokens, as long as the agent itself is a function of (task, seed) and of what the
 * endpoint answers: no clock, no Math.random, no outside service whose answers change.
 */
import { existsSync } from 'node:fs';
import { isAbsolute, resolve } from 'node:path';
import { pathToFileURL } from 'node:url';
import { UserError } from '../../errors.ts';
import { SeededRandom } from '../../random.ts';
import { mixSeed, episodeSeed } from '../../agents/seeds.ts';
import type { Message } from '../../chat.ts';
import type { Decoder } from '../../models/generate.ts';
import type { PromptRow } from '../prompts.ts';
import type { RewardFunction } from '../rewards/index.ts';
import { perRolloutScale, rowsOfCalls, type AgentRow, type RecordedCall, type RowStats } from './agent-rows.ts';
import type { Completion } from './rollout.ts';

/** What an agent is given beside its task. */
export interface AgentContext {
  /** The rollout's own OpenAI-compatible base URL (ends in /v1). */
  baseURL: string;
  /** Any non-empty string: the endpoint is local to the run. */
  apiKey: string;
  /** The model name the endpoint serves. */
  model: string;
  /** The rollout's seed, shared by the G rollouts of a task: the agent's own randomness. */
  seed: number;
  /** Aborted at agent_timeout; pass it to the client (the `openai` SDK's and the AI SDK's `abortSignal`). */
  signal: AbortSignal;
}

/** What an agent returns: a reward, a reward with information, or its final text or messages for `--reward`. */
export type AgentResult = number | string | Message[] | ({ reward?: number | null; text?: string; messages?: Message[] } & Record<string, unknown>);

export type AgentFunction = (task: Record<string, unknown>, ctx: AgentContext) => Promise<AgentResult> | AgentResult;

/** The call predicate of `train_calls=FILE.mjs`: whether call `index` of a rollout is trained on. */
export type CallPredicate = (call: { index: number; calls: number; promptIds: readonly number[]; completionIds: readonly number[]; finishReason: string; request: unknown }) => boolean;

/** What the endpoint gives a rollout's calls: its generator and where to record them. */
export interface RolloutRoute {
  rng: SeededRandom;
  record(call: RecordedCall & { request?: unknown; text?: string }): void;
}

/**
 * The endpoint the harness runs its agents against (src/serve in the run): the live weights set
 * before each round, rollout routes registered for the round.
 */
export interface AgentEndpoint {
  /** Base URL of the server, without /v1 (http://127.0.0.1:PORT). */
  readonly url: string;
  readonly model: string;
  routes: Map<string, RolloutRoute>;
  /** Serves these weights from now on (no call in flight). */
  setModel(decoder: Decoder): Promise<void>;
  /** Seconds spent decoding since the last call of this (the rest of a round is the agents' own code). */
  takeDecodeSeconds(): number;
  close(): Promise<void>;
}

/** A loaded `--agent` module. */
export interface LoadedAgent {
  spec: string;
  fn: AgentFunction;
}

/**
 * The function a module `FILE[:export]` exports (its default export without `:export`), each
 * mistake one line: `label` names the flag or setting, `bad` what the spec must look like, `what`
 * the function it must be.
 */
async function importFunction(spec: string, o: { label: string; setting: string; bad: string; what: string }): Promise<unknown> {
  const m = /^(.*\.(?:mjs|cjs|js|ts|mts))(?::([A-Za-z_$][\w$]*))?$/.exec(spec);
  if (!m) throw new UserError(o.bad, { setting: o.setting });
  const file = isAbsolute(m[1]) ? m[1] : resolve(m[1]);
  if (!existsSync(file)) throw new UserError(`${o.label} ${spec}: ${file} does not exist`, { setting: o.setting });
  let mod: Record<string, unknown>;
  try {
    mod = (await import(pathToFileURL(file).href)) as Record<string, unknown>;
  } catch (e) {
    throw new UserError(`${o.label} ${spec}: cannot load the module (${firstLine(e)})`, { setting: o.setting });
  }
  const name = m[2] ?? 'default';
  const fn = mod[name];
  if (typeof fn !== 'function') throw new UserError(`${o.label} ${spec}: the module's ${name === 'default' ? 'default export' : `export "${name}"`} is not a function ${o.what}`, { setting: o.setting });
  return fn;
}

/** Loads `--agent FILE[:export]`: the default export (or the named one) must be a function. */
export async function loadAgent(spec: string | AgentFunction): Promise<LoadedAgent> {
  if (typeof spec === 'function') return { spec: spec.name || 'agent', fn: spec };
  const fn = await importFunction(spec, { label: '--agent', setting: 'agent', bad: `--agent ${spec}: an agent must be a .mjs, .js or .ts module, optionally FILE:export`, what: '(task, { baseURL, apiKey, model, seed, signal }) => reward' });
  return { spec, fn: fn as AgentFunction };
}

/** Loads `train_calls`: 'all', 'last' (the rollout's last call), or a predicate module FILE[:export]. */
export async function loadCallPredicate(v: string): Promise<CallPredicate | 'all' | 'last'> {
  if (v === 'all' || v === 'last') return v;
  const fn = await importFunction(v, { label: 'grpo: train_calls', setting: 'train_calls', bad: `grpo: train_calls must be all, last or a predicate module FILE.mjs[:export], got "${v}"`, what: '(call) => boolean' });
  return fn as CallPredicate;
}

function firstLine(e: unknown): string {
  return (e instanceof Error ? e.message : String(e)).split('\n')[0].slice(0, 300);
}

/** One rollout's outcome. */
export interface AgentRollout {
  /** Index of its task in the round. */
  task: number;
  /** The agent's own reward (null: none given), its text and messages, what else it returned. */
  reward: number | null;
  text: string;
  messages: Message[] | null;
  info: Record<string, unknown>;
  calls: (RecordedCall & { request?: unknown })[];
  rows: AgentRow[];
  stats: RowStats;
  error: string | null;
}

export interface AgentSettings {
  agent_timeout: number;
  max_agent_error_rate: number;
}

/** The agent's return read: a reward, information, a final text or messages (null when it is none of them). */
export function readResult(r: unknown): { reward: number | null; text: string; messages: Message[] | null; info: Record<string, unknown> } | null {
  const lastAssistant = (ms: Message[]) => [...ms].reverse().find((m) => m.role === 'assistant')?.content ?? '';
  if (typeof r === 'number') return Number.isFinite(r) ? { reward: r, text: '', messages: null, info: {} } : null;
  if (typeof r === 'string') return { reward: null, text: r, messages: null, info: {} };
  if (Array.isArray(r)) {
    if (!r.every((m) => m && typeof m === 'object' && typeof m.role === 'string')) return null;
    const ms = r as Message[];
    return { reward: null, text: typeof lastAssistant(ms) === 'string' ? (lastAssistant(ms) as string) : '', messages: ms, info: {} };
  }
  if (r && typeof r === 'object') {
    const o = r as Record<string, unknown>;
    const { reward, text, messages, ...info } = o;
    if (reward !== undefined && reward !== null && !(typeof reward === 'number' && Number.isFinite(reward))) return null;
    const ms = Array.isArray(messages) ? (messages as Message[]) : null;
    const t = typeof text === 'string' ? text : ms ? String(lastAssistant(ms) ?? '') : '';
    if (reward === undefined && typeof text !== 'string' && !ms) return null;
    return { reward: typeof reward === 'number' ? reward : null, text: t, messages: ms, info };
  }
  return null;
}

/**
 * Runs the agent on each task G times against `endpoint` and turns the recorded calls into rows.
 * `scored`: whether --reward functions score the agent's text (else the agent must return a reward).
 */
export async function runAgents(
  agent: LoadedAgent,
  endpoint: AgentEndpoint,
  tasks: readonly PromptRow[],
  o: { G: number; seed: number; runSeed: number; step: number; scored: boolean; trainCalls: CallPredicate | 'all' | 'last'; settings: AgentSettings },
): Promise<{ rollouts: AgentRollout[]; agentSeconds: number; decodeSeconds: number }> {
  const t0 = performance.now();
  endpoint.takeDecodeSeconds();
  const jobs = tasks.flatMap((task, p) => Array.from({ length: o.G }, (_, g) => ({ task, p, g })));
  const rollouts = await Promise.all(
    jobs.map(async ({ task, p, g }): Promise<AgentRollout> => {
      const id = `s${o.step}-${p}-${g}-${mixSeed(o.seed, p, g).toString(36)}`;
      const calls: (RecordedCall & { request?: unknown })[] = [];
      const route: RolloutRoute = { rng: new SeededRandom(mixSeed(o.seed, p, g, 0xa6e7)), record: (c) => calls.push(c) };
      endpoint.routes.set(id, route);
      const ac = new AbortController();
      const seed = episodeSeed(o.runSeed, o.step, p);
      let timer: NodeJS.Timeout | undefined;
      let error: string | null = null;
      let result: ReturnType<typeof readResult> = null;
      try {
        const ran = Promise.resolve().then(() => agent.fn({ ...task.row }, { baseURL: `${endpoint.url}/rollouts/${id}/v1`, apiKey: 'prefzoo', model: endpoint.model, seed, signal: ac.signal }));
        const timeout = new Promise<never>((_, reject) => {
          timer = setTimeout(() => {
            ac.abort(new Error(`agent_timeout: ${o.settings.agent_timeout} s`));
            reject(new Error(`timed out after agent_timeout=${o.settings.agent_timeout} s`));
          }, o.settings.agent_timeout * 1000);
        });
        const r = await Promise.race([ran, timeout]);
        result = readResult(r);
        if (!result) error = `returned ${describe(r)}, not a reward, { reward, ...info }, a text or messages`;
        else if (result.reward === null && !o.scored) error = `returned ${describe(r)} and no --reward scores it: return a number or { reward }`;
      } catch (e) {
        error = firstLine(e);
      } finally {
        clearTimeout(timer);
        endpoint.routes.delete(id);
      }
      if (!error && calls.length === 0) error = 'made no call to the endpoint';
      const trained = trainedCalls(calls, o.trainCalls);
      const { rows, stats } = error ? { rows: [], stats: rowsOfCalls([]).stats } : rowsOfCalls(calls, trained);
      return { task: p, reward: result?.reward ?? null, text: result?.text ?? '', messages: result?.messages ?? null, info: result?.info ?? {}, calls, rows, stats: error ? { ...stats, calls: calls.length } : stats, error };
    }),
  );
  const decodeSeconds = endpoint.takeDecodeSeconds();
  const failed = rollouts.filter((r) => r.error);
  if (failed.length > 0 && failed.length > o.settings.max_agent_error_rate * rollouts.length) {
    const f = failed[0];
    throw new UserError(
      `--agent ${agent.spec}: ${failed.length} of ${rollouts.length} rollouts failed (past max_agent_error_rate=${o.settings.max_agent_error_rate}); the first, on the task at ${tasks[f.task].at}: ${f.error}`,
      { setting: 'agent' },
    );
  }
  return { rollouts, agentSeconds: (performance.now() - t0) / 1000 - decodeSeconds, decodeSeconds };
}

function describe(v: unknown): string {
  if (v === undefined) return 'undefined';
  if (v === null) return 'null';
  if (typeof v === 'number') return String(v);
  const s = JSON.stringify(v);
  return s === undefined ? typeof v : s.length > 60 ? `${s.slice(0, 57)}...` : s;
}

function trainedCalls(calls: readonly (RecordedCall & { request?: unknown })[], which: CallPredicate | 'all' | 'last'): (i: number) => boolean {
  if (which === 'all') return () => true;
  if (which === 'last') return (i) => i === calls.length - 1;
  return (i) => {
    const c = calls[i];
    return which({ index: i, calls: calls.length, promptIds: c.promptIds, completionIds: c.completionIds, finishReason: c.finishReason, request: c.request }) === true;
  };
}

/** The round's rollouts as one Completion each (what the reward functions and the metrics read). */
export function rolloutCompletions(rollouts: readonly AgentRollout[]): Completion[] {
  return rollouts.map((r) => {
    const last = r.rows[r.rows.length - 1];
    return {
      prompt: r.task,
      promptIds: last?.promptIds ?? [],
      ids: last?.ids ?? [],
      lossMask: r.rows.flatMap((x) => x.lossMask),
      text: r.text,
      stopped: r.rows.every((x) => x.stopped),
      info: { agent_reward: r.error ? null : r.reward, ...(r.messages ? { messages: r.messages } : {}), ...r.info, calls: r.stats.calls, rows: r.rows.length, ...(r.error ? { error: r.error } : {}) },
    };
  });
}

/** The 'agent' reward function: each rollout's own reward (null when the agent gave none). */
export const AGENT_REWARD: RewardFunction = {
  name: 'agent',
  source: '--agent',
  rerunnable: true,
  score: ({ rollouts }) => (rollouts ?? []).map((r) => {
    const v = (r as { agent_reward?: unknown }).agent_reward;
    return typeof v === 'number' ? v : null;
  }),
};

/** The round's rows, each with its rollout's advantage times the per-rollout scale (agent-rows.ts). */
export function rowsWithAdvantages(rollouts: readonly AgentRollout[], advantages: ArrayLike<number>): { row: AgentRow; rollout: number; advantage: number }[] {
  const scale = perRolloutScale(rollouts.map((r) => r.rows.length));
  return rollouts.flatMap((r, i) => r.rows.map((row) => ({ row, rollout: i, advantage: advantages[i] * scale[i] })));
}

/** agent/… metrics of a round. */
export function agentRoundMetrics(rollouts: readonly AgentRollout[], agentSeconds: number, decodeSeconds: number): Record<string, number> {
  const n = rollouts.length;
  const sum = (f: (r: AgentRollout) => number) => rollouts.reduce((a, r) => a + f(r), 0);
  const calls = sum((r) => r.stats.calls);
  return {
    'agent/calls_per_rollout': calls / n,
    'agent/rows_per_rollout': sum((r) => r.rows.length) / n,
    'agent/merged_calls': sum((r) => r.stats.merged),
    'agent/forked_calls': sum((r) => r.stats.forked),
    'agent/retokenization_forks': sum((r) => r.stats.retokenized),
    'agent/errors': sum((r) => (r.error ? 1 : 0)),
    'agent/agent_seconds': agentSeconds,
    'agent/decode_seconds': decodeSeconds,
  };
}
