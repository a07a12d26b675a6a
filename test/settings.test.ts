// The settings table (src/train/settings.ts) as the one source: --help, docs/settings.md, validation,
// nearest-name suggestions, per-command refusals, TRL YAML configs, and one training problem for
// train, artifacts and bench.
import { describe, it, expect, beforeAll, afterAll } from 'vitest';
import { existsSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { createHash } from 'node:crypto';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { resolveConfig, DEFAULT_CONFIG } from '../src/train/config.ts';
import { settingsPage } from '../src/online/settings-page.ts';
import { TRAIN_SETTINGS, settingNames, nearestName, declareCommand, defineSettings, refuseUnhonoured, settingsHelp } from '../src/train/settings.ts';
import { resolveLoss } from '../losses/index.ts';
import { exportArtifacts } from '../src/train/artifacts.ts';
import { train } from '../src/train/trainer.ts';
import { initModelFolder } from '../src/models/init.ts';
import { readManifest } from '../src/artifacts/manifest.ts';
import { benchSettings, prepareBench } from '../scripts/bench/step.ts';
import { prefzoo } from './helpers/cli.ts';

let dir: string;
beforeAll(() => {
  dir = mkdtempSync(join(tmpdir(), 'prefzoo-settings-'));
});
afterAll(() => rmSync(dir, { recursive: true, force: true }));

const message = (f: () => unknown): string => {
  try {
    f();
  } catch (e) {
    return (e as Error).message;
  }
  throw new Error('expected an error');
};

describe('the settings table', () => {
  it('train --help prints every setting as key=default with its meaning; nash-md --help only those it honours', async () => {
    const [trainHelp, nashHelp] = await Promise.all([prefzoo('train', '--help'), prefzoo('nash-md', '--help')]);
    expect(trainHelp.code).toBe(0);
    for (const [k, d] of Object.entries(TRAIN_SETTINGS)) {
      const line = trainHelp.stdout.split('\n').find((l) => l.trimStart().startsWith(`${k}=`));
      expect(line, k).toBeDefined();
      expect(line!.replace(/\s+/g, ' ')).toContain(d.doc.replace(/\s+/g, ' ').slice(0, 30));
    }
    expect(trainHelp.stdout).toContain('learning_rate=5e-6');
    const nash = settingNames('nash-md');
    for (const k of Object.keys(TRAIN_SETTINGS)) {
      expect(nashHelp.stdout.split('\n').some((l) => l.trimStart().startsWith(`${k}=`)), k).toBe(nash.includes(k));
    }
    expect(nash).not.toContain('eval_data');
  });

  it('docs/settings.md is what scripts/settings-doc.ts writes from the table', () => {
    const page = readFileSync(join(__dirname, '..', 'docs', 'settings.md'), 'utf8');
    expect(page, 'docs/settings.md is stale: run node --import tsx scripts/settings-doc.ts').toBe(settingsPage());
    for (const k of Object.keys(TRAIN_SETTINGS)) expect(page).toContain(`| \`${k}\` |`);
  });

  it('defaults come from the table', () => {
    for (const [k, d] of Object.entries(TRAIN_SETTINGS)) expect(DEFAULT_CONFIG[k as keyof typeof DEFAULT_CONFIG]).toBe(d.default);
  });

  it('an unknown key gets the nearest setting or loss parameter, in one line', () => {
    expect(message(() => resolveConfig({ params: ['learnig_rate=1e-3'] }))).toBe("unknown setting 'learnig_rate'; did you mean 'learning_rate'?");
    // Loss parameters are candidates too: of the loss given, or of any loss.
    expect(message(() => resolveConfig({ params: ['betta=0.2'], loss: 'dpo' }))).toMatch(/unknown setting 'betta'; did you mean 'beta'\?$/);
    expect(message(() => resolveConfig({ params: ['desirable_weigth=2'], loss: 'kto' }))).toMatch(/did you mean 'desirable_weight'\?$/);
    expect(message(() => resolveConfig({ params: ['lable_smoothing=0.1'] }))).toMatch(/did you mean 'label_smoothing'\?$/);
    // A setting of a command that does not honour it is suggested, then refused by name.
    expect(message(() => resolveConfig({ params: ['learnig_rate=1'], command: 'artifacts', loss: 'dpo' }))).toMatch(/did you mean 'learning_rate'\?$/);
    expect(message(() => resolveConfig({ params: ['zzzzzz=1'] }))).toBe("unknown setting 'zzzzzz'");
    expect(nearestName('max_step', ['max_steps', 'max_length'])).toBe('max_steps');
    // A key of the loss given is accepted and left for the loss.
    expect(resolveConfig({ params: ['beta=0.2'], loss: 'dpo' }).lossParams).toEqual({ beta: '0.2' });
  });

  it('range, type and choice errors name the setting and what it allows, in one line', () => {
    const cases: [string, RegExp][] = [
      ['batch_size=0', /^--param: batch_size must be an integer in \[1, 1048576\], got "0"$/],
      ['batch_size=2.5', /batch_size must be an integer/],
      ['learning_rate=-1', /^--param: learning_rate must be a number in \[0, 10\], got "-1"$/],
      ['lr_scheduler=step', /^--param: lr_scheduler must be one of constant, linear, cosine, got "step"$/],
      ['share_prompt=maybe', /^--param: share_prompt must be true or false, got "maybe"$/],
      ['max_steps=1e13', /max_steps must be an integer in \[0, 1e12\]/],
    ];
    for (const [p, re] of cases) {
      const m = message(() => resolveConfig({ params: [p] }));
      expect(m, p).toMatch(re);
      expect(m).not.toContain('\n');
    }
    const cfg = join(dir, 'bad.json');
    writeFileSync(cfg, JSON.stringify({ warmup_ratio: 2 }));
    expect(message(() => resolveConfig({ configFile: cfg }))).toBe(`${cfg}: warmup_ratio must be a number in [0, 1], got 2`);
  });

  it('declareCommand: a command with its own settings block; refuseUnhonoured names the setting and the command', () => {
    const own = defineSettings({ num_generations: { type: 'int', default: 8, min: 2, max: 1024, group: 'Sampling', trl: 'num_generations', doc: 'completions per prompt' } });
    declareCommand('test-own', { honours: ['learning_rate', 'seed'], own, lossParams: 'none' });
    const r = resolveConfig({ command: 'test-own', params: ['num_generations=4', 'seed=3'] });
    expect(r.own).toEqual({ num_generations: 4 });
    expect(r.config.seed).toBe(3);
    expect(message(() => resolveConfig({ command: 'test-own', params: ['num_generations=1'] }))).toMatch(/num_generations must be an integer in \[2, 1024\]/);
    expect(message(() => resolveConfig({ command: 'test-own', params: ['num_generation=4'] }))).toMatch(/did you mean 'num_generations'\?$/);
    expect(message(() => resolveConfig({ command: 'test-own', params: ['batch_size=2', 'max_steps=3'] }))).toBe('settings batch_size, max_steps cannot be honoured by prefzoo test-own (it honours learning_rate, seed, num_generations)');
    expect(() => refuseUnhonoured('test-own', ['seed', 'num_generations'])).not.toThrow();
    expect(settingsHelp('test-own')).toMatch(/Sampling:\n\s+num_generations=8\s+completions per prompt/);
    // A TRL YAML config maps the command's own settings by their TRL names too.
    const yaml = join(dir, 'own.yaml');
    writeFileSync(yaml, 'num_generations: 6\nlearning_rate: 1.0e-5\n');
    expect(resolveConfig({ command: 'test-own', configFile: yaml })).toMatchObject({ own: { num_generations: 6 }, config: { learning_rate: 1e-5 } });
    // The command's base (its defaults, as the demos pass) is never refused.
    expect(resolveConfig({ command: 'test-own', base: { batch_size: 2 } }).config.batch_size).toBe(2);
  });
});

describe('prefzoo artifacts honours or refuses every setting', () => {
  let model: string;
  beforeAll(() => {
    model = join(dir, 'model');
    initModelFolder(model, 'llama', 'tiny', 3);
  });

  it('a setting it cannot honour (learning_rate, eval_steps) is refused in one line naming it and the command, and leaves no folder', async () => {
    const cfg = join(dir, 'art.json');
    writeFileSync(cfg, JSON.stringify({ eval_steps: 5 }));
    const [p, c] = await Promise.all([
      prefzoo('artifacts', '--model', model, '--loss', 'dpo', '-o', join(dir, 'refused'), '--param', 'learning_rate=1e-3'),
      prefzoo('artifacts', '--model', model, '--loss', 'dpo', '-o', join(dir, 'refused2'), '--config', cfg),
    ]);
    expect(p.code).not.toBe(0);
    expect(p.stderr.trim().split('\n')).toHaveLength(1);
    expect(p.stderr).toMatch(/setting learning_rate cannot be honoured by prefzoo artifacts/);
    expect(c.code).not.toBe(0);
    expect(c.stderr).toMatch(/setting eval_steps cannot be honoured by prefzoo artifacts/);
    expect(existsSync(join(dir, 'refused'))).toBe(false);
  });

  it('gradient_checkpointing, base_dtype, ld_alpha and gradient_accumulation_steps change the artifacts (they were ignored)', () => {
    const plain = readManifest(exportArtifacts({ model, loss: 'dpo', out: join(dir, 'plain'), params: ['lora_r=4'] }).dir);
    const r = exportArtifacts({ model, loss: 'dpo', out: join(dir, 'honoured'), params: ['lora_r=4', 'base_dtype=float16', 'ld_alpha=0.5', 'gradient_accumulation_steps=2', 'gradient_checkpointing=true'] });
    const m = readManifest(r.dir);
    const frozen = (x: typeof m) => x.params.filter((p) => !p.trainable).map((p) => p.dtype);
    expect(new Set(frozen(plain))).toEqual(new Set(['float32']));
    expect(frozen(m)).toContain('float16');
    expect(plain.batchInputs.map((b) => b.name)).not.toContain('sequence_tokens');
    expect(m.batchInputs.map((b) => b.name)).toContain('sequence_tokens');
    expect(plain.training.accumulation).toBeNull();
    expect(m.training.accumulation).not.toBeNull();
    // Recomputation: the training graph differs (recomputed segments), the batch layout does not.
    const bytes = (d: string) => readFileSync(join(d, 'training_model.onnx')).length;
    const rc = exportArtifacts({ model, loss: 'dpo', out: join(dir, 'recompute'), params: ['lora_r=4', 'gradient_checkpointing=true'] });
    expect(bytes(rc.dir)).not.toBe(bytes(join(dir, 'plain')));
  });
});

describe('a TRL YAML config', () => {
  it("maps TRL's DPOConfig keys to prefzoo's, converting f_alpha_divergence_coef = 1 − f_alpha", () => {
    const file = join(dir, 'dpo.yaml');
    writeFileSync(
      file,
      [
        'model_name_or_path: ./m',
        'dataset_name: pairs.jsonl',
        'output_dir: trl-run',
        'learning_rate: 1.0e-6',
        'per_device_train_batch_size: 2',
        'num_train_epochs: 3',
        'lr_scheduler_type: cosine',
        'optim: adamw_torch',
        'truncation_mode: keep_start',
        'beta: 0.25',
        'loss_type: sigmoid',
        'f_divergence_type: alpha_divergence',
        'f_alpha_divergence_coef: 0.3',
        'rpo_alpha: null',
        'report_to: [tensorboard]',
        'bf16: false',
        'disable_dropout: true',
        'use_peft: true',
        'lora_r: 8',
        '',
      ].join('\n'),
    );
    const r = resolveConfig({ configFile: file });
    expect(r.config).toMatchObject({ learning_rate: 1e-6, batch_size: 2, num_epochs: 3, lr_scheduler: 'cosine', optimizer: 'adamw', truncation: 'keep_start', report_to: 'tensorboard', lora_r: 8, lora_alpha: 32 });
    expect(r.trl).toEqual({ model: './m', data: 'pairs.jsonl', out: 'trl-run', loss: 'dpo' });
    expect(r.lossParams.f_alpha).toBeCloseTo(0.7, 12);
    // The loss takes the mapped parameters.
    const loss = resolveLoss(r.trl!.loss!, r.lossParams);
    expect(loss.terms[0].params).toMatchObject({ beta: 0.25, f_divergence: 'alpha_divergence', rpo_alpha: 0 });
    expect(loss.terms[0].params.f_alpha as number).toBeCloseTo(0.7, 12);
    // --param still overrides the file.
    expect(resolveConfig({ configFile: file, params: ['batch_size=5'] }).config.batch_size).toBe(5);
  });

  it('a list of loss types with weights is a mixture; without use_peft the lora keys are not read (as in TRL)', () => {
    const file = join(dir, 'mix.yml');
    writeFileSync(file, 'loss_type: [sigmoid, sft]\nloss_weights: [0.8, 0.2]\nlora_r: 8\n');
    const r = resolveConfig({ configFile: file });
    expect(r.trl?.loss).toBe('dpo:0.8,sft:0.2');
    expect(r.config.lora_r).toBe(0);
  });

  it('the keys prefzoo does not honour are named together in one line', async () => {
    const file = join(dir, 'refused.yaml');
    writeFileSync(file, 'learning_rate: 1.0e-6\nbf16: true\ndeepspeed: ds.json\nlr_scheduler_type: polynomial\n');
    const m = message(() => resolveConfig({ configFile: file }));
    expect(m).toBe(`${file}: prefzoo does not honour these 3 TRL settings: bf16: true, deepspeed: "ds.json", lr_scheduler_type: "polynomial"`);
    const cli = await prefzoo('train', '--config', file, '--model', 'm', '--data', 'd', '-o', join(dir, 'never'));
    expect(cli.code).not.toBe(0);
    expect(cli.stderr.trim().split('\n')).toHaveLength(1);
    expect(cli.stderr).toContain('bf16: true, deepspeed');
  });
});

describe('one training problem', () => {
  it('train, artifacts and bench build the same artifacts from the same settings', async () => {
    // The bench's model: the tiny init-model llama with seed 0 (prepareBench builds the same in memory).
    const model = join(dir, 'bench-model');
    initModelFolder(model, 'llama', 'tiny', 0);
    const m = { loraRank: 4, gradientCheckpointing: true, baseDtype: 'float16' as const };
    const s = benchSettings(m);
    const params = ['lora_r=4', `lora_alpha=${s.lora_alpha}`, 'lora_target_modules=all-linear', 'gradient_checkpointing=true', 'base_dtype=float16'];
    const bench = prepareBench(join(dir, 'bench'), 'tiny', 2, 16, true, 'cpu', 'float32', m);
    const exported = exportArtifacts({ model, loss: 'dpo', out: join(dir, 'same-export'), params });
    const data = join(dir, 'pairs.jsonl');
    writeFileSync(data, ['a b', 'c d', 'e f'].map((p, i) => JSON.stringify({ prompt: p, chosen: ` yes ${i}`, rejected: ` no ${i}` }) + '\n').join(''));
    const run = join(dir, 'same-train');
    await train({ model, data, loss: 'dpo', out: run, params: [...params, 'max_steps=1', 'batch_size=2', 'max_length=32', 'max_prompt_length=16'] });
    const dirs = { bench: bench.artDir, artifacts: exported.dir, train: join(run, 'artifacts') };
    const view = (d: string) => {
      const x = readManifest(d);
      return { params: x.params, batchInputs: x.batchInputs, target: x.target, computeDtype: x.computeDtype, accumulation: x.training.accumulation, optimizer: x.optimizer.config, loss: x.loss?.name };
    };
    const hash = (d: string) => createHash('sha256').update(readFileSync(join(d, 'training_model.onnx'))).digest('hex');
    expect(view(dirs.artifacts)).toEqual(view(dirs.bench));
    expect(view(dirs.train)).toEqual(view(dirs.bench));
    expect(hash(dirs.artifacts)).toBe(hash(dirs.bench));
    expect(hash(dirs.train)).toBe(hash(dirs.bench));
  });
});
