/**
 * The multi-turn GRPO rollout (src/online/grpo/agent-rollout.ts):
 *
 * - a scripted policy: recorded assistant turns (token ids a policy could have sampled, ending with the
 *   template's end-of-turn id) fed to the rollout's turn handler with real tools behind the real
 *   executor; the tool metrics, turns and stop reasons are exact, and each completion's ids and loss
 *   mask equal what the chat template's render of the whole conversation gives (tokenizeConversation:
 *   an independent cut of the same conversation), and the micro-batch's loss mask is that mask;
 * - journaled MCP results (a real server from npm) replayed for a resumed step;
 * - `prefzoo grpo` against a real MCP server for 2 steps: tools/call_frequency and the other agent
 *   metrics in metrics.jsonl; killed with SIGKILL after its first checkpoint and resumed, the same rows
 *   and weights; a throwing environment stops the run in one line naming it; --help lists the flags.
 */
import { spawnSync } from 'node:child_process';
import { existsSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join, resolve } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { initModelFolder } from '../src/models/init.ts';
import { loadTokenizer, type LoadedTokenizer } from '../src/tokenize/index.ts';
import { chatPromptIds, tokenizeConversation } from '../src/tokenize/conversation.ts';
import { Episode, STOP_REASONS, type AgentRolloutSettings } from '../src/online/grpo/agent-rollout.ts';
import { agentMetrics, lengthMetrics } from '../src/online/grpo/metrics.ts';
import { microBatches, type GrpoRound } from '../src/online/grpo/round.ts';
import type { Completion } from '../src/online/grpo/rollout.ts';
import { ToolExecutor, toolsFromValues, ToolJournal, startMcpServers, type CallRecord } from '../src/agents/index.ts';
import type { Message } from '../src/chat.ts';
import { renderReport } from '../src/train/report.ts';
import { scoreCompletions } from '../src/online/grpo/evaluate.ts';
import { loadAllRewards } from '../src/online/rewards/index.ts';
import { killWhen } from './helpers/faults.ts';

const ROOT = resolve(import.meta.dirname, '..');
const bin = join(ROOT, 'bin', 'prefzoo.mjs');
const EVERYTHING = join(ROOT, 'node_modules/@modelcontextprotocol/server-everything/dist/index.js');
const dir = mkdtempSync(join(tmpdir(), 'prefzoo-agent-rollout-'));
afterAll(() => rmSync(dir, { recursive: true, force: true }));
const model = join(dir, 'model');
let tok: LoadedTokenizer;
let END: number;

beforeAll(() => {
  initModelFolder(model, 'llama', 'tiny', 3);
  tok = loadTokenizer(model);
  END = tok.tokenToId('<|im_end|>')!;
});

const SETTINGS: AgentRolloutSettings = { temperature: 1, top_p: 1, top_k: 0, max_completion_length: 400, max_turns: 4, max_tool_calling_iterations: 0, max_tool_response_tokens: 0 };

const TOOLS = toolsFromValues([
  { name: 'lookup', description: 'Looks a key up.', parameters: { type: 'object', properties: { key: { type: 'string' } }, required: ['key'] }, run: ({ key }: { key: string }) => `the value of ${key} is 7` },
  { name: 'broken', description: 'Always fails.', parameters: { type: 'object', properties: {} }, run: () => { throw new Error('disk on fire'); } },
]);

/** A call as the template writes it (so the recorded turn is what the template renders back). */
const call = (name: string, args: Record<string, unknown>) => `<tool_call>\n{"name": "${name}", "arguments": ${JSON.stringify(args).replace(/":/g, '": ').replace(/,"/g, ', "')}}\n</tool_call>`;

/** Feeds recorded turns (text + the end-of-turn id) to an episode, extending as the rollout would. */
async function script(ex: ToolExecutor, turns: string[], rollout: number, settings = SETTINGS): Promise<{ ep: Episode; promptIds: number[]; start: Message[] }> {
  const start: Message[] = [{ role: 'user', content: `question ${rollout}` }];
  const promptIds = chatPromptIds(tok, start, { tools: ex.specs });
  const ep = new Episode(tok, settings, 'hermes', ex.specs, start, { executor: ex, env: null, where: { row: { prompt: start }, seed: 11, step: 1, rollout, at: 'q.jsonl:1' } });
  let k = 0;
  for (const t of turns) {
    const ids = [...tok.encode(t, { addSpecialTokens: false }), END];
    // Recorded sampler log-probs: −1, −2, … over the policy's tokens, in order.
    const next = await ep.take(ids, true, ids.map(() => -++k));
    if (!next) break;
  }
  return { ep, promptIds, start };
}

function completionOf(ep: Episode, promptIds: number[]): Completion {
  return { prompt: 0, promptIds, ids: ep.ids, lossMask: ep.lossMask, text: ep.finalAnswer, stopped: ep.stopped, info: ep.info() as unknown as Record<string, unknown>, logps: ep.logps! };
}

describe('the agent rollout, scripted', () => {
  it('exact tool metrics, turns, stop reasons; ids and masks equal the template\'s render of the conversation', async () => {
    const ex = new ToolExecutor({ tools: TOOLS });
    const a = await script(ex, [call('lookup', { key: 'x' }), 'It is 7.'], 0);
    const b = await script(ex, [`${call('broken', {})}\n${call('lookup', { key: 'y' })}`, '<tool_call>not json</tool_call>', 'Gave up.'], 1);
    const c = await script(ex, ['No tools needed.'], 2);
    const d = await script(ex, [call('lookup', { key: 'z' }), call('lookup', { key: 'z' }), call('lookup', { key: 'z' }), call('lookup', { key: 'z' }), 'never'], 3);

    expect([a, b, c, d].map((x) => x.ep.turns)).toEqual([2, 3, 1, 4]);
    expect([a, b, c, d].map((x) => x.ep.stopReason)).toEqual(['stop', 'stop', 'stop', 'max_turns']);
    expect(a.ep.finalAnswer).toBe('It is 7.');
    const rec = (x: { ep: Episode }) => x.ep.records.map((r: CallRecord) => [r.name, r.ok]);
    expect(rec(a)).toEqual([['lookup', true]]);
    expect(rec(b)).toEqual([['broken', false], ['lookup', true], ['', false]]);
    expect(a.ep.messages[2]).toEqual({ role: 'tool', content: 'the value of x is 7', name: 'lookup' });
    expect(b.ep.messages[2].content).toBe('{"error":"broken failed: disk on fire"}');

    const completions = [a, b, c, d].map((x) => completionOf(x.ep, x.promptIds));
    const m = agentMetrics(completions);
    // 1 + 3 + 0 + 3 calls (the fourth turn of d is cut by max_turns before its calls run) over 4 rollouts; 2 of 7 failed.
    expect(m['tools/call_frequency']).toBe(7 / 4);
    expect(m['tools/failure_frequency']).toBe(2 / 7);
    expect([m['num_turns/mean'], m['num_turns/min'], m['num_turns/max']]).toEqual([10 / 4, 1, 4]);
    expect(m['stop_reason/stop']).toBe(3 / 4);
    expect(m['stop_reason/max_turns']).toBe(1 / 4);
    expect(STOP_REASONS.reduce((s, r) => s + m[`stop_reason/${r}`], 0)).toBe(1);

    // Rewards read the final answers, and each rollout's conversation, calls and turns as a third argument.
    const rewardFile = join(dir, 'turns.mjs');
    writeFileSync(rewardFile, 'export function seen(completions, rows, rollouts) { return completions.map((c, i) => (c === "It is 7." ? 100 : 0) + rollouts[i].turns * 10 + rollouts[i].tool_calls.length); }\n');
    const fns = await loadAllRewards([rewardFile]);
    const rowsOf = [{ prompt: 'q', row: { prompt: 'q' }, at: 'q.jsonl:1' }];
    const scored = await scoreCompletions(fns, [1], rowsOf, completions, { maxCompletionLength: 400, timeout: 10 });
    expect(Array.from(scored.rewards)).toEqual([121, 33, 10, 43]);
    // The independent cut: the template renders the whole conversation, tokenizeConversation splits it.
    for (const x of [a, c, d]) {
      const conv = tokenizeConversation(tok, x.ep.messages, { tools: ex.specs });
      const n = x.promptIds.length + x.ep.ids.length;
      expect(conv.ids.slice(0, n)).toEqual([...x.promptIds, ...x.ep.ids]);
      expect(conv.mask.slice(0, n)).toEqual([...x.promptIds.map(() => 0), ...x.ep.lossMask]);
    }
    // The policy's tokens: every sampled id (its end-of-turn id included) is 1, every bridge id 0.
    const sampled = (x: { ep: Episode }) => x.ep.lossMask.reduce((s, v) => s + v, 0);
    expect(sampled(a)).toBe(tok.encode(call('lookup', { key: 'x' }), { addSpecialTokens: false }).length + tok.encode('It is 7.', { addSpecialTokens: false }).length + 2);
    expect(lengthMetrics(completions)['completions/mean_length']).toBe(completions.reduce((s, x) => s + sampled({ ep: [a, b, c, d][completions.indexOf(x)].ep }), 0) / 4);

    // The sampler's log-probs follow the ids: the policy's tokens carry theirs in order, bridge tokens 0.
    for (const c of completions) {
      expect(c.logps).toHaveLength(c.ids.length);
      const own = c.logps!.filter((_, t) => c.lossMask[t] === 1);
      expect(own).toEqual(own.map((_, t) => -t - 1));
      expect(c.logps!.filter((_, t) => c.lossMask[t] === 0).every((v) => v === 0)).toBe(true);
    }

    // The micro-batch's loss mask is the rollout's mask at the completion's positions; the old and the
    // sampler's log-probs are placed on every completion position (bridge ones included) and masked by the loss.
    const round: GrpoRound = {
      promptIds: completions.map((x) => x.promptIds), ids: completions.map((x) => x.ids), counted: [1, 1, 1, 0],
      masks: completions.map((x) => x.lossMask), advantages: [1, -1, 0.5, 2], old: completions.map((x) => x.ids.map((_, t) => -t - 1)), ref: null,
      sampling: completions.map((x) => x.logps!), metrics: {},
    };
    const [mb] = microBatches(round, { old: true, ref: false, teacher: false, items: false, entropies: false, bonus: false, adaptive: false, sampling: true }, { batchSize: 4, padTo: 1, padId: 0 });
    const samp = mb.feeds.sampling_token_logps.data as Float32Array;
    const [B, T] = mb.feeds.loss_mask.dims as number[];
    const lm = mb.feeds.loss_mask.data as Float32Array;
    const old = mb.feeds.old_token_logps.data as Float32Array;
    const ids = mb.feeds.input_ids.data as BigInt64Array;
    expect(B).toBe(4);
    completions.forEach((x, r) => {
      const row = Array.from(ids.subarray(r * T, (r + 1) * T), Number);
      const P = x.promptIds.length;
      expect(row.slice(0, P + x.ids.length)).toEqual([...x.promptIds, ...x.ids]);
      // Position P + t - 1 predicts completion token t (the graph's shift), or P + t: find which by the old log-probs.
      const placed = Array.from(old.subarray(r * T, (r + 1) * T)).map((v, t) => [v, t]).filter(([v]) => v !== 0);
      expect(placed.map(([v]) => v)).toEqual(x.ids.map((_, t) => -t - 1));
      const at = placed.map(([, t]) => t);
      expect(at.map((t) => samp[r * T + t])).toEqual(x.logps);
      const want = round.counted[r] ? x.lossMask : x.lossMask.map(() => 0);
      expect(at.map((t) => lm[r * T + t])).toEqual(want);
      expect(Array.from(lm.subarray(r * T, (r + 1) * T)).reduce((s, v) => s + v, 0)).toBe(want.reduce((s, v) => s + v, 0));
    });
  });

  it('a bridge that would pass max_completion_length ends the rollout, unappended (TRL\'s rollback); calls past max_tool_calling_iterations end it', async () => {
    const ex = new ToolExecutor({ tools: TOOLS });
    const first = [...tok.encode(call('lookup', { key: 'x' }), { addSpecialTokens: false }), END];
    const tight = await script(ex, [call('lookup', { key: 'x' }), 'never'], 0, { ...SETTINGS, max_completion_length: first.length + 5 });
    expect(tight.ep.ids).toEqual(first);
    expect([tight.ep.stopReason, tight.ep.stopped, tight.ep.turns]).toEqual(['max_completion_length', false, 1]);
    const capped = await script(ex, [call('lookup', { key: 'x' }), call('lookup', { key: 'y' }), 'never'], 0, { ...SETTINGS, max_tool_calling_iterations: 1 });
    expect([capped.ep.stopReason, capped.ep.turns, capped.ep.records.length]).toEqual(['max_tool_calling_iterations', 2, 1]);
  });

  it('journaled MCP results are replayed for a resumed step (server-everything over stdio)', async () => {
    const journalFile = join(dir, 'journal.jsonl');
    const run = async (resumeFrom?: number) => {
      const servers = await startMcpServers([{ command: 'node', args: [EVERYTHING, 'stdio'], name: 'everything' }]);
      const ex = new ToolExecutor({ providers: servers, journal: ToolJournal.open(journalFile, resumeFrom === undefined ? {} : { resumeFrom }) });
      try {
        return (await script(ex, [call('echo', { message: 'hello' }), 'done'], 0)).ep;
      } finally {
        await ex.close();
      }
    };
    const live = await run();
    expect(live.records.map((r) => [r.name, r.ok, !!r.replayed])).toEqual([['echo', true, false]]);
    expect(live.messages[2].content).toContain('hello');
    const again = await run(1);
    expect(again.records.map((r) => [r.name, r.ok, !!r.replayed])).toEqual([['echo', true, true]]);
    expect(again.ids).toEqual(live.ids);
    expect(again.messages).toEqual(live.messages);
  });
});

describe('prefzoo grpo with tools', () => {
  const prompts = join(dir, 'prompts.jsonl');
  const envThrows = join(dir, 'env-throws.mjs');
  const SET = ['mcp_tools=echo', 'max_steps=2', 'save_steps=1', 'batch_size=4', 'num_generations=2', 'max_completion_length=12', 'max_turns=2', 'logging_steps=1', 'threads=1', 'learning_rate=1e-3', 'beta=0.05'];
  const args = (out: string, extra: string[] = []) => ['grpo', '--model', model, '--prompts', prompts, '--reward', 'format:\\d', '--mcp', `node ${EVERYTHING} stdio`, '-o', out, '--quiet', ...SET.flatMap((s) => ['--param', s]), ...extra];
  const rows = (out: string) => readFileSync(join(out, 'metrics.jsonl'), 'utf8').trim().split('\n').map((l) => JSON.parse(l)).map(({ 'tokens/s': _, ...r }) => r);

  beforeAll(() => {
    writeFileSync(prompts, ['What is 2+2?', 'Say a digit.'].map((p) => JSON.stringify({ prompt: p }) + '\n').join(''));
    writeFileSync(envThrows, 'export default () => ({ reset: () => { throw new Error("board is gone"); }, step: () => ({ messages: [], done: true }) });\n');
  });

  it('runs 2 steps against a real MCP server with the agent metrics; killed with SIGKILL and resumed, the same rows and weights', async () => {
    const straight = join(dir, 'straight');
    const a = spawnSync(process.execPath, [bin, ...args(straight)], { encoding: 'utf8' });
    expect(a.status, a.stderr).toBe(0);
    const want = rows(straight);
    expect(want.map((r) => r.step)).toEqual([1, 2]);
    for (const k of ['tools/call_frequency', 'tools/failure_frequency', 'num_turns/mean', 'num_turns/min', 'num_turns/max', ...STOP_REASONS.map((r) => `stop_reason/${r}`), 'completions/mean_length']) {
      expect(want.every((r) => Number.isFinite(r[k])), k).toBe(true);
    }
    expect(existsSync(join(straight, 'tool-journal.jsonl'))).toBe(true);
    const sample = JSON.parse(readFileSync(join(straight, 'completions.jsonl'), 'utf8').split('\n')[0]);
    expect(sample.messages[0]).toEqual({ role: 'user', content: expect.any(String) });
    expect(sample.messages[1].role).toBe('assistant');
    // prefzoo report shows each logged step's first rollout as a conversation.
    const html = renderReport(straight);
    expect(html.match(/class="conversation"/g)).toHaveLength(2);
    expect(html).toContain(`<div class="msg user"><b>user</b><pre>${sample.messages[0].content.replace(/[&<>"]/g, (c: string) => ({ '&': '&amp;', '<': '&lt;', '>': '&gt;', '"': '&quot;' })[c]!)}</pre></div>`);

    const broken = join(dir, 'broken');
    await killWhen(args(broken), () => existsSync(join(broken, 'checkpoints', 'step-00000001', 'state.json')));
    expect(existsSync(join(broken, 'final'))).toBe(false);
    const b = spawnSync(process.execPath, [bin, ...args(broken, ['--resume'])], { encoding: 'utf8' });
    expect(b.status, b.stderr).toBe(0);
    expect(rows(broken)).toEqual(want);
    expect(Buffer.compare(readFileSync(join(straight, 'final', 'model.safetensors')), readFileSync(join(broken, 'final', 'model.safetensors')))).toBe(0);
  });

  it('a throwing environment stops the run in one line naming it, the function and the prompt', () => {
    const r = spawnSync(process.execPath, [bin, 'grpo', '--model', model, '--prompts', prompts, '--env', envThrows, '--reward', 'format:\\d', '-o', join(dir, 'env'), '--quiet', ...SET.slice(1).flatMap((s) => ['--param', s])], { encoding: 'utf8' });
    expect(r.status).toBe(1);
    const lines = r.stderr.trim().split('\n');
    expect(lines, r.stderr).toHaveLength(1);
    expect(lines[0]).toMatch(new RegExp(`^prefzoo: --env ${envThrows.replace(/[.*+?^${}()|[\]\\]/g, '\\$&')}: reset\\(\\) threw for the prompt at .*prompts\\.jsonl:[12]: board is gone$`));
  });

  it('--help lists the agent flags; agent settings without tools are refused in one line', () => {
    const h = spawnSync(process.execPath, [bin, 'grpo', '--help'], { encoding: 'utf8' }).stdout;
    for (const f of ['--tools <module>', '--mcp <command>', '--mcp-config <file>', '--env <module>']) expect(h).toContain(f);
    for (const k of ['max_turns=10', 'max_tool_calling_iterations=0', 'max_tool_response_tokens=256', 'tool_timeout=60', 'mask_truncated_completions=false', 'max_completion_length=256']) expect(h).toContain(`    ${k}  `);
    const r = spawnSync(process.execPath, [bin, 'grpo', '--model', model, '--prompts', prompts, '--reward', 'format:x', '-o', join(dir, 'refused'), '--param', 'max_turns=3'], { encoding: 'utf8' });
    expect(r.status).toBe(1);
    expect(r.stderr.trim()).toBe('prefzoo: grpo: max_turns=3 applies to rollouts with tools or an environment; give --tools, --mcp, --mcp-config or --env, or leave max_turns out');
  });
});
