/**
 * Judges (task, external command, reward model), win-rate estimation, and reward models: scores
 * against the float64 reference forward, Bradley–Terry training, scoring pairs for MPO.
 */
import { mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, describe, expect, it } from 'vitest';
import { taskCorrect, CommandJudge, loadJudge, RewardJudge, TaskJudge, winRates } from '../src/online/judges.ts';
import { RewardModel, rewardTrain, scorePairs } from '../src/online/reward-model.ts';
import { initModelFolder, initValueHead } from '../src/models/init.ts';
import { loadModel } from '../src/models/load.ts';
import { saveCheckpoint } from '../src/models/checkpoint.ts';
import { loadTokenizer, tokenizePromptResponse } from '../src/tokenize/index.ts';
import { loadData } from '../datasets/examples.ts';
import { makeMeta } from '../datasets/schema.ts';
import { referenceHidden } from './helpers/reference-forward.ts';

const dir = mkdtempSync(join(tmpdir(), 'prefzoo-judges-'));
afterAll(() => rmSync(dir, { recursive: true, force: true }));

describe('task judge', () => {
  it('a correct answer (sum, first digit) beats a wrong one; equal correctness ties', async () => {
    const j = new TaskJudge();
    expect(await j.compare([
      { prompt: '3+4=', a: '7', b: '2' },
      { prompt: '3+4=', a: '2', b: '7' },
      { prompt: '9+8=', a: '1', b: '5' },
      { prompt: '9+8=', a: '7', b: ' 7 ' },
      { prompt: [{ role: 'user', content: '5+5=' }], a: '0', b: '10' },
    ])).toEqual([1, 0, 0.5, 0.5, 1]);
    expect(taskCorrect('12+35=', '7')).toBe(true);
    expect(await j.compare([{ prompt: '4719:', a: '4', b: '7' }, { prompt: '4719:', a: '1', b: '9' }, { prompt: '4719:', a: '47', b: '4' }])).toEqual([1, 0.5, 0]);
    await expect(j.compare([{ prompt: 'hello', a: '1', b: '2' }])).rejects.toThrow(/neither "digits:" nor "a\+b="/);
  });

  it('win-rates against the other samples: P̂_k = mean_j P(y_k ≻ y_j)', async () => {
    const [w] = await winRates(new TaskJudge(), [{ prompt: '3+4=', responses: ['7', '2', '7', '5'] }]);
    // 7 beats the two wrong answers and ties the other 7: (1 + 1 + 0.5)/3; a wrong one ties the other wrong one.
    [2.5 / 3, 0.5 / 3, 2.5 / 3, 0.5 / 3].forEach((v, k) => expect(w[k]).toBeCloseTo(v, 12));
  });
});

describe('command judge', () => {
  const script = join(dir, 'judge.mjs');
  // A judge that prefers the longer answer, answering one JSON line per input line.
  writeFileSync(
    script,
    `import { createInterface } from 'node:readline';
const rl = createInterface({ input: process.stdin });
rl.on('line', (l) => { const r = JSON.parse(l); process.stdout.write(JSON.stringify({ p: r.a.length > r.b.length ? 1 : r.a.length < r.b.length ? 0 : 0.5 }) + '\\n'); });`,
  );

  it('speaks JSONL on stdin/stdout and stays up across calls', async () => {
    const j = await loadJudge(`cmd:node ${script}`);
    expect(await j.compare([{ prompt: 'x', a: 'long', b: 'no' }, { prompt: 'x', a: 'a', b: 'bb' }])).toEqual([1, 0]);
    expect(await j.compare([{ prompt: [{ role: 'user', content: 'hi' }], a: 'ab', b: 'cd' }])).toEqual([0.5]);
    await j.release();
  });

  it('names the command and the answer when the output is bad or ends early', async () => {
    const bad = new CommandJudge(`node -e "process.stdin.once('data', () => console.log('yes'))"`);
    await expect(bad.compare([{ prompt: 'x', a: 'a', b: 'b' }])).rejects.toThrow(/answer 1 is not JSON/);
    await bad.release();
    const range = new CommandJudge(`node -e "process.stdin.once('data', () => console.log(JSON.stringify({p: 2})))"`);
    await expect(range.compare([{ prompt: 'x', a: 'a', b: 'b' }])).rejects.toThrow(/answer 1 must be \{"p": number in \[0, 1\]\}/);
    await range.release();
    const quits = new CommandJudge(`node -e "console.error('no model loaded'); process.exit(3)"`);
    await expect(quits.compare([{ prompt: 'x', a: 'a', b: 'b' }])).rejects.toThrow(/closed its output after 0 answers.*no model loaded/);
    await quits.release();
    await expect(loadJudge('gpt4')).rejects.toThrow(/--judge must be task, reward:DIR or cmd:COMMAND/);
  });
});

describe('reward models', () => {
  const base = join(dir, 'base');
  initModelFolder(base, 'llama', 'tiny', 4);

  it('score r(x, y) = w·h_last + b, against the float64 reference forward; judge P = σ(r_a − r_b)', async () => {
    const rmDir = join(dir, 'rm-random');
    const m = loadModel(base);
    const weights = new Map(m.weights);
    const head = initValueHead(m.config, 9);
    head.get('value_head.weight')!.data.forEach((_, i, a) => (a[i] = Math.sin(i + 1)));
    head.get('value_head.bias')!.data[0] = 0.25;
    for (const [k, v] of head) weights.set(k, v);
    saveCheckpoint(rmDir, weights, { config: m.config });
    for (const f of ['tokenizer.json', 'tokenizer_config.json']) writeFileSync(join(rmDir, f), (await import('node:fs')).readFileSync(join(base, f)));
    const items = [
      { prompt: '3+4=', response: '7' },
      { prompt: 'What is the capital of France?', response: 'Paris, of course.' },
    ];
    const rm = await RewardModel.load(rmDir);
    const got = await rm.score(items);
    await rm.release();
    const tok = loadTokenizer(rmDir);
    const w = head.get('value_head.weight')!.data;
    items.forEach((x, i) => {
      const t = tokenizePromptResponse(tok, x.prompt, x.response);
      const h = referenceHidden(m.config, m.weights, [...t.promptIds, ...t.responseIds]).at(-1)!;
      const want = h.reduce((s, v, j) => s + v * w[j], 0.25);
      expect(Math.abs(got[i] - want)).toBeLessThan(1e-4 * Math.max(1, Math.abs(want)));
    });
    const judge = await RewardJudge.load(rmDir);
    const [p] = await judge.compare([{ prompt: items[0].prompt, a: items[0].response, b: 'nine' }]);
    const rm2 = await RewardModel.load(rmDir);
    const [ra, rb] = await rm2.score([items[0], { prompt: items[0].prompt, response: 'nine' }]);
    await rm2.release();
    expect(p).toBeCloseTo(1 / (1 + Math.exp(rb - ra)), 6);
    await judge.release();
    await expect(RewardModel.load(base)).rejects.toThrow(/has no reward head.*reward-train/);
  });

  it('Bradley–Terry training learns the pairs (first loss ≈ ln 2), and scorePairs writes scores MPO can read', async () => {
    const pairs = Array.from({ length: 24 }, (_, i) => ({ prompt: `${i % 10}+${(i * 3) % 10}=`, responses: [`${(i % 10 + ((i * 3) % 10)) % 10}`, 'I do not know'] }));
    const out = join(dir, 'rm');
    const r = await rewardTrain({
      model: base,
      data: 'pairs',
      rows: { kind: 'pairwise', meta: makeMeta('pairwise', 'plain', 'test'), examples: pairs, files: [] },
      out,
      base: { learning_rate: 3e-3, batch_size: 8, max_steps: 30, warmup_steps: 0, pad_to_multiple_of: 16, logging_steps: 1, max_length: 32, max_prompt_length: 16 },
    });
    const first = JSON.parse((await import('node:fs')).readFileSync(join(out, 'metrics.jsonl'), 'utf8').split('\n')[0]);
    expect(Math.abs(first.loss - Math.LN2)).toBeLessThan(0.05);
    expect(r.train_accuracy).toBe(1);
    expect(r.last.loss).toBeLessThan(0.3);
    const jsonl = join(dir, 'pairs.jsonl');
    writeFileSync(jsonl, pairs.map((p) => JSON.stringify({ prompt: p.prompt, chosen: p.responses[0], rejected: p.responses[1] })).join('\n') + '\n');
    const scored = join(dir, 'scored.parquet');
    const s = await scorePairs({ rewardModel: out, data: jsonl, out: scored });
    expect(s).toMatchObject({ rows: 24, agreement: 1 });
    const back = await loadData(scored, join(dir, 'work'));
    const rm = await RewardModel.load(out);
    const direct = await rm.score([{ prompt: pairs[0].prompt, response: pairs[0].responses[0] }, { prompt: pairs[0].prompt, response: pairs[0].responses[1] }]);
    await rm.release();
    expect(back.examples[0].responseScores).toEqual(direct);
    await expect(rewardTrain({ model: base, data: jsonl, out })).rejects.toThrow(/already holds a reward model/);
  });
});
