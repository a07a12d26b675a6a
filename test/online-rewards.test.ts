/**
 * GRPO's reward functions: the answer checker on real GSM8K rows, format and DAPO's overlong
 * penalty, user modules (sync, async, several exports), commands, reward-model folders, and the
 * one-line errors naming the function and the prompt row.
 */
import { mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join, resolve } from 'node:path';
import { afterAll, describe, expect, it } from 'vitest';
import { answersMatch, extractAnswer, loadAllRewards, loadRewards, overlongPenalty, releaseRewards, scoreAll, scoreOne, type RewardBatch, type RewardRow } from '../src/online/rewards/index.ts';
import { readPromptRows } from '../src/online/prompts.ts';
import { initModelFolder, initValueHead } from '../src/models/init.ts';
import { loadModel } from '../src/models/load.ts';
import { saveCheckpoint } from '../src/models/checkpoint.ts';
import { RewardModel } from '../src/online/reward-model.ts';

const GSM8K = resolve(__dirname, '..', '..', 'shared', 'data', 'gsm8k_test.jsonl');
const dir = mkdtempSync(join(tmpdir(), 'prefzoo-rewards-'));
afterAll(() => rmSync(dir, { recursive: true, force: true }));

function batchOf(completions: string[], rows: RewardRow[], maxCompletionLength = 64): RewardBatch {
  return { completions, rows, lengths: completions.map((c) => c.length), maxCompletionLength };
}
const place = (i: number) => `p.jsonl:${i + 1}`;

describe('prompt rows', () => {
  it('GSM8K: the question is the prompt and the answer column is kept, each row named by its line', async () => {
    const rows = await readPromptRows(GSM8K);
    expect(rows).toHaveLength(1319);
    expect(rows[0].prompt).toMatch(/^Janet’s ducks lay 16 eggs per day/);
    expect(rows[0].row.answer).toMatch(/#### 18$/);
    expect(rows[0].row.question).toBeUndefined();
    expect(rows[2].at).toBe(`${GSM8K}:3`);
  });
});

describe('accuracy', () => {
  it('real GSM8K rows: the gold "#### N" against the completion\'s last number or \\boxed{}; a wrong number scores 0', async () => {
    const rows = (await readPromptRows(GSM8K)).slice(0, 40);
    const gold = rows.map((r) => String(r.row.answer).split('####').pop()!.trim());
    const [acc] = await loadRewards('accuracy');
    const reasoning = (r: (typeof rows)[number]) => String(r.row.answer).split('####')[0].replace(/<<[^>]*>>/g, '');
    const right = rows.map((r, i) => `${reasoning(r)}So the answer is ${gold[i]}.`);
    const boxed = rows.map((r, i) => `${reasoning(r)}Final: \\boxed{${gold[i]}} and that is all.`);
    const wrong = rows.map((r, i) => `${reasoning(r)}So the answer is ${Number(gold[i].replace(/,/g, '')) + 1}.`);
    const score = (c: string[]) => scoreOne(acc, batchOf(c, rows.map((r) => r.row as RewardRow)), place, 10);
    expect(Array.from(await score(right))).toEqual(rows.map(() => 1));
    expect(Array.from(await score(boxed))).toEqual(rows.map(() => 1));
    expect(Array.from(await score(wrong))).toEqual(rows.map(() => 0));
    expect(Array.from(await score(rows.map(() => 'I do not know')))).toEqual(rows.map(() => 0));
  });

  it('final answers: \\boxed{} with nested braces, numbers with $ and commas, text answers', () => {
    expect(extractAnswer('so x = \\boxed{\\frac{1}{2}} done')).toBe('\\frac{1}{2}');
    expect(extractAnswer('first 3 then 4, finally $1,234.')).toBe('$1,234');
    expect(extractAnswer('no digits here')).toBeNull();
    expect(answersMatch('$1,234', '1234')).toBe(true);
    expect(answersMatch('18.0', '18')).toBe(true);
    expect(answersMatch('-3.5', '-3.50')).toBe(true);
    expect(answersMatch('17', '18')).toBe(false);
    expect(answersMatch('\\frac{1}{2}', '\\frac{1}{ 2}')).toBe(true);
    expect(answersMatch('Paris', 'paris')).toBe(true);
    expect(answersMatch('', '')).toBe(false);
  });

  it('a prompt row without an answer column is named in one line', async () => {
    const [acc] = await loadRewards('accuracy');
    await expect(scoreOne(acc, batchOf(['7', '8'], [{ prompt: 'a', answer: '7' }, { prompt: 'b' }]), place, 10)).rejects.toThrow(/^reward function "accuracy" failed: the prompt has no "answer" column \(prompt p\.jsonl:2\)$/);
  });
});

describe('format and length', () => {
  it('format:REGEX matches across lines; a bad pattern is refused', async () => {
    const [f] = await loadRewards('format:^<think>.*</think>\\s*<answer>.*</answer>$');
    const rows = [{ prompt: 'q' }, { prompt: 'q' }, { prompt: 'q' }];
    expect(Array.from(await scoreOne(f, batchOf(['<think>a\nb</think>\n<answer>4</answer>', '<answer>4</answer>', '<think></think><answer>x</answer> tail'], rows), place, 10))).toEqual([1, 0, 0]);
    await expect(loadRewards('format:(')).rejects.toThrow(/format:\(: not a regular expression/);
  });

  it('length: DAPO Eq. 13 (0 up to L − C, linear to −1 at L, −1 beyond)', async () => {
    expect(overlongPenalty(90, 100, 20)).toBeCloseTo(-0.5, 15);
    expect(overlongPenalty(80, 100, 20)).toBe(0);
    expect(overlongPenalty(100, 100, 20)).toBe(-1);
    expect(overlongPenalty(101, 100, 20)).toBe(-1);
    const [l] = await loadRewards('length:4');
    const b: RewardBatch = { completions: ['', '', '', ''], rows: [{ prompt: 'q' }, { prompt: 'q' }, { prompt: 'q' }, { prompt: 'q' }], lengths: [3, 6, 7, 8], maxCompletionLength: 8 };
    expect(Array.from(await scoreOne(l, b, place, 10))).toEqual([0, -0.5, -0.75, -1]);
    await expect(loadRewards('length:0')).rejects.toThrow(/integer ≥ 1/);
  });
});

describe('user modules, commands, reward models', () => {
  const mod = join(dir, 'rewards.mjs');
  writeFileSync(mod, [
    'export function short(completions) { return completions.map((c) => (c.length <= 2 ? 1 : 0)); }',
    'export async function echoAnswer(completions, rows) { await new Promise((r) => setTimeout(r, 5)); return completions.map((c, i) => (c === rows[i].answer ? 2 : rows[i].skip ? null : -1)); }',
    'export function throwsOnThird(completions, rows) { return completions.map((c, i) => { if (rows[i].bad) throw new Error("cannot parse " + c); return 0; }); }',
    'export function nan(completions) { return completions.map((_, i) => (i === 1 ? NaN : 0)); }',
    'export function tooFew(completions) { return completions.slice(1).map(() => 0); }',
    'export function hangs() { return new Promise(() => {}); }',
    'export const notAFunction = 3;',
  ].join('\n'));
  const rows: RewardRow[] = [{ prompt: 'a', answer: 'x' }, { prompt: 'b', answer: 'yy', skip: true }, { prompt: 'c', answer: 'z', bad: true }];
  const completions = ['x', 'no', 'z'];

  it('every exported function is a reward (sync or async; null means "does not apply"); FILE:name picks one', async () => {
    const fns = await loadRewards(mod);
    // Each is logged under its own name, never the module's path (the same run logs the same names anywhere).
    expect(fns.map((f) => f.name)).toEqual(['short', 'echoAnswer', 'throwsOnThird', 'nan', 'tooFew', 'hangs']);
    const [echo] = await loadRewards(`${mod}:echoAnswer`);
    const got = await scoreAll([fns[0], echo], batchOf(completions, rows), place, 10);
    expect(Array.from(got[0])).toEqual([1, 1, 1]);
    expect(Array.from(got[1])).toEqual([2, NaN, 2]);
    await expect(loadRewards(`${mod}:notAFunction`)).rejects.toThrow(/exports no function "notAFunction"/);
    await expect(loadRewards(join(dir, 'missing.mjs'))).rejects.toThrow(/does not exist/);
  });

  it('throws, NaN, the wrong count, a hang: one line naming the function and the prompt row', async () => {
    const one = async (name: string) => (await loadRewards(`${mod}:${name}`))[0];
    const b = batchOf(completions, rows);
    await expect(scoreOne(await one('throwsOnThird'), b, place, 10)).rejects.toThrow(/^reward function "throwsOnThird" \(.*rewards\.mjs\) threw: cannot parse z \(prompt p\.jsonl:3\)$/);
    await expect(scoreOne(await one('nan'), b, place, 10)).rejects.toThrow(/^reward function "nan" \(.*rewards\.mjs\) returned NaN for completion 2; a reward must be a finite number or null \(prompt p\.jsonl:2\)$/);
    await expect(scoreOne(await one('tooFew'), b, place, 10)).rejects.toThrow(/^reward function "tooFew" \(.*rewards\.mjs\) returned 2 rewards for 3 completions \(prompt p\.jsonl:1 … p\.jsonl:3\)$/);
    await expect(scoreOne(await one('hangs'), b, place, 0.05)).rejects.toThrow(/^reward function "hangs" \(.*rewards\.mjs\) gave no answer within reward_timeout = 0\.05 s \(prompt p\.jsonl:1 … p\.jsonl:3\)$/);
  });

  it('cmd:COMMAND speaks JSON lines: {"prompt","completion","row"} in, {"reward"} out; a bad answer names the row', async () => {
    const script = join(dir, 'rew.mjs');
    writeFileSync(script, [
      "import { createInterface } from 'node:readline';",
      "createInterface({ input: process.stdin }).on('line', (l) => { const x = JSON.parse(l);",
      "  if (x.row.bad) console.log('oops'); else console.log(JSON.stringify({ reward: x.completion.length + x.row.prompt.length })); });",
    ].join('\n'));
    const fns = await loadAllRewards([`cmd:${process.execPath} ${script}`]);
    const ok = await scoreOne(fns[0], batchOf(['x', 'no'], rows.slice(0, 2)), place, 10);
    expect(Array.from(ok)).toEqual([2, 3]);
    await expect(scoreOne(fns[0], batchOf(completions, rows), place, 10)).rejects.toThrow(/^reward function "cmd" \(cmd:.*\) failed: answer is not JSON: "oops" \(prompt p\.jsonl:3\)$/);
    await releaseRewards(fns);
    await expect(loadAllRewards(['accuracy', 'accuracy'])).rejects.toThrow(/--reward accuracy is given twice/);
    await expect(loadRewards('nonsense')).rejects.toThrow(/--reward must be accuracy, format:REGEX/);
  });

  it('two rewards of the same name are told apart by _2, _3 in --reward order; built-ins go by their kind\'s name', async () => {
    const other = join(dir, 'other.mjs');
    writeFileSync(other, 'export function short(completions) { return completions.map(() => 0.5); }\n');
    const fns = await loadAllRewards([`${mod}:short`, 'format:^x', 'format:o', `${other}:short`, 'length:1', 'accuracy']);
    expect(fns.map((f) => f.name)).toEqual(['short', 'format', 'format_2', 'short_2', 'length', 'accuracy']);
    const got = await scoreAll(fns.slice(0, 4), batchOf(completions, rows), place, 10);
    expect(got.map((r) => Array.from(r))).toEqual([[1, 1, 1], [1, 0, 0], [0, 1, 0], [0.5, 0.5, 0.5]]);
    await releaseRewards(fns);
  });

  it('reward:DIR scores with the reward model, as RewardModel.score does', async () => {
    const base = join(dir, 'base');
    initModelFolder(base, 'llama', 'tiny', 3);
    const m = loadModel(base);
    const weights = new Map(m.weights);
    for (const [k, v] of initValueHead(m.config, 4)) weights.set(k, v);
    const rmDir = join(dir, 'rm');
    saveCheckpoint(rmDir, weights, { config: m.config });
    for (const f of ['tokenizer.json', 'tokenizer_config.json']) writeFileSync(join(rmDir, f), readFileSync(join(base, f)));
    const [fn] = await loadRewards(`reward:${rmDir}`);
    const got = await scoreOne(fn, batchOf(['7', 'seven'], [{ prompt: '3+4=' }, { prompt: '3+4=' }]), place, 30);
    await releaseRewards([fn]);
    const rm = await RewardModel.load(rmDir);
    const want = await rm.score([{ prompt: '3+4=', response: '7' }, { prompt: '3+4=', response: 'seven' }]);
    await rm.release();
    expect(Array.from(got)).toEqual(want);
  });
});
