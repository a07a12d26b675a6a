/**
 * The layering check of docs/architecture.md: reads every relative import of src/, losses/,
 * datasets/ and scripts/, and lists (1) imports that run to a higher floor than the importer's, except
 * from the CLI and scripts, which stand on top, and (2) pairs of folders that import each other.
 *
 *   node --import tsx scripts/layers.ts          prints the folder graph and both lists; exit 1 if either is non-empty
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
  ['src/online', 'src/agents'],
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
  process.exitCode = r.upward.length || r.mutual.length ? 1 : 0;
}
