/**
 * The reward registry of GRPO: one row per kind of `--reward` spec (accuracy, format, length, a
 * module, a command, a reward model), each kind one file of this folder. The `--reward` grammar,
 * `--help`, docs/settings.md's reward section and the library's `RewardSpec` type all come from
 * REWARD_KINDS; a new kind is one file and one `registerRewardKind` (or one row here).
 *
 * Names: each function is logged as `rewards/<name>/mean` under its own name (a module's function
 * name; `accuracy`, `format`, `length`, `cmd`, `reward_model` for the others). Two functions of the
 * same name are told apart by a suffix in `--reward` order: the second is `<name>_2`, the third
 * `<name>_3` (REWARD_NAMING). The same spec given twice is refused.
 *
 * `scoreAll` runs them and checks every answer: a function that throws, answers NaN, ∞ or a
 * non-number, the wrong count, or takes longer than `timeoutSeconds` stops the run with one line
 * naming the function and the prompt row (file and line).
 */
import { UserError } from '../../errors.ts';
import { accuracy } from './accuracy.ts';
import { cmd } from './cmd.ts';
import { format } from './format.ts';
import { length } from './length.ts';
import { model } from './model.ts';
import { module } from './module.ts';
import { RowError, type RewardBatch, type RewardEnv, type RewardFunction, type RewardKind } from './reward.ts';

export { accuracy, cmd, format, length, model, module };
export { answersMatch, asNumber, extractAnswer } from './accuracy.ts';
export { overlongPenalty } from './length.ts';
export { ModelReward } from './model.ts';
export { RowError, type RewardBatch, type RewardEnv, type RewardFunction, type RewardKind, type RewardRow, type UserRewardFn } from './reward.ts';

/** The built-in kinds, in the order a spec is matched (the first row that matches takes it). */
const BUILT_IN = [accuracy, format, length, cmd, model, module] as const;

/** A `--reward` spec of a built-in kind, as a TypeScript type (the library's). */
export type RewardSpec = (typeof BUILT_IN)[number] extends infer K ? (K extends RewardKind<infer S> ? S : never) : never;

const KINDS: RewardKind<string>[] = [...(BUILT_IN as readonly RewardKind<string>[])];

/** Every kind, in matching order. */
export function rewardKinds(): readonly RewardKind<string>[] {
  return KINDS;
}

/** Adds a kind of reward (one file, one row): matched before the module kind, whose file patterns catch anything ending in .ts/.mjs. */
export function registerRewardKind(kind: RewardKind<string>): void {
  if (KINDS.some((k) => k.name === kind.name)) throw new Error(`reward kind ${kind.name} is registered already`);
  KINDS.splice(KINDS.length - 1, 0, kind);
}

/** How two functions of the same name are told apart, for --help. */
export const REWARD_NAMING = 'each reward is logged as rewards/<name>/mean under its own name (a module function\'s name; accuracy, format, length, cmd, reward_model); a name given again gets _2, _3, … in --reward order';

/** The grammar in one line: `accuracy | format:REGEX | …`. */
export function rewardSyntax(): string {
  return KINDS.map((k) => k.syntax).join(' | ');
}

/** --help's reward block: one line per kind, then the naming rule. */
export function rewardHelp(indent = '    '): string {
  const w = Math.max(...KINDS.map((k) => k.syntax.length)) + 2;
  return [...KINDS.map((k) => `${indent}${k.syntax.padEnd(w)}${k.help}`), `${indent}${REWARD_NAMING}`].join('\n');
}

/** docs/settings.md's reward section. */
export function rewardMarkdown(): string {
  const cell = (s: string) => s.replace(/\|/g, '\\|');
  return [
    '## Rewards (`prefzoo grpo --reward`)',
    '',
    '<!-- From the reward registry, src/online/rewards/index.ts. -->',
    '',
    '| spec | reward |',
    '|---|---|',
    ...KINDS.map((k) => `| \`${cell(k.syntax)}\` | ${cell(k.help)} |`),
    '',
    `Names: ${REWARD_NAMING}.`,
    '',
  ].join('\n');
}

/** The functions one `--reward` spec names (a module may give several). */
export async function loadRewards(spec: string, env: RewardEnv = {}): Promise<RewardFunction[]> {
  const kind = KINDS.find((k) => k.matches(spec));
  if (!kind) throw new UserError(`--reward must be ${KINDS.map((k) => k.syntax).join(', ')}, got "${spec}"`);
  return kind.load(spec, env);
}

/** Names made unique in order: the second `format` is `format_2` (a suffix taken already moves on). */
function uniqueNames(fns: readonly RewardFunction[]): RewardFunction[] {
  const taken = new Set<string>();
  const seen = new Map<string, number>();
  return fns.map((f) => {
    let n = f.name;
    if (taken.has(n)) {
      let k = seen.get(f.name) ?? 1;
      do n = `${f.name}_${++k}`;
      while (taken.has(n) || fns.some((g) => g.name === n));
      seen.set(f.name, k);
    }
    taken.add(n);
    return n === f.name ? f : renamed(f, n);
  });
}

function renamed(f: RewardFunction, name: string): RewardFunction {
  return new Proxy(f, { get: (t, k) => (k === 'name' ? name : Reflect.get(t, k, t)) });
}

/** Every spec's functions, names unique (REWARD_NAMING); the same spec twice is refused. */
export async function loadAllRewards(specs: readonly string[], env: RewardEnv = {}): Promise<RewardFunction[]> {
  if (specs.length === 0) throw new UserError(`grpo: give at least one --reward (${rewardSyntax()})`);
  const twice = specs.find((s, i) => specs.indexOf(s) !== i);
  if (twice !== undefined) throw new UserError(`--reward ${twice} is given twice`);
  const out: RewardFunction[] = [];
  try {
    for (const s of specs) out.push(...(await loadRewards(s, env)));
  } catch (e) {
    await releaseRewards(out);
    throw e;
  }
  return uniqueNames(out);
}

export async function releaseRewards(fns: readonly RewardFunction[]): Promise<void> {
  await Promise.all(fns.map((f) => f.release?.()));
}

class Timeout extends Error {}

async function withTimeout<T>(p: Promise<T> | T, seconds: number): Promise<T> {
  if (!(seconds > 0)) return p;
  let timer: NodeJS.Timeout | undefined;
  try {
    return await Promise.race([
      Promise.resolve(p),
      new Promise<T>((_, reject) => {
        timer = setTimeout(() => reject(new Timeout()), seconds * 1000);
      }),
    ]);
  } finally {
    clearTimeout(timer);
  }
}

/** Where completion `i` comes from, for messages: its prompt row's place in the file. */
export type PlaceOf = (i: number) => string;

function rowsSpan(place: PlaceOf, n: number): string {
  return n === 1 ? place(0) : `${place(0)} … ${place(n - 1)}`;
}

/**
 * Runs one function on the batch and checks its answer; returns numbers with NaN for null.
 * A function that throws on the batch is re-run one completion at a time to name the row it fails on.
 */
export async function scoreOne(fn: RewardFunction, batch: RewardBatch, place: PlaceOf, timeoutSeconds: number): Promise<Float64Array> {
  const n = batch.completions.length;
  const who = `reward function "${fn.name}"${fn.source ? ` (${fn.source})` : ''}`;
  const fail = (where: string, why: string) => new UserError(`${who} ${why} (prompt ${where})`);
  let got: unknown;
  try {
    got = await withTimeout(fn.score(batch), timeoutSeconds);
  } catch (e) {
    if (e instanceof Timeout) {
      fn.abandon?.();
      throw fail(rowsSpan(place, n), `gave no answer within reward_timeout = ${timeoutSeconds} s`);
    }
    if (e instanceof RowError) throw fail(place(e.index), `failed: ${e.message}`);
    if (e instanceof UserError) throw e;
    // Find the first completion it throws on, for the message.
    const msg = (x: unknown) => (x instanceof Error ? x.message : String(x)).split('\n')[0];
    if (fn.rerunnable !== false && n > 1) {
      for (let i = 0; i < n; i++) {
        const one: RewardBatch = { ...batch, completions: [batch.completions[i]], rows: [batch.rows[i]], lengths: [batch.lengths[i]], ...(batch.rollouts ? { rollouts: [batch.rollouts[i]] } : {}) };
        try {
          await withTimeout(fn.score(one), timeoutSeconds);
        } catch (e1) {
          throw fail(place(i), `threw: ${msg(e1)}`);
        }
      }
    }
    throw fail(rowsSpan(place, n), `threw: ${msg(e)}`);
  }
  if (!Array.isArray(got)) throw fail(rowsSpan(place, n), `returned ${got === null ? 'null' : typeof got}, not an array of numbers`);
  if (got.length !== n) throw fail(rowsSpan(place, n), `returned ${got.length} rewards for ${n} completions`);
  const out = new Float64Array(n);
  got.forEach((v, i) => {
    if (v === null || v === undefined) out[i] = NaN;
    else if (typeof v !== 'number' || !Number.isFinite(v)) throw fail(place(i), `returned ${typeof v === 'number' ? String(v) : JSON.stringify(v)?.slice(0, 40) ?? typeof v} for completion ${i + 1}; a reward must be a finite number or null`);
    else out[i] = v;
  });
  return out;
}

/** [functions][completions] rewards (NaN where a function answered null). */
export async function scoreAll(fns: readonly RewardFunction[], batch: RewardBatch, place: PlaceOf, timeoutSeconds: number): Promise<Float64Array[]> {
  const out: Float64Array[] = [];
  for (const f of fns) out.push(await scoreOne(f, batch, place, timeoutSeconds));
  return out;
}
