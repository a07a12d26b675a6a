import { describe, it, expect } from 'vitest';
import { readdirSync, readFileSync, statSync } from 'node:fs';
import { join, relative } from 'node:path';

const root = join(import.meta.dirname, '..');

function sources(dir: string): string[] {
  return readdirSync(dir).flatMap((n) => {
    const p = join(dir, n);
    return statSync(p).isDirectory() ? sources(p) : p.endsWith('.ts') ? [p] : [];
  });
}

/** Files allowed to name a model_type in a comparison: the family files and the registry. */
const FAMILY_FILES = ['llama', 'qwen3', 'gemma', 'mistral', 'phi3', 'gpt2', 'families'].map((n) => `src/models/${n}.ts`);
const KNOWN_TYPES = ['llama', 'qwen2', 'qwen3', 'mistral', 'gemma', 'phi3', 'gpt2'];
const DISPATCH = [
  /model_type\s*[!=]==?/,
  /[!=]==?\s*[\w.?]*model_type\b/,
  /switch\s*\([^)]*model_type/,
  new RegExp(`[!=]==?\\s*['"\`](${KNOWN_TYPES.join('|')})['"\`]`),
  new RegExp(`['"\`](${KNOWN_TYPES.join('|')})['"\`]\\s*[!=]==?`),
  new RegExp(`case\\s*['"\`](${KNOWN_TYPES.join('|')})['"\`]`),
];

describe('one description per architecture', () => {
  it('no code outside the family files and the registry dispatches on model_type', () => {
    const found: string[] = [];
    for (const file of [...sources(join(root, 'src')), ...sources(join(root, 'scripts'))]) {
      const rel = relative(root, file);
      if (FAMILY_FILES.includes(rel)) continue;
      readFileSync(file, 'utf8')
        .split('\n')
        .forEach((line, i) => {
          if (DISPATCH.some((re) => re.test(line))) found.push(`${rel}:${i + 1}: ${line.trim()}`);
        });
    }
    expect(found).toEqual([]);
  });
});
