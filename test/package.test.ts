/**
 * The package as a user gets it: `npm pack`, the tarball installed into a new project with the
 * README's line (from the npm cache: no network), imported from an .mjs file, the examples
 * typechecked against the shipped .d.ts and run (convert → train 2 steps → evaluate), and `--help` of
 * every command from the compiled bin. Then the library's own promises from the sources: an
 * AbortSignal stops a run, a missing GPU adapter is one line and a DeviceUnavailableError.
 */
import { execFile, spawnSync, type SpawnSyncReturns } from 'node:child_process';
import { promisify } from 'node:util';
import { cpSync, existsSync, mkdirSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join, resolve } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { COMMANDS } from '../src/cli/commands/index.ts';
import { AbortedError, BadInputError, DeviceUnavailableError, UserError, convert, evaluate, initModel, train } from '../src/index.ts';
import { BIN } from './helpers/cli.ts';

const execFileAsync = promisify(execFile);
const repo = resolve(__dirname, '..');
const tsc = join(repo, 'node_modules', 'typescript', 'bin', 'tsc');
/** What the README's install line sets; npm's own notices aside, nothing else is needed. */
const INSTALL_ENV = { ...process.env, ONNXRUNTIME_NODE_INSTALL: 'skip' };

function sh(cmd: string, args: string[], o: { cwd: string; env?: NodeJS.ProcessEnv }): SpawnSyncReturns<string> {
  const r = spawnSync(cmd, args, { cwd: o.cwd, env: o.env ?? process.env, encoding: 'utf8', maxBuffer: 64 << 20 });
  if (r.status !== 0) throw new Error(`${cmd} ${args.join(' ')} exited ${r.status}:\n${r.stdout}\n${r.stderr}`);
  return r;
}

describe('the npm package', () => {
  let packed: { filename: string; files: { path: string }[] };
  let work = '';
  let app = '';

  beforeAll(() => {
    work = mkdtempSync(join(tmpdir(), 'prefzoo-package-'));
    app = join(work, 'app');
    // prepack (`npm run build`) would build dist/ again: test/global-setup.ts has just built it with the
    // same script from the current sources (the first test checks that prepack is that script), so the
    // pack skips it. The tarball lands outside the repo.
    const r = sh('npm', ['pack', '--json', '--ignore-scripts', '--pack-destination', work], { cwd: repo });
    packed = JSON.parse(r.stdout.slice(r.stdout.indexOf('[')))[0];
    mkdirSync(app);
    // As `npm init -y` writes it (CommonJS by default): the examples are .mts, ES modules either way.
    writeFileSync(join(app, 'package.json'), JSON.stringify({ name: 'app', version: '1.0.0', private: true }));
    sh('npm', ['install', join(work, packed.filename), '--prefer-offline', '--no-audit', '--no-fund'], { cwd: app, env: INSTALL_ENV });
  }, 600_000);

  afterAll(() => rmSync(work, { recursive: true, force: true }));

  it('ships the compiled library, its types and the bin, and no tests, CI, scripts or sources', () => {
    // `npm pack` builds dist/ through prepack with the script test/global-setup.ts runs before the tests.
    const pkg = JSON.parse(readFileSync(join(repo, 'package.json'), 'utf8')) as { scripts: Record<string, string> };
    expect(pkg.scripts.prepack).toBe('npm run build');
    expect(pkg.scripts.build).toBe('node scripts/build.mjs');
    expect(readFileSync(join(repo, 'test', 'global-setup.ts'), 'utf8')).toContain("join(root, 'scripts', 'build.mjs')");
    const files = packed.files.map((f) => f.path);
    for (const f of ['package.json', 'bin/prefzoo.mjs', 'dist/src/index.js', 'dist/src/index.d.ts', 'dist/src/cli/main.js', 'dist/datasets/parquet-reader.mjs', 'dist/datasets/parquet-worker.mjs', 'dist/src/runtime/placement-probe.mjs']) {
      expect(files).toContain(f);
    }
    const stray = files.filter((f) => /^(test|\.ci|scripts|src|datasets|losses|examples|docs|tmp|node_modules)\//.test(f) || /fixtures|\.test\.|\.installed|tsbuildinfo/.test(f));
    expect(stray).toEqual([]);
    expect(existsSync(join(app, 'node_modules', 'prefzoo', 'src'))).toBe(false);
  });

  it('imports from an .mjs file: the API functions and error classes', () => {
    writeFileSync(join(app, 'keys.mjs'), "import * as p from 'prefzoo';\nconsole.log(JSON.stringify(Object.fromEntries(Object.entries(p).map(([k, v]) => [k, typeof v]))));\n");
    const api = JSON.parse(sh(process.execPath, ['keys.mjs'], { cwd: app }).stdout) as Record<string, string>;
    for (const f of ['convert', 'inspect', 'tokenize', 'train', 'evaluate', 'generate', 'initModel', 'sppo', 'nashMd', 'rewardTrain', 'exportModel', 'listLosses', 'getLoss', 'resolveLoss', 'parseLossSpec']) {
      expect(api[f], f).toBe('function');
    }
    for (const c of ['UserError', 'BadInputError', 'DamagedFileError', 'DeviceUnavailableError', 'AbortedError']) expect(api[c], c).toBe('function');
  });

  it('typechecks the examples (and a wrong option type as an error) against the shipped .d.ts, and runs convert → train (2 steps) → evaluate', () => {
    cpSync(join(repo, 'examples'), join(app, 'examples'), { recursive: true, filter: (f) => !f.endsWith('README.md') });
    // A consumer without a mistake compiles; one with a wrong type (a number for the model folder) must not.
    writeFileSync(join(app, 'examples', 'wrong.mts'), "import { train } from 'prefzoo';\n// @ts-expect-error model is a folder name\nawait train({ model: 1, data: 'd', loss: 'dpo', out: 'o' });\n");
    const tsconfig = {
      compilerOptions: { target: 'ES2022', module: 'NodeNext', moduleResolution: 'NodeNext', strict: true, skipLibCheck: false, outDir: 'out', types: ['node'], typeRoots: [join(repo, 'node_modules', '@types')] },
      include: ['examples'],
    };
    writeFileSync(join(app, 'tsconfig.json'), JSON.stringify(tsconfig));
    // The @ts-expect-error above is itself an error if the option types were loose (unused directive).
    sh(process.execPath, [tsc, '-p', '.'], { cwd: app });

    const r = sh(process.execPath, [join('out', 'convert-train-evaluate.mjs'), join(work, 'run')], { cwd: app, env: { ...process.env, STEPS: '2' } });
    expect(r.stdout).toMatch(/^converted 64 pairwise rows/m);
    expect(r.stdout).toMatch(/^trained 2 steps in/m);
    expect(r.stdout).toMatch(/^accuracy [01]\.\d{3}, margin -?\d+\.\d{4} over 64 pairs$/m);
    expect(existsSync(join(work, 'run', 'run', 'final', 'model.safetensors'))).toBe(true);
  });

  it('--help of the program and of every command runs from the compiled bin', async () => {
    const bin = join(app, 'node_modules', '.bin', 'prefzoo');
    const top = sh(bin, ['--help'], { cwd: app }).stdout;
    for (const c of COMMANDS) expect(top).toContain(`  ${c.name} `);
    // Four at a time: each loads its command's modules (ONNX Runtime, Arrow) as a user's call would.
    const queue = [...COMMANDS];
    const helps = new Map<string, string>();
    await Promise.all(
      Array.from({ length: 4 }, async () => {
        for (let c = queue.shift(); c; c = queue.shift()) helps.set(c.name, (await execFileAsync(bin, [c.name, '--help'], { cwd: app })).stdout);
      }),
    );
    for (const c of COMMANDS) expect(helps.get(c.name)!.startsWith(`Usage: prefzoo ${c.name} `), c.name).toBe(true);
  });
});

describe('the library from the sources', () => {
  const dir = mkdtempSync(join(tmpdir(), 'prefzoo-api-'));
  afterAll(() => rmSync(dir, { recursive: true, force: true }));

  it('an AbortSignal stops training at the next step, as an AbortedError, with no final model', async () => {
    initModel({ output: join(dir, 'm') });
    const rows = Array.from({ length: 16 }, (_, i) => JSON.stringify({ prompt: `${i}:`, chosen: String(i % 10), rejected: String((i + 1) % 10) }));
    writeFileSync(join(dir, 'p.jsonl'), rows.join('\n') + '\n');
    await convert(join(dir, 'p.jsonl'), join(dir, 'p.parquet'));
    const ac = new AbortController();
    const seen: string[] = [];
    const run = train({
      model: join(dir, 'm'),
      data: join(dir, 'p.parquet'),
      loss: 'dpo',
      out: join(dir, 'run'),
      settings: { max_steps: 50, batch_size: 2, max_length: 16, max_prompt_length: 8, save_steps: 0 },
      signal: ac.signal,
      progress: (label) => ({
        update(value) {
          seen.push(`${label} ${value}`);
          if (label === 'train' && value >= 1) ac.abort();
        },
        stop() {},
      }),
    });
    await expect(run).rejects.toBeInstanceOf(AbortedError);
    await expect(run).rejects.toBeInstanceOf(UserError);
    expect(seen).toContain('train 1');
    expect(seen.filter((s) => s.startsWith('train ')).length).toBe(1);
    expect(existsSync(join(dir, 'run', 'final'))).toBe(false);
    // Aborted before it starts: refused at once.
    await expect(evaluate({ model: join(dir, 'm'), ref: join(dir, 'm'), data: join(dir, 'p.parquet'), signal: AbortSignal.abort() })).rejects.toBeInstanceOf(AbortedError);
  });

  it('a bad setting, loss parameter or record is a BadInputError naming the setting, or the file and line', async () => {
    const base = { model: join(dir, 'm'), data: join(dir, 'p.parquet'), loss: 'dpo', out: join(dir, 'bad') };
    const range = await train({ ...base, settings: { max_steps: -3 } }).catch((e: unknown) => e);
    expect(range).toBeInstanceOf(BadInputError);
    expect((range as BadInputError).setting).toBe('max_steps');
    const typo = await train({ ...base, settings: { learning_rat: 1e-4 } }).catch((e: unknown) => e);
    expect((typo as BadInputError).setting).toBe('learning_rat');
    expect((typo as Error).message).toContain("did you mean 'learning_rate'?");
    const beta = await train({ ...base, settings: { beta: -1 } }).catch((e: unknown) => e);
    expect(beta).toBeInstanceOf(BadInputError);
    expect((beta as BadInputError).setting).toBe('beta');
    writeFileSync(join(dir, 'broken.jsonl'), `${JSON.stringify({ prompt: 'a', chosen: 'b', rejected: 'c' })}\n{"prompt": "a", "chosen": \n`);
    const record = await convert(join(dir, 'broken.jsonl'), join(dir, 'broken.parquet')).catch((e: unknown) => e);
    expect(record).toMatchObject({ kind: 'bad-input', file: join(dir, 'broken.jsonl'), line: 2 });
    expect(existsSync(join(dir, 'bad'))).toBe(false);
  });

  it('a broken Vulkan setup: the command prints one line, nothing native before it; the API throws DeviceUnavailableError', async () => {
    const env = { ...process.env, VK_ICD_FILENAMES: join(dir, 'missing_icd.json') };
    const r = spawnSync(process.execPath, [BIN, 'eval', '--model', join(dir, 'm'), '--ref', join(dir, 'm'), '--data', join(dir, 'p.parquet'), '--device', 'webgpu', '--quiet'], { cwd: dir, env, encoding: 'utf8' });
    expect(r.status).toBe(1);
    expect(r.stderr.split('\n').filter((l) => l !== '')).toEqual([expect.stringMatching(/^prefzoo: execution provider "webgpu" found no usable GPU adapter/)]);
    // In this process: the adapter search runs in a child whose environment says the same.
    const saved = process.env.VK_ICD_FILENAMES;
    process.env.VK_ICD_FILENAMES = env.VK_ICD_FILENAMES;
    try {
      const e = await evaluate({ model: join(dir, 'm'), ref: join(dir, 'm'), data: join(dir, 'p.parquet'), runtime: { ep: 'webgpu' } }).catch((x: unknown) => x);
      expect(e).toBeInstanceOf(DeviceUnavailableError);
      expect((e as DeviceUnavailableError).device).toBe('webgpu');
      expect((e as DeviceUnavailableError).setting).toBe('device');
    } finally {
      if (saved === undefined) delete process.env.VK_ICD_FILENAMES;
      else process.env.VK_ICD_FILENAMES = saved;
    }
  });
});
