/**
 * Environments that own their data and reward (TRL 1.8–1.9's environment_factory; docs/agents.md,
 * "Environments"):
 *
 * - a module exporting a map of factories (`export default { … }` or `export const environments`),
 *   each prompt row picking one by its `environment` column (env_column);
 * - `prefzoo grpo` with no prompts file, the environments' reset() giving the prompt (a string, and
 *   `{ prompt: messages }`): 2 GRPO steps; completions.jsonl shows the prompts they gave, and the
 *   metrics the mean of the rewards they gave, read back from the log the environments themselves
 *   wrote; killed with SIGKILL after the first checkpoint and resumed, the same rows and weights;
 * - the refusals, each one line: a row naming an unknown environment or lacking the column (file:line
 *   and the known names), no max_steps without prompts, a reset giving no prompt for a row without one,
 *   a map mixing environments with and without reward() and no --reward, env_column with one factory.
 */
import { spawnSync } from 'node:child_process';
import { existsSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join, resolve } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { initModelFolder } from '../src/models/init.ts';
import { loadEnvironment } from '../src/agents/env.ts';
import { grpo, type GrpoOptions } from '../src/online/grpo/index.ts';
import { UserError } from '../src/errors.ts';
import { killWhen } from './helpers/faults.ts';
import { metricsRows } from './helpers/metrics-rows.ts';

const ROOT = resolve(import.meta.dirname, '..');
const bin = join(ROOT, 'bin', 'prefzoo.mjs');
const dir = mkdtempSync(join(tmpdir(), 'prefzoo-env-owned-'));
afterAll(() => rmSync(dir, { recursive: true, force: true }));
const model = join(dir, 'model');

/**
 * Two games. `wordle` gives its prompt as a string (TRL's reset), `guess` as `{ prompt: messages }`;
 * each rewards a function of its seed and the answer's length, and appends what it gave (name, seed,
 * prompt, reward) and the row it was reset with to $ENV_LOG, one JSON line per episode.
 */
const GAMES = `
import { appendFileSync } from 'node:fs';
function game(name, giveMessages) {
  return () => {
    let seed = 0, prompt = null, text = '', given = null;
    return {
      reset(row, o) {
        seed = o.seed;
        given = row;
        const ask = name + ' game ' + (seed % 1000) + ': say a digit';
        prompt = giveMessages ? [{ role: 'system', content: 'You play ' + name + '.' }, { role: 'user', content: ask }] : ask;
        return giveMessages ? { prompt } : prompt;
      },
      step(a) { text = a.text; return { messages: [], done: true }; },
      reward() {
        const r = (seed % 10) / 10 + (text.length % 3);
        appendFileSync(process.env.ENV_LOG, JSON.stringify({ name, seed, prompt, reward: r, row: given }) + '\\n');
        return r;
      },
    };
  };
}
`;

const files = {
  games: join(dir, 'games.mjs'),
  named: join(dir, 'named.mjs'),
  noPrompt: join(dir, 'no-prompt.mjs'),
  mixed: join(dir, 'mixed.mjs'),
  one: join(dir, 'one.mjs'),
  unstable: join(dir, 'unstable.mjs'),
  rows: join(dir, 'rows.jsonl'),
  unknown: join(dir, 'unknown.jsonl'),
  lacking: join(dir, 'lacking.jsonl'),
};

beforeAll(() => {
  initModelFolder(model, 'llama', 'tiny', 3);
  writeFileSync(files.games, `${GAMES}\nexport default { wordle: game('wordle', false), guess: game('guess', true) };\n`);
  writeFileSync(files.named, `${GAMES}\nexport const environments = { wordle: game('wordle', false), guess: game('guess', true) };\nexport function helper() {}\n`);
  writeFileSync(files.noPrompt, `export default () => ({ reset: () => ({ messages: [] }), step: () => ({ messages: [], done: true }), reward: () => 1 });\n`);
  writeFileSync(
    files.mixed,
    `class Scored { reset() { return 'hi'; } step() { return { messages: [], done: true }; } reward() { return 1; } }\n` +
      `export default { scored: Scored, unscored: () => ({ reset: () => 'hi', step: () => ({ messages: [], reward: 1, done: true }) }) };\n`,
  );
  writeFileSync(files.one, `export default () => ({ reset: () => 'hi', step: () => ({ messages: [], done: true }), reward: () => 1 });\n`);
  writeFileSync(files.unstable, `let k = 0;\nexport default () => ({ reset: () => 'question ' + k++, step: () => ({ messages: [], done: true }), reward: () => 1 });\n`);
  writeFileSync(files.rows, [{ environment: 'guess' }, { environment: 'wordle', level: 2 }].map((r) => JSON.stringify(r) + '\n').join(''));
  writeFileSync(files.unknown, [{ environment: 'guess' }, { environment: 'chess' }].map((r) => JSON.stringify(r) + '\n').join(''));
  writeFileSync(files.lacking, [{ prompt: 'a digit?' }].map((r) => JSON.stringify(r) + '\n').join(''));
});

describe('a map of environments', () => {
  it('is a default export or an `environments` export; each row picks its environment by the column', async () => {
    for (const f of [files.games, files.named]) {
      const envs = await loadEnvironment(f);
      expect(envs.single).toBe(false);
      expect(envs.names).toEqual(['wordle', 'guess']);
      const g = await envs.open('rows.jsonl:1', { environment: 'guess' });
      await g.reset({}, 1234);
      expect(g.prompt).toEqual([{ role: 'system', content: 'You play guess.' }, { role: 'user', content: 'guess game 234: say a digit' }]);
      const w = await envs.open('rows.jsonl:2', { environment: 'wordle' });
      await w.reset({}, 77);
      expect(w.prompt).toBe('wordle game 77: say a digit');
      expect(envs.withColumn('game').pick({ game: 'wordle' }, 'x:1').spec).toBe(`${f} (wordle)`);
    }
    const one = await loadEnvironment(files.one);
    expect(one.single).toBe(true);
    expect(one.pick({ environment: 'anything' }, 'x:1').spec).toBe(files.one);
  });

  it('a row naming no environment of the map, or lacking the column, is one line with its file:line and the names', async () => {
    const envs = await loadEnvironment(files.games);
    expect(() => envs.pick({ environment: 'chess' }, 'p.jsonl:7')).toThrow(`p.jsonl:7: environment "chess" names no environment; the --env ${files.games} environments are wordle, guess`);
    expect(() => envs.pick({ prompt: 'x' }, 'p.jsonl:3')).toThrow(`p.jsonl:3: no "environment" column to pick an environment by (env_column); the --env ${files.games} environments are wordle, guess`);
  });
});

describe('prefzoo grpo with environments that own their data and reward', () => {
  const SET = ['max_steps=2', 'save_steps=1', 'batch_size=4', 'num_generations=2', 'max_completion_length=8', 'max_turns=1', 'logging_steps=1', 'threads=1', 'learning_rate=1e-3'];
  const args = (out: string, extra: string[] = []) => ['grpo', '--model', model, '--env', files.games, '-o', out, '--quiet', ...SET.flatMap((s) => ['--param', s]), ...extra];
  const run = (a: string[], log = join(dir, 'unused.log')) => spawnSync(process.execPath, [bin, ...a], { encoding: 'utf8', env: { ...process.env, ENV_LOG: log } });
  const oneLine = (r: ReturnType<typeof run>): string => {
    expect(r.status, r.stderr).toBe(1);
    const lines = r.stderr.trim().split('\n');
    expect(lines, r.stderr).toHaveLength(1);
    return lines[0];
  };

  it('no prompts file: 2 steps whose prompts and rewards are the environments\'; killed and resumed, the same rows and weights', async () => {
    const straight = join(dir, 'straight');
    const log = join(dir, 'straight.log');
    const a = run(args(straight), log);
    expect(a.status, a.stderr).toBe(0);

    // What the environments gave, in the order their episodes ended: 4 rollouts a step (2 rows × 2).
    const gave = readFileSync(log, 'utf8').trim().split('\n').map((l) => JSON.parse(l) as { name: string; seed: number; prompt: unknown; reward: number; row: unknown });
    expect(gave).toHaveLength(8);
    // The generated rows: { index }, the map's environments in turn by index.
    for (const g of gave) expect(g.row).toEqual(g.name === 'wordle' ? { index: 0, environment: 'wordle' } : { index: 1, environment: 'guess' });
    const steps = [gave.slice(0, 4), gave.slice(4)];
    for (const s of steps) {
      // Round-robin over the map: each round holds one row of each environment, its 2 rollouts sharing the seed.
      expect(s.map((g) => g.name).sort()).toEqual(['guess', 'guess', 'wordle', 'wordle']);
      for (const name of ['guess', 'wordle']) expect(new Set(s.filter((g) => g.name === name).map((g) => g.seed)).size).toBe(1);
    }
    expect(steps[0][0].seed).not.toBe(steps[1][0].seed);

    const rows = metricsRows(straight);
    expect(rows.map((r) => r.step)).toEqual([1, 2]);
    rows.forEach((r, k) => {
      const mean = steps[k].reduce((t, g) => t + g.reward, 0) / 4;
      expect(r['rewards/env/mean']).toBeCloseTo(mean, 12);
      expect(r.reward).toBeCloseTo(mean, 12);
    });

    // completions.jsonl: each logged round's first prompt, as its environment gave it, and the rewards it gave.
    const lines = readFileSync(join(straight, 'completions.jsonl'), 'utf8').trim().split('\n').map((l) => JSON.parse(l));
    expect(lines.map((l) => l.step)).toEqual([1, 1, 2, 2]);
    for (const l of lines) {
      const from = steps[l.step - 1].filter((g) => JSON.stringify(g.prompt) === JSON.stringify(l.prompt));
      expect(from.length, JSON.stringify(l.prompt)).toBe(2);
      expect(from.map((g) => g.reward)).toContain(l.rewards.env);
      const asked = typeof l.prompt === 'string' ? [{ role: 'user', content: l.prompt }] : l.prompt;
      expect(l.messages.slice(0, asked.length)).toEqual(asked);
    }
    expect(JSON.parse(readFileSync(join(straight, 'config.json'), 'utf8')).agent.environments).toEqual(['wordle', 'guess']);

    const broken = join(dir, 'broken');
    await killWhen(args(broken), () => existsSync(join(broken, 'checkpoints', 'step-00000001', 'state.json')), { ENV_LOG: join(dir, 'broken.log') });
    expect(existsSync(join(broken, 'final'))).toBe(false);
    const b = run(args(broken, ['--resume']), join(dir, 'broken.log'));
    expect(b.status, b.stderr).toBe(0);
    expect(metricsRows(broken)).toEqual(rows);
    expect(Buffer.compare(readFileSync(join(straight, 'final', 'model.safetensors')), readFileSync(join(broken, 'final', 'model.safetensors')))).toBe(0);
  });

  it('a prompts file of rows without prompts: each row plays the environment it names, its columns reaching reset', () => {
    const out = join(dir, 'from-rows');
    const log = join(dir, 'rows.log');
    const r = run(['grpo', '--model', model, '--prompts', files.rows, '--env', files.games, '-o', out, '--quiet', ...SET.flatMap((s) => ['--param', s])], log);
    expect(r.status, r.stderr).toBe(0);
    const gave = readFileSync(log, 'utf8').trim().split('\n').map((l) => JSON.parse(l) as { name: string; row: unknown });
    expect(gave.map((g) => g.name).sort()).toEqual(['guess', 'guess', 'guess', 'guess', 'wordle', 'wordle', 'wordle', 'wordle']);
    for (const g of gave) expect(g.row).toEqual(g.name === 'wordle' ? { environment: 'wordle', level: 2 } : { environment: 'guess' });
  });

  it('refuses before the run in one line: unknown environment, missing column, no max_steps, no prompts and no env, a mixed map without --reward, env_column with one factory', async () => {
    const rest = SET.slice(1);
    const refused = async (o: Partial<GrpoOptions>, params: string[]): Promise<string> => {
      const e = await grpo({ model, rewards: [], out: join(dir, 'refused'), params, ...o }).then(() => null, (x: unknown) => x);
      expect(e).toBeInstanceOf(UserError);
      const m = (e as Error).message;
      expect(m.split('\n')).toHaveLength(1);
      return m;
    };
    expect(await refused({ prompts: files.unknown, env: files.games }, rest)).toBe(`${files.unknown}:2: environment "chess" names no environment; the --env ${files.games} environments are wordle, guess`);
    expect(await refused({ prompts: files.lacking, env: files.games }, rest)).toBe(
      `${files.lacking}:1: no "environment" column to pick an environment by (env_column); the --env ${files.games} environments are wordle, guess`,
    );
    expect(await refused({ env: files.games }, rest)).toBe(`grpo: without --prompts the --env ${files.games} environments give the prompts and the rows never run out; set max_steps`);
    expect(await refused({ rewards: ['format:x'] }, SET.filter((s) => !s.startsWith('max_turns')))).toBe('grpo: no --prompts: give a prompts file, or an --env whose environments give the prompt (reset() returning it)');
    expect(await refused({ env: files.mixed }, SET)).toBe(
      `grpo: no --reward, and the --env ${files.mixed} environment unscored has no reward(): its rows would go unscored; give --reward, or a reward() to each of scored, unscored`,
    );
    expect(await refused({ env: files.one }, [...SET, 'env_column=game'])).toBe(`grpo: env_column=game picks among a map of environments; --env ${files.one} exports one factory: leave env_column out`);
    // Values as the library takes them: a map whose entry is not a factory.
    expect(await refused({ env: { wordle: () => ({ reset: () => 'x', step: () => ({ messages: [], done: true }) }), chess: 'no' as never } }, SET)).toBe(`--env env: the map's "chess" is not an environment factory (a function or class returning { reset, step })`);
    expect(existsSync(join(dir, 'refused'))).toBe(false);
  });

  it('stops at the first reset in one line: no prompt for a row without one, prompts that differ within a group', () => {
    const rest = SET.flatMap((s) => ['--param', s]);
    // The module, the function and the generated row.
    expect(oneLine(run(['grpo', '--model', model, '--env', files.noPrompt, '-o', join(dir, 'r7'), ...rest]))).toMatch(
      new RegExp(`^prefzoo: --env ${files.noPrompt.replace(/[.*+?^${}()|[\]\\]/g, '\\$&')}: reset\\(\\) gave no prompt for the row at generated row [01], which has none; return it from reset \\(a string, or \\{ prompt \\}\\)$`),
    );
    expect(oneLine(run(['grpo', '--model', model, '--env', files.unstable, '-o', join(dir, 'r8'), ...rest]))).toMatch(
      /reset\(\) gave the rollouts of the row at generated row [01] different prompts for the same row and seed; its prompt must be a function of them$/,
    );
  });

  it('--help says the environments may give the prompts and the reward', () => {
    const h = spawnSync(process.execPath, [bin, 'grpo', '--help'], { encoding: 'utf8' }).stdout.replace(/\s+/g, ' ');
    expect(h).toContain('--prompts <file>');
    expect(h).toContain('a map of factories by name');
    expect(h).toContain('reset() may return the prompt');
    expect(h).toContain('env_column=environment');
  });
});
