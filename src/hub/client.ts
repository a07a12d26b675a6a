/**
 * The network side of the Hub, through `@huggingface/hub` (the Hub's own JavaScript client): a
 * revision's commit (`modelInfo`/`datasetInfo` with `sha`), the file tree (`listFiles`) and a file's
 * bytes (`downloadFile`, whose Blob fetches byte ranges). What the library leaves to its caller is
 * here: `HF_ENDPOINT` (passed as `hubUrl`), `HF_TOKEN` (as `accessToken`), a cut download resumed
 * with a `Range` request onto the `.incomplete` blob, the size and sha256 checked before a blob is
 * named, a progress bar in bytes with the rate, and the Hub's 401/403/404 as one line each.
 */
import { createHash } from 'node:crypto';
import { closeSync, createReadStream, existsSync, mkdirSync, openSync, readFileSync, renameSync, rmSync, statSync, truncateSync, writeFileSync, writeSync } from 'node:fs';
import { homedir } from 'node:os';
import { join } from 'node:path';
import { UserError } from '../errors.ts';
import type { Reporter } from '../progress.ts';
import { CachedRepo, type RepoType } from './cache.ts';

export const DEFAULT_ENDPOINT = 'https://huggingface.co';

/** Where and how the Hub is reached, from the environment (and the command's --offline). */
export interface HubContext {
  endpoint: string;
  token?: string;
  offline: boolean;
  cacheDir: string;
  /** A download's byte count; notes on a resumed download or a cut connection. */
  reporter: Reporter;
}

const TRUE = /^(1|on|yes|true)$/i;

/** `HF_HUB_OFFLINE` as huggingface_hub reads it: 1, ON, YES or TRUE. */
export function offlineFromEnv(env: NodeJS.ProcessEnv = process.env): boolean {
  return TRUE.test(env.HF_HUB_OFFLINE ?? '');
}

/** `HF_TOKEN`, else the token `hf auth login` saved (`HF_TOKEN_PATH`, else `HF_HOME/token`). */
export function tokenFromEnv(env: NodeJS.ProcessEnv = process.env): string | undefined {
  const direct = env.HF_TOKEN ?? env.HUGGING_FACE_HUB_TOKEN;
  if (direct) return direct.trim();
  const file = env.HF_TOKEN_PATH ?? join(env.HF_HOME ?? join(env.XDG_CACHE_HOME ?? join(homedir(), '.cache'), 'huggingface'), 'token');
  try {
    const t = readFileSync(file, 'utf8').trim();
    return t || undefined;
  } catch {
    return undefined;
  }
}

/** A file of a repo's tree: its size and the ETag its blob is named by (sha256 for LFS, git sha1 otherwise). */
export interface TreeFile {
  path: string;
  size: number;
  etag: string;
}

/** A connection that failed or was cut: worth resuming, unlike the Hub's answers. */
class Transient extends Error {}

/** The server sent the whole file to a ranged request: the partial blob must start over. */
class RangeIgnored extends Error {
  constructor() {
    super('the server ignored the Range request');
  }
}

function headerOf(init: RequestInit | undefined, name: string): string | undefined {
  const h = init?.headers;
  if (!h) return undefined;
  if (h instanceof Headers) return h.get(name) ?? undefined;
  if (Array.isArray(h)) return h.find(([k]) => k.toLowerCase() === name.toLowerCase())?.[1];
  const rec = h as Record<string, string>;
  const key = Object.keys(rec).find((k) => k.toLowerCase() === name.toLowerCase());
  return key ? rec[key] : undefined;
}

function reasonOf(e: unknown): string {
  if (typeof e === 'string') return e;
  const err = e as { message?: string; cause?: { code?: string; message?: string } };
  const cause = err?.cause?.code ?? err?.cause?.message;
  return [err?.message, cause].filter(Boolean).join(': ') || String(e);
}

const sleep = (ms: number): Promise<void> => new Promise((r) => setTimeout(r, ms));

function mb(n: number): string {
  return (n / 1e6).toFixed(n < 1e7 ? 2 : 1);
}

/** One repo at one revision on the Hub, as the library reaches it. */
export class HubRepo {
  readonly cached: CachedRepo;
  /** The file a request is about, for the one-line errors. */
  private file?: string;
  /** What the fetch below last threw: the library's Blob streams report a failure by its message only. */
  private failure?: Error;

  constructor(
    readonly ctx: HubContext,
    readonly type: RepoType,
    readonly repo: string,
    readonly revision: string,
  ) {
    this.cached = new CachedRepo(ctx.cacheDir, type, repo);
    if (ctx.token !== undefined && !ctx.token.startsWith('hf_')) throw new UserError('HF_TOKEN: a Hugging Face access token starts with "hf_"', { setting: 'HF_TOKEN' });
  }

  /** The repo as people name it: `model Qwen/Qwen2.5-0.5B@main`. */
  get label(): string {
    return `${this.type} ${this.repo}${this.revision === 'main' ? '' : `@${this.revision}`}`;
  }

  get page(): string {
    return `${this.ctx.endpoint}/${this.type === 'dataset' ? 'datasets/' : ''}${this.repo}`;
  }

  private statusError(resp: Response): UserError {
    const code = resp.headers.get('x-error-code') ?? '';
    const message = resp.headers.get('x-error-message') ?? '';
    const s = resp.status;
    if (code === 'GatedRepo' || (s === 403 && /gated/i.test(message))) {
      return new UserError(`${this.label} is gated: accept its licence on ${this.page} while signed in${this.ctx.token ? ' as the owner of HF_TOKEN' : ', and set HF_TOKEN to a token of that account'} (the Hub answered ${s})`);
    }
    if (code === 'EntryNotFound' || (s === 404 && this.file && code !== 'RepoNotFound' && code !== 'RevisionNotFound')) {
      return new UserError(`${this.label} has no file ${this.file ?? '(unknown)'} (the Hub answered 404)`, { file: this.file });
    }
    if (code === 'RevisionNotFound') return new UserError(`${this.type} ${this.repo} has no revision "${this.revision}" (the Hub answered ${s})`, { setting: 'revision' });
    if (s === 401 || s === 403) {
      return this.ctx.token
        ? new UserError(`${this.label}: HF_TOKEN cannot read it (the Hub answered ${s}${message ? `: ${message}` : ''}): a wrong or expired token, or an account without access`, { setting: 'HF_TOKEN' })
        : new UserError(`${this.label}: no such folder here, and the Hub answered ${s} without a token (not found, or private): check the name, or set HF_TOKEN to a token that can read it`);
    }
    return new UserError(`${this.label}: no such ${this.type} repo on ${this.ctx.endpoint}, and no such folder here (the Hub answered ${s})`);
  }

  /** The fetch the library is given: errors of the Hub become one line; a dropped connection is Transient. */
  private readonly fetch: typeof fetch = async (input, init) => {
    let resp: Response;
    try {
      resp = await fetch(input, init);
    } catch (e) {
      throw (this.failure = new Transient(`cannot reach ${this.ctx.endpoint} (${reasonOf(e)})`));
    }
    if (resp.status === 401 || resp.status === 403 || resp.status === 404) {
      await resp.body?.cancel();
      throw (this.failure = this.statusError(resp));
    }
    const range = headerOf(init, 'range');
    if (range && /^bytes=[1-9]/.test(range) && resp.status === 200) {
      await resp.body?.cancel();
      throw (this.failure = new RangeIgnored());
    }
    return resp;
  };

  /** Runs a library call; a connection that failed becomes one line suggesting the cache. */
  private async call<T>(file: string | undefined, f: () => Promise<T>): Promise<T> {
    this.file = file;
    try {
      return await f();
    } catch (e) {
      if (e instanceof Transient) throw new UserError(`${this.label}: no such folder here, and ${e.message}; to use only the Hugging Face cache, set HF_HUB_OFFLINE=1`);
      if (e instanceof UserError) throw e;
      const status = (e as { statusCode?: number }).statusCode;
      throw new UserError(`${this.label}: ${status ? `the Hub answered ${status}` : 'the Hub request failed'} (${reasonOf(e).split('\n')[0]})`);
    }
  }

  private get creds(): { hubUrl: string; accessToken?: string; fetch: typeof fetch } {
    return { hubUrl: this.ctx.endpoint, ...(this.ctx.token ? { accessToken: this.ctx.token } : {}), fetch: this.fetch };
  }

  /** The 40-hex commit the revision points to now. */
  async commit(revision = this.revision): Promise<string> {
    const hub = await import('@huggingface/hub');
    const o = { ...this.creds, name: this.repo, revision, additionalFields: ['sha' as const] };
    const info = await this.call(undefined, () => (this.type === 'model' ? hub.modelInfo(o) : hub.datasetInfo(o)));
    const sha = (info as { sha?: string }).sha;
    if (typeof sha !== 'string' || !/^[0-9a-f]{40}$/.test(sha)) throw new UserError(`${this.label}: the Hub's answer names no commit (sha)`);
    return sha;
  }

  /** Every file of the repo at `commit`, by path. */
  async tree(commit: string): Promise<Map<string, TreeFile>> {
    const hub = await import('@huggingface/hub');
    const out = new Map<string, TreeFile>();
    await this.call(undefined, async () => {
      for await (const e of hub.listFiles({ ...this.creds, repo: { type: this.type, name: this.repo }, revision: commit, recursive: true })) {
        if (e.type !== 'file') continue;
        const etag = e.lfs?.oid ?? e.oid;
        if (!etag) throw new UserError(`${this.label}: the Hub's file tree gives no oid for ${e.path}`);
        out.set(e.path, { path: e.path, size: e.lfs?.size ?? e.size, etag });
      }
    });
    return out;
  }

  /**
   * Puts `files` of `commit` into the cache's snapshot (blobs already there are only linked) and
   * returns their snapshot paths. One progress bar for the lot, in bytes.
   */
  async fetchFiles(commit: string, files: readonly TreeFile[]): Promise<string[]> {
    const todo = files.filter((f) => !this.cached.file(commit, f.path) && !existsSync(this.cached.blobPath(f.etag)));
    const total = todo.reduce((s, f) => s + f.size, 0);
    const bar = todo.length ? this.ctx.reporter.progress(`download ${this.repo}`, total) : undefined;
    const t0 = Date.now();
    let done = 0;
    const tick = (n: number, file: string): void => {
      done += n;
      const secs = Math.max(1e-3, (Date.now() - t0) / 1000);
      bar?.update(done, { file, MB: `${mb(done)}/${mb(total)}`, 'MB/s': (done / 1e6 / secs).toFixed(2) });
    };
    try {
      const out: string[] = [];
      for (const f of files) out.push(await this.fetchFile(commit, f, tick));
      return out;
    } finally {
      bar?.stop();
    }
  }

  private async fetchFile(commit: string, f: TreeFile, tick: (n: number, file: string) => void): Promise<string> {
    const have = this.cached.file(commit, f.path);
    if (have) return have;
    const blob = this.cached.blobPath(f.etag);
    if (existsSync(blob)) return this.cached.link(commit, f.path, f.etag);
    mkdirSync(join(this.cached.dir, 'blobs'), { recursive: true });
    const part = `${blob}.incomplete`;
    if (!existsSync(part)) writeFileSync(part, '');
    const resumedAt = statSync(part).size;
    if (resumedAt > f.size) truncateSync(part, 0);
    tick(Math.min(resumedAt, f.size), f.path);
    if (resumedAt > 0 && resumedAt < f.size) this.ctx.reporter.info(`${this.repo}/${f.path}: resuming at byte ${resumedAt} of ${f.size}`);
    const hub = await import('@huggingface/hub');
    let remote: Blob | null = null;
    const ATTEMPTS = 6;
    for (let attempt = 1; ; attempt++) {
      const start = statSync(part).size;
      if (start >= f.size) break;
      try {
        this.file = f.path;
        remote ??= await hub.downloadFile({ ...this.creds, repo: { type: this.type, name: this.repo }, path: f.path, revision: commit });
        if (!remote) throw new UserError(`${this.label} has no file ${f.path} (the Hub answered 404)`, { file: f.path });
        if (remote.size !== f.size) throw new UserError(`${this.label}: ${f.path} is ${remote.size} bytes by its download and ${f.size} by the file tree`, { file: f.path });
        await this.append((start > 0 ? remote.slice(start) : remote).stream(), part, (n) => tick(n, f.path));
      } catch (e) {
        if (e instanceof RangeIgnored) {
          tick(-start, f.path);
          truncateSync(part, 0);
          continue;
        }
        if (e instanceof UserError) throw e;
        const at = statSync(part).size;
        if (attempt >= ATTEMPTS) {
          throw new UserError(`${this.label}: download of ${f.path} cut at byte ${at} of ${f.size} (${reasonOf(e)}), ${ATTEMPTS} tries; run again to resume from ${part}`, { file: f.path });
        }
        this.ctx.reporter.info(`${this.repo}/${f.path}: connection cut at byte ${at} of ${f.size} (${reasonOf(e)}); resuming`);
        await sleep(200 * 2 ** (attempt - 1));
      }
    }
    await this.verify(part, f);
    renameSync(part, blob);
    return this.cached.link(commit, f.path, f.etag);
  }

  /** Appends a stream's bytes to `file`. A stream failed by the library carries our error's text, or a cut connection's. */
  private async append(stream: ReadableStream<Uint8Array>, file: string, onBytes: (n: number) => void): Promise<void> {
    const fd = openSync(file, 'a');
    const reader = stream.getReader();
    try {
      for (;;) {
        let r: ReadableStreamReadResult<Uint8Array>;
        try {
          r = await reader.read();
        } catch (e) {
          if (e instanceof Error && !(e instanceof TypeError)) throw e;
          if (typeof e === 'string' && this.failure && e === this.failure.message) throw this.failure;
          throw new Transient(reasonOf(e));
        }
        if (r.done) break;
        writeSync(fd, r.value);
        onBytes(r.value.length);
      }
    } finally {
      closeSync(fd);
      reader.releaseLock();
    }
  }

  /** The size, and for LFS files (named by their sha256) the digest, before the blob takes its name. */
  private async verify(part: string, f: TreeFile): Promise<void> {
    const size = statSync(part).size;
    if (size !== f.size) {
      rmSync(part, { force: true });
      throw new UserError(`${this.label}: ${f.path} arrived with ${size} bytes, the Hub lists ${f.size}; removed, run again`, { file: f.path });
    }
    if (!/^[0-9a-f]{64}$/.test(f.etag)) return;
    const h = createHash('sha256');
    for await (const chunk of createReadStream(part)) h.update(chunk as Buffer);
    const got = h.digest('hex');
    if (got !== f.etag) {
      rmSync(part, { force: true });
      throw new UserError(`${this.label}: ${f.path} arrived with sha256 ${got.slice(0, 12)}…, the Hub lists ${f.etag.slice(0, 12)}…; removed, run again`, { file: f.path });
    }
  }
}
