/**
 * The training loop (src/train/loop.ts) through `prefzoo nash-md`: checkpoints every save_steps, a run
 * killed with SIGKILL and continued with --resume writing the same metrics rows and final weights as
 * an uninterrupted run, the NaN stop, and the refusal of a setting nash-md does not honour.
 */
import { spawnSync } from 'node:child_process';
import { existsSync, mkdtempSync, readdirSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { initModelFolder } from '../src/models/init.ts';
import { bin, killWhen } from './helpers/faults.ts';
import { metricsRows } from './helpers/metrics-rows.ts';
import { loadJudge, type Judge } from '../src/online/judges.ts';
import { runNashMd } from '../src/online/nash-md.ts';
import { pairAccuracy, RewardModel, rewardTrain } from '../src/online/reward-model.ts';
import { makeMeta } from '../datasets/schema.ts';
import { runOnline, type OnlineMethod } from '../src/train/loop.ts';
import { sampleWith } from '../src/online/policy.ts';
import { buildCausalLM } from '../src/models/index.ts';
import { sequenceLogps } from '../src/models/logps.ts';
import { collate } from '../src/models/batch.ts';
import { modelParamSpecs, optimizerOf } from '../src/train/run.ts';
import { resolveConfig } from '../src/train/config.ts';
import { tokenizePromptResponse } from '../src/tokenize/index.ts';

const dir = mkdtempSync(join(tmpdir(), 'prefzoo-online-loop-'));
afterAll(() => rmSync(dir, { recursive: true, force: true }));
const model = join(dir, 'model');
const prompts = join(dir, 'prompts.txt');
const judge = join(dir, 'judge.mjs');

// 6 prompts, rounds of 2 × 2: one round per epoch (a new shuffle every round), two micro-batches per update.
const SETTINGS = ['max_steps=12', 'save_steps=3', 'batch_size=2', 'gradient_accumulation_steps=2', 'learning_rate=3e-3', 'warmup_steps=2', 'lr_scheduler=cosine', 'pad_to_multiple_of=16', 'logging_steps=1', 'beta=0.1', 'mixture_coef=0.5'];

function args(out: string, extra: string[] = []): string[] {
  return ['nash-md', '--model', model, '--prompts', prompts, '--judge', `cmd:node ${judge}`, '-o', out, '--max-new-tokens', '4', '--quiet', ...SETTINGS.flatMap((s) => ['--param', s]), ...extra];
}

function runSync(out: string, extra: string[] = []) {
  return spawnSync(process.execPath, [bin, ...args(out, extra)], { encoding: 'utf8' });
}

const rows = metricsRows;

beforeAll(() => {
  initModelFolder(model, 'llama', 'tiny', 5);
  writeFileSync(prompts, ['1+2=', '3+4=', '5+6=', '7+8=', '9+0=', '2+2='].join('\n') + '\n');
  // An external judge that prefers the shorter response: a signal even for an untrained model.
  writeFileSync(
    judge,
    `import { createInterface } from 'node:readline';
const text = (t) => (typeof t === 'string' ? t : JSON.stringify(t));
for await (const line of createInterface({ input: process.stdin })) {
  const c = JSON.parse(line);
  const a = text(c.a).length, b = text(c.b).length;
  process.stdout.write(JSON.stringify({ p: a < b ? 1 : a > b ? 0 : 0.5 }) + '\\n');
}
`,
  );
});

describe('online loop (nash-md)', () => {
  it('checkpoints every save_steps; a run killed with SIGKILL and resumed writes the same rows and weights', async () => {
    const straight = join(dir, 'straight');
    const a = runSync(straight);
    expect(a.status, a.stderr).toBe(0);
    expect(readdirSync(join(straight, 'checkpoints'))).toEqual(['step-00000003', 'step-00000006', 'step-00000009', 'step-00000012']);
    const want = rows(straight);
    expect(want.map((r) => r.step)).toEqual(Array.from({ length: 12 }, (_, i) => i + 1));
    // The judge's signal reaches the rows (not every comparison a tie), and the updates move the policy.
    expect(want.some((r) => r['objective/win_rate_vs_mixture'] !== 0.5)).toBe(true);
    expect(new Set(want.map((r) => r.loss)).size).toBeGreaterThan(1);

    const broken = join(dir, 'broken');
    await killWhen(args(broken), () => existsSync(join(broken, 'checkpoints', 'step-00000003', 'state.json')));
    expect(existsSync(join(broken, 'final'))).toBe(false);
    const b = runSync(broken, ['--resume']);
    expect(b.status, b.stderr).toBe(0);
    expect(rows(broken)).toEqual(want);
    const left = readFileSync(join(straight, 'final', 'model.safetensors'));
    const right = readFileSync(join(broken, 'final', 'model.safetensors'));
    expect(Buffer.compare(left, right)).toBe(0);
  });

  /** The same run through the library, with the same external judge. */
  async function nashMd(out: string, o: { resume?: boolean; params?: string[] } = {}) {
    const j = await loadJudge(`cmd:node ${judge}`);
    try {
      const list = readFileSync(prompts, 'utf8').trim().split('\n');
      return await runNashMd({ model, prompts: list, promptsFile: prompts, judge: j, out, maxNewTokens: 4, temperature: 1, topK: 0, topP: 1, params: [...SETTINGS, ...(o.params ?? [])], resume: o.resume });
    } finally {
      await j.release();
    }
  }

  it('a NaN loss stops the run in one line, keeping the last good checkpoint, which resumes', async () => {
    const out = join(dir, 'nan');
    process.env.PREFZOO_FAULT_NAN_AT_STEP = '5';
    try {
      await expect(nashMd(out)).rejects.toThrow(/^nash-md: loss is NaN at step 5: stopping without applying the update\. The last good checkpoint is .*checkpoints\/step-00000003 \(resume with --resume after lowering learning_rate\)\.$/);
    } finally {
      delete process.env.PREFZOO_FAULT_NAN_AT_STEP;
    }
    expect(readdirSync(join(out, 'checkpoints'))).toEqual(['step-00000003']);
    expect(existsSync(join(out, 'final'))).toBe(false);
    await nashMd(out, { resume: true });
    expect(rows(out)).toEqual(rows(join(dir, 'straight')));
  });

  it('refuses a setting nash-md does not honour, in one line, before writing anything', async () => {
    const out = join(dir, 'refused');
    await expect(nashMd(out, { params: ['eval_data=held.jsonl'] })).rejects.toThrow(/^setting eval_data cannot be honoured by prefzoo nash-md \(it honours learning_rate, .*save_steps.*\)$/);
    expect(existsSync(out)).toBe(false);
  });
});

describe('online loop: several updates per round', () => {
  /**
   * A method taking two updates on each round (as GRPO's num_iterations): SFT on its own samples,
   * drawn with seeds from the loop's RNG. A checkpoint inside a round must hold the round and the RNG.
   */
  const selfTrain: OnlineMethod<string, { promptIds: number[][]; ids: number[][] }> = {
    name: 'self-sft',
    spec: (s) => ({
      params: modelParamSpecs(s.model, s.init, s.lora, false),
      batchInputs: [
        { name: 'input_ids', dtype: 'int64', shape: ['rows', 'len'] },
        { name: 'attention_mask', dtype: 'int64', shape: ['rows', 'len'] },
        { name: 'loss_mask', dtype: 'float32', shape: ['rows', 'len'] },
      ],
      optimizer: optimizerOf(s.config),
      loss: { name: 'self_sft' },
      modelConfig: s.model,
      buildForward(g, p, batch, mode) {
        const m = buildCausalLM(g, s.model, new Map(Object.entries(p)), { inputIds: batch.input_ids, attentionMask: batch.attention_mask }, { lora: s.lora });
        const { logp } = sequenceLogps(g, m, batch.loss_mask);
        if (mode === 'eval') return { outputs: { logp } };
        return { loss: g.neg(g.reduceMean(logp, undefined, false)), metrics: {} };
      },
    }),
    updatesPerRound: () => 2,
    async collect(ctx, prompts) {
      const ys = await sampleWith(ctx.tok, await ctx.policy(), prompts, { n: 1, seed: ctx.rng.nextU32(), maxNewTokens: 4, temperature: 1, topK: 0, topP: 1 });
      return { promptIds: ys.map((y) => y.promptIds), ids: ys.map((y) => y.ids) };
    },
    async microBatches(ctx, r) {
      const rows = r.ids.map((ids, i) => ({ promptIds: r.promptIds[i], responseIds: [ids], src: { prompt: '', responses: [''] } }));
      const c = collate(rows, { kind: 'single', padTo: 16, padId: ctx.tok.padId ?? 0, dtype: 'float32', refLogps: () => [0] });
      return [{ feeds: { input_ids: c.feeds.input_ids, attention_mask: c.feeds.attention_mask, loss_mask: c.feeds.loss_mask }, tokens: c.tokens }];
    },
    metrics: (r, u) => ({ update: u, 'completions/mean_length': r.ids.reduce((a, y) => a + y.length, 0) / r.ids.length }),
  };
  const list = ['1+2=', '3+4=', '5+6=', '7+8=', '9+0='];
  const params = ['max_steps=8', 'save_steps=3', 'batch_size=2', 'learning_rate=1e-2', 'logging_steps=1'];
  const go = (out: string, resume = false) => runOnline({ model, out, params, resume }, list, selfTrain, { config: resolveConfig({ params }).config, record: {} });

  it('a run stopped inside a round resumes from the checkpoint holding that round: the same rows and weights', async () => {
    const straight = join(dir, 'self-straight');
    const a = await go(straight);
    expect(a.steps).toBe(8);
    const want = rows(straight);
    expect(want.map((r) => r.update)).toEqual([0, 1, 0, 1, 0, 1, 0, 1]);
    const broken = join(dir, 'self-broken');
    // Step 3 is the first update of round 2: its checkpoint holds the round, step 4 (its second update) fails.
    process.env.PREFZOO_FAULT_NAN_AT_STEP = '4';
    try {
      await expect(go(broken)).rejects.toThrow(/^self-sft: loss is NaN at step 4/);
    } finally {
      delete process.env.PREFZOO_FAULT_NAN_AT_STEP;
    }
    const state = JSON.parse(readFileSync(join(broken, 'checkpoints', 'step-00000003', 'state.json'), 'utf8'));
    expect(state.online.pending.next).toBe(1);
    expect(state.online.rounds).toBe(2);
    await go(broken, true);
    expect(rows(broken)).toEqual(want);
    expect(Buffer.compare(readFileSync(join(straight, 'final', 'model.safetensors')), readFileSync(join(broken, 'final', 'model.safetensors')))).toBe(0);
  });
});

describe('a round of several draws (the trainer\'s micro-batches)', () => {
  it('each draw stays in one epoch and the next draw starts the next epoch, so a round may span two; every item once per epoch; the plan counts ⌊draws per epoch / draws per round⌋ rounds', async () => {
    const items = ['a', 'b', 'c', 'd', 'e'];
    const seen: { items: string[]; draws: number[]; epoch: number }[] = [];
    const method: OnlineMethod<string, { ids: number[][] }> = {
      name: 'draws-sft',
      partialRounds: true,
      draws: () => ({ size: 2, count: 2 }),
      spec: (s) => ({
        params: modelParamSpecs(s.model, s.init, s.lora, false),
        batchInputs: [
          { name: 'input_ids', dtype: 'int64', shape: ['rows', 'len'] },
          { name: 'attention_mask', dtype: 'int64', shape: ['rows', 'len'] },
          { name: 'loss_mask', dtype: 'float32', shape: ['rows', 'len'] },
        ],
        optimizer: optimizerOf(s.config),
        loss: { name: 'draws_sft' },
        modelConfig: s.model,
        buildForward(g, p, batch, mode) {
          const m = buildCausalLM(g, s.model, new Map(Object.entries(p)), { inputIds: batch.input_ids, attentionMask: batch.attention_mask }, { lora: s.lora });
          const { logp } = sequenceLogps(g, m, batch.loss_mask);
          if (mode === 'eval') return { outputs: { logp } };
          return { loss: g.neg(g.reduceMean(logp, undefined, false)), metrics: {} };
        },
      }),
      async collect(ctx, got, info) {
        seen.push({ items: [...got], draws: info.draws!, epoch: info.epoch });
        return { ids: got.map((x) => tokenizePromptResponse(ctx.tok, `${x}=`, x).responseIds) };
      },
      async microBatches(ctx, r) {
        const rows = r.ids.map((ids) => ({ promptIds: [1], responseIds: [ids], src: { prompt: '', responses: [''] } }));
        const c = collate(rows, { kind: 'single', padTo: 16, padId: ctx.tok.padId ?? 0, dtype: 'float32', refLogps: () => [0] });
        return [{ feeds: { input_ids: c.feeds.input_ids, attention_mask: c.feeds.attention_mask, loss_mask: c.feeds.loss_mask }, tokens: c.tokens }];
      },
    };
    const params = ['num_epochs=3', 'batch_size=2', 'learning_rate=1e-3', 'logging_steps=1', 'threads=1'];
    const r = await runOnline({ model, out: join(dir, 'draws'), params }, items, method, { config: resolveConfig({ params }).config, record: {} });
    // 5 items in draws of 2: 3 draws per epoch (2, 2, 1), 2 draws per round: ⌊3/2⌋ = 1 round per epoch.
    expect(r.steps).toBe(3);
    expect(seen.map((x) => x.draws)).toEqual([
      [2, 2],
      [1, 2],
      [2, 1],
    ]);
    // Epoch by epoch the draws hold every item once: the first five items, then the next five.
    const flat = seen.flatMap((x) => x.items);
    expect([...flat.slice(0, 5)].sort()).toEqual(items);
    expect([...flat.slice(5, 10)].sort()).toEqual(items);
    expect(seen.map((x) => x.epoch)).toEqual([0, 1, 1]);
    expect(rows(join(dir, 'draws')).map((x) => x.epoch)).toEqual([0.8, 1.4, 2]);
  });
});

describe('reward-train on the loop', () => {
  it('evaluates eval_data every eval_steps through the training graphs as the saved model scores it; checkpoints every save_steps', async () => {
    const pair = (i: number) => ({ prompt: `${i % 10}+${(i * 3) % 10}=`, responses: [`${(i % 10) + ((i * 3) % 10)}`, 'no idea'] });
    const train = Array.from({ length: 12 }, (_, i) => pair(i));
    const held = Array.from({ length: 6 }, (_, i) => pair(i + 20));
    const evalFile = join(dir, 'held.jsonl');
    writeFileSync(evalFile, held.map((p) => JSON.stringify({ prompt: p.prompt, chosen: p.responses[0], rejected: p.responses[1] })).join('\n') + '\n');
    const out = join(dir, 'rm');
    const r = await rewardTrain({
      model,
      data: 'pairs',
      rows: { kind: 'pairwise', meta: makeMeta('pairwise', 'plain', 'test'), examples: train, files: [] },
      out,
      params: ['max_steps=6', 'save_steps=2', 'eval_steps=3', `eval_data=${evalFile}`],
      base: { learning_rate: 3e-3, batch_size: 4, warmup_steps: 0, pad_to_multiple_of: 16, logging_steps: 1, max_length: 32, max_prompt_length: 16 },
    });
    expect(readdirSync(join(out, 'checkpoints'))).toEqual(['step-00000002', 'step-00000004', 'step-00000006']);
    expect(existsSync(join(out, 'artifacts'))).toBe(false);
    const evals = rows(out).filter((x) => x.split === 'eval');
    expect(evals.map((x) => x.step)).toEqual([3, 6]);
    // The final evaluation (artifacts' eval graph) against the saved reward model, scored apart, in float64.
    const rm = await RewardModel.load(out);
    const scores = await rm.score(held.flatMap((p) => [{ prompt: p.prompt, response: p.responses[0] }, { prompt: p.prompt, response: p.responses[1] }]));
    const acc = await pairAccuracy(rm, held);
    await rm.release();
    const bt = held.reduce((a, _, i) => a + Math.log1p(Math.exp(-(scores[2 * i] - scores[2 * i + 1]))), 0) / held.length;
    expect(evals[1].accuracy).toBe(acc);
    expect(r.eval_accuracy).toBe(acc);
    expect(evals[1].loss as number).toBeCloseTo(bt, 4);
    expect(evals[0].loss).not.toBe(evals[1].loss);
  });
});
