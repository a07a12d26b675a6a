import { describe, it, expect } from 'vitest';
import { mkdirSync, mkdtempSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { checkLayers } from '../scripts/layers.ts';

const root = join(import.meta.dirname, '..');

describe('layers (docs/architecture.md)', () => {
  it('no import runs upward outside the CLI and scripts, and no two folders import each other', () => {
    const r = checkLayers(root);
    expect(r.upward.map((e) => `${e.from} → ${e.to}`)).toEqual([]);
    expect(r.mutual).toEqual([]);
  });

  it('sees an upward import and a pair of folders importing each other', () => {
    const dir = mkdtempSync(join(tmpdir(), 'prefzoo-layers-'));
    for (const d of ['src/onnx', 'src/models', 'losses', 'datasets', 'scripts']) mkdirSync(join(dir, d), { recursive: true });
    writeFileSync(join(dir, 'src/onnx/graph.ts'), "import { x } from '../models/llama.ts';\n");
    writeFileSync(join(dir, 'src/models/llama.ts'), "import type { G } from '../onnx/graph.ts';\n");
    const r = checkLayers(dir);
    expect(r.upward.map((e) => `${e.from} → ${e.to}`)).toEqual(['src/onnx/graph.ts → src/models/llama.ts']);
    expect(r.mutual).toEqual([['src/models', 'src/onnx']]);
  });
});
