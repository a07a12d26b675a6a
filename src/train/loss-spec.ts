/**
 * `--loss dpo` or a weighted mixture `--loss dpo:0.8,bco_pair:0.2,sft:1` plus the run's loss
 * parameters → loss terms. A parameter goes to every term that declares it; one that no term
 * declares is an error naming the losses.
 */
import { UserError } from '../cli/errors.ts';
import { getLoss } from '../../losses/index.ts';
import { findSpec, parseParams } from '../../losses/params.ts';
import type { LossTerm } from './graph.ts';

export function resolveLossTerms(spec: string, raw: Record<string, unknown>): LossTerm[] {
  const parts = spec.split(',').map((s) => s.trim()).filter(Boolean);
  if (parts.length === 0) throw new UserError('--loss: give a loss name, e.g. dpo, or a mixture such as dpo:0.8,sft:0.2');
  const terms = parts.map((part) => {
    const [name, w, extra] = part.split(':');
    if (extra !== undefined) throw new UserError(`--loss: "${part}" should be NAME or NAME:WEIGHT`);
    const weight = w === undefined ? 1 : Number(w);
    if (!Number.isFinite(weight) || weight <= 0) throw new UserError(`--loss: weight of ${name} must be a number > 0, got "${w}"`);
    return { name: name.trim(), weight, loss: getLoss(name.trim()) };
  });
  const names = new Set<string>();
  for (const t of terms) {
    if (names.has(t.name)) throw new UserError(`--loss: ${t.name} appears twice`);
    names.add(t.name);
  }
  for (const k of Object.keys(raw)) {
    if (!terms.some((t) => findSpec(t.loss.params, k))) {
      throw new UserError(`--param ${k}: not a training setting, and no loss of "${spec}" has such a parameter (see \`prefzoo train --help\` and \`prefzoo loss --help\`)`);
    }
  }
  return terms.map((t) => {
    const own = Object.fromEntries(Object.entries(raw).filter(([k]) => findSpec(t.loss.params, k)));
    const params = parseParams(t.name, t.loss.params, own);
    t.loss.check?.(params);
    return { name: t.name, weight: t.weight, loss: t.loss, params };
  });
}
