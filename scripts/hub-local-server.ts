/**
 * A local server that answers the Hugging Face Hub's routes as `@huggingface/hub` (and
 * huggingface_hub) call them, for the tests and for trying `prefzoo … ORG/NAME` on a machine without
 * the network (docs/hub.md):
 *
 *   GET /api/{models|datasets}/ORG/NAME/revision/REV     info with `sha` (the commit REV points to)
 *   GET /api/{models|datasets}/ORG/NAME/tree/REV?recursive=true   the file tree: path, size, oid, lfs
 *   GET /[datasets/]ORG/NAME/resolve/REV/PATH            a small file: 307 to /api/resolve-cache/…;
 *                                                        an LFS file: 302 to /cdn-lfs/<sha256>, with
 *                                                        X-Repo-Commit, X-Linked-Etag, X-Linked-Size
 *   the redirect targets: the bytes, `Range` honoured (206 + Content-Range), ETag
 *
 * Errors as the Hub sends them: an unknown or private repo → 401 with X-Error-Code RepoNotFound (no
 * token), a gated one → 403 GatedRepo, an unknown revision → 404 RevisionNotFound, a missing file →
 * 404 EntryNotFound. Every request is counted; `dropOnce` cuts the connection mid-file once.
 *
 *   node --import tsx scripts/hub-local-server.ts [--port 8765] [--dir DIR]
 *     writes a tiny model (tiny-org/tiny-llama, with a gated twin tiny-org/gated-llama and a
 *     private one tiny-org/private-llama) and a tiny preference dataset (tiny-org/tiny-prefs, its
 *     train and test splits as data/*.parquet), then serves them until stopped; prints the
 *     HF_ENDPOINT to export.
 */
import { createHash } from 'node:crypto';
import { mkdirSync, readdirSync, readFileSync, statSync } from 'node:fs';
import { createServer, type IncomingMessage, type Server, type ServerResponse } from 'node:http';
import type { AddressInfo } from 'node:net';
import { join, relative } from 'node:path';
import { fileURLToPath } from 'node:url';

type RepoType = 'model' | 'dataset';

interface HubFile {
  path: string;
  bytes: Buffer;
  /** git blob sha1: the oid of every file, the ETag of a small one. */
  oid: string;
  /** sha256, for files stored with LFS (weights, Parquet, anything over 10 kB). */
  lfs?: string;
}

interface HubRepoData {
  type: RepoType;
  name: string;
  refs: Map<string, string>;
  commits: Map<string, Map<string, HubFile>>;
  gated?: boolean;
  private?: boolean;
}

export interface RequestRecord {
  method: string;
  url: string;
  range?: string;
  status: number;
}

const LFS_EXT = /\.(safetensors|parquet|bin|gguf|onnx)$/;

function fileOf(path: string, bytes: Buffer): HubFile {
  const oid = createHash('sha1').update(`blob ${bytes.length}\0`).update(bytes).digest('hex');
  const lfs = LFS_EXT.test(path) || bytes.length > 10_000 ? createHash('sha256').update(bytes).digest('hex') : undefined;
  return { path, bytes, oid, ...(lfs ? { lfs } : {}) };
}

function walk(dir: string, root = dir, out: string[] = []): string[] {
  for (const name of readdirSync(dir)) {
    const p = join(dir, name);
    if (statSync(p).isDirectory()) walk(p, root, out);
    else out.push(relative(root, p));
  }
  return out.sort();
}

export class LocalHub {
  readonly repos = new Map<string, HubRepoData>();
  readonly requests: RequestRecord[] = [];
  /** The next full download of this path is cut after this many bytes (once). */
  dropOnce?: { path: string; afterBytes: number };
  /** The token private and gated repos accept. */
  token = 'hf_localtesttoken';
  private server?: Server;
  url = '';

  /**
   * Publishes a folder's files (or given files) as a commit of `ORG/NAME`, pointed to by `revision`
   * (default main). Returns the commit sha.
   */
  publish(type: RepoType, name: string, files: string | Record<string, Buffer | string>, o: { revision?: string; gated?: boolean; private?: boolean } = {}): string {
    const entries: [string, Buffer][] =
      typeof files === 'string' ? walk(files).map((p) => [p.split('\\').join('/'), readFileSync(join(files, p))]) : Object.entries(files).map(([p, b]) => [p, Buffer.isBuffer(b) ? b : Buffer.from(b)]);
    const key = `${type}/${name}`;
    const repo: HubRepoData = this.repos.get(key) ?? { type, name, refs: new Map(), commits: new Map() };
    if (o.gated !== undefined) repo.gated = o.gated;
    if (o.private !== undefined) repo.private = o.private;
    const tree = new Map(entries.map(([p, b]) => [p, fileOf(p, b)]));
    const h = createHash('sha1').update(key);
    for (const f of tree.values()) h.update(f.path).update(f.oid);
    const sha = h.digest('hex');
    repo.commits.set(sha, tree);
    repo.refs.set(o.revision ?? 'main', sha);
    this.repos.set(key, repo);
    return sha;
  }

  /** Requests whose URL contains `part` (all without it). */
  count(part = ''): number {
    return this.requests.filter((r) => r.url.includes(part)).length;
  }

  async start(port = 0): Promise<string> {
    this.server = createServer((req, res) => this.handle(req, res));
    await new Promise<void>((r) => this.server!.listen(port, '127.0.0.1', r));
    this.url = `http://127.0.0.1:${(this.server.address() as AddressInfo).port}`;
    return this.url;
  }

  async stop(): Promise<void> {
    this.server?.closeAllConnections();
    await new Promise<void>((r) => (this.server ? this.server.close(() => r()) : r()));
  }

  private fail(res: ServerResponse, status: number, code: string, message: string): void {
    res.writeHead(status, { 'Content-Type': 'application/json', 'X-Error-Code': code, 'X-Error-Message': message });
    res.end(JSON.stringify({ error: message }));
  }

  /** The repo if this request may read it; else answers as the Hub does and returns null. */
  private access(req: IncomingMessage, res: ServerResponse, type: RepoType, name: string): HubRepoData | null {
    const repo = this.repos.get(`${type}/${name}`);
    const auth = req.headers.authorization;
    const authed = auth === `Bearer ${this.token}`;
    if (!repo || (repo.private && !authed)) {
      // Without a token the Hub does not say whether a repo exists.
      if (auth) this.fail(res, authed ? 404 : 401, 'RepoNotFound', authed ? 'Repository not found' : 'Invalid credentials in Authorization header');
      else this.fail(res, 401, 'RepoNotFound', 'Repository not found');
      return null;
    }
    if (repo.gated && !authed) {
      this.fail(res, auth ? 403 : 401, 'GatedRepo', `Access to ${type} ${name} is restricted. You must have access to it and be authenticated to access it. Please log in.`);
      return null;
    }
    return repo;
  }

  private commitOf(res: ServerResponse, repo: HubRepoData, rev: string): string | null {
    const sha = repo.commits.has(rev) ? rev : repo.refs.get(rev);
    if (!sha) {
      this.fail(res, 404, 'RevisionNotFound', `Invalid rev id: ${rev}`);
      return null;
    }
    return sha;
  }

  private handle(req: IncomingMessage, res: ServerResponse): void {
    const u = new URL(req.url ?? '/', 'http://x');
    const record: RequestRecord = { method: req.method ?? 'GET', url: req.url ?? '', ...(req.headers.range ? { range: String(req.headers.range) } : {}), status: 0 };
    this.requests.push(record);
    res.on('finish', () => (record.status = res.statusCode));
    const p = u.pathname;
    let m: RegExpExecArray | null;
    if ((m = /^\/api\/(models|datasets)\/([^/]+\/[^/]+)\/revision\/(.+)$/.exec(p))) {
      const type = m[1].slice(0, -1) as RepoType;
      const repo = this.access(req, res, type, m[2]);
      if (!repo) return;
      const sha = this.commitOf(res, repo, decodeURIComponent(m[3]));
      if (!sha) return;
      const info = { _id: createHash('md5').update(m[2]).digest('hex').slice(0, 24), id: m[2], sha, private: !!repo.private, gated: repo.gated ? 'auto' : false, downloads: 0, likes: 0, lastModified: '2026-01-01T00:00:00.000Z', siblings: [...repo.commits.get(sha)!.keys()].map((rfilename) => ({ rfilename })) };
      res.writeHead(200, { 'Content-Type': 'application/json' });
      res.end(JSON.stringify(info));
      return;
    }
    if ((m = /^\/api\/(models|datasets)\/([^/]+\/[^/]+)\/tree\/(.+)$/.exec(p))) {
      const type = m[1].slice(0, -1) as RepoType;
      const repo = this.access(req, res, type, m[2]);
      if (!repo) return;
      const sha = this.commitOf(res, repo, decodeURIComponent(m[3]));
      if (!sha) return;
      const files = [...repo.commits.get(sha)!.values()];
      const dirs = new Set<string>();
      for (const f of files) for (let i = f.path.indexOf('/'); i > 0; i = f.path.indexOf('/', i + 1)) dirs.add(f.path.slice(0, i));
      const entries = [
        ...[...dirs].map((path) => ({ type: 'directory', oid: createHash('sha1').update(path).digest('hex'), size: 0, path })),
        ...files.map((f) => ({ type: 'file', oid: f.oid, size: f.bytes.length, path: f.path, ...(f.lfs ? { lfs: { oid: f.lfs, size: f.bytes.length, pointerSize: 134 } } : {}) })),
      ];
      res.writeHead(200, { 'Content-Type': 'application/json' });
      res.end(JSON.stringify(entries));
      return;
    }
    if ((m = /^\/(datasets\/)?([^/]+\/[^/]+)\/resolve\/([^/]+)\/(.+)$/.exec(p))) {
      const type: RepoType = m[1] ? 'dataset' : 'model';
      const repo = this.access(req, res, type, m[2]);
      if (!repo) return;
      const sha = this.commitOf(res, repo, decodeURIComponent(m[3]));
      if (!sha) return;
      const path = decodeURIComponent(m[4]);
      const f = repo.commits.get(sha)!.get(path);
      if (!f) return this.fail(res, 404, 'EntryNotFound', `${path} does not exist on "${m[3]}"`);
      const common = { 'X-Repo-Commit': sha, ETag: `"${f.oid}"` };
      if (f.lfs) {
        res.writeHead(302, { ...common, 'X-Linked-Etag': `"${f.lfs}"`, 'X-Linked-Size': String(f.bytes.length), Location: `/cdn-lfs/${f.lfs}?repo=${encodeURIComponent(m[2])}&path=${encodeURIComponent(path)}` });
      } else {
        res.writeHead(307, { ...common, Location: `/api/resolve-cache/${type}s/${m[2]}/${sha}/${encodeURIComponent(path)}` });
      }
      res.end();
      return;
    }
    if ((m = /^\/cdn-lfs\/([0-9a-f]{64})$/.exec(p))) {
      const f = this.findBlob((x) => x.lfs === m![1]);
      if (!f) return this.fail(res, 404, 'EntryNotFound', 'no such object');
      return this.serveBytes(req, res, f, `"${f.lfs}"`);
    }
    if ((m = /^\/api\/resolve-cache\/(models|datasets)\/([^/]+\/[^/]+)\/([0-9a-f]{40})\/(.+)$/.exec(p))) {
      const repo = this.repos.get(`${m[1].slice(0, -1)}/${m[2]}`);
      const f = repo?.commits.get(m[3])?.get(decodeURIComponent(m[4]));
      if (!f) return this.fail(res, 404, 'EntryNotFound', 'no such file');
      return this.serveBytes(req, res, f, `"${f.oid}"`);
    }
    this.fail(res, 404, 'NotFound', `no route ${p}`);
  }

  private findBlob(pred: (f: HubFile) => boolean): HubFile | undefined {
    for (const r of this.repos.values()) for (const c of r.commits.values()) for (const f of c.values()) if (pred(f)) return f;
    return undefined;
  }

  private serveBytes(req: IncomingMessage, res: ServerResponse, f: HubFile, etag: string): void {
    const size = f.bytes.length;
    const range = /^bytes=(\d+)-(\d*)$/.exec(String(req.headers.range ?? ''));
    let start = 0;
    let end = size - 1;
    if (range) {
      start = Number(range[1]);
      end = range[2] ? Math.min(Number(range[2]), size - 1) : size - 1;
      if (start >= size) {
        res.writeHead(416, { 'Content-Range': `bytes */${size}` });
        res.end();
        return;
      }
    }
    const headers = { ETag: etag, 'Accept-Ranges': 'bytes', 'Content-Type': 'application/octet-stream', 'Content-Length': String(end - start + 1) };
    res.writeHead(range ? 206 : 200, range ? { ...headers, 'Content-Range': `bytes ${start}-${end}/${size}` } : headers);
    if (req.method === 'HEAD') return void res.end();
    const drop = this.dropOnce;
    if (drop && drop.path === f.path && start === 0 && end - start + 1 > drop.afterBytes) {
      this.dropOnce = undefined;
      // Part of the body, then the connection goes: what a cut network looks like to the client.
      res.write(f.bytes.subarray(0, drop.afterBytes), () => setTimeout(() => res.socket?.destroy(), 20));
      return;
    }
    res.end(f.bytes.subarray(start, end + 1));
  }
}

/** A tiny preference dataset as Hub datasets hold it: plain Parquet with prompt/chosen/rejected strings. */
export async function preferenceParquet(rows: number, seed = 0): Promise<Buffer> {
  const arrow = await import('apache-arrow');
  const pw = await import('parquet-wasm');
  const words = ['red', 'green', 'blue', 'cat', 'dog', 'sun', 'rain', 'tree', 'stone', 'river'];
  const prompt: string[] = [];
  const chosen: string[] = [];
  const rejected: string[] = [];
  for (let i = 0; i < rows; i++) {
    const a = words[(i + seed) % words.length];
    const b = words[(i * 3 + 1 + seed) % words.length];
    prompt.push(`Say the word ${a}.`);
    chosen.push(`${a}`);
    rejected.push(`${b} ${b}`);
  }
  const t = arrow.tableFromArrays({ prompt, chosen, rejected });
  return Buffer.from(pw.writeParquet(pw.Table.fromIPCStream(arrow.tableToIPC(t, 'stream'))));
}

/** The repos the tests and the demo serve: a tiny model (plus gated and private twins) and a tiny dataset. */
export async function publishFixtures(hub: LocalHub, dir: string): Promise<{ model: string; dataset: string }> {
  const { initModelFolder } = await import('../src/models/init.ts');
  const modelDir = join(dir, 'tiny-llama');
  mkdirSync(modelDir, { recursive: true });
  initModelFolder(modelDir, 'llama', 'tiny', 0);
  hub.publish('model', 'tiny-org/tiny-llama', modelDir);
  hub.publish('model', 'tiny-org/gated-llama', modelDir, { gated: true });
  hub.publish('model', 'tiny-org/private-llama', modelDir, { private: true });
  hub.publish('dataset', 'tiny-org/tiny-prefs', {
    'README.md': '---\nlicense: mit\n---\n# tiny-prefs\nA tiny preference dataset for tests.\n',
    'data/train-00000-of-00001.parquet': await preferenceParquet(24),
    'data/test-00000-of-00001.parquet': await preferenceParquet(8, 5),
  });
  return { model: 'tiny-org/tiny-llama', dataset: 'tiny-org/tiny-prefs' };
}

if (process.argv[1] && fileURLToPath(import.meta.url) === process.argv[1]) {
  const args = process.argv.slice(2);
  const flag = (name: string): string | undefined => {
    const i = args.indexOf(name);
    return i >= 0 ? args[i + 1] : undefined;
  };
  const { mkdtempSync } = await import('node:fs');
  const { tmpdir } = await import('node:os');
  const dir = flag('--dir') ?? mkdtempSync(join(tmpdir(), 'prefzoo-hub-'));
  const hub = new LocalHub();
  const names = await publishFixtures(hub, dir);
  const url = await hub.start(Number(flag('--port') ?? 8765));
  process.stdout.write(
    `serving the Hub's routes at ${url}\n` +
      `  export HF_ENDPOINT=${url}\n` +
      `  models: ${names.model}, tiny-org/gated-llama (gated), tiny-org/private-llama (token ${hub.token}); dataset: ${names.dataset}\n`,
  );
  const log = (): void => {
    process.stdout.write(`${hub.requests.length} requests served\n`);
    process.exit(0);
  };
  process.on('SIGINT', log);
  process.on('SIGTERM', log);
}
