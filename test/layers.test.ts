import { describe, it, expect } from 'vitest';
import { mkdirSync, mkdtempSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { checkLayers, importCircles, shortestCircle } from '../scripts/layers.ts';

const root = join(import.meta.dirname, '..');

describe('layers (docs/architecture.md)', () => {
  it('no import runs upward outside the CLI and scripts, and no two folders import each other', () => {
    const r = checkLayers(root);
    expect(r.upward.map((e) => `${e.from} → ${e.to}`)).toEqual([]);
    expect(r.mutual).toEqual([]);
  });

  it('no circle of imports between files, type-only imports included', () => {
    expect(importCircles(root).map((c) => shortestCircle(root, c).join(' → '))).toEqual([]);
  });

  it('sees a circle of type-only imports inside a folder, and the shortest way round it', () => {
    const dir = mkdtempSync(join(tmpdir(), 'prefzoo-circles-'));
    for (const d of ['src/models', 'losses', 'datasets', 'scripts']) mkdirSync(join(dir, d), { recursive: true });
    writeFileSync(join(dir, 'src/models/family.ts'), "import type { Params } from './params.ts';\nimport type { X } from './other.ts';\n");
    writeFileSync(join(dir, 'src/models/params.ts'), "import { read } from './config.ts';\n");
    writeFileSync(join(dir, 'src/models/config.ts'), "import {\n  type Family,\n} from './family.ts';\n");
    writeFileSync(join(dir, 'src/models/other.ts'), 'export type X = number;\n');
    writeFileSync(join(dir, 'src/models/leaf.ts'), "export { read } from './config.ts';\n");
    const circles = importCircles(dir);
    expect(circles).toEqual([['src/models/config.ts', 'src/models/family.ts', 'src/models/params.ts']]);
    expect(shortestCircle(dir, circles[0])).toEqual(['src/models/config.ts', 'src/models/family.ts', 'src/models/params.ts', 'src/models/config.ts']);
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
