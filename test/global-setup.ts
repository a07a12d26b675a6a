/**
 * Before the tests: dist/ built from the current sources. The tests run the CLI as the compiled
 * package runs it (vitest.config.ts sets PREFZOO_DIST=1): the same code as the sources through tsx,
 * without tsx's start-up on each of the suite's hundreds of CLI runs. dist/ is rebuilt only when a
 * source, the build script or a tsconfig is newer than its last build (dist/.built), so the tests
 * never run a stale build.
 */
import { execFileSync } from 'node:child_process';
import { existsSync, readdirSync, statSync } from 'node:fs';
import { join, resolve } from 'node:path';

const root = resolve(__dirname, '..');

function newest(path: string): number {
  if (!existsSync(path)) return 0;
  const st = statSync(path);
  if (!st.isDirectory()) return st.mtimeMs;
  let m = st.mtimeMs;
  for (const e of readdirSync(path)) m = Math.max(m, newest(join(path, e)));
  return m;
}

export default function setup(): void {
  const stamp = join(root, 'dist', '.built');
  const sources = ['src', 'datasets', 'losses', 'scripts', 'package.json', 'tsconfig.json', 'tsconfig.build.json'].map((p) => newest(join(root, p)));
  if (existsSync(stamp) && statSync(stamp).mtimeMs >= Math.max(...sources)) return;
  execFileSync(process.execPath, [join(root, 'scripts', 'build.mjs')], { stdio: 'inherit', cwd: root });
}
