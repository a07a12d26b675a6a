#!/usr/bin/env node
// Entry point: runs the TypeScript sources directly through tsx, so no build step is needed.
import { register } from 'tsx/esm/api';
import { fileURLToPath } from 'node:url';
import { dirname, join } from 'node:path';

register();
const here = dirname(fileURLToPath(import.meta.url));
const { main } = await import(join(here, '..', 'src', 'cli', 'main.ts'));
await main(process.argv);
