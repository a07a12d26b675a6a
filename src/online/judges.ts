/**
 * Judges: one interface, P(a ≻ b | prompt) for a batch of comparisons, three kinds:
 *
 *   task          the built-in verifiable judge of the demo tasks (recall the first digit, "4719:" → "4";
 *                 modular addition, "3+4=" → "7"): a correct answer beats a wrong one, equal
 *                 correctness is a tie (½)
 *   reward:DIR    a reward model trained by `prefzoo reward-train`: P = σ(r(a) − r(b)) (Bradley–Terry),
 *                 scored by the `reward:DIR` reward (rewards/model.ts) on the run's device
 *   cmd:COMMAND   an external program speaking JSONL: one `{"prompt","a","b"}` line in, one
 *                 `{"p": P(a ≻ b)}` line out, in order (see `CommandJudge`; the protocol is the
 *                 `cmd:` reward's, line-process.ts's JsonLinesProgram)
 *
 * Judges see text (the decoded responses), so any judge works with any policy's tokenizer.
 */
import { UserError } from '../errors.ts';
import type { RuntimeOptions } from '../runtime/session.ts';
import type { Text } from '../../datasets/schema.ts';
import { ModelReward } from './rewards/model.ts';
import { promptKey } from './prompts.ts';
import { AnswerError, JsonLinesProgram } from './line-process.ts';

export interface Comparison {
  prompt: Text;
  a: Text;
  b: Text;
}

export interface Judge {
  readonly name: string;
  /** P(a ≻ b | prompt) ∈ [0, 1] per comparison. */
  compare(items: readonly Comparison[]): Promise<number[]>;
  release(): Promise<void>;
}

/**
 * The modulus of the task judge's sums ("3+4=" → "7"). It is the judge's: the demo tasks
 * (src/demos/task.ts) stand above it and take it from here.
 */
export const DEMO_MODULUS = 10;

function plain(t: Text): string {
  return typeof t === 'string' ? t : t.map((m) => m.content).join('\n');
}

/**
 * The demo tasks' answer check, on the prompt's text (message prompts: the last message). A prompt
 * ending in digits and a colon ("4719:") asks for its first digit; one ending in "a+b=" for
 * (a + b) mod 10. A response is correct when its text is exactly that digit.
 */
export function taskCorrect(prompt: Text, response: Text): boolean {
  const p = typeof prompt === 'string' ? prompt : prompt[prompt.length - 1]?.content ?? '';
  const recall = /(\d+):\s*$/.exec(p);
  if (recall) return plain(response).trim() === recall[1][0];
  const sum = /(\d+)\s*\+\s*(\d+)\s*=\s*$/.exec(p);
  if (sum) return plain(response).trim() === String((Number(sum[1]) + Number(sum[2])) % DEMO_MODULUS);
  throw new UserError(`task judge: prompt ${JSON.stringify(p.slice(-40))} is neither "digits:" nor "a+b=" (the built-in judge knows only the demo tasks)`);
}

export class TaskJudge implements Judge {
  readonly name = 'task';
  async compare(items: readonly Comparison[]): Promise<number[]> {
    return items.map((c) => 0.5 + 0.5 * (Number(taskCorrect(c.prompt, c.a)) - Number(taskCorrect(c.prompt, c.b))));
  }
  async release(): Promise<void> {}
}

/** Bradley–Terry judge over a reward model: each distinct (prompt, response) is scored once per call. */
export class RewardJudge implements Judge {
  readonly name: string;
  private constructor(private readonly rm: ModelReward) {
    this.name = rm.source;
  }

  static async load(dir: string, runtime?: RuntimeOptions): Promise<RewardJudge> {
    return new RewardJudge(await ModelReward.load(dir, runtime));
  }

  async compare(items: readonly Comparison[]): Promise<number[]> {
    const key = (p: Text, r: Text) => promptKey(p) + '\u0000' + promptKey(r);
    const todo = new Map<string, { prompt: Text; response: Text }>();
    for (const c of items) {
      todo.set(key(c.prompt, c.a), { prompt: c.prompt, response: c.a });
      todo.set(key(c.prompt, c.b), { prompt: c.prompt, response: c.b });
    }
    const list = [...todo.values()];
    const scores = await this.rm.scoreTexts(list);
    const byKey = new Map(list.map((x, i) => [key(x.prompt, x.response), scores[i]]));
    return items.map((c) => 1 / (1 + Math.exp(byKey.get(key(c.prompt, c.b))! - byKey.get(key(c.prompt, c.a))!)));
  }

  async release(): Promise<void> {
    await this.rm.release();
  }
}

/**
 * An external judge: `sh -c COMMAND` started once and kept running. Each comparison is written to
 * its stdin as one JSON line `{"prompt": …, "a": …, "b": …}` (text or message lists, as in the
 * data); it must answer each with one line `{"p": number in [0, 1]}` (P(a ≻ b)), in order.
 * Anything else stops the run with the command, the answer's number and the reason.
 */
export class CommandJudge implements Judge {
  readonly name: string;
  private readonly program: JsonLinesProgram;
  private answered = 0;

  constructor(readonly command: string) {
    if (!command.trim()) throw new UserError('--judge cmd: the command is empty');
    this.name = `cmd:${command}`;
    this.program = new JsonLinesProgram(command);
  }

  async compare(items: readonly Comparison[]): Promise<number[]> {
    const read = (a: unknown) => {
      const p = (a as { p?: unknown } | null)?.p;
      return typeof p === 'number' && p >= 0 && p <= 1 ? p : undefined;
    };
    try {
      const out = await this.program.ask(items.map((c) => ({ prompt: c.prompt, a: c.a, b: c.b })), read);
      this.answered += out.length;
      return out;
    } catch (e) {
      if (!(e instanceof AnswerError)) throw e;
      const n = this.answered + e.index + 1;
      const shown = JSON.stringify(e.line.slice(0, 80));
      if (e.why === 'closed') throw new UserError(`judge command "${this.command}" closed its output after ${n - 1} answers${this.program.stderrNote()}`);
      if (e.why === 'json') throw new UserError(`judge command "${this.command}": answer ${n} is not JSON: ${shown}`);
      throw new UserError(`judge command "${this.command}": answer ${n} must be {"p": number in [0, 1]}, got ${shown}`);
    }
  }

  async release(): Promise<void> {
    await this.program.release();
  }
}

/** `task`, `reward:DIR` or `cmd:COMMAND` (the `--judge` flag). */
export async function loadJudge(spec: string, runtime?: RuntimeOptions): Promise<Judge> {
  if (spec === 'task') return new TaskJudge();
  if (spec.startsWith('reward:')) return RewardJudge.load(spec.slice('reward:'.length), runtime);
  if (spec.startsWith('cmd:')) return new CommandJudge(spec.slice('cmd:'.length));
  throw new UserError(`--judge must be task, reward:DIR or cmd:COMMAND, got "${spec}"`);
}

/**
 * P̂(y_k ≻ π) for each of K samples of one prompt: the mean of P(y_k ≻ y_j) over the other samples
 * (each unordered pair judged once, P(y_j ≻ y_k) = 1 − P(y_k ≻ y_j)).
 */
export async function winRates(judge: Judge, groups: { prompt: Text; responses: Text[] }[]): Promise<number[][]> {
  const items: Comparison[] = [];
  for (const g of groups) {
    for (let i = 0; i < g.responses.length; i++) for (let j = i + 1; j < g.responses.length; j++) items.push({ prompt: g.prompt, a: g.responses[i], b: g.responses[j] });
  }
  const p = await judge.compare(items);
  let at = 0;
  return groups.map((g) => {
    const K = g.responses.length;
    const sum = new Array<number>(K).fill(0);
    for (let i = 0; i < K; i++) {
      for (let j = i + 1; j < K; j++) {
        sum[i] += p[at];
        sum[j] += 1 - p[at];
        at++;
      }
    }
    return sum.map((s) => (K > 1 ? s / (K - 1) : 0.5));
  });
}

/**
 * Runs `f` with the judge `spec` names, loaded on the run's device (its `device` and `threads`
 * settings) and released after; a Judge object is used as it is and left to its owner.
 */
export async function withJudge<T>(spec: Judge | string, runtime: () => RuntimeOptions, f: (judge: Judge) => Promise<T>): Promise<T> {
  if (typeof spec !== 'string') return f(spec);
  const judge = await loadJudge(spec, runtime());
  try {
    return await f(judge);
  } finally {
    await judge.release();
  }
}
