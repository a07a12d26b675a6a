/**
 * Writes docs/settings.md from the settings tables (src/train/settings.ts and the online methods') and the reward registry; `--check` only says
 * whether the page is up to date (exit 1 when not). test/settings.test.ts fails on a stale page.
 */
import { readFileSync } from 'node:fs';
import { join } from 'node:path';
import { writeFileAtomic } from '../src/io/atomic.ts';
import { settingsPage } from '../src/online/settings-page.ts';

const file = join(import.meta.dirname, '..', 'docs', 'settings.md');
const text = settingsPage();
if (process.argv.includes('--check')) {
  let old = '';
  try {
    old = readFileSync(file, 'utf8');
  } catch {
    // missing: stale
  }
  if (old !== text) {
    process.stderr.write(`${file} is out of date; run node --import tsx scripts/settings-doc.ts\n`);
    process.exit(1);
  }
  process.stdout.write(`${file} is up to date\n`);
} else {
  writeFileAtomic(file, text);
  process.stdout.write(`wrote ${file}\n`);
}
