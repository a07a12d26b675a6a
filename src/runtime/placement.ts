/**
 * Where ONNX Runtime places each node of a graph: per execution provider, how many nodes, and which
 * ran on the CPU instead of the device (a "fallback": a kernel the provider lacks for that op or
 * type; each one costs a device↔host copy on both sides). ONNX Runtime states the placement only in
 * its verbose log, written natively to stderr, so the session is opened once in a child process.
 */
import { spawn } from 'node:child_process';
import { fileURLToPath } from 'node:url';
import { UserError } from '../errors.ts';
import { sessionOptions, type RuntimeOptions } from './session.ts';

export interface Placement {
  /** Nodes per execution provider, e.g. { WebGpuExecutionProvider: 412, CPUExecutionProvider: 0 }. */
  nodes: Record<string, number>;
  /** The nodes placed on the CPU provider when another was asked for: `OpType (node name)`. */
  fallbacks: { op: string; name: string }[];
}

const PROBE = fileURLToPath(new URL('./placement-probe.mjs', import.meta.url));
const HEADER = /Node\(s\) placed on \[(\w+)\]\. Number of nodes: (\d+)/;
const ITEM = /VerifyEachNodeIsAssignedToAnEp\]\s{3}(\S+) \((.*)\)\s*$/;

/** Placement of the model file `model` under `runtime` (its provider, options and threads). */
export async function placement(model: string, runtime: RuntimeOptions): Promise<Placement> {
  const opts = sessionOptions(runtime);
  const stderr = await new Promise<string>((resolve, reject) => {
    const child = spawn(process.execPath, [PROBE, model, JSON.stringify(opts)], { stdio: ['ignore', 'ignore', 'pipe'] });
    let text = '';
    child.stderr.setEncoding('utf8');
    child.stderr.on('data', (d: string) => (text += d));
    child.on('error', reject);
    child.on('close', () => resolve(text));
  });
  const failed = stderr.split('\n').find((l) => l.startsWith('placement-probe-error: '));
  if (failed) throw new UserError(`${model}: ${failed.slice('placement-probe-error: '.length)}`);
  const nodes: Record<string, number> = {};
  const fallbacks: Placement['fallbacks'] = [];
  const device = (runtime.ep ?? 'cpu') !== 'cpu';
  let current = '';
  for (const line of stderr.split('\n')) {
    const h = HEADER.exec(line);
    if (h) {
      current = h[1];
      nodes[current] = Number(h[2]);
      continue;
    }
    const it = ITEM.exec(line);
    if (it && device && current === 'CPUExecutionProvider') fallbacks.push({ op: it[1], name: it[2] });
  }
  if (Object.keys(nodes).length === 0) {
    // ONNX Runtime logs nothing per provider when every node went to the one provider asked for.
    const all = /All nodes placed on \[(\w+)\]\. Number of nodes: (\d+)/.exec(stderr);
    if (all) nodes[all[1]] = Number(all[2]);
  }
  return { nodes, fallbacks };
}

/** `WebGpuExecutionProvider 412, CPUExecutionProvider 3 (Sum ×2, NonZero)` — for logs. */
export function describePlacement(p: Placement): string {
  const counts = Object.entries(p.nodes).map(([ep, n]) => `${ep.replace('ExecutionProvider', '')} ${n}`).join(', ');
  if (p.fallbacks.length === 0) return counts;
  const byOp = new Map<string, number>();
  for (const f of p.fallbacks) byOp.set(f.op, (byOp.get(f.op) ?? 0) + 1);
  return `${counts} (CPU fallbacks: ${[...byOp].map(([op, n]) => (n > 1 ? `${op} ×${n}` : op)).join(', ')})`;
}
