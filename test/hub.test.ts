/**
 * Models and datasets by Hub name. No network reaches these machines, so the Hub is
 * scripts/hub-local-server.ts: a local server answering the routes `@huggingface/hub` calls (info
 * at a revision, the file tree, `resolve` with its redirects and X-Repo-Commit / X-Linked-Etag /
 * X-Linked-Size headers, byte ranges), reached through HF_ENDPOINT. The cache it leaves is checked
 * against the documented layout and read back with the library's own cache scanner.
 */
import { describe, it, expect, beforeAll, afterAll } from 'vitest';
import { execFile } from 'node:child_process';
import { createHash } from 'node:crypto';
import { cpSync, existsSync, lstatSync, mkdirSync, mkdtempSync, readdirSync, readFileSync, readlinkSync, rmSync, symlinkSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join, relative } from 'node:path';
import { promisify } from 'node:util';
import { scanCachedRepo } from '@huggingface/hub';
import { LocalHub, preferenceParquet, publishFixtures } from '../scripts/hub-local-server.ts';
import { resolveDataset, resolveModel, splitFiles } from '../src/hub/index.ts';
import { initModelFolder } from '../src/models/init.ts';
import { convert as convertByName, inspect as inspectByName } from '../src/index.ts';
import { renderReport } from '../src/train/report.ts';
import { loadModel } from '../src/models/load.ts';
import { initLora } from '../src/models/lora.ts';
import { saveAdapter } from '../src/models/peft.ts';
import { readExportSource } from '../src/export/source.ts';
import { exportGguf } from '../src/export/gguf.ts';
import { Normal } from '../src/random.ts';
import { reporterOf } from '../src/progress.ts';
import { BIN } from './helpers/cli.ts';

const root = mkdtempSync(join(tmpdir(), 'pz-hub-'));
const hub = new LocalHub();
let endpoint = '';
let modelCommit = '';
let dataCommit = '';

/** The environment without the caller's Hugging Face settings. */
function cleanEnv(extra: Record<string, string>): NodeJS.ProcessEnv {
  const env = { ...process.env };
  for (const k of Object.keys(env)) if (k.startsWith('HF_') || k.startsWith('HUGGINGFACE_')) delete env[k];
  return { ...env, HF_HOME: join(root, 'hf-home'), ...extra };
}

const execAsync = promisify(execFile);

/** `prefzoo ARGS` in a child process (asynchronously: the Hub server answers from this one). */
async function pz(args: string[], env: Record<string, string>): Promise<{ code: number; stdout: string; stderr: string }> {
  try {
    const r = await execAsync(process.execPath, [BIN, ...args], { env: cleanEnv(env), cwd: root, encoding: 'utf8' });
    return { code: 0, ...r };
  } catch (e) {
    const err = e as { code: number; stdout: string; stderr: string };
    return { code: err.code, stdout: err.stdout, stderr: err.stderr };
  }
}

/** A failure as the project promises one: exit 1 and one `prefzoo: …` line, no stack trace. */
function oneLine(r: { code: number; stderr: string }, pattern: RegExp): string {
  expect(r.code, r.stderr).toBe(1);
  expect(r.stderr).not.toMatch(/^\s+at /m);
  const last = r.stderr.trim().split('\n').pop()!;
  expect(last).toMatch(/^prefzoo: /);
  expect(last).toMatch(pattern);
  return last;
}

function sha256(bytes: Buffer): string {
  return createHash('sha256').update(bytes).digest('hex');
}

beforeAll(async () => {
  await publishFixtures(hub, join(root, 'fixtures'));
  modelCommit = hub.repos.get('model/tiny-org/tiny-llama')!.refs.get('main')!;
  dataCommit = hub.repos.get('dataset/tiny-org/tiny-prefs')!.refs.get('main')!;
  endpoint = await hub.start();
});
afterAll(async () => {
  await hub.stop();
  rmSync(root, { recursive: true, force: true });
});

describe('a train run by name against the local Hub', () => {
  const cache = () => join(root, 'cache-train');
  const args = (out: string) => ['train', '--model', 'tiny-org/tiny-llama', '--data', 'tiny-org/tiny-prefs', '--loss', 'dpo', '-o', out, '--param', 'max_steps=1', '--param', 'batch_size=4'];

  it('downloads once into the cache layout; a second run (TRL config keys) reads only the cache; offline, both names are found', async () => {
    const before = hub.count();
    const r1 = await pz(args('run1'), { HF_ENDPOINT: endpoint, HF_HUB_CACHE: cache() });
    expect(r1.code, r1.stderr).toBe(0);
    const fetched = hub.requests.slice(before);
    expect(fetched.length).toBeGreaterThan(0);
    // Each blob crossed the wire once, from the route the Hub's resolve redirected to.
    const bodies = fetched.filter((q) => q.url.startsWith('/cdn-lfs/') && q.range !== 'bytes=0-0').map((q) => q.url);
    expect(bodies.length).toBe(3); // model.safetensors, tokenizer.json (LFS: over 10 kB), the train split's Parquet
    expect(new Set(bodies).size).toBe(bodies.length);
    expect(fetched.some((q) => q.url.includes('/data/test-'))).toBe(false); // only the split asked for
    const cfg = JSON.parse(readFileSync(join(root, 'run1', 'config.json'), 'utf8'));
    expect(cfg.hub.model).toMatchObject({ repo: 'tiny-org/tiny-llama', type: 'model', revision: 'main', commit: modelCommit, from: 'download' });
    expect(cfg.hub.data).toMatchObject({ repo: 'tiny-org/tiny-prefs', type: 'dataset', revision: 'main', commit: dataCommit, split: 'train', files: ['data/train-00000-of-00001.parquet'] });

    // The layout huggingface_hub writes: refs/main → commit; snapshot files are relative links into blobs/.
    const repoDir = join(cache(), 'models--tiny-org--tiny-llama');
    expect(readFileSync(join(repoDir, 'refs', 'main'), 'utf8')).toBe(modelCommit);
    const snap = join(repoDir, 'snapshots', modelCommit);
    for (const f of ['config.json', 'model.safetensors', 'tokenizer.json']) {
      expect(lstatSync(join(snap, f)).isSymbolicLink()).toBe(true);
      expect(readlinkSync(join(snap, f))).toMatch(/^\.\.\/\.\.\/blobs\/[0-9a-f]{40,64}$/);
    }
    const published = hub.repos.get('model/tiny-org/tiny-llama')!.commits.get(modelCommit)!.get('model.safetensors')!;
    expect(readlinkSync(join(snap, 'model.safetensors'))).toBe(`../../blobs/${sha256(published.bytes)}`);
    expect(readFileSync(join(snap, 'model.safetensors')).equals(published.bytes)).toBe(true);
    expect(readdirSync(join(repoDir, 'blobs')).filter((f) => f.endsWith('.incomplete'))).toEqual([]);
    // The library's own cache scanner reads it as one revision named by main.
    const scanned = await scanCachedRepo(repoDir);
    expect(scanned.revisions.map((r) => [r.commitOid, r.refs])).toEqual([[modelCommit, ['main']]]);
    expect(scanned.revisions[0].files.map((f) => f.path.slice(snap.length + 1)).sort()).toEqual(cfg.hub.model.files);
    const dataLink = readlinkSync(join(cache(), 'datasets--tiny-org--tiny-prefs', 'snapshots', dataCommit, 'data', 'train-00000-of-00001.parquet'));
    expect(dataLink).toMatch(/^\.\.\/\.\.\/\.\.\/blobs\/[0-9a-f]{64}$/);

    // Second run: the names come from a TRL config; the server sees no request.
    writeFileSync(join(root, 'dpo.yaml'), 'model_name_or_path: tiny-org/tiny-llama\ndataset_name: tiny-org/tiny-prefs\ndataset_train_split: train\noutput_dir: run2\nmax_steps: 1\nper_device_train_batch_size: 4\n');
    const seen = hub.count();
    const r2 = await pz(['train', '--config', 'dpo.yaml'], { HF_ENDPOINT: endpoint, HF_HUB_CACHE: cache() });
    expect(r2.code, r2.stderr).toBe(0);
    expect(hub.count()).toBe(seen);
    expect(JSON.parse(readFileSync(join(root, 'run2', 'config.json'), 'utf8')).hub.model).toMatchObject({ commit: modelCommit, from: 'cache' });

    // Offline (--offline, and HF_HUB_OFFLINE=1 with nothing listening at the endpoint): both names are found.
    const offline = { env: { HF_ENDPOINT: 'http://127.0.0.1:9', HF_HUB_CACHE: cache(), HF_HUB_OFFLINE: '1' } };
    expect((await resolveModel('tiny-org/tiny-llama', 'model', offline)).hub).toMatchObject({ commit: modelCommit, from: 'cache' });
    expect((await resolveDataset('tiny-org/tiny-prefs', offline)).hub).toMatchObject({ commit: dataCommit, from: 'cache' });
    const r4 = await pz(['convert', 'tiny-org/tiny-prefs', '-o', 'd.parquet', '--offline'], { HF_ENDPOINT: endpoint, HF_HUB_CACHE: cache() });
    expect(r4.code, r4.stderr).toBe(0);
    expect(r4.stdout).toMatch(/rows: read 24, written 24, skipped 0/);
    expect(hub.count()).toBe(seen);
    // The report shows which snapshot the run used.
    const html = renderReport(join(root, 'run1'));
    expect(html).toMatch(new RegExp(`<h2>Hub snapshots</h2>[\\s\\S]*tiny-org/tiny-llama@main</td><td><code>${modelCommit}</code>[\\s\\S]*tiny-org/tiny-prefs@main</td><td><code>${dataCommit}</code>`));
  }, 240_000);

  it('a missing repo and a missing file each give one line; private, gated, unknown revision and no weights are named', async () => {
    const env = { HF_ENDPOINT: endpoint, HF_HUB_CACHE: join(root, 'cache-errors') };
    const t = ['--data', 'tiny-org/tiny-prefs', '--loss', 'dpo', '-o', 'run-x'];
    oneLine(await pz(['train', '--model', 'tiny-org/no-such-model', ...t], env), /model tiny-org\/no-such-model: no such folder here, and the Hub answered 401 without a token .*HF_TOKEN/);
    oneLine(await pz(['train', '--model', 'tiny-org/tiny-llama', ...t], { ...env, HF_HUB_OFFLINE: '1' }), /model tiny-org\/tiny-llama: config\.json is not in the Hugging Face cache .*HF_HUB_OFFLINE=1/);
    // The same errors without a process each: UserErrors whose message is the line the CLI prints.
    const fails = (spec: string, extra: Record<string, string> = {}) =>
      resolveModel(spec, 'model', { env: { ...env, ...extra } }).then(
        () => 'resolved',
        (e: Error) => `${e.name}: ${e.message}`,
      );
    expect(await fails('tiny-org/private-llama')).toMatch(/^UserError: .*answered 401 .*set HF_TOKEN/);
    expect(await fails('tiny-org/private-llama', { HF_TOKEN: 'hf_not_the_token' })).toMatch(/^UserError: .*HF_TOKEN cannot read it \(the Hub answered 401/);
    expect(await fails('tiny-org/gated-llama')).toMatch(/^UserError: model tiny-org\/gated-llama is gated: accept its licence on http:\/\/127\.0\.0\.1:\d+\/tiny-org\/gated-llama/);
    expect(await fails('tiny-org/tiny-llama@v2')).toMatch(/^UserError: .*has no revision "v2"/);
    hub.publish('model', 'tiny-org/no-weights', { 'config.json': '{"model_type":"llama"}', 'tokenizer.json': '{}', 'pytorch_model.bin': Buffer.alloc(16) });
    expect(await fails('tiny-org/no-weights')).toMatch(/^UserError: .*has no model\.safetensors .*PyTorch \.bin weights only/);
    expect(await resolveDataset('tiny-org/tiny-prefs', { split: 'validation', env }).catch((e: Error) => e.message)).toMatch(/no data files for the validation split/);
    // With the token, the private repo is read.
    const r = await resolveModel('tiny-org/private-llama', 'model', { env: { ...env, HF_TOKEN: hub.token } });
    expect(r.hub?.from).toBe('download');
    expect(existsSync(join(r.path, 'model.safetensors'))).toBe(true);
  }, 120_000);
});

describe('the library takes names too', () => {
  it('convert and inspect a split by name, through HF_ENDPOINT and HF_HUB_CACHE', async () => {
    const saved = { HF_ENDPOINT: process.env.HF_ENDPOINT, HF_HUB_CACHE: process.env.HF_HUB_CACHE };
    process.env.HF_ENDPOINT = endpoint;
    process.env.HF_HUB_CACHE = join(root, 'cache-library');
    try {
      const s = await convertByName('tiny-org/tiny-prefs', join(root, 'lib-test.parquet'), { split: 'test' });
      expect([s.read, s.written, s.kind]).toEqual([8, 8, 'pairwise']);
      const seen = hub.count();
      const r = await inspectByName('tiny-org/tiny-prefs', { split: 'test', offline: true });
      expect(r.rows).toBe(8);
      expect(hub.count()).toBe(seen);
    } finally {
      for (const [k, v] of Object.entries(saved)) if (v === undefined) delete process.env[k];
      else process.env[k] = v;
    }
  });
});

describe('a LoRA adapter repo naming its base by Hub name', () => {
  it('export --model ADAPTER-REPO merges it into the base it names: the same GGUF as the local folders', async () => {
    const base = join(root, 'fixtures', 'tiny-llama');
    const { config } = loadModel(base);
    const lora = { rank: 4, alpha: 8, targets: ['q_proj', 'v_proj'] };
    const w = initLora(config, lora, 3);
    const rng = new Normal(11);
    for (const [k, t] of w) if (k.includes('lora_B')) t.data.set(rng.fill(t.data.length, 0.2));
    const adapterDir = join(root, 'tiny-adapter');
    saveAdapter(adapterDir, w, { config, lora, baseModel: base });
    const cfg = JSON.parse(readFileSync(join(adapterDir, 'adapter_config.json'), 'utf8'));
    const commit = hub.publish('model', 'tiny-org/tiny-adapter', { 'adapter_config.json': JSON.stringify({ ...cfg, base_model_name_or_path: 'tiny-org/tiny-llama' }), 'adapter_model.safetensors': readFileSync(join(adapterDir, 'adapter_model.safetensors')) });
    // GGUF's general.name is the adapter folder's name: the snapshot's is the commit.
    const named = join(root, 'local-adapter', commit);
    cpSync(adapterDir, named, { recursive: true });
    exportGguf(readExportSource(base, named), join(root, 'local.gguf'), 'f32');
    const cache = join(root, 'cache-adapter');
    const r = await pz(['export', '--model', 'tiny-org/tiny-adapter', '--format', 'gguf', '-o', 'hub.gguf'], { HF_ENDPOINT: endpoint, HF_HUB_CACHE: cache });
    expect(r.code, r.stderr).toBe(0);
    expect(r.stderr).toMatch(/--model tiny-org\/tiny-adapter → .*models--tiny-org--tiny-adapter\/snapshots\//);
    expect(r.stderr).toMatch(/base_model_name_or_path tiny-org\/tiny-llama → .*models--tiny-org--tiny-llama\/snapshots\//);
    expect(readFileSync(join(root, 'hub.gguf')).equals(readFileSync(join(root, 'local.gguf')))).toBe(true);
    // train --adapter takes the repo as the adapter to continue.
    const a = await resolveModel('tiny-org/tiny-adapter', 'adapter', { env: { HF_ENDPOINT: endpoint, HF_HUB_CACHE: cache, HF_HUB_OFFLINE: '1' } });
    expect(a.adapter).toBe(true);
    expect(readdirSync(a.path).sort()).toEqual(['adapter_config.json', 'adapter_model.safetensors']);
  }, 120_000);
});

describe('downloads resume', () => {
  const published = () => hub.repos.get('model/tiny-org/tiny-llama')!.commits.get(modelCommit)!.get('model.safetensors')!.bytes;

  it('a connection cut mid-file resumes with a Range request; the blob is whole', async () => {
    const cache = join(root, 'cache-cut');
    hub.dropOnce = { path: 'model.safetensors', afterBytes: 200_000 };
    const before = hub.count();
    const notes: string[] = [];
    const bars: { label: string; total: number; values: number[]; fields: Record<string, string | number>[]; stopped: boolean }[] = [];
    const progress = (label: string, total: number) => {
      const bar = { label, total, values: [] as number[], fields: [] as Record<string, string | number>[], stopped: false };
      bars.push(bar);
      return { update: (v: number, f: Record<string, string | number> = {}) => void (bar.values.push(v), bar.fields.push(f)), stop: () => void (bar.stopped = true) };
    };
    const r = await resolveModel('tiny-org/tiny-llama', 'model', { env: { HF_ENDPOINT: endpoint, HF_HUB_CACHE: cache }, reporter: reporterOf({ info: (l) => notes.push(l), progress }) });
    // One bar in bytes over the files fetched, rising to its total across the cut, with the rate.
    const files = hub.repos.get('model/tiny-org/tiny-llama')!.commits.get(modelCommit)!;
    const fetchedBytes = r.hub!.files.reduce((n, f) => n + files.get(f)!.bytes.length, 0);
    expect(bars.map((b) => [b.label, b.total, b.stopped])).toEqual([['download tiny-org/tiny-llama', fetchedBytes, true]]);
    expect(bars[0].values.at(-1)).toBe(fetchedBytes);
    expect(bars[0].values.every((v, i) => v <= fetchedBytes && (i === 0 || v >= bars[0].values[i - 1]))).toBe(true);
    expect(bars[0].fields.at(-1)).toMatchObject({ file: 'model.safetensors', MB: `${(fetchedBytes / 1e6).toFixed(2)}/${(fetchedBytes / 1e6).toFixed(2)}` });
    expect(Number(bars[0].fields.at(-1)!['MB/s'])).toBeGreaterThan(0);
    expect(hub.dropOnce).toBeUndefined();
    const ranges = hub.requests.slice(before).filter((q) => q.url.startsWith('/cdn-lfs/') && q.range && q.range !== 'bytes=0-0');
    expect(ranges.length).toBe(1);
    const start = Number(/^bytes=(\d+)-/.exec(ranges[0].range!)![1]);
    expect(start).toBeGreaterThan(0);
    expect(start).toBeLessThanOrEqual(200_000);
    expect(notes.join('\n')).toMatch(/connection cut at byte \d+ of \d+ .*resuming/);
    expect(readFileSync(join(r.path, 'model.safetensors')).equals(published())).toBe(true);
  });

  it('an .incomplete blob left by an earlier run is continued from its length', async () => {
    const cache = join(root, 'cache-partial');
    const bytes = published();
    const blobs = join(cache, 'models--tiny-org--tiny-llama', 'blobs');
    mkdirSync(blobs, { recursive: true });
    writeFileSync(join(blobs, `${sha256(bytes)}.incomplete`), bytes.subarray(0, 1000));
    const before = hub.count();
    const r = await resolveModel('tiny-org/tiny-llama', 'model', { env: { HF_ENDPOINT: endpoint, HF_HUB_CACHE: cache } });
    const ranges = hub.requests.slice(before).filter((q) => q.url.startsWith(`/cdn-lfs/${sha256(bytes)}`) && q.range !== 'bytes=0-0');
    expect(ranges.map((q) => q.range)).toEqual([`bytes=1000-${bytes.length - 1}`]);
    expect(readFileSync(join(r.path, 'model.safetensors')).equals(bytes)).toBe(true);
    expect(existsSync(join(blobs, `${sha256(bytes)}.incomplete`))).toBe(false);
  });
});

describe('a cache laid out by the documented rules is found by name', () => {
  it('models--ORG--NAME with refs/main, snapshots/<sha>/ of relative links into blobs/, a commit revision, and datasets', async () => {
    const cache = join(root, 'cache-by-hand');
    const src = join(root, 'by-hand-model');
    initModelFolder(src, 'llama', 'tiny', 3);
    const commit = 'c0ffee'.padEnd(40, '0');
    const repoDir = join(cache, 'models--someone--hand-made');
    const snap = join(repoDir, 'snapshots', commit);
    mkdirSync(join(repoDir, 'blobs'), { recursive: true });
    mkdirSync(snap, { recursive: true });
    for (const f of readdirSync(src)) {
      const bytes = readFileSync(join(src, f));
      const etag = f.endsWith('.safetensors') ? sha256(bytes) : createHash('sha1').update(`blob ${bytes.length}\0`).update(bytes).digest('hex');
      writeFileSync(join(repoDir, 'blobs', etag), bytes);
      symlinkSync(relative(snap, join(repoDir, 'blobs', etag)), join(snap, f));
    }
    mkdirSync(join(repoDir, 'refs'));
    writeFileSync(join(repoDir, 'refs', 'main'), commit);
    // Nothing listens on the endpoint: any request would fail.
    const env = { HF_HUB_CACHE: cache, HF_ENDPOINT: 'http://127.0.0.1:9' };
    const r = await resolveModel('someone/hand-made', 'model', { env });
    expect(r.path).toBe(snap);
    expect(r.hub).toMatchObject({ repo: 'someone/hand-made', revision: 'main', commit, from: 'cache' });
    expect((await resolveModel(`someone/hand-made@${commit}`, 'model', { env })).path).toBe(snap);
    // HF_HOME/hub is the cache when HF_HUB_CACHE is not set.
    expect((await resolveModel('someone/hand-made', 'config', { env: { HF_HOME: join(root, 'home'), HF_HUB_OFFLINE: '1' } }).catch((e: Error) => e.message)) as string).toMatch(new RegExp(`${join(root, 'home', 'hub', 'models--someone--hand-made')} has no refs/main`));

    // A dataset split of two shards; one missing is named offline.
    const dcommit = 'da7a'.padEnd(40, '1');
    const dsnap = join(cache, 'datasets--someone--prefs', 'snapshots', dcommit, 'data');
    mkdirSync(dsnap, { recursive: true });
    mkdirSync(join(cache, 'datasets--someone--prefs', 'refs'));
    writeFileSync(join(cache, 'datasets--someone--prefs', 'refs', 'main'), dcommit);
    writeFileSync(join(dsnap, 'train-00000-of-00002.parquet'), await preferenceParquet(6));
    const gap = await resolveDataset('someone/prefs', { env: { ...env, HF_HUB_OFFLINE: '1' } }).catch((e: Error) => e.message);
    expect(gap).toMatch(/lacks data\/train-00001-of-00002\.parquet/);
    writeFileSync(join(dsnap, 'train-00001-of-00002.parquet'), await preferenceParquet(6, 1));
    const d = await resolveDataset('someone/prefs', { env });
    expect(d.spec).toBe(join(dsnap, 'train-0000*-of-00002.parquet'));
    expect(d.files.map((f) => f.slice(dsnap.length + 1))).toEqual(['train-00000-of-00002.parquet', 'train-00001-of-00002.parquet']);
  });
});

describe('dataset splits by the layouts of the Hub', () => {
  it('finds a split and subset among data/, named files, split folders and the Parquet conversion', () => {
    const files = ['README.md', 'data/train-00000-of-00002.parquet', 'data/train-00001-of-00002.parquet', 'data/test-00000-of-00001.parquet', 'data/train_extra.txt', 'other/train-00000-of-00001.parquet'];
    expect(splitFiles(files, 'train')).toEqual(['data/train-00000-of-00002.parquet', 'data/train-00001-of-00002.parquet']);
    expect(splitFiles(files, 'test')).toEqual(['data/test-00000-of-00001.parquet']);
    expect(splitFiles(files, 'validation')).toEqual([]);
    expect(splitFiles(files, 'train', 'other')).toEqual(['other/train-00000-of-00001.parquet']);
    expect(splitFiles(['train.jsonl', 'test.jsonl'], 'train')).toEqual(['train.jsonl']);
    expect(splitFiles(['default/train/0000.parquet', 'default/train/0001.parquet', 'default/test/0000.parquet'], 'train')).toEqual(['default/train/0000.parquet', 'default/train/0001.parquet']);
    expect(splitFiles(['en/train/0000.parquet', 'fr/train/0000.parquet'], 'train', 'fr')).toEqual(['fr/train/0000.parquet']);
    expect(splitFiles(['default/prefs-train.parquet', 'default/prefs-test.parquet'], 'train')).toEqual(['default/prefs-train.parquet']);
    // A split holding Parquet and JSON takes the Parquet.
    expect(splitFiles(['data/train.jsonl', 'data/train-00000-of-00001.parquet'], 'train')).toEqual(['data/train-00000-of-00001.parquet']);
  });

  it("takes the Hub's Parquet conversion (refs/convert/parquet) when the repo's own files hold none", async () => {
    const rows = await preferenceParquet(5);
    hub.publish('dataset', 'tiny-org/script-only', { 'README.md': '# a dataset built by a script', 'script_only.py': 'print(1)\n' });
    const conv = hub.publish('dataset', 'tiny-org/script-only', { 'default/train/0000.parquet': rows }, { revision: 'refs/convert/parquet' });
    const cache = join(root, 'cache-conv');
    const d = await resolveDataset('tiny-org/script-only', { env: { HF_ENDPOINT: endpoint, HF_HUB_CACHE: cache } });
    expect(d.hub).toMatchObject({ revision: 'refs/convert/parquet', commit: conv, files: ['default/train/0000.parquet'], from: 'download' });
    // refs/ + the revision, as huggingface_hub writes it.
    expect(readFileSync(join(cache, 'datasets--tiny-org--script-only', 'refs', 'refs', 'convert', 'parquet'), 'utf8')).toBe(conv);
    expect(readFileSync(d.files[0]).equals(rows)).toBe(true);
    // And offline, from the cache.
    const again = await resolveDataset('tiny-org/script-only', { env: { HF_ENDPOINT: endpoint, HF_HUB_CACHE: cache, HF_HUB_OFFLINE: '1' } });
    expect(again.hub).toMatchObject({ revision: 'refs/convert/parquet', from: 'cache' });
  });
});
