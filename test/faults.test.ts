/**
 * Fault injection on train and eval: kill -9 at several points of a run, a rerun that
 * must neither reuse stale reference log-probs nor fail, a disk that fills up, NaN weights, ties,
 * and the one-line messages for a missing device, wrong columns and pre-tokenized data.
 */
import { describe, it, expect, beforeAll, afterAll } from 'vitest';
import { cpSync, existsSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join, resolve } from 'node:path';
import { initModelFolder } from '../src/models/init.ts';
import { loadModel } from '../src/models/load.ts';
import { saveCheckpoint } from '../src/models/checkpoint.ts';
import { demoPairs } from '../src/demos/task.ts';
import { cli, expectOneLineError, holds, killWhen, smallDisk, temporaries } from './helpers/faults.ts';

let dir: string;
let m1: string;
let m2: string;
let pairs: string;

const SETTINGS = ['batch_size=8', 'max_length=32', 'max_prompt_length=16', 'pad_to_multiple_of=16', 'learning_rate=3e-3'];

function train(out: string, o: { model?: string; steps?: number; extra?: string[]; data?: string; loss?: string; env?: Record<string, string> } = {}) {
  return cli(trainArgs(out, o), { env: o.env });
}

function trainArgs(out: string, o: { model?: string; steps?: number; extra?: string[]; data?: string; loss?: string } = {}): string[] {
  const params = [...SETTINGS, `max_steps=${o.steps ?? 4}`].flatMap((s) => ['--param', s]);
  return ['train', '--model', o.model ?? m1, '--data', o.data ?? pairs, '--loss', o.loss ?? 'dpo', '-o', out, '--quiet', ...params, ...(o.extra ?? [])];
}

function metrics(run: string): Array<Record<string, number>> {
  return readFileSync(join(run, 'metrics.jsonl'), 'utf8').trim().split('\n').map((l) => JSON.parse(l));
}

beforeAll(() => {
  dir = mkdtempSync(join(tmpdir(), 'pz-faults-'));
  m1 = join(dir, 'm1');
  m2 = join(dir, 'm2');
  initModelFolder(m1, 'llama', 'tiny', 11);
  initModelFolder(m2, 'llama', 'tiny', 12);
  pairs = join(dir, 'pairs.jsonl');
  writeFileSync(pairs, demoPairs(2, 40, 0).train.map((p) => JSON.stringify(p)).join('\n') + '\n');
});

afterAll(() => rmSync(dir, { recursive: true, force: true }));

describe('the reference log-prob cache and the run folder', () => {
  it('after kill -9 with the cache written: a rerun with another model is refused without --resume, refused with it, and fresh with --overwrite', async () => {
    const run = join(dir, 'killed');
    await killWhen(trainArgs(run, { steps: 400 }), () => existsSync(join(run, 'data', 'reference.parquet')) && existsSync(join(run, 'artifacts', 'artifacts.json')));
    expectOneLineError(train(run, { model: m2 }), /killed: not empty .*--resume.*--overwrite/);
    expectOneLineError(train(run, { model: m2, extra: ['--resume'] }), /--resume: .*killed was started with --model .*m1; .*--overwrite/);
    const over = train(run, { model: m2, steps: 1, extra: ['--overwrite'] });
    expect(over.status, over.stderr).toBe(0);
    const fresh = train(join(dir, 'fresh-m2'), { model: m2, steps: 1 });
    expect(fresh.status, fresh.stderr).toBe(0);
    // Nothing of m1's reference survived: step 1 is exactly a fresh m2 run's (loss ln 2, rewards 0).
    const [a] = metrics(run);
    const [b] = metrics(join(dir, 'fresh-m2'));
    expect(a.loss).toBe(b.loss);
    expect(a['rewards/chosen']).toBe(b['rewards/chosen']);
    expect(Math.abs(a.loss - Math.LN2)).toBeLessThan(1e-6);
    expect(temporaries(run)).toEqual([]);
  });

  it('kill -9 during reference scoring and during a checkpoint write: --resume finishes with no temporaries and every step once', async () => {
    const run = join(dir, 'killed2');
    // While the reference is being scored: the converted data is there, the cache is not yet.
    await killWhen(trainArgs(run, { steps: 12, extra: ['--param', 'save_steps=4'] }), () => existsSync(join(run, 'data', 'pairs.parquet')) && !existsSync(join(run, 'data', 'reference.parquet')));
    // While a checkpoint is being written.
    await killWhen(trainArgs(run, { steps: 12, extra: ['--param', 'save_steps=4', '--resume'] }), () => holds(join(run, 'checkpoints'), /\.tmp/));
    const r = train(run, { steps: 12, extra: ['--param', 'save_steps=4', '--resume'] });
    expect(r.status, r.stderr).toBe(0);
    expect(temporaries(run)).toEqual([]);
    expect(metrics(run).map((m) => m.step)).toEqual(Array.from({ length: 12 }, (_, i) => i + 1));
    expect(existsSync(join(run, 'final', 'model.safetensors'))).toBe(true);
  });

  it('--resume refuses a cache made with other tokenization settings or model files changed in place', () => {
    const run = join(dir, 'resumable');
    const model = join(dir, 'm-copy');
    cpSync(m1, model, { recursive: true });
    expect(train(run, { model, steps: 2, extra: ['--param', 'save_steps=1'] }).status).toBe(0);
    expectOneLineError(
      train(run, { model, steps: 4, extra: ['--resume', '--param', 'max_length=24'] }),
      /reference\.parquet: cached by a run with different tokenization settings; .*--overwrite/,
    );
    // The same path, rewritten with other weights: the reference is no longer what the cache holds.
    cpSync(join(m2, 'model.safetensors'), join(model, 'model.safetensors'));
    expectOneLineError(train(run, { model, steps: 4, extra: ['--resume'] }), /cached by a run with different model files; /);
  });

  it('--overwrite removes only what a run writes; --quiet prints nothing on stderr', () => {
    const run = join(dir, 'foreign');
    const r = train(run, { steps: 1 });
    expect(r.status, r.stderr).toBe(0);
    expect(r.stderr).toBe('');
    writeFileSync(join(run, 'notes.txt'), 'mine');
    expectOneLineError(train(run, { steps: 1, extra: ['--overwrite'] }), /--overwrite removes only a run's own files, and this folder also holds notes\.txt/);
    expect(readFileSync(join(run, 'notes.txt'), 'utf8')).toBe('mine');
  });
});

describe('numbers that must not mislead', () => {
  it('step 1 (policy = reference): rewards/accuracies is 0, not rounding noise', () => {
    const sg = join(dir, 'sg32.json');
    writeFileSync(sg, JSON.stringify((JSON.parse(readFileSync(resolve(__dirname, '../../shared/data/dpo_en_demo.json'), 'utf8')) as unknown[]).slice(0, 32)));
    for (const loss of ['dpo', 'ipo']) {
      const run = join(dir, `step1-${loss}`);
      const r = cli(['train', '--model', m1, '--data', sg, '--loss', loss, '-o', run, '--quiet', ...['batch_size=32', 'max_steps=1', 'max_length=128', 'max_prompt_length=64', 'pad_to_multiple_of=16'].flatMap((s) => ['--param', s])]);
      expect(r.status, r.stderr).toBe(0);
      const [m] = metrics(run);
      expect(m['rewards/accuracies']).toBe(0);
      expect(Math.abs(m['rewards/margins'])).toBeLessThan(1e-5);
    }
  });

  it('eval with policy = reference: accuracy 0 with every pair a tie, the rule the help states; eval --json shows progress on stderr', () => {
    const r = cli(['eval', '--model', m1, '--ref', m1, '--data', pairs, '--json', '--max-length', '32', '--max-prompt-length', '16']);
    expect(r.status, r.stderr).toBe(0);
    const s = JSON.parse(r.stdout);
    expect(s.accuracy).toBe(0);
    expect(s.ties).toBe(s.count);
    expect(s.count).toBe(40);
    expect(r.stderr).toMatch(/reference log-probs/);
    expect(cli(['eval', '--help']).stdout).toMatch(/ties count as wrong/);
    expect(cli(['train', '--help']).stdout).toMatch(/rewards\/accuracies: .*ties count as wrong/);
  });

  it('the demo reports the implicit-reward accuracy before training by the same rule (0), next to the preference accuracy', () => {
    const r = cli(['demo', '--steps', '2', '--json', '-o', join(dir, 'demo')]);
    expect(r.status, r.stderr).toBe(0);
    const s = JSON.parse(r.stdout);
    expect(s.reward_accuracy_before).toBe(0);
    expect(s.accuracy_before).toBeGreaterThan(0);
  });

  it('eval on data tokenized by `prefzoo tokenize` counts the rows tokenize truncated', () => {
    const canonical = join(dir, 'pairs.parquet');
    expect(cli(['convert', pairs, '-o', canonical]).status).toBe(0);
    const tok = join(dir, 'pairs.tok.parquet');
    const t = cli(['tokenize', canonical, '--model', m1, '-o', tok, '--max-length', '6', '--max-prompt-length', '4']);
    expect(t.status, t.stderr).toBe(0);
    const cut = Number(/(\d+) truncated/.exec(t.stdout)![1]);
    expect(cut).toBeGreaterThan(0);
    const e = cli(['eval', '--model', m1, '--ref', m1, '--data', tok, '--json', '--quiet']);
    expect(e.status, e.stderr).toBe(0);
    expect(JSON.parse(e.stdout).truncated).toBe(cut);
  });
});

describe('NaN weights', () => {
  let nan: string;
  beforeAll(() => {
    nan = join(dir, 'm-nan');
    cpSync(m1, nan, { recursive: true });
    const w = loadModel(m1).weights;
    w.get('model.layers.1.mlp.down_proj.weight')!.data[5] = NaN;
    saveCheckpoint(nan, w, { config: loadModel(m1).config });
  });

  it('eval stops with one line naming the tensor instead of printing accuracy 0', () => {
    expectOneLineError(cli(['eval', '--model', nan, '--ref', m1, '--data', pairs, '--json']), /m-nan\/model\.safetensors: tensor "model\.layers\.1\.mlp\.down_proj\.weight" holds NaN .*damaged/);
  });

  it('train says the weights are damaged (not "lower learning_rate") and leaves no run folder', () => {
    const run = join(dir, 'run-nan');
    const line = expectOneLineError(train(run, { model: nan }), /tensor "model\.layers\.1\.mlp\.down_proj\.weight" holds NaN/);
    expect(line).not.toMatch(/learning_rate/);
    expect(existsSync(run)).toBe(false);
  });

  it('a non-finite loss at step 1 says the learning rate is not the cause', () => {
    const line = expectOneLineError(train(join(dir, 'nan-step1'), { env: { PREFZOO_FAULT_NAN_AT_STEP: '1' } }), /loss is NaN at step 1: .*learning rate is not the cause/);
    expect(line).not.toMatch(/lower learning_rate/);
  });
});

describe('one line, no leftovers', () => {
  it('a full disk under the run folder: exit 1, one line, no run folder and no temporaries', () => {
    const disk = smallDisk(join(dir, 'small'));
    try {
      const run = join(disk.dir, 'run');
      const r = disk.run(trainArgs(run, { steps: 2 }), { room: 900 * 1024, fileLimit: 256 * 1024 });
      expectOneLineError(r, disk.expected);
      expect(existsSync(run)).toBe(false);
      expect(temporaries(disk.dir)).toEqual([]);
    } finally {
      disk.release();
    }
  });

  it('device=cuda on a CPU-only install: one line and no empty run folder', () => {
    const run = join(dir, 'cuda');
    expectOneLineError(train(run, { extra: ['--param', 'device=cuda'] }), /execution provider "cuda" (is not available|could not start)/);
    expect(existsSync(run)).toBe(false);
  });

  it('sppo names the columns it needs as the data has them (chosen_prob, rejected_prob)', () => {
    expectOneLineError(train(join(dir, 'sppo'), { loss: 'sppo' }), /needs columns chosen_prob, rejected_prob, which the data does not have/);
  });
});
