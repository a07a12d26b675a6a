/**
 * Names to folders: `ORG/NAME[@revision]` becomes a snapshot folder of the shared Hugging Face cache,
 * in this order: an existing local path is used as it is; else the cache (refs/<revision> →
 * snapshots/<commit>/, with every file the command needs); else a download of those files only
 * (never with HF_HUB_OFFLINE=1 or --offline). What was resolved is returned as a {@link HubSnapshot}
 * for the run's config.json.
 */
import { existsSync, readFileSync } from 'node:fs';
import { dirname, join } from 'node:path';
import { UserError } from '../errors.ts';
import { SILENT, type Reporter } from '../progress.ts';
import { CachedRepo, hubCacheDir, type RepoType } from './cache.ts';
import { DEFAULT_ENDPOINT, HubRepo, offlineFromEnv, tokenFromEnv, type HubContext, type TreeFile } from './client.ts';

/** How a name is resolved; everything else comes from the environment (HF_ENDPOINT, HF_TOKEN, HF_HUB_CACHE, HF_HUB_OFFLINE). */
export interface HubOptions {
  /** A branch, tag or commit (default main; `NAME@revision` gives it too). */
  revision?: string;
  /** Only the cache, as HF_HUB_OFFLINE=1. */
  offline?: boolean;
  /** A download's byte count; notes on a resumed download or a cut connection (default: none). */
  reporter?: Reporter;
  /** The environment to read (default process.env). */
  env?: NodeJS.ProcessEnv;
}

/** What a name resolved to: written into a run's config.json and shown by `prefzoo report`. */
export interface HubSnapshot {
  repo: string;
  type: RepoType;
  /** The revision asked for (main unless given). */
  revision: string;
  /** The commit it pointed to. */
  commit: string;
  /** The snapshot folder (for a dataset, the files' glob in it). */
  path: string;
  /** The repo's files used, relative to the snapshot. */
  files: string[];
  /** Found in the cache, or downloaded now. */
  from: 'cache' | 'download';
  split?: string;
  subset?: string;
}

export function hubContext(o: HubOptions = {}): HubContext {
  const env = o.env ?? process.env;
  return {
    endpoint: (env.HF_ENDPOINT || DEFAULT_ENDPOINT).replace(/\/+$/, ''),
    token: tokenFromEnv(env),
    offline: o.offline === true || offlineFromEnv(env),
    cacheDir: hubCacheDir(env),
    reporter: o.reporter ?? SILENT,
  };
}

const NAME = /^[A-Za-z0-9][\w.-]*\/[A-Za-z0-9][\w.-]*(@[^\s@]+)?$/;

/** A file's extension: such a name is a local file that is missing (`runs/config.json`), not a repo. */
const FILE_EXT = /\.(parquet|jsonl|json|csv|tsv|arrow|gz|safetensors|ya?ml|txt|jinja)$/i;

/** Whether `spec` names a Hub repo: not an existing path, of the form ORG/NAME[@revision], not ending in a file's extension. */
export function isHubName(spec: string): boolean {
  if (existsSync(spec) || !NAME.test(spec)) return false;
  return !FILE_EXT.test(spec.replace(/@[^@]*$/, ''));
}

/** `ORG/NAME@rev` → repo and revision; `--revision` must agree with an `@rev`. */
export function parseName(spec: string, revision?: string): { repo: string; revision: string } {
  const at = spec.indexOf('@');
  const repo = at < 0 ? spec : spec.slice(0, at);
  const named = at < 0 ? undefined : spec.slice(at + 1);
  if (named !== undefined && revision !== undefined && named !== revision) throw new UserError(`${spec}: names revision ${named} and --revision says ${revision}; give one`, { setting: 'revision' });
  return { repo, revision: named ?? revision ?? 'main' };
}

const MODEL_SIDE_FILES = ['config.json', 'generation_config.json', 'tokenizer.json', 'tokenizer_config.json', 'special_tokens_map.json', 'chat_template.jinja'];
const WEIGHTS = 'model.safetensors';
const INDEX = 'model.safetensors.index.json';
const ADAPTER_FILES = ['adapter_config.json', 'adapter_model.safetensors'];

/** What a command reads from a model repo. */
export type ModelWant = 'model' | 'adapter' | 'config' | 'tokenizer';

const TOKENIZER_FILES = ['config.json', 'tokenizer.json', 'tokenizer_config.json', 'special_tokens_map.json', 'chat_template.jinja'];

/** The shards a safetensors index names, in order. */
function shardsOf(indexFile: string, label: string): string[] {
  let raw: { weight_map?: Record<string, string> };
  try {
    raw = JSON.parse(readFileSync(indexFile, 'utf8'));
  } catch (e) {
    throw new UserError(`${label}: ${INDEX} is not valid JSON (${(e as Error).message})`, { file: indexFile });
  }
  if (!raw.weight_map || typeof raw.weight_map !== 'object') throw new UserError(`${label}: ${INDEX} has no weight_map`, { file: indexFile });
  return [...new Set(Object.values(raw.weight_map))].sort();
}

/** The kind of a model repo by its files: an adapter repo has adapter_config.json and no config.json. */
function kindOf(want: ModelWant, has: (f: string) => boolean): ModelWant {
  return want === 'model' && !has('config.json') && has('adapter_config.json') ? 'adapter' : want;
}

/** The first file a cached snapshot lacks for `want`, or null when it holds all. */
function missingInSnapshot(cached: CachedRepo, commit: string, want: ModelWant): string | null {
  const has = (f: string): boolean => cached.file(commit, f) !== null;
  const kind = kindOf(want, has);
  if (kind === 'config') return has('config.json') ? null : 'config.json';
  if (kind === 'tokenizer') return has('tokenizer.json') ? null : 'tokenizer.json';
  if (kind === 'adapter') return ADAPTER_FILES.find((f) => !has(f)) ?? null;
  for (const f of ['config.json', 'tokenizer.json']) if (!has(f)) return f;
  if (has(WEIGHTS)) return null;
  if (!has(INDEX)) return WEIGHTS;
  return shardsOf(cached.file(commit, INDEX)!, `${cached.repo}`).find((f) => !has(f)) ?? null;
}

function offlineError(ctx: HubContext, cached: CachedRepo, label: string, revision: string, commit: string | null, missing: string): UserError {
  const why = ctx.offline ? 'and downloads are off (HF_HUB_OFFLINE=1 or --offline)' : '';
  const where = commit ? `${cached.dir}/snapshots/${commit.slice(0, 12)}… has no ${missing}` : `${cached.dir} has no refs/${revision}`;
  return new UserError(`${label}: ${missing} is not in the Hugging Face cache (${where}) ${why}`.trim(), { file: missing });
}

/**
 * A model, adapter or config repo as a local folder. `want`: `model` (config, tokenizer files,
 * the safetensors weights and shards; an adapter repo gives its two files), `adapter` (a PEFT
 * LoRA adapter's two files), `config` (config.json alone).
 */
export async function resolveModel(spec: string, want: ModelWant, o: HubOptions = {}): Promise<{ path: string; hub?: HubSnapshot; adapter: boolean }> {
  if (!isHubName(spec)) return { path: spec, adapter: false };
  const ctx = hubContext(o);
  const { repo, revision } = parseName(spec, o.revision);
  const cached = new CachedRepo(ctx.cacheDir, 'model', repo);
  const label = `model ${repo}${revision === 'main' ? '' : `@${revision}`}`;
  const cachedCommit = cached.commitOf(revision);
  if (cachedCommit) {
    const missing = missingInSnapshot(cached, cachedCommit, want);
    if (missing === null) {
      const files = cached.files(cachedCommit);
      const adapter = kindOf(want, (f) => files.includes(f)) === 'adapter';
      return { path: cached.snapshotDir(cachedCommit), adapter, hub: { repo, type: 'model', revision, commit: cachedCommit, path: cached.snapshotDir(cachedCommit), files, from: 'cache' } };
    }
    if (ctx.offline) throw offlineError(ctx, cached, label, revision, cachedCommit, missing);
  } else if (ctx.offline) {
    throw offlineError(ctx, cached, label, revision, null, want === 'adapter' ? ADAPTER_FILES[0] : want === 'tokenizer' ? 'tokenizer.json' : 'config.json');
  }
  const hub = new HubRepo(ctx, 'model', repo, revision);
  const commit = await hub.commit();
  cached.writeRef(revision, commit);
  const tree = await hub.tree(commit);
  const kind = kindOf(want, (f) => tree.has(f));
  const pick = (f: string): TreeFile => {
    const e = tree.get(f);
    if (!e) throw new UserError(`${label} (commit ${commit.slice(0, 12)}) has no ${f}`, { file: f });
    return e;
  };
  let files: TreeFile[];
  if (kind === 'config') files = [pick('config.json')];
  else if (kind === 'tokenizer') files = [pick('tokenizer.json'), ...TOKENIZER_FILES.filter((f) => f !== 'tokenizer.json' && tree.has(f)).map(pick)];
  else if (kind === 'adapter') files = ADAPTER_FILES.map(pick);
  else {
    pick('config.json');
    files = MODEL_SIDE_FILES.filter((f) => tree.has(f)).map(pick);
    if (tree.has(WEIGHTS)) files.push(pick(WEIGHTS));
    else if (tree.has(INDEX)) {
      const [index] = await hub.fetchFiles(commit, [pick(INDEX)]);
      files.push(pick(INDEX), ...shardsOf(index, label).map(pick));
    } else {
      const bin = [...tree.keys()].some((f) => /\.(bin|pth|pt)$/.test(f));
      throw new UserError(`${label} (commit ${commit.slice(0, 12)}) has no ${WEIGHTS} (nor ${INDEX})${bin ? '; it has PyTorch .bin weights only, which prefzoo does not read' : ''}`, { file: WEIGHTS });
    }
  }
  await hub.fetchFiles(commit, files);
  const path = cached.snapshotDir(commit);
  return { path, adapter: kind === 'adapter', hub: { repo, type: 'model', revision, commit, path, files: files.map((f) => f.path).sort(), from: 'download' } };
}

// ─── datasets ──────────────────────────────────────────────────────────────────────────────────────

/** Data files `prefzoo convert` reads; Parquet is preferred when a split has several kinds. */
const DATA_EXT = /\.(parquet|jsonl|json|csv|tsv|arrow)(\.gz)?$/i;

/** The Hub's Parquet conversion of every dataset: `<subset>/<split>/NNNN.parquet` (older: `<subset>/<name>-<split>.parquet`). */
export const PARQUET_REVISION = 'refs/convert/parquet';

/**
 * The data files of one split (and subset) among a dataset repo's files, as the `datasets` library
 * finds them by name: `data/train-00000-of-00002.parquet`, `train.jsonl`, `data/train/…`,
 * `<subset>/train-….parquet`, and the conversion's `default/train/0000.parquet`.
 */
export function splitFiles(paths: readonly string[], split: string, subset?: string): string[] {
  const sub = subset ?? 'default';
  const okDirs = subset
    ? [[subset], ['data', subset], [subset, split], ['data', subset, split]]
    : [[], ['data'], ['data', split], [split], ['default', split], ['default']];
  const esc = split.replace(/[.*+?^${}()|[\]\\]/g, '\\$&');
  const byName = new RegExp(`^${esc}([-_.][^/]*)?$`);
  const converted = new RegExp(`-${esc}(-\\d{5}-of-\\d{5})?\\.parquet$`);
  const picked = paths.filter((p) => {
    if (!DATA_EXT.test(p)) return false;
    const parts = p.split('/');
    const name = parts.pop()!;
    if (parts.some((d) => d.startsWith('.'))) return false;
    if (!okDirs.some((d) => d.length === parts.length && d.every((x, i) => x === parts[i]))) return false;
    if (parts[parts.length - 1] === split) return true;
    return byName.test(name) || (parts.length === 1 && parts[0] === sub && converted.test(name));
  });
  const parquet = picked.filter((p) => /\.parquet$/i.test(p));
  return (parquet.length ? parquet : picked).sort();
}

/** The first shard missing by the names' `-NNNNN-of-MMMMM` count, or null. */
function missingShard(files: readonly string[]): string | null {
  const m = files.map((f) => /^(.*)-(\d{5})-of-(\d{5})(\.[^/]*)$/.exec(f));
  if (m.some((x) => !x)) return null;
  const [, stem, , count, ext] = m[0]!;
  for (let i = 0; i < Number(count); i++) {
    const name = `${stem}-${String(i).padStart(5, '0')}-of-${count}${ext}`;
    if (!files.includes(name)) return name;
  }
  return null;
}

/**
 * The glob in one folder that names exactly `files` (absolute, under the snapshot), as the data
 * readers take it: `…/data/train-*.parquet`.
 */
function globOf(root: string, files: readonly string[], label: string): string {
  const dirs = new Set(files.map((f) => dirname(f)));
  if (dirs.size !== 1) throw new UserError(`${label}: the split's files lie in ${dirs.size} folders (${[...dirs].join(', ')}); pass them to prefzoo convert first`);
  if (files.length === 1) return join(root, files[0]);
  const names = files.map((f) => f.slice(f.lastIndexOf('/') + 1));
  let pre = names[0];
  for (const n of names) while (!n.startsWith(pre)) pre = pre.slice(0, -1);
  let suf = names[0];
  for (const n of names) while (!n.endsWith(suf)) suf = suf.slice(1);
  if (pre.length + suf.length > Math.min(...names.map((n) => n.length))) suf = '';
  const dir = [...dirs][0];
  return join(root, dir === '.' ? '' : dir, `${pre}*${suf}`);
}

/** A dataset split by name: its data files in the cache, and the glob the data readers take. */
export interface ResolvedData {
  /** What the data readers take: a file, or a glob in one folder. */
  spec: string;
  /** The files, absolute. */
  files: string[];
  hub?: HubSnapshot;
}

/**
 * `--data ORG/NAME` with a split (default train) and subset: the repo's own data files for them, or
 * the Hub's Parquet conversion (revision refs/convert/parquet) when the repo has none.
 */
export async function resolveDataset(spec: string, o: HubOptions & { split?: string; subset?: string } = {}): Promise<ResolvedData> {
  if (!isHubName(spec)) return { spec, files: [] };
  const ctx = hubContext(o);
  const split = o.split ?? 'train';
  const { repo, revision } = parseName(spec, o.revision);
  const cached = new CachedRepo(ctx.cacheDir, 'dataset', repo);
  const what = `${split} split${o.subset ? ` of subset ${o.subset}` : ''}`;
  const label = `dataset ${repo}${revision === 'main' ? '' : `@${revision}`}`;
  const done = (rev: string, commit: string, rel: string[], from: 'cache' | 'download'): ResolvedData => {
    const root = cached.snapshotDir(commit);
    const glob = globOf(root, rel, label);
    return { spec: glob, files: rel.map((f) => join(root, f)), hub: { repo, type: 'dataset', revision: rev, commit, path: glob, files: rel, from, split, ...(o.subset ? { subset: o.subset } : {}) } };
  };
  // The cache: the revision asked for, then (for main) the Parquet conversion.
  const revisions = revision === 'main' ? [revision, PARQUET_REVISION] : [revision];
  let firstMissing: string | null = null;
  for (const rev of revisions) {
    const commit = cached.commitOf(rev);
    if (!commit) continue;
    const rel = splitFiles(cached.files(commit), split, o.subset);
    const gap = rel.length ? missingShard(rel) : null;
    if (rel.length && !gap) return done(rev, commit, rel, 'cache');
    firstMissing ??= gap;
  }
  if (ctx.offline) {
    const commit = cached.commitOf(revision);
    const where = commit ? `${cached.dir}/snapshots/${commit.slice(0, 12)}… ${firstMissing ? `lacks ${firstMissing}` : `holds no data files of the ${what}`}` : `${cached.dir} has no refs/${revision}`;
    throw new UserError(`${label}: the ${what} is not in the Hugging Face cache (${where}) and downloads are off (HF_HUB_OFFLINE=1 or --offline)`, { file: firstMissing ?? undefined });
  }
  let dataFiles: string[] = [];
  const none = (extra = ''): UserError =>
    new UserError(`${label}: no data files for the ${what}${dataFiles.length ? ` (it has ${dataFiles.slice(0, 4).join(', ')}${dataFiles.length > 4 ? ', …' : ''}; choose with --split and --subset)` : ''}${extra}`, { setting: 'split' });
  for (const rev of revisions) {
    const hub = new HubRepo(ctx, 'dataset', repo, rev);
    let commit: string;
    try {
      commit = await hub.commit();
    } catch (e) {
      // A dataset the Hub has not converted: say what the repo's own files lacked.
      if (rev === PARQUET_REVISION && e instanceof UserError && /no revision/.test(e.message)) throw none(', and the Hub has no Parquet conversion of it');
      throw e;
    }
    cached.writeRef(rev, commit);
    const tree = await hub.tree(commit);
    const rel = splitFiles([...tree.keys()], split, o.subset);
    if (!rel.length) {
      if (rev === revision) dataFiles = [...tree.keys()].filter((p) => DATA_EXT.test(p));
      // The repo's own files hold none: its data may live only in the conversion.
      if (rev !== revisions[revisions.length - 1]) continue;
      throw none(rev === PARQUET_REVISION ? ', nor has the Hub\'s Parquet conversion' : '');
    }
    await hub.fetchFiles(commit, rel.map((f) => tree.get(f)!));
    return done(rev, commit, rel, 'download');
  }
  throw new UserError(`${label}: no data files for the ${what}`);
}
