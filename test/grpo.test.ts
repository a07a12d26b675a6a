/**
 * `prefzoo grpo` end to end on a tiny model: TRL's metric names and sample completions in the run
 * folder; a run killed with SIGKILL after its first checkpoint and continued with --resume writing
 * the same metrics rows, samples and weights as an uninterrupted one (num_iterations = 2, so a
 * checkpoint falls inside a round; beta > 0, gradient accumulation); a reward function that throws
 * stopping the run in one line naming it and the prompt row, the checkpoint kept; --help listing
 * every setting with its default (grpo's own defaults of trainer settings among them, one declaration
 * for config, --help and docs); and the advantages against hand-computed values.
 */
import { spawnSync } from 'node:child_process';
import { existsSync, mkdtempSync, readdirSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join, resolve } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { initModelFolder } from '../src/models/init.ts';
import { combineRewards, computeAdvantages, GRPO_SETTINGS, nanStd } from '../src/online/grpo/index.ts';
import { rewardMetrics } from '../src/online/grpo/metrics.ts';
import { getLoss } from '../losses/index.ts';
import { resolveConfig } from '../src/train/config.ts';
import { commandDecl, commandDefaults, declareCommand, declaredCommands, settingsHelp, settingsMarkdown, TRAIN_SETTINGS } from '../src/train/settings.ts';
import { killWhen } from './helpers/faults.ts';

const bin = resolve(import.meta.dirname, '..', 'bin', 'prefzoo.mjs');
const dir = mkdtempSync(join(tmpdir(), 'prefzoo-grpo-'));
afterAll(() => rmSync(dir, { recursive: true, force: true }));
const model = join(dir, 'model');
const prompts = join(dir, 'prompts.jsonl');
const rewardsMjs = join(dir, 'rewards.mjs');

// Rounds of 4 prompts × 2 completions in two micro-batches of 4; each round gets two updates
// (num_iterations), so the checkpoints at odd steps fall inside a round.
const SETTINGS = [
  'max_steps=4', 'save_steps=3', 'batch_size=4', 'gradient_accumulation_steps=2', 'num_generations=2', 'num_iterations=2',
  'max_completion_length=3', 'beta=0.05', 'loss_type=grpo', 'learning_rate=3e-3', 'warmup_steps=1', 'pad_to_multiple_of=8',
  'logging_steps=1', 'log_completions=2',
];

function args(out: string, rewards: string[], extra: string[] = []): string[] {
  return ['grpo', '--model', model, '--prompts', prompts, ...rewards.flatMap((r) => ['--reward', r]), '-o', out, '--quiet', ...SETTINGS.flatMap((s) => ['--param', s]), ...extra];
}
const REWARDS = ['accuracy', `${rewardsMjs}:short`];

function runSync(out: string, rewards = REWARDS, extra: string[] = []) {
  return spawnSync(process.execPath, [bin, ...args(out, rewards, extra)], { encoding: 'utf8' });
}

function jsonl(file: string): Record<string, unknown>[] {
  return readFileSync(file, 'utf8').trim().split('\n').map((l) => JSON.parse(l));
}

/** metrics.jsonl rows without the wall-clock field. */
function rows(out: string): Record<string, unknown>[] {
  return jsonl(join(out, 'metrics.jsonl')).map(({ 'tokens/s': _, ...r }) => r);
}

beforeAll(() => {
  initModelFolder(model, 'llama', 'tiny', 5);
  writeFileSync(prompts, ['1+2=', '3+4=', '5+6=', '7+1=', '9+0=', '2+2=', '4+4=', '6+3='].map((p) => JSON.stringify({ prompt: p, answer: String(eval(p.slice(0, -1)) % 10) }) + '\n').join(''));
  writeFileSync(rewardsMjs, [
    // Shorter completions score higher: a signal even for an untrained model.
    'export function short(completions) { return completions.map((c) => -c.length / 10); }',
    'let calls = 0;',
    // Fine for two rounds, then throws on every completion (the batch call and the one-by-one retries count).
    'export function breaksLater(completions) { calls++; return completions.map((c) => { if (calls > 2) throw new Error("cannot read " + JSON.stringify(c)); return 0; }); }',
  ].join('\n'));
});

describe('prefzoo grpo', () => {
  it('writes TRL\'s metrics and sample completions; killed with SIGKILL and resumed, it writes the same rows, samples and weights', async () => {
    const straight = join(dir, 'straight');
    const a = runSync(straight);
    expect(a.status, a.stderr).toBe(0);
    expect(readdirSync(join(straight, 'checkpoints'))).toEqual(['step-00000003', 'step-00000004']);
    const want = rows(straight);
    expect(want.map((r) => r.step)).toEqual([1, 2, 3, 4]);
    for (const key of ['loss', 'reward', 'reward_std', 'rewards/accuracy/mean', 'rewards/short/mean', 'frac_reward_zero_std', 'frac_reward_none', 'completions/mean_length', 'completions/clipped_ratio', 'kl', 'entropy', 'clip_ratio/low_mean', 'clip_ratio/high_mean', 'clip_ratio/region_mean', 'grad_norm', 'learning_rate',
      'sampling/sampling_logp_difference/mean', 'sampling/sampling_logp_difference/max', 'sampling/importance_sampling_ratio/min', 'sampling/importance_sampling_ratio/mean', 'sampling/importance_sampling_ratio/max']) {
      expect(want.every((r) => typeof r[key] === 'number' && Number.isFinite(r[key])), key).toBe(true);
    }
    // The second update of a round starts from the updated policy: its ratio is no longer 1, so KL and the loss move.
    expect(want[0].kl).toBe(0);
    expect(want[1].kl as number).toBeGreaterThan(0);
    const samples = jsonl(join(straight, 'completions.jsonl'));
    expect(samples.map((s) => s.step)).toEqual([1, 1, 3, 3]);
    expect(Object.keys(samples[0])).toEqual(['step', 'prompt', 'completion', 'rewards', 'reward', 'advantage']);

    const broken = join(dir, 'broken');
    await killWhen(args(broken, REWARDS), () => existsSync(join(broken, 'checkpoints', 'step-00000003', 'state.json')));
    expect(existsSync(join(broken, 'final'))).toBe(false);
    const b = runSync(broken, REWARDS, ['--resume']);
    expect(b.status, b.stderr).toBe(0);
    expect(rows(broken)).toEqual(want);
    expect(jsonl(join(broken, 'completions.jsonl'))).toEqual(samples);
    expect(Buffer.compare(readFileSync(join(straight, 'final', 'model.safetensors')), readFileSync(join(broken, 'final', 'model.safetensors')))).toBe(0);
  });

  it('a reward function that throws stops the run in one line naming it and the prompt row; the checkpoint stays', () => {
    const out = join(dir, 'throws');
    const r = runSync(out, ['accuracy', `${rewardsMjs}:breaksLater`], ['--param', 'save_steps=2', '--param', 'num_iterations=1']);
    expect(r.status).toBe(1);
    expect(r.stderr.trim().split('\n')).toHaveLength(1);
    expect(r.stderr.trim()).toMatch(new RegExp(`^prefzoo: reward function "breaksLater" \\(.*rewards\\.mjs\\) threw: cannot read .* \\(prompt ${prompts.replace(/[.*+?^${}()|[\]\\]/g, '\\$&')}:[1-8]\\)$`));
    expect(readdirSync(join(out, 'checkpoints'))).toEqual(['step-00000002']);
    expect(existsSync(join(out, 'checkpoints', 'step-00000002', 'state.json'))).toBe(true);
  });

  it('refuses in one line: a round that is not whole groups, an unknown setting, a setting grpo does not honour', () => {
    const odd = runSync(join(dir, 'odd'), REWARDS, ['--param', 'num_generations=3']);
    expect(odd.stderr.trim()).toMatch(/^prefzoo: grpo: batch_size × gradient_accumulation_steps \(4 × 2 = 8 completions\) must be a multiple of num_generations \(3\)$/);
    const unknown = runSync(join(dir, 'unknown'), REWARDS, ['--param', 'num_generation=4']);
    expect(unknown.stderr.trim()).toMatch(/^prefzoo: grpo: unknown setting 'num_generation'; did you mean 'num_generations'\?$/);
    const refused = runSync(join(dir, 'refused'), REWARDS, ['--param', 'max_samples=3']);
    expect(refused.stderr.trim()).toMatch(/^prefzoo: setting max_samples cannot be honoured by prefzoo grpo/);
    for (const x of [odd, unknown, refused]) expect(x.status).toBe(1);
    expect(existsSync(join(dir, 'refused'))).toBe(false);
  });

  it('--help lists every setting with its default', () => {
    const h = spawnSync(process.execPath, [bin, 'grpo', '--help'], { encoding: 'utf8' }).stdout;
    for (const [k, s] of Object.entries(GRPO_SETTINGS)) expect(h, k).toContain(`    ${k}=${s.default === '' ? "''" : s.default}  `);
    for (const p of getLoss('grpo').params.filter((q) => q.name !== 'max_completion_length')) expect(h, p.name).toContain(`    ${p.name}=${p.default ?? '(unset)'}  `);
    for (const k of ['lora_r=0', 'save_steps=0', 'gradient_accumulation_steps=1', "eval_data=''"]) expect(h).toContain(`    ${k}`);
    // grpo's own defaults of trainer settings (TRL's GRPOConfig), not train's.
    expect(h).toMatch(/^ {4}learning_rate=1e-6 {2,}peak learning rate/m);
    expect(h).toMatch(/^ {4}batch_size=8 {2,}/m);
    expect(h).not.toContain(`learning_rate=${TRAIN_SETTINGS.learning_rate.default}`);
  });
});

describe('per-command defaults (declareCommand)', () => {
  it('one declaration gives grpo its defaults in the config, --help and docs/settings.md; train keeps the table\'s', () => {
    const grpoDefaults = commandDecl('grpo').defaults;
    expect(grpoDefaults).toEqual({ batch_size: 8, learning_rate: 1e-6 });
    const g = resolveConfig({ command: 'grpo' }).config;
    expect([g.learning_rate, g.batch_size, g.max_grad_norm]).toEqual([1e-6, 8, TRAIN_SETTINGS.max_grad_norm.default]);
    expect(commandDefaults('grpo')).toEqual(g);
    // A given value, and a caller's base, still win over the command's default.
    expect(resolveConfig({ command: 'grpo', params: ['learning_rate=3e-5'] }).config.learning_rate).toBe(3e-5);
    expect(resolveConfig({ command: 'grpo', base: { batch_size: 16 } }).config.batch_size).toBe(16);
    const t = resolveConfig({ command: 'train' }).config;
    expect([t.learning_rate, t.batch_size]).toEqual([TRAIN_SETTINGS.learning_rate.default, TRAIN_SETTINGS.batch_size.default]);
    expect(settingsHelp('grpo')).toMatch(/^ {4}learning_rate=1e-6 /m);
    expect(settingsHelp('train')).toMatch(/^ {4}learning_rate=5e-6 /m);
    expect(settingsMarkdown()).toContain('Its defaults: `batch_size=8`, `learning_rate=1e-6` (the table\'s for the rest).');
  });

  it('a default for a setting the command does not honour, or out of its range, is a declaration error', () => {
    expect(() => declareCommand('defaults-unhonoured', { honours: ['learning_rate'], defaults: { batch_size: 2 } })).toThrow(/declareCommand defaults-unhonoured: a default for batch_size, which it does not honour/);
    expect(() => declareCommand('defaults-range', { honours: ['learning_rate'], defaults: { learning_rate: -1 } })).toThrow(/learning_rate/);
    expect(declaredCommands().map((c) => c.name)).not.toContain('defaults-unhonoured');
    expect(declaredCommands().map((c) => c.name)).not.toContain('defaults-range');
  });
});

describe('advantages', () => {
  it('group: r − group mean, ÷ (sample std + 1e-4); rloo: r − mean of the others; batch and none; unscorable rows get 0', () => {
    const r = [1, 0, 0, 1, /* group 2 */ 2, 2, 2, 2];
    const s = Math.sqrt(1 / 3); // sample std of [1, 0, 0, 1]
    const g = computeAdvantages(r, 4, 'group', 'group');
    expect(Array.from(g.advantages)).toEqual([0.5 / (s + 1e-4), -0.5 / (s + 1e-4), -0.5 / (s + 1e-4), 0.5 / (s + 1e-4), 0, 0, 0, 0]);
    expect(g.zeroStd).toEqual([false, false, false, false, true, true, true, true]);
    const loo = computeAdvantages(r, 4, 'none', 'rloo');
    expect(Array.from(loo.advantages)).toEqual([1 - 1 / 3, 0 - 2 / 3, 0 - 2 / 3, 1 - 1 / 3, 0, 0, 0, 0]);
    const batch = computeAdvantages(r, 4, 'batch', 'group');
    const sb = nanStd(r);
    expect(sb).toBeCloseTo(Math.sqrt(((1 - 1.25) ** 2 * 2 + 1.25 ** 2 * 2 + 0.75 ** 2 * 4) / 7), 14);
    expect(batch.advantages[0]).toBeCloseTo(0.5 / (sb + 1e-4), 14);
    expect(batch.zeroStd.every((z) => !z)).toBe(true);
    const withNaN = computeAdvantages([1, NaN, 0, 1], 4, 'none', 'group');
    [1 / 3, 0, -2 / 3, 1 / 3].forEach((v, i) => expect(withNaN.advantages[i]).toBeCloseTo(v, 15));
  });

  it('weighted sum over the functions that answered; none answered: unscorable (NaN)', () => {
    const out = combineRewards([Float64Array.of(1, NaN, NaN), Float64Array.of(2, 3, NaN)], [0.5, 2]);
    expect(out[0]).toBe(4.5);
    expect(out[1]).toBe(6);
    expect(out[2]).toBeNaN();
  });

  it('a completion whose every reward is null gets advantage 0, is left out of its group\'s mean and std, and is counted in frac_reward_none', () => {
    const perFunction = [Float64Array.of(1, NaN, 0, 3), Float64Array.of(NaN, NaN, 2, NaN)];
    const r = combineRewards(perFunction, [1, 1]);
    expect(Array.from(r)).toEqual([1, NaN, 2, 3]);
    const a = computeAdvantages(r, 4, 'group', 'group');
    // Group of the three scored completions: mean 2, sample std 1.
    expect(Array.from(a.advantages)).toEqual([-1 / (1 + 1e-4), 0, 0, 1 / (1 + 1e-4)]);
    const m = rewardMetrics(['a', 'b'], perFunction, r);
    expect(m.frac_reward_none).toBe(0.25);
    expect(m.reward).toBe(2);
    expect(m['rewards/b/mean']).toBe(2);
    expect(m['rewards/b/std']).toBe(0);
  });
});
