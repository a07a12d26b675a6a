/**
 * The recipes of docs/architecture.md ("How to add an online method", "How to add a reward kind"),
 * held as families.test.ts holds the family recipe: a renamed copy is registered the way the recipe
 * says and runs as the original does.
 */
import { describe, it, expect, beforeAll } from 'vitest';
import { mkdtempSync, readFileSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { buildProgram } from '../src/cli/main.ts';
import { initModelFolder } from '../src/models/init.ts';
import { TaskJudge } from '../src/online/judges.ts';
import { runOnline } from '../src/train/loop.ts';
import { nashMdMethod, runNashMd } from '../src/online/nash-md.ts';
import { samplerOptions } from '../src/online/sampling.ts';
import { format, registerRewardKind, rewardHelp, rewardMarkdown, rewardSyntax, type RewardKind } from '../src/online/rewards/index.ts';
import { resolveConfig } from '../src/train/config.ts';
import { commandDecl, declareCommand, type TRAIN_SETTINGS } from '../src/train/settings.ts';
import { resolveLoss } from '../losses/index.ts';

const dir = mkdtempSync(join(tmpdir(), 'prefzoo-recipes-'));
const model = join(dir, 'model');

beforeAll(() => {
  initModelFolder(model, 'llama', 'tiny', 11);
});

/** metrics.jsonl rows without the wall-clock field. */
function rows(out: string): Record<string, unknown>[] {
  return readFileSync(join(out, 'metrics.jsonl'), 'utf8').trim().split('\n').map((l) => JSON.parse(l)).map(({ 'tokens/s': _, ...r }) => r);
}

describe('adding an online method is one file (the method and its declareCommand) and one command row', () => {
  it('a renamed copy of Nash-MD, declared and run on the loop, trains as nash-md does', async () => {
    const nash = commandDecl('nash-md');
    declareCommand('nash-md-copy', { honours: nash.honours as (keyof typeof TRAIN_SETTINGS)[], own: nash.own, lossParams: nash.lossParams });
    expect(() => resolveConfig({ params: ['eval_data=x.jsonl'], command: 'nash-md-copy' })).toThrow(/cannot be honoured by prefzoo nash-md-copy/);

    const prompts = ['12:', '345:', '7:', '89:'];
    const params = ['max_steps=2', 'batch_size=2', 'learning_rate=3e-3', 'pad_to_multiple_of=8', 'logging_steps=1', 'threads=1', 'max_completion_length=3'];
    const judge = new TaskJudge();
    const original = join(dir, 'nash-md');
    await runNashMd({ model, prompts, judge, out: original, params });

    const copyOut = join(dir, 'nash-md-copy');
    const { config, lossParams, own } = resolveConfig({ params, command: 'nash-md-copy' });
    const method = { ...nashMdMethod({ config, loss: resolveLoss('nash_md', lossParams), sampling: samplerOptions(own as Parameters<typeof samplerOptions>[0]), judge }), name: 'nash-md-copy' };
    await runOnline({ model, out: copyOut }, prompts, method, { config, record: {} });

    expect(JSON.parse(readFileSync(join(copyOut, 'config.json'), 'utf8')).method).toBe('nash-md-copy');
    const want = rows(original);
    expect(want.map((r) => r.step)).toEqual([1, 2]);
    expect(rows(copyOut)).toEqual(want);
  });
});

/** Runs the prefzoo command line in this process (so it sees the reward kinds registered here). */
async function prefzoo(...args: string[]): Promise<void> {
  await (await buildProgram([args[0]])).parseAsync(['node', 'prefzoo', ...args]);
}

describe('adding a reward kind is one file (its RewardKind) and one registry row', () => {
  it('a renamed copy of format: registered, listed in --help and the docs, and scoring in a grpo run as the original', async () => {
    const fmt: RewardKind<`fmt:${string}`> = {
      name: 'fmt',
      syntax: 'fmt:REGEX',
      help: 'format:REGEX under another prefix (the recipe test)',
      matches: (spec): spec is `fmt:${string}` => spec.startsWith('fmt:'),
      load: async (spec, env) => (await format.load(`format:${spec.slice('fmt:'.length)}`, env)).map((f) => ({ ...f, name: 'fmt' })),
    };
    registerRewardKind(fmt);
    expect(() => registerRewardKind(fmt)).toThrow(/registered already/);
    expect(rewardSyntax()).toContain('| fmt:REGEX |');
    expect(rewardHelp()).toContain(fmt.help);
    expect(rewardMarkdown()).toContain('| `fmt:REGEX` |');

    const prompts = join(dir, 'prompts.jsonl');
    writeFileSync(prompts, ['1+2=', '3+4=', '5+6=', '7+1='].map((p) => JSON.stringify({ prompt: p, answer: '0' }) + '\n').join(''));
    const out = join(dir, 'grpo');
    const params = ['max_steps=2', 'batch_size=4', 'num_generations=2', 'max_completion_length=3', 'pad_to_multiple_of=8', 'logging_steps=1', 'threads=1', 'log_completions=2'];
    await prefzoo('grpo', '--model', model, '--prompts', prompts, '--reward', 'format:[aeiou]', '--reward', 'fmt:[aeiou]', '-o', out, '--quiet', ...params.flatMap((p) => ['--param', p]));
    const got = rows(out);
    expect(got).toHaveLength(2);
    for (const r of got) {
      expect(typeof r['rewards/fmt/mean']).toBe('number');
      expect(r['rewards/fmt/mean']).toBe(r['rewards/format/mean']);
      expect(r['rewards/fmt/std']).toBe(r['rewards/format/std']);
    }
    // Each logged completion scored by both, as the regular expression reads its text.
    const logged = readFileSync(join(out, 'completions.jsonl'), 'utf8').trim().split('\n').map((l) => JSON.parse(l));
    expect(logged.length).toBe(4);
    for (const l of logged) {
      const want = /[aeiou]/su.test(l.completion) ? 1 : 0;
      expect(l.rewards).toEqual({ format: want, fmt: want });
    }
  });
});
