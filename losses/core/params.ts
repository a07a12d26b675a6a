/**
 * Loss parameters: typed specs with defaults, parsing from CLI strings or config values, and
 * range checks whose messages name the parameter and its valid range.
 */
import { BadInputError, UserError } from '../../src/errors.ts';
import type { ParamSpec, ParamValue, Params } from './types.ts';

/** A human-readable valid range, e.g. "(0, ∞)" or "[0, 0.5)" or "one of lambda, list_mle". */
export function describeRange(s: ParamSpec): string {
  if (s.type === 'boolean') return 'true or false';
  if (s.type === 'enum') return `one of ${s.choices!.join(', ')}`;
  const lo = s.min === undefined ? '(-∞' : `${s.minOpen ? '(' : '['}${s.min}`;
  const hi = s.max === undefined ? '∞)' : `${s.max}${s.maxOpen ? ')' : ']'}`;
  return `${s.type === 'integer' ? 'an integer in ' : ''}${lo}, ${hi}`;
}

function inRange(s: ParamSpec, v: number): boolean {
  if (!Number.isFinite(v)) return false;
  if (s.type === 'integer' && !Number.isInteger(v)) return false;
  if (s.min !== undefined && (s.minOpen ? v <= s.min : v < s.min)) return false;
  if (s.max !== undefined && (s.maxOpen ? v >= s.max : v > s.max)) return false;
  return true;
}

/** Converts one raw value (string from the CLI, or a JSON value) to the spec's type, or throws. */
export function coerceParam(s: ParamSpec, raw: unknown, where: string): ParamValue {
  const bad = () =>
    new BadInputError(`${where}parameter ${s.name} must be ${describeRange(s)}, got ${JSON.stringify(raw)}`, { setting: s.name });
  if (raw === null) {
    if (s.default === null) return null;
    throw bad();
  }
  switch (s.type) {
    case 'boolean': {
      if (typeof raw === 'boolean') return raw;
      if (raw === 'true' || raw === '1' || raw === 1) return true;
      if (raw === 'false' || raw === '0' || raw === 0) return false;
      throw bad();
    }
    case 'enum': {
      if (typeof raw === 'string' && s.choices!.includes(raw)) return raw;
      throw bad();
    }
    default: {
      const v = typeof raw === 'number' ? raw : typeof raw === 'string' && raw.trim() !== '' ? Number(raw) : NaN;
      if (!inRange(s, v)) throw bad();
      return v;
    }
  }
}

/** Finds the spec a name (or alias) refers to. */
export function findSpec(specs: readonly ParamSpec[], name: string): ParamSpec | undefined {
  return specs.find((s) => s.name === name || (s.aliases ?? []).includes(name));
}

/**
 * Fills defaults and checks every given parameter. Unknown names are an error listing the valid ones.
 * `raw` values may be strings (CLI) or numbers/booleans (config files).
 */
export function parseParams(lossName: string, specs: readonly ParamSpec[], raw: Record<string, unknown>): Params {
  const out: Params = {};
  for (const s of specs) out[s.name] = s.default;
  const seen = new Map<string, string>();
  for (const [k, v] of Object.entries(raw)) {
    const s = findSpec(specs, k);
    if (!s) {
      const valid = specs.map((p) => p.name).join(', ') || '(none)';
      throw new BadInputError(`unknown parameter "${k}" for loss ${lossName}; valid parameters: ${valid}`, { setting: k });
    }
    const prev = seen.get(s.name);
    if (prev !== undefined) throw new UserError(`parameter ${s.name} of loss ${lossName} is given twice (as ${prev} and ${k})`);
    seen.set(s.name, k);
    out[s.name] = coerceParam(s, v, `loss ${lossName}: `);
  }
  return out;
}

/** Parses `--param k=v` strings into a raw map (values stay strings; each loss coerces its own). */
export function parseParamArgs(args: readonly string[]): Record<string, string> {
  const out: Record<string, string> = {};
  for (const a of args) {
    const eq = a.indexOf('=');
    if (eq <= 0) throw new UserError(`--param expects name=value, got "${a}"`);
    const k = a.slice(0, eq).trim();
    if (k in out) throw new UserError(`--param ${k} is given twice`);
    out[k] = a.slice(eq + 1).trim();
  }
  return out;
}

/** Spec shorthands used by the loss modules. */
export const spec = {
  beta: (dflt = 0.1, doc = 'inverse temperature β of the implicit reward β·ℓ'): ParamSpec => ({
    name: 'beta', type: 'number', default: dflt, min: 0, minOpen: true, doc,
  }),
  labelSmoothing: (max = 0.5, maxOpen = false, dflt = 0, doc = 'label smoothing ε (conservative DPO)'): ParamSpec => ({
    name: 'label_smoothing', type: 'number', default: dflt, min: 0, max, maxOpen, doc,
  }),
};
