/**
 * The shared Hugging Face cache, laid out as `huggingface_hub` lays it out, so Python's tools and
 * prefzoo read what the other fetched:
 *
 *   $HF_HUB_CACHE/models--ORG--NAME/            (datasets--ORG--NAME for a dataset repo)
 *     blobs/<etag>                              the file's bytes, named by its ETag: the sha256 of an
 *                                               LFS file, the git blob sha1 of any other
 *     blobs/<etag>.incomplete                   a download under way (resumed from its length)
 *     refs/<revision>                           a branch or tag name → the 40-hex commit it pointed to
 *     snapshots/<commit>/<path>                 a relative link to ../../blobs/<etag> (one more ../
 *                                               per folder of <path>)
 *
 * A snapshot only ever holds links to complete blobs: a blob is written under `.incomplete` and
 * renamed once its size (and sha256, for LFS files) is checked.
 */
import { existsSync, lstatSync, mkdirSync, readdirSync, readFileSync, rmSync, statSync, symlinkSync, copyFileSync, writeFileSync, renameSync } from 'node:fs';
import { homedir } from 'node:os';
import { dirname, join, relative } from 'node:path';

export type RepoType = 'model' | 'dataset';

/** The cache folder: `HF_HUB_CACHE`, else `HF_HOME/hub`, else `~/.cache/huggingface/hub` (as huggingface_hub). */
export function hubCacheDir(env: NodeJS.ProcessEnv = process.env): string {
  if (env.HF_HUB_CACHE) return env.HF_HUB_CACHE;
  if (env.HUGGINGFACE_HUB_CACHE) return env.HUGGINGFACE_HUB_CACHE;
  const home = env.HF_HOME ?? join(env.XDG_CACHE_HOME ?? join(homedir(), '.cache'), 'huggingface');
  return join(home, 'hub');
}

/** `models--ORG--NAME` / `datasets--ORG--NAME`. */
export function repoFolderName(type: RepoType, repo: string): string {
  return [`${type}s`, ...repo.split('/')].join('--');
}

export const COMMIT = /^[0-9a-f]{40}$/;

/** One repo's folder in the cache. */
export class CachedRepo {
  readonly dir: string;
  constructor(
    readonly cacheDir: string,
    readonly type: RepoType,
    readonly repo: string,
  ) {
    this.dir = join(cacheDir, repoFolderName(type, repo));
  }

  /** The commit a revision names in the cache: itself when it is one, else refs/<revision>; null when unknown here. */
  commitOf(revision: string): string | null {
    if (COMMIT.test(revision)) return existsSync(this.snapshotDir(revision)) ? revision : null;
    const ref = join(this.dir, 'refs', revision);
    if (!existsSync(ref) || !statSync(ref).isFile()) return null;
    const sha = readFileSync(ref, 'utf8').trim();
    return COMMIT.test(sha) ? sha : null;
  }

  /** Records that `revision` points to `commit` (not for a commit itself, as huggingface_hub). */
  writeRef(revision: string, commit: string): void {
    if (revision === commit) return;
    const ref = join(this.dir, 'refs', revision);
    mkdirSync(dirname(ref), { recursive: true });
    const tmp = `${ref}.${process.pid}.tmp`;
    writeFileSync(tmp, commit);
    renameSync(tmp, ref);
  }

  snapshotDir(commit: string): string {
    return join(this.dir, 'snapshots', commit);
  }

  blobPath(etag: string): string {
    return join(this.dir, 'blobs', etag);
  }

  /** The snapshot's path of a file, when it is there and its link leads to a blob that exists. */
  file(commit: string, path: string): string | null {
    const p = join(this.snapshotDir(commit), path);
    try {
      return statSync(p).isFile() ? p : null;
    } catch {
      return null;
    }
  }

  /** Every file of a snapshot (relative paths, sorted), following its links. */
  files(commit: string): string[] {
    const root = this.snapshotDir(commit);
    const out: string[] = [];
    const walk = (rel: string): void => {
      for (const name of readdirSync(join(root, rel))) {
        const r = rel ? `${rel}/${name}` : name;
        let st;
        try {
          st = statSync(join(root, r));
        } catch {
          continue; // a link to a missing blob is not a file of the snapshot
        }
        if (st.isDirectory()) walk(r);
        else if (st.isFile()) out.push(r);
      }
    };
    if (existsSync(root)) walk('');
    return out.sort();
  }

  /** Links snapshots/<commit>/<path> to blobs/<etag> with a relative link (a copy where links are refused). */
  link(commit: string, path: string, etag: string): string {
    const dst = join(this.snapshotDir(commit), path);
    const blob = this.blobPath(etag);
    mkdirSync(dirname(dst), { recursive: true });
    try {
      if (lstatSync(dst)) rmSync(dst, { force: true });
    } catch {
      // not there yet
    }
    try {
      symlinkSync(relative(dirname(dst), blob), dst);
    } catch {
      copyFileSync(blob, dst);
    }
    return dst;
  }
}
