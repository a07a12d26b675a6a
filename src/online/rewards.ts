/**
 * Reward functions of GRPO: each scores a batch of completions, given each completion's prompt
 * record (the prompt plus the file's other columns, e.g. `answer`), with a number or null
 * ("does not apply", TRL's None) per completion. Chosen by `--reward SPEC`:
 *
 *   accuracy       1 when the completion's final answer equals the row's `answer` (numerically when
 *                  both are numbers), else 0; the final answer is the last `\boxed{…}`, else the last
 *                  number; in the gold answer GSM8K's "#### N" line wins (`extractAnswer`, `answersMatch`)
 *   format:REGEX   1 when the completion matches the regular expression (JavaScript syntax, `s` flag:
 *                  `.` matches newlines; anchor with ^ and $ for a whole-text match), else 0
 *   length[:C]     DAPO's soft overlong penalty (Eq. 13): 0 up to L − C tokens, then falling linearly
 *                  to −1 at L = max_completion_length; C defaults to L/5
 *   ./FILE.mjs|.ts every exported function `(completions, rows) => (number | null)[]`, sync or async
 *                  (`./FILE.mjs:name` picks one); rows[i] is completion i's prompt record
 *   cmd:COMMAND    a program speaking JSON lines (as the `cmd:` judge): one `{"prompt", "completion",
 *                  "row"}` line in per completion, one `{"reward": number | null}` line out, in order
 *   reward:DIR     a reward model trained by `prefzoo reward-train`: r(prompt, completion)
 *
 * `scoreAll` runs them and checks every answer: a function that throws, answers NaN, ∞ or a
 * non-number, the wrong count, or takes longer than `timeoutSeconds` stops the run with one line
 * naming the function and the prompt row (file and line).
 */
import { existsSync } from 'node:fs';
import { isAbsolute, resolve } from 'node:path';
import { pathToFileURL } from 'node:url';
import { UserError } from '../errors.ts';
import type { RuntimeOptions } from '../runtime/session.ts';
import type { Text } from '../../datasets/schema.ts';
import { RewardModel } from './reward-model.ts';
import { LineProcess } from './line-process.ts';

/** One completion's prompt record: the prompt and the other columns of its row. */
export type RewardRow = Record<string, unknown> & { prompt: Text };

/** What a reward function is given: completions (text), their rows, token counts, and the length limit. */
export interface RewardBatch {
  completions: string[];
  rows: RewardRow[];
  /** Completion lengths in tokens. */
  lengths: number[];
  maxCompletionLength: number;
}

export interface RewardFunction {
  /** The metric name: `rewards/<name>/mean`. */
  readonly name: string;
  score(batch: RewardBatch): Promise<(number | null)[]> | (number | null)[];
  release?(): Promise<void>;
}

/** A user's reward function: TRL's callable in TypeScript form. */
export type UserRewardFn = (completions: string[], rows: RewardRow[]) => (number | null)[] | Promise<(number | null)[]>;

// ---- accuracy ---------------------------------------------------------------------------------

/** The content of the last `\boxed{…}` (braces balanced), or null. */
function lastBoxed(text: string): string | null {
  const at = text.lastIndexOf('\\boxed{');
  if (at < 0) return null;
  let depth = 0;
  for (let i = at + '\\boxed'.length; i < text.length; i++) {
    if (text[i] === '{') depth++;
    else if (text[i] === '}' && --depth === 0) return text.slice(at + '\\boxed{'.length, i).trim();
  }
  return null;
}

const NUMBER = /-?\$?\d[\d,]*(?:\.\d+)?|-?\.\d+/g;

/** The last number written in the text (thousands commas and a leading $ allowed), or null. */
function lastNumber(text: string): string | null {
  const all = text.match(NUMBER);
  return all ? all[all.length - 1] : null;
}

/** A final answer as a number, when it reads as one ("1,234", "$18", "-3.50", "12%", "18."). */
export function asNumber(s: string): number | null {
  const t = s.trim().replace(/^\$/, '').replace(/^\\\$/, '').replace(/,/g, '').replace(/\\?%$/, '').replace(/\.$/, '').replace(/^-\$/, '-');
  if (!/^-?(\d+(\.\d*)?|\.\d+)$/.test(t)) return null;
  return Number(t);
}

/**
 * The final answer of a text: the last `\boxed{…}`; else, after GSM8K's "#### " marker, what follows
 * the last one; else the last number. Null when there is none.
 */
export function extractAnswer(text: string): string | null {
  const boxed = lastBoxed(text);
  if (boxed !== null) return boxed;
  const mark = text.lastIndexOf('####');
  if (mark >= 0) return text.slice(mark + 4).trim();
  return lastNumber(text);
}

/** Numerically equal when both read as numbers (relative 1e-9), else equal as text up to spaces and case. */
export function answersMatch(got: string, gold: string): boolean {
  const a = asNumber(got);
  const b = asNumber(gold);
  if (a !== null && b !== null) return Math.abs(a - b) <= 1e-9 * Math.max(1, Math.abs(b));
  const norm = (s: string) => s.replace(/\s+/g, '').replace(/^\$|\$$/g, '').toLowerCase();
  return norm(got) !== '' && norm(got) === norm(gold);
}

class RowError extends Error {
  constructor(readonly index: number, message: string) {
    super(message);
  }
}

const accuracy: RewardFunction = {
  name: 'accuracy',
  score({ completions, rows }) {
    return completions.map((c, i) => {
      const gold = rows[i].answer;
      if (typeof gold !== 'string' && typeof gold !== 'number') {
        throw new RowError(i, gold === undefined ? 'the prompt has no "answer" column' : `"answer" must be text or a number, got ${JSON.stringify(gold).slice(0, 40)}`);
      }
      const want = extractAnswer(String(gold));
      if (want === null || want === '') throw new RowError(i, `no final answer in "answer" ${JSON.stringify(String(gold).slice(-40))}`);
      const got = extractAnswer(c);
      return got !== null && answersMatch(got, want) ? 1 : 0;
    });
  },
};

// ---- format, length ---------------------------------------------------------------------------

function formatReward(source: string): RewardFunction {
  let re: RegExp;
  try {
    re = new RegExp(source, 'su');
  } catch (e) {
    throw new UserError(`--reward format:${source}: not a regular expression (${(e as Error).message})`);
  }
  return { name: `format:${source}`, score: ({ completions }) => completions.map((c) => (re.test(c) ? 1 : 0)) };
}

/** DAPO's soft overlong penalty of a completion of n tokens under limit L and buffer C. */
export function overlongPenalty(n: number, L: number, C: number): number {
  if (n <= L - C) return 0;
  if (n <= L) return (L - C - n) / C;
  return -1;
}

function lengthReward(cache: number | null): RewardFunction {
  return {
    name: 'length',
    score({ lengths, maxCompletionLength: L }) {
      const C = cache ?? Math.max(1, Math.round(L / 5));
      if (C > L) throw new UserError(`--reward length:${C}: the buffer is longer than max_completion_length (${L})`);
      return lengths.map((n) => overlongPenalty(n, L, C));
    },
  };
}

// ---- a module, a command, a reward model ------------------------------------------------------

async function moduleRewards(spec: string): Promise<RewardFunction[]> {
  const m = /^(.*\.(?:mjs|js|ts|mts))(?::([A-Za-z_$][\w$]*))?$/.exec(spec);
  if (!m) throw new UserError(`--reward ${spec}: a module must be a .mjs, .js or .ts file, optionally FILE:function`);
  const file = isAbsolute(m[1]) ? m[1] : resolve(m[1]);
  if (!existsSync(file)) throw new UserError(`--reward ${spec}: ${file} does not exist`);
  let mod: Record<string, unknown>;
  try {
    mod = (await import(pathToFileURL(file).href)) as Record<string, unknown>;
  } catch (e) {
    throw new UserError(`--reward ${spec}: cannot load the module (${(e as Error).message.split('\n')[0]})`);
  }
  const names = m[2] ? [m[2]] : Object.keys(mod).filter((k) => typeof mod[k] === 'function');
  if (m[2] && typeof mod[m[2]] !== 'function') throw new UserError(`--reward ${spec}: the module exports no function "${m[2]}"`);
  if (names.length === 0) throw new UserError(`--reward ${spec}: the module exports no function`);
  return names.map((n) => {
    const fn = mod[n] as UserRewardFn;
    return { name: `${m[1]}:${n}`, score: ({ completions, rows }) => fn(completions, rows) };
  });
}

/** `cmd:COMMAND`: the judge's JSON-lines protocol with `{"prompt","completion","row"}` → `{"reward"}`. */
class CommandReward implements RewardFunction {
  readonly name: string;
  private proc: LineProcess;
  constructor(readonly command: string) {
    if (!command.trim()) throw new UserError('--reward cmd: the command is empty');
    this.name = `cmd:${command}`;
    this.proc = new LineProcess(command);
  }

  async score({ completions, rows }: RewardBatch): Promise<(number | null)[]> {
    this.proc.send(completions.map((c, i) => ({ prompt: rows[i].prompt, completion: c, row: rows[i] })));
    const out: (number | null)[] = [];
    for (let i = 0; i < completions.length; i++) {
      const line = await this.proc.next();
      if (line === null) throw new RowError(i, `the command closed its output${this.proc.stderrNote()}`);
      let r: unknown;
      try {
        r = (JSON.parse(line) as { reward?: unknown })?.reward;
      } catch {
        throw new RowError(i, `answer is not JSON: ${JSON.stringify(line.slice(0, 80))}`);
      }
      if (r !== null && typeof r !== 'number') throw new RowError(i, `answer must be {"reward": number or null}, got ${JSON.stringify(line.slice(0, 80))}`);
      out.push(r);
    }
    return out;
  }

  /** After a timeout the program's answers are out of step: it is killed and restarted on next use. */
  abandon(): void {
    this.proc.kill();
    this.proc = new LineProcess(this.command);
  }

  async release(): Promise<void> {
    await this.proc.release();
  }
}

class ModelReward implements RewardFunction {
  readonly name: string;
  constructor(private readonly rm: RewardModel) {
    this.name = `reward:${rm.dir}`;
  }
  async score({ completions, rows }: RewardBatch): Promise<number[]> {
    return this.rm.score(completions.map((c, i) => ({ prompt: rows[i].prompt, response: c })));
  }
  async release(): Promise<void> {
    await this.rm.release();
  }
}

/** The functions one `--reward` spec names (a module may give several). */
export async function loadRewards(spec: string, runtime?: RuntimeOptions): Promise<RewardFunction[]> {
  if (spec === 'accuracy') return [accuracy];
  if (spec.startsWith('format:')) return [formatReward(spec.slice('format:'.length))];
  if (spec === 'length' || spec.startsWith('length:')) {
    const c = spec === 'length' ? null : Number(spec.slice('length:'.length));
    if (c !== null && !(Number.isInteger(c) && c >= 1)) throw new UserError(`--reward ${spec}: the buffer must be an integer ≥ 1 (tokens)`);
    return [lengthReward(c)];
  }
  if (spec.startsWith('cmd:')) return [new CommandReward(spec.slice('cmd:'.length))];
  if (spec.startsWith('reward:')) return [new ModelReward(await RewardModel.load(spec.slice('reward:'.length), runtime))];
  if (/\.(mjs|js|ts|mts)(:[\w$]+)?$/.test(spec)) return moduleRewards(spec);
  throw new UserError(`--reward must be accuracy, format:REGEX, length[:TOKENS], ./FILE.mjs|.ts[:function], cmd:COMMAND or reward:DIR, got "${spec}"`);
}

/** Every spec's functions, names unique (a repeated spec is refused). */
export async function loadAllRewards(specs: readonly string[], runtime?: RuntimeOptions): Promise<RewardFunction[]> {
  if (specs.length === 0) throw new UserError('grpo: give at least one --reward (accuracy, format:REGEX, length, ./rewards.mjs, cmd:COMMAND, reward:DIR)');
  const out: RewardFunction[] = [];
  try {
    for (const s of specs) out.push(...(await loadRewards(s, runtime)));
  } catch (e) {
    await releaseRewards(out);
    throw e;
  }
  const dup = out.find((f, i) => out.findIndex((g) => g.name === f.name) !== i);
  if (dup) {
    await releaseRewards(out);
    throw new UserError(`--reward ${dup.name} is given twice`);
  }
  return out;
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
  const fail = (where: string, why: string) => new UserError(`reward function "${fn.name}" ${why} (prompt ${where})`);
  let got: unknown;
  try {
    got = await withTimeout(fn.score(batch), timeoutSeconds);
  } catch (e) {
    if (e instanceof Timeout) {
      if (fn instanceof CommandReward) fn.abandon();
      throw fail(rowsSpan(place, n), `gave no answer within reward_timeout = ${timeoutSeconds} s`);
    }
    if (e instanceof RowError) throw fail(place(e.index), `failed: ${e.message}`);
    if (e instanceof UserError) throw e;
    // Find the first completion it throws on, for the message.
    const msg = (x: unknown) => (x instanceof Error ? x.message : String(x)).split('\n')[0];
    if (!(fn instanceof CommandReward) && n > 1) {
      for (let i = 0; i < n; i++) {
        const one: RewardBatch = { ...batch, completions: [batch.completions[i]], rows: [batch.rows[i]], lengths: [batch.lengths[i]] };
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
