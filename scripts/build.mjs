// `npm run build` (and `npm pack`, through prepack): compiles the library and the CLI to ESM JavaScript
// with .d.ts in dist/ (tsconfig.build.json), then copies the plain-JavaScript workers and probes the
// compiled modules load by URL. Plain JavaScript, so it runs before anything is built.
// It builds into a temporary folder and puts it in dist/'s place at the end, so a process running
// from dist/ meanwhile (the tests run the CLI from it while test/package.test.ts packs) never finds
// it half-written or gone.
import { execFileSync } from 'node:child_process';
import { copyFileSync, mkdirSync, renameSync, rmSync, writeFileSync } from 'node:fs';
import { createRequire } from 'node:module';
import { dirname, join } from 'node:path';
import { fileURLToPath } from 'node:url';

const root = join(dirname(fileURLToPath(import.meta.url)), '..');
const dist = join(root, 'dist');
/** Loaded with `new URL('./x.mjs', import.meta.url)`, so tsc does not see them. */
const ASSETS = ['datasets/parquet-reader.mjs', 'datasets/parquet-worker.mjs', 'src/runtime/placement-probe.mjs', 'src/demos/lookup-agent.mjs', 'scripts/bench/serve-client.mjs'];

const out = `${dist}.building-${process.pid}`;
const old = `${dist}.old-${process.pid}`;
rmSync(out, { recursive: true, force: true });
const tsc = createRequire(import.meta.url).resolve('typescript/bin/tsc');
try {
  execFileSync(process.execPath, [tsc, '-p', join(root, 'tsconfig.build.json'), '--outDir', out], { stdio: 'inherit', cwd: root });
  for (const f of ASSETS) {
    mkdirSync(dirname(join(out, f)), { recursive: true });
    copyFileSync(join(root, f), join(out, f));
  }
  // When the sources were last built (test/global-setup.ts rebuilds when a source is newer).
  writeFileSync(join(out, '.built'), `${new Date().toISOString()}\n`);
} catch (e) {
  rmSync(out, { recursive: true, force: true });
  throw e;
}
let moved = false;
try {
  renameSync(dist, old);
  moved = true;
} catch {
  // No dist/ yet.
}
renameSync(out, dist);
if (moved) rmSync(old, { recursive: true, force: true });
