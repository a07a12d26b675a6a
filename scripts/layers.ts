/**
 * The layering check of docs/architecture.md: reads every relative import of src/, losses/,
 * datasets/ and scripts/, and lists (1) imports that run to a higher floor than the importer's, except
 * from the CLI and scripts, which stand on top, (2) pairs of folders that import each other and (3)
 * circles of imports between files, inside a folder too, `import type` included.
 *
 *   node --import tsx scripts/layers.ts          prints the folder graph and the three lists; exit 1 if any is non-empty
 */
import { readdirSync, readFileSync, statSync } from 'node:fs';
import { dirname, join, normalize, relative } from 'node:path';
import { fileURLToPath } from 'node:url';

/** Floors from the ground up; a folder may import its own floor and those below. */
export const FLOORS: readonly (readonly string[])[] = [
  ['src/errors.ts', 'src/progress.ts', 'src/random.ts', 'src/chat.ts', 'src/io'],
  ['src/onnx', 'src/hub'],
  ['src/runtime'],
  ['src/autodiff', 'src/optim'],
  ['src/tokenize'],
  ['datasets'],
  ['losses', 'src/models'],
  ['src/artifacts', 'src/export'],
  ['src/eval'],
  ['src/train'],
  ['src/online', 'src/agents', 'src/serve'],
  ['src/demos'],
  ['src/index.ts', 'src/cli', 'scripts'],
];

/** Where imports may run upward: the command line and the scripts draw on every layer. */
const TOP = new Set(['src/cli', 'scripts']);

const ROOTS = ['src', 'losses', 'datasets', 'scripts'];

/** The room a file belongs to: a folder under src/, a top-level folder, or a file directly in src/. */
export function roomOf(file: string): string {
  const parts = file.split('/');
  if (parts[0] === 'src') return parts.length > 2 ? `src/${parts[1]}` : file;
  return parts[0];
}

export function floorOf(room: string): number {
  const i = FLOORS.findIndex((f) => f.includes(room));
  if (i < 0) throw new Error(`${room} is on no floor of scripts/layers.ts: add it`);
  return i;
}

function walk(root: string, dir: string, out: string[]): void {
  for (const name of readdirSync(join(root, dir))) {
    const rel = join(dir, name);
    if (statSync(join(root, rel)).isDirectory()) walk(root, rel, out);
    else if (/\.(ts|mjs)$/.test(name)) out.push(rel);
  }
}

export interface Edge {
  from: string;
  to: string;
}

/** Every relative import between two different rooms, as file → file (paths relative to `root`). */
export function importEdges(root: string): Edge[] {
  const files: string[] = [];
  for (const r of ROOTS) walk(root, r, files);
  const spec = /(?:from\s+|import\s*\(\s*|import\s+)['"](\.{1,2}\/[^'"]+)['"]/g;
  const edges: Edge[] = [];
  for (const from of files) {
    for (const m of readFileSync(join(root, from), 'utf8').matchAll(spec)) {
      const to = normalize(join(dirname(from), m[1]));
      if (roomOf(to) !== roomOf(from)) edges.push({ from, to });
    }
  }
  return edges;
}

/** Every relative import, within a room too, as file → file (only files that exist: `.ts`/`.mjs` sources). */
export function fileEdges(root: string): Edge[] {
  const files: string[] = [];
  for (const r of ROOTS) walk(root, r, files);
  const known = new Set(files);
  const spec = /(?:from\s+|import\s*\(\s*|import\s+)['"](\.{1,2}\/[^'"]+)['"]/g;
  const edges: Edge[] = [];
  for (const from of files) {
    for (const m of readFileSync(join(root, from), 'utf8').matchAll(spec)) {
      const to = normalize(join(dirname(from), m[1]));
      if (known.has(to)) edges.push({ from, to });
    }
  }
  return edges;
}

/**
 * Circles of imports between files, `import type` included (a type-only circle still ties the files
 * together: none of them can be read, moved or tested without the others). Each is one strongly
 * connected component of the file graph, its files sorted.
 */
export function importCircles(root: string): string[][] {
  const next = new Map<string, string[]>();
  for (const e of fileEdges(root)) {
    const row = next.get(e.from) ?? [];
    if (!row.includes(e.to)) row.push(e.to);
    next.set(e.from, row);
  }
  // Tarjan's strongly connected components, iteratively (no recursion limit on deep chains).
  const index = new Map<string, number>();
  const low = new Map<string, number>();
  const onStack = new Set<string>();
  const stack: string[] = [];
  const components: string[][] = [];
  let counter = 0;
  for (const start of [...next.keys()].sort()) {
    if (index.has(start)) continue;
    const work: [string, number][] = [[start, 0]];
    while (work.length) {
      const top = work[work.length - 1];
      const [v, i] = top;
      if (i === 0) {
        index.set(v, counter);
        low.set(v, counter++);
        stack.push(v);
        onStack.add(v);
      }
      const out = next.get(v) ?? [];
      if (i < out.length) {
        top[1]++;
        const w = out[i];
        if (!index.has(w)) work.push([w, 0]);
        else if (onStack.has(w)) low.set(v, Math.min(low.get(v)!, index.get(w)!));
        continue;
      }
      work.pop();
      if (work.length) {
        const parent = work[work.length - 1][0];
        low.set(parent, Math.min(low.get(parent)!, low.get(v)!));
      }
      if (low.get(v) === index.get(v)) {
        const comp: string[] = [];
        let w: string;
        do {
          w = stack.pop()!;
          onStack.delete(w);
          comp.push(w);
        } while (w !== v);
        if (comp.length > 1 || (next.get(v) ?? []).includes(v)) components.push(comp.sort());
      }
    }
  }
  return components.sort((a, b) => a[0].localeCompare(b[0]));
}

/** The shortest circle through `file` inside `component` (breadth-first), as file → … → file. */
export function shortestCircle(root: string, component: string[]): string[] {
  const inside = new Set(component);
  const next = new Map<string, string[]>();
  for (const e of fileEdges(root)) if (inside.has(e.from) && inside.has(e.to)) next.set(e.from, [...(next.get(e.from) ?? []), e.to]);
  const start = component[0];
  const prev = new Map<string, string>();
  const queue = [start];
  while (queue.length) {
    const v = queue.shift()!;
    for (const w of next.get(v) ?? []) {
      if (w === start) {
        const path = [v];
        while (path[0] !== start) path.unshift(prev.get(path[0])!);
        return [...path, start];
      }
      if (!prev.has(w)) {
        prev.set(w, v);
        queue.push(w);
      }
    }
  }
  return [start, start];
}

export interface LayerReport {
  /** room → rooms it imports, with counts. */
  graph: Map<string, Map<string, number>>;
  upward: Edge[];
  mutual: [string, string][];
}

export function checkLayers(root: string): LayerReport {
  const edges = importEdges(root);
  const graph = new Map<string, Map<string, number>>();
  for (const e of edges) {
    const a = roomOf(e.from);
    const b = roomOf(e.to);
    const row = graph.get(a) ?? new Map<string, number>();
    row.set(b, (row.get(b) ?? 0) + 1);
    graph.set(a, row);
  }
  const upward = edges.filter((e) => !TOP.has(roomOf(e.from)) && floorOf(roomOf(e.to)) > floorOf(roomOf(e.from)));
  const mutual: [string, string][] = [];
  for (const [a, row] of graph) for (const b of row.keys()) if (a < b && graph.get(b)?.has(a)) mutual.push([a, b]);
  return { graph, upward, mutual };
}

if (process.argv[1] && fileURLToPath(import.meta.url) === process.argv[1]) {
  const root = join(dirname(fileURLToPath(import.meta.url)), '..');
  const r = checkLayers(root);
  for (const [a, row] of [...r.graph].sort((x, y) => floorOf(y[0]) - floorOf(x[0]) || x[0].localeCompare(y[0]))) {
    const targets = [...row].sort((x, y) => floorOf(y[0]) - floorOf(x[0]) || x[0].localeCompare(y[0]));
    process.stdout.write(`${a} (floor ${floorOf(a)}) → ${targets.map(([b, n]) => `${b} ${n}`).join(', ')}\n`);
  }
  process.stdout.write(`upward imports (outside ${[...TOP].join(', ')}): ${r.upward.length}\n`);
  for (const e of r.upward) process.stdout.write(`  ${relative('.', e.from)} → ${e.to}\n`);
  process.stdout.write(`folders that import each other: ${r.mutual.length}\n`);
  for (const [a, b] of r.mutual) process.stdout.write(`  ${a} ⇄ ${b}\n`);
  const circles = importCircles(root);
  process.stdout.write(`circles of imports between files (import type included): ${circles.length}\n`);
  for (const c of circles) process.stdout.write(`  ${c.length} files: ${shortestCircle(root, c).join(' → ')}${c.length > 2 ? ` (and ${c.join(', ')})` : ''}\n`);
  process.exitCode = r.upward.length || r.mutual.length || circles.length ? 1 : 0;
}
