/** Parsers shared by the commands' flags; errors name the flag and what it takes. */
import { UserError } from '../errors.ts';
import { EXECUTION_PROVIDERS, type ExecutionProvider } from '../runtime/session.ts';

/** `--device`'s help text, the same on every command. */
export const DEVICE_HELP = 'cpu, webgpu (any Vulkan GPU; bundled, nothing to install) or cuda (needs the CUDA build of onnxruntime-node)';

/** The `--device` flag: one of the execution providers. */
export function device(v: string): ExecutionProvider {
  if (!(EXECUTION_PROVIDERS as readonly string[]).includes(v)) throw new UserError(`--device must be ${EXECUTION_PROVIDERS.join(', ')}; got "${v}"`);
  return v as ExecutionProvider;
}

/** Commander collector for a repeatable flag (`--param a=1 --param b=2`). */
export function collect(v: string, prev: string[]): string[] {
  return [...prev, v];
}

/** A positive integer flag; `dflt` when the flag was not given. */
export function positiveInt(flag: string, v: string | undefined, dflt: number): number;
export function positiveInt(flag: string, v: string | undefined): number | undefined;
export function positiveInt(flag: string, v: string | undefined, dflt?: number): number | undefined {
  if (v === undefined) return dflt;
  if (!/^\d+$/.test(v.trim()) || Number(v) < 1) throw new UserError(`${flag} must be a positive integer, got "${v}"`);
  return Number(v);
}
