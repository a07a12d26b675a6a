#!/usr/bin/env node
// Entry point of the `prefzoo` command.
// - Installed from the package: runs the compiled JavaScript in dist/ (no TypeScript at run time).
// - In a clone (src/ beside this folder and tsx installed): runs the TypeScript sources through tsx, so
//   an edit needs no build and a stale dist/ is never run. PREFZOO_DIST=1 runs dist/ there too.
import { existsSync } from 'node:fs';

const root = new URL('../', import.meta.url);
const source = new URL('src/cli/main.ts', root);
const compiled = new URL('dist/src/cli/main.js', root);

let entry = compiled;
if (process.env.PREFZOO_DIST !== '1' && existsSync(source)) {
  try {
    const { register } = await import('tsx/esm/api');
    register();
    entry = source;
  } catch {
    // No tsx (a production install of a clone): fall back to dist/.
  }
}
if (entry === compiled && !existsSync(compiled)) {
  process.stderr.write('prefzoo: dist/ is missing; run `npm run build` (or `npm install`, which builds it) in the package folder\n');
  process.exit(1);
}
const { main } = await import(entry.href);
await main(process.argv);
