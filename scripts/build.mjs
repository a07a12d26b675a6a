// `npm run build` (and `npm pack`, through prepack): compiles the library and the CLI to ESM JavaScript
// with .d.ts in dist/ (tsconfig.build.json), then copies the plain-JavaScript workers and probes the
// compiled modules load by URL. Plain JavaScript, so it runs before anything is built.
import { execFileSync } from 'node:child_process';
import { copyFileSync, mkdirSync, rmSync } from 'node:fs';
import { createRequire } from 'node:module';
import { dirname, join } from 'node:path';
import { fileURLToPath } from 'node:url';

const root = join(dirname(fileURLToPath(import.meta.url)), '..');
const dist = join(root, 'dist');
/** Loaded with `new URL('./x.mjs', import.meta.url)`, so tsc does not see them. */
const ASSETS = ['datasets/parquet-reader.mjs', 'datasets/parquet-worker.mjs', 'src/runtime/placement-probe.mjs', 'src/demos/lookup-agent.mjs'];

rmSync(dist, { recursive: true, force: true });
const tsc = createRequire(import.meta.url).resolve('typescript/bin/tsc');
execFileSync(process.execPath, [tsc, '-p', join(root, 'tsconfig.build.json')], { stdio: 'inherit', cwd: root });
for (const f of ASSETS) {
  mkdirSync(dirname(join(dist, f)), { recursive: true });
  copyFileSync(join(root, f), join(dist, f));
}
