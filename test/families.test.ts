import { describe, it, expect } from 'vitest';
import { mkdtempSync, readdirSync, readFileSync, statSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join, relative } from 'node:path';
import { buildProgram } from '../src/cli/main.ts';
import { UserError } from '../src/errors.ts';
import { parseConfig, presetConfig } from '../src/models/config.ts';
import { ARCHES, familyOf, registerFamily } from '../src/models/families.ts';
import type { Family } from '../src/models/family.ts';

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

/** The slots every family must fill (the optional ones: normalizeName, normInit, initStd, released, onnx, gguf). */
const METHODS = ['parse', 'preset', 'hiddenSize', 'numLayers', 'maxPositions', 'parameterShapes', 'window', 'hidden', 'headWeight', 'decode', 'cacheShape', 'projections'] as const;

describe('every registered family', () => {
  it.each(ARCHES.slice())('%s fills every required slot, consistently with its tiny preset', (type) => {
    const f = familyOf(type);
    expect(f.model_type).toBe(type);
    expect(f.hfClass).toMatch(/^[A-Z]\w+$/);
    expect(typeof f.learnedPositions).toBe('boolean');
    for (const m of METHODS) expect(typeof f[m], m).toBe('function');
    const c = presetConfig(type, 'tiny', { vocabSize: 300 });
    expect(c.model_type).toBe(type);
    expect(c.architectures).toEqual([f.hfClass]);
    const shapes = f.parameterShapes(c);
    expect(shapes.get(f.embedding)).toEqual([c.vocab_size, f.hiddenSize(c)]);
    // Every LoRA target is a weight of the checkpoint, with the shape its layout says.
    const mods = f.projections(c);
    expect(mods.length).toBeGreaterThan(0);
    for (const m of mods) expect(shapes.get(`${m.name}.weight`), m.name).toEqual(m.layout === 'linear' ? [m.out, m.in] : [m.in, m.out]);
    expect(f.cacheShape(c).layers).toBe(f.numLayers(c));
    expect(f.maxPositions(c)).toBeGreaterThan(0);
    for (const [name, shape] of Object.entries(f.released ?? {})) expect(shape.model_type, name).toBe(type);
  });

  it('an unknown model_type is one line naming it and the supported ones', () => {
    let err: unknown;
    try {
      parseConfig({ model_type: 'bert' }, 'm/config.json');
    } catch (e) {
      err = e;
    }
    expect(err).toBeInstanceOf(UserError);
    expect((err as Error).message).toBe(`m/config.json: model_type "bert" is not supported (supported: ${ARCHES.join(', ')})`);
  });
});

/** Runs the prefzoo command line in this process (so it sees families registered here). */
async function prefzoo(...args: string[]): Promise<void> {
  await (await buildProgram([args[0]])).parseAsync(['node', 'prefzoo', ...args]);
}

describe('adding a family is one family object and one registry entry', () => {
  it.each([
    ['llama', 'toyllama'],
    ['phi3', 'toyphi3'],
    ['gpt2', 'toygpt2'],
  ])('a renamed copy of %s registered as %s runs init-model and logps as the original does', async (from, to) => {
    expect(() => parseConfig({ model_type: to })).toThrow(`model_type "${to}" is not supported`);
    const copy: Family = { ...familyOf(from), model_type: to };
    registerFamily(copy);
    expect(familyOf(to)).toBe(copy);
    expect(() => registerFamily(copy)).toThrow(/already registered/);

    const dir = mkdtempSync(join(tmpdir(), 'prefzoo-family-'));
    const input = join(dir, 'rows.jsonl');
    writeFileSync(input, ['{"input_ids":[5,9,14,3,27,8,11],"loss_mask":[0,0,1,1,1,1,1]}', '{"input_ids":[40,2,7],"loss_mask":[0,1,1]}'].join('\n') + '\n');
    const out: Record<string, string> = {};
    for (const arch of [from, to]) {
      await prefzoo('init-model', '--arch', arch, '--preset', 'tiny', '--seed', '3', '-o', join(dir, arch));
      expect(JSON.parse(readFileSync(join(dir, arch, 'config.json'), 'utf8')).model_type).toBe(arch);
      await prefzoo('logps', '--model', join(dir, arch), '--input', input, '--threads', '1', '-o', join(dir, `${arch}.jsonl`));
      out[arch] = readFileSync(join(dir, `${arch}.jsonl`), 'utf8');
    }
    expect(out[to].trim().split('\n')).toHaveLength(2);
    expect(out[to]).toBe(out[from]);
  });
});
