/**
 * `prefzoo distill` with tools and an environment (issue 44 item 3, multi-turn): the on-policy
 * micro-batches are GRPO's multi-turn rollouts — the tools rendered into the prompt, each turn
 * answered by the environment (a `tool` message, bridged in as the template renders it) — and the
 * step's loss is gkd's float64 reference from independent forwards of teacher and student over the
 * recorded conversations, counted on the student's sampled tokens only (the bridges masked); the
 * tool metrics are the conversations'; an interrupted run resumes to the same weights and rows; and
 * what cannot be honoured is refused in one line. The student's head is built to end its turns
 * quickly (a random tiny model rarely writes its end-of-turn id), so conversations have several turns.
 */
import { describe, it, expect, beforeAll, afterAll } from 'vitest';
import { mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { initModelFolder } from '../src/models/init.ts';
import { saveCheckpoint } from '../src/models/checkpoint.ts';
import { loadModel } from '../src/models/load.ts';
import { parseConfig, type ModelConfig } from '../src/models/config.ts';
import { loadTokenizer } from '../src/tokenize/index.ts';
import { chatPromptIds } from '../src/tokenize/conversation.ts';
import { ToolExecutor, toolsFromValues } from '../src/agents/index.ts';
import { distill } from '../src/train/distill.ts';
import { distillAgents } from '../src/online/distill-agents.ts';
import type { RefWeights } from './helpers/reference-forward.ts';
import { randomWeights } from './helpers/model-fixtures.ts';
import { distillModel, float64Gkd, withNanAt } from './helpers/distill-fixtures.ts';
import { prefzoo } from './helpers/cli.ts';

const K = 6;
const dir = mkdtempSync(join(tmpdir(), 'pz-distill-tools-'));
afterAll(() => rmSync(dir, { recursive: true, force: true }));
let teacher: string;
let student: string;
const data = join(dir, 'chat.jsonl');
const toolsMjs = join(dir, 'tools.mjs');
const envMjs = join(dir, 'env.mjs');
// A small tool: the template renders its schema into every prompt (about 230 tokens with the template's own text).
const LOOKUP = { name: 'f', description: 'F.', parameters: { type: 'object', properties: {} } };

/**
 * A tiny untied llama whose `<|im_end|>` logit is large in every context: every embedding row gets a
 * shared direction c, and the head's row of that id is c scaled, so turns end after a few tokens.
 */
function chatty(out: string, seed: number): string {
  initModelFolder(out, 'llama', 'tiny', seed, {}, { num_hidden_layers: 1 });
  const config = parseConfig({ ...JSON.parse(readFileSync(join(out, 'config.json'), 'utf8')), tie_word_embeddings: false });
  const w = randomWeights(config, seed);
  const end = loadTokenizer(out).tokenToId('<|im_end|>')!;
  const H = config.hidden_size as number;
  const c = Array.from({ length: H }, (_, i) => Math.sin(i * 1.7 + 0.3));
  const norm = Math.hypot(...c);
  const emb = w.get('model.embed_tokens.weight')!.data as Float32Array;
  for (let v = 0; v < config.vocab_size; v++) for (let i = 0; i < H; i++) emb[v * H + i] += (2 * c[i]) / norm;
  const head = w.get('lm_head.weight')!.data as Float32Array;
  for (let i = 0; i < H; i++) head[end * H + i] = (5 * c[i]) / norm;
  saveCheckpoint(out, w, { config });
  return out;
}

beforeAll(() => {
  teacher = distillModel(join(dir, 'teacher'), 1, { layers: 1 });
  student = chatty(join(dir, 'student'), 2);
  writeFileSync(data, Array.from({ length: 8 }, (_, i) => JSON.stringify({ prompt: [{ role: 'user', content: `What is ${i} plus ${i + 1}?` }], chosen: [{ role: 'assistant', content: `It is ${2 * i + 1}.` }], rejected: [{ role: 'assistant', content: 'No idea.' }] })).join('\n') + '\n');
  writeFileSync(toolsMjs, `export const lookup = { ...${JSON.stringify(LOOKUP)}, run: () => '7' };\n`);
  // Every turn is answered by a tool message, never done: conversations run to max_turns or the budget.
  writeFileSync(envMjs, "export default () => ({ reset() { return {}; }, step({ text }) { return { messages: [{ role: 'tool', content: 'heard ' + text.length + ' characters' }], done: false }; } });\n");
});

type Samples = { step: number; rows: number[]; promptIds: number[][]; ids: number[][]; masks: number[][] }[];
const recorder = () => {
  const got: Samples = [];
  return { got, onSamples: (s: { step: number; rows: readonly number[]; promptIds: readonly (readonly number[])[]; ids: readonly (readonly number[])[]; masks?: readonly (readonly number[])[] }) => got.push({ step: s.step, rows: [...s.rows], promptIds: s.promptIds.map((p) => [...p]), ids: s.ids.map((x) => [...x]), masks: (s.masks ?? []).map((x) => [...x]) }) };
};
const rowsOf = (run: string) => readFileSync(join(run, 'metrics.jsonl'), 'utf8').trim().split('\n').map((l) => JSON.parse(l) as Record<string, number>);
const CLOCKS = new Set(['tokens/s', 'distill/sample_seconds', 'distill/teacher_seconds', 'distill/sample_cpu_seconds', 'distill/teacher_cpu_seconds']);
const timeless = (r: Record<string, number>) => Object.fromEntries(Object.entries(r).filter(([k]) => !CLOCKS.has(k)));
const weightsOf = (d: string) => loadModel(d) as { config: ModelConfig; weights: RefWeights };
const agents = () => distillAgents({ tools: [toolsMjs], env: envMjs });
/** Maximal runs of 1s: the student's turns (each at least its end id, bridges between them). */
const turnsOf = (mask: readonly number[]) => mask.filter((m, k) => m === 1 && (k === 0 || mask[k - 1] === 0)).length;

describe('prefzoo distill --tools / --env (multi-turn on-policy)', () => {
  it("2 steps: the loss is gkd's float64 reference over the recorded conversations, bridges masked; the tool metrics are theirs", async () => {
    const out = join(dir, 'run-loss');
    const rec = recorder();
    // learning_rate 0: both steps score the starting weights, so each step's loss has an independent reference.
    const params = ['max_steps=2', 'batch_size=3', 'optimizer=sgd', 'momentum=0', 'max_grad_norm=0', 'lr_scheduler=constant', 'learning_rate=0', `distill_topk=${K}`, 'beta=1', 'lmbda=1', 'max_completion_length=48', 'max_turns=3', 'seed=3'];
    const r = await distill({ teacher, model: student, data, out, params, onSamples: rec.onSamples, multiTurn: agents() });
    expect(r.onPolicy).toMatchObject({ lmbda: 1, microBatches: 2, sampled: 2 });
    expect(rec.got.map((g) => g.step)).toEqual([1, 2]);
    const tok = loadTokenizer(student);
    const tools = new ToolExecutor({ tools: toolsFromValues([{ ...LOOKUP, run: () => '' }]) }).specs;
    const S = weightsOf(student);
    const T = weightsOf(teacher);
    const rows = rowsOf(out);
    let bridged = 0;
    for (const g of rec.got) {
      g.rows.forEach((i, j) => {
        // The prompt as GRPO renders it: the row's messages with the tools offered.
        expect(g.promptIds[j]).toEqual(chatPromptIds(tok, [{ role: 'user', content: `What is ${i} plus ${i + 1}?` }], { tools }));
        expect(g.masks[j].length).toBe(g.ids[j].length);
        if (g.masks[j].includes(0)) bridged++;
      });
      const { ref, M } = float64Gkd(T, S, g.rows.map((_, j) => ({ promptIds: g.promptIds[j], ids: g.ids[j], mask: g.masks[j] })), K, 1);
      expect(M).toBe(g.masks.flat().filter((m) => m === 1).length);
      const row = rows[g.step - 1];
      expect(ref.loss).toBeGreaterThan(1e-3);
      expect(Math.abs(row.loss - ref.loss)).toBeLessThanOrEqual(1e-4 * ref.loss);
      expect(row['distill/completion_length']).toBe(M / g.rows.length);
      const turns = g.masks.map(turnsOf);
      expect(row['num_turns/mean']).toBe(turns.reduce((a, v) => a + v, 0) / turns.length);
      expect(row['num_turns/max']).toBe(Math.max(...turns));
      // A random model writes no well-formed call: no tool ran, none failed.
      expect(row['tools/call_frequency']).toBe(0);
      expect(row['stop_reason/stop']).toBe(0);
    }
    // Some conversations went past their first turn: tokens answered by the environment, out of the loss.
    expect(bridged).toBeGreaterThan(1);
    const config = JSON.parse(readFileSync(join(out, 'config.json'), 'utf8'));
    expect(config.agent).toEqual({ tools: [toolsMjs], mcp: [], env: envMjs });
    expect(config.max_turns).toBe(3);
  });

  it('lmbda = 0.5 with tools: an interrupted run resumes to the same weights, rows and conversations', async () => {
    const params = ['max_steps=4', 'save_steps=2', 'batch_size=2', 'gradient_accumulation_steps=2', 'learning_rate=1e-2', `distill_topk=${K}`, 'lmbda=0.5', 'max_completion_length=40', 'max_turns=2', 'seed=5'];
    const straight = recorder();
    const s = await distill({ teacher, model: student, data, out: join(dir, 'run-mix'), params, onSamples: straight.onSamples, multiTurn: agents() });
    expect(s.onPolicy!.sampled).toBeGreaterThan(0);
    expect(s.onPolicy!.sampled).toBeLessThan(8);
    const broken = join(dir, 'run-mix-broken');
    await expect(withNanAt(3, () => distill({ teacher, model: student, data, out: broken, params, multiTurn: agents() }))).rejects.toThrow(/loss is NaN at step 3/);
    const resumed = recorder();
    const r = await distill({ teacher, model: student, data, out: broken, params, resume: true, onSamples: resumed.onSamples, multiTurn: agents() });
    expect(Buffer.compare(readFileSync(join(s.finalDir, 'model.safetensors')), readFileSync(join(r.finalDir, 'model.safetensors')))).toBe(0);
    expect(resumed.got).toEqual(straight.got.filter((x) => x.step > 2));
    expect(rowsOf(broken).map(timeless)).toEqual(rowsOf(join(dir, 'run-mix')).map(timeless));
  });

  it('refuses in one line what it cannot honour: tools at lmbda = 0, tools with seq_kd, agent settings without tools', async () => {
    const cli = await prefzoo('distill', '--teacher', teacher, '--model', student, '--data', data, '-o', join(dir, 'run-refused'), '--tools', toolsMjs, '--param', `distill_topk=${K}`);
    expect(cli.code).toBe(1);
    const lines = cli.stderr.trim().split('\n');
    expect(lines).toHaveLength(1);
    expect(lines[0]).toBe("prefzoo: --tools with lmbda=0: multi-turn rollouts are the student's on-policy micro-batches, and at lmbda=0 the student samples none; set lmbda > 0 or leave --tools out");
    await expect(distill({ teacher, model: student, data, out: join(dir, 'run-r1'), params: ['lmbda=0.5', 'seq_kd=true'], multiTurn: distillAgents({ env: envMjs }) }))
      .rejects.toThrow(/^--env with seq_kd: the teacher's generations are one turn per prompt/);
    await expect(distill({ teacher, model: student, data, out: join(dir, 'run-r2'), params: ['lmbda=1', 'max_turns=3'] }))
      .rejects.toThrow(/^distill: max_turns=3 applies to rollouts with tools or an environment; give --tools, --mcp, --mcp-config or --env, or leave max_turns out$/);
  });
});
