/**
 * The endpoint of an `--agent` run: `prefzoo serve`'s server (src/serve) on 127.0.0.1 at a free port,
 * over the live weights of the step, with one path per rollout (`/rollouts/ID/v1`). A rollout's path
 * draws from the rollout's own generator with the run's sampling settings, caps each call at
 * max_completion_length tokens, continues a conversation from the ids it sampled (token in, token
 * out: agent-continue.ts) and records every call for the harness (agent-harness.ts).
 */
import type { Message, ToolSpec } from '../../chat.ts';
import type { Decoder } from '../../models/generate.ts';
import type { LoadedTokenizer } from '../../tokenize/index.ts';
import { ServeEngine } from '../../serve/engine.ts';
import { startServer, type Rollout } from '../../serve/http.ts';
import { continuedPrompt, type AnsweredCall } from './agent-continue.ts';
import type { AgentEndpoint, RolloutRoute } from './agent-harness.ts';
import type { GrpoSettings } from './settings.ts';

/** The model name the run's endpoint serves. */
export const AGENT_MODEL = 'policy';

export async function openAgentEndpoint(tok: LoadedTokenizer, decoder: Decoder, s: GrpoSettings, o: { maxBatch?: number } = {}): Promise<AgentEndpoint> {
  // No kept prompts: whether a rollout's first call copies another's prompt would hang on which
  // request arrived first, and a run must not depend on that (a rollout's own next call continues
  // its kept row instead, see EngineRequest.keep).
  const engine = new ServeEngine(decoder, tok, { maxBatch: o.maxBatch ?? 128, prefixCache: 0 });
  // A rollout's route gone (its agent ended): the row kept for its next call goes too.
  const routes = new (class extends Map<string, RolloutRoute> {
    override delete(id: string): boolean {
      engine.release(id);
      return super.delete(id);
    }
  })();
  // Per rollout, the calls answered so far (for token-in continuation).
  const history = new Map<string, AnsweredCall[]>();
  const endOfTurn = new Set(engine.stopIds);
  const server = await startServer({
    engine,
    model: AGENT_MODEL,
    host: '127.0.0.1',
    port: 0,
    // The run's own agents: as many at once as a round has rollouts, none turned away.
    limits: { maxConcurrency: 1 << 16, maxQueue: 1 << 16 },
    // The agents' connections stay open between rounds: the optimizer step between them blocks this
    // process's event loop for seconds, and a server timing idle sockets out would reset the next
    // round's first requests as the agents' client reuses them.
    keepAliveTimeout: 0,
    routes: {
      rollout: (id): Rollout | null => {
        const route = routes.get(id);
        if (!route) return null;
        const calls = history.get(id) ?? [];
        history.set(id, calls);
        return {
          rng: route.rng,
          sampling: { temperature: s.temperature, top_p: s.top_p, top_k: s.top_k },
          maxTokens: s.max_completion_length,
          keep: id,
          prompt: (messages: readonly Message[], tools: readonly ToolSpec[]) => continuedPrompt(tok, calls, messages, tools),
          record: (c) => {
            const answer: Message = { role: 'assistant', content: c.text, ...(c.toolCalls.length ? { tool_calls: c.toolCalls } : {}) };
            const last = c.completionIds[c.completionIds.length - 1];
            calls.push({ messages: c.messages, tools: c.tools, promptIds: c.promptIds, completionIds: c.completionIds, ended: last !== undefined && endOfTurn.has(last), answer });
            route.record({ promptIds: c.promptIds, completionIds: c.completionIds, logps: c.logps, finishReason: c.finishReason, text: c.text, request: { messages: c.messages, tools: c.tools } });
          },
        };
      },
    },
  });
  const base = server.url.replace(/\/v1$/, '');
  let busy = engine.busySeconds;
  return {
    url: base,
    model: AGENT_MODEL,
    routes,
    async setModel(d: Decoder) {
      history.clear();
      await engine.setModel(d);
    },
    takeDecodeSeconds() {
      const now = engine.busySeconds;
      const d = now - busy;
      busy = now;
      return d;
    },
    async close() {
      await server.close({ cancel: true });
      await engine.close();
    },
  };
}
