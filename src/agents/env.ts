/**
 * `--env ./env.mjs`: environments for games and simulators. The module exports a factory (a function
 * or a class) making one `Environment` per rollout, or a map of them by name (`Environments`: each
 * prompt row picks one by its `environment` column); `EnvSession` wraps an instance so that whatever
 * goes wrong inside it — `reset`, `step`, `reward` or `close` throwing, or answering in the wrong
 * shape — stops the run with one line naming the module, the function and the prompt's file:line.
 * That is a bug in the environment, not something the model did, so it is not fed back as a message.
 */
import { existsSync } from 'node:fs';
import { isAbsolute, resolve } from 'node:path';
import { pathToFileURL } from 'node:url';
import { UserError } from '../errors.ts';
import { ROLES, type Message, type ToolSpec } from '../chat.ts';
import { toolFromExport, type LoadedTool } from './tools.ts';
import type { Environment, EnvironmentAction, EnvironmentFactories, EnvironmentFactory, EnvironmentStep } from './types.ts';

/** An environment that broke: the run stops with this one line. */
export class EnvironmentError extends UserError {
  constructor(
    message: string,
    readonly module: string,
    readonly fn: string,
  ) {
    super(message, { setting: 'env' });
    this.name = 'EnvironmentError';
  }
}

const isClass = (f: Function): boolean => /^class[\s{]/.test(Function.prototype.toString.call(f));

/**
 * One environment factory of a loaded `--env` module: `open()` makes one environment session per
 * rollout. `spec` names it in messages: the module (`./env.mjs`), with the map's key for one of a map
 * (`./envs.mjs (wordle)`).
 */
export class EnvironmentModule {
  constructor(
    readonly spec: string,
    private readonly factory: EnvironmentFactory,
  ) {}

  /** A fresh environment, checked to have reset and step; `where` is the prompt's file:line, named if it breaks. */
  private async make(where?: string): Promise<Environment> {
    let env: Environment;
    try {
      env = await this.factory();
    } catch (e) {
      throw new EnvironmentError(`--env ${this.spec}: the factory threw${where ? ` for the prompt at ${where}` : ''}: ${firstLine(e)}`, this.spec, 'factory');
    }
    if (!env || typeof env.reset !== 'function' || typeof env.step !== 'function') {
      throw new EnvironmentError(`--env ${this.spec}: the factory must return an object with reset(row, { seed }) and step({ text, toolCalls })`, this.spec, 'factory');
    }
    return env;
  }

  /** A fresh environment for one rollout; `where` is the prompt's file:line, named if it breaks. */
  async open(where?: string): Promise<EnvSession> {
    return new EnvSession(this.spec, await this.make(where), where);
  }

  /**
   * Whether its environments have `reward()`: one is made (and closed) to see, since a factory's
   * environments show their methods only once made.
   */
  async hasReward(): Promise<boolean> {
    const env = await this.make();
    const has = typeof env.reward === 'function';
    await new EnvSession(this.spec, env).close();
    return has;
  }
}

/**
 * A run's environments: one factory for every row, or a map of factories by name, a row picking one
 * by its `column` (the `env_column` setting, default `environment`, TRL's column).
 */
export class Environments {
  private constructor(
    /** The `--env` spec (or `env` for values). */
    readonly spec: string,
    /** One factory (`single`), or the map's, by name in the map's order. */
    private readonly byName: ReadonlyMap<string, EnvironmentModule>,
    readonly single: boolean,
    readonly column: string,
  ) {}

  static one(m: EnvironmentModule): Environments {
    return new Environments(m.spec, new Map([['', m]]), true, 'environment');
  }

  static map(spec: string, factories: ReadonlyMap<string, EnvironmentFactory>): Environments {
    return new Environments(spec, new Map([...factories].map(([k, f]) => [k, new EnvironmentModule(`${spec} (${k})`, f)])), false, 'environment');
  }

  /** The same environments, rows picking by `column`. */
  withColumn(column: string): Environments {
    return new Environments(this.spec, this.byName, this.single, column);
  }

  /** The map's names, in its order (empty for one factory). */
  get names(): string[] {
    return this.single ? [] : [...this.byName.keys()];
  }

  /** Every factory: the one, or the map's in order. */
  get modules(): EnvironmentModule[] {
    return [...this.byName.values()];
  }

  /** A fresh environment for the prompt `row` at `where` (its file:line): the one factory's, or the one the row picks. */
  open(where?: string, row: Record<string, unknown> = {}): Promise<EnvSession> {
    return this.pick(row, where ?? 'the row').open(where);
  }

  /** The factory a row picks; a map's row without the column, or naming no environment of the map, is one line naming `at`. */
  pick(row: Record<string, unknown>, at: string): EnvironmentModule {
    if (this.single) return this.byName.get('')!;
    const known = `the --env ${this.spec} environments are ${this.names.join(', ')}`;
    if (!(this.column in row)) throw new UserError(`${at}: no "${this.column}" column to pick an environment by (env_column); ${known}`, { setting: 'env_column' });
    const name = row[this.column];
    const m = typeof name === 'string' ? this.byName.get(name) : undefined;
    if (!m) throw new UserError(`${at}: ${this.column} ${JSON.stringify(name)} names no environment; ${known}`, { setting: 'env_column' });
    return m;
  }
}

function firstLine(e: unknown): string {
  return (e instanceof Error ? e.message : String(e)).split('\n')[0].slice(0, 300);
}

/**
 * Loads an `--env` module: `FILE` (its default export, else its `environments` export, else its only
 * function export) or `FILE:name`; the export is a factory or a map of factories by name.
 */
export async function loadEnvironment(spec: string, flag = '--env'): Promise<Environments> {
  const m = /^(.*\.(?:mjs|cjs|js|ts|mts))(?::([A-Za-z_$][\w$]*))?$/.exec(spec);
  if (!m) throw new UserError(`${flag} ${spec}: an environment must be a .mjs, .js or .ts module, optionally FILE:export`, { setting: 'env' });
  const file = isAbsolute(m[1]) ? m[1] : resolve(m[1]);
  if (!existsSync(file)) throw new UserError(`${flag} ${spec}: ${file} does not exist`, { setting: 'env' });
  let mod: Record<string, unknown>;
  try {
    mod = (await import(pathToFileURL(file).href)) as Record<string, unknown>;
  } catch (e) {
    throw new UserError(`${flag} ${spec}: cannot load the module (${firstLine(e)})`, { setting: 'env' });
  }
  let value: unknown;
  if (m[2]) {
    if (!(m[2] in mod)) throw new UserError(`${flag} ${spec}: the module exports no "${m[2]}"`, { setting: 'env' });
    value = mod[m[2]];
  } else if (mod.default !== undefined) value = mod.default;
  else if (mod.environments !== undefined) value = mod.environments;
  else {
    const fns = Object.entries(mod).filter(([, v]) => typeof v === 'function');
    if (fns.length !== 1) throw new UserError(`${flag} ${spec}: export the environment factory as default, or name it (${spec}:name)${fns.length ? `; it exports ${fns.map(([k]) => k).join(', ')}` : ''}`, { setting: 'env' });
    value = fns[0][1];
  }
  return environmentFrom(value, spec, flag);
}

/** A factory from a function or class: a class is constructed, a function called. */
function factoryOf(f: Function): EnvironmentFactory {
  return isClass(f) ? () => new (f as new () => Environment)() : () => (f as () => Environment)();
}

/**
 * The environments of a value: a factory (a class, constructed; a function, called), or a map of
 * them by name (`{ wordle: () => new Wordle(), guess: GuessEnv }`). One shared instance is refused.
 */
export function environmentFrom(value: unknown, spec = 'env', flag = '--env'): Environments {
  if (typeof value === 'function') return Environments.one(new EnvironmentModule(spec, factoryOf(value)));
  if (value && typeof value === 'object' && typeof (value as Environment).reset === 'function') {
    throw new UserError(`${flag} ${spec}: export a factory (a function or class returning { reset, step }), not one environment object: every rollout needs its own`, { setting: 'env' });
  }
  if (value && typeof value === 'object' && !Array.isArray(value)) {
    const entries = Object.entries(value as EnvironmentFactories);
    if (entries.length === 0) throw new UserError(`${flag} ${spec}: the map of environments is empty; give it { name: factory, … }`, { setting: 'env' });
    const bad = entries.find(([, f]) => typeof f !== 'function');
    if (bad) throw new UserError(`${flag} ${spec}: the map's "${bad[0]}" is not an environment factory (a function or class returning { reset, step })`, { setting: 'env' });
    return Environments.map(spec, new Map(entries.map(([k, f]) => [k, factoryOf(f)])));
  }
  throw new UserError(`${flag} ${spec}: the export is not an environment factory (a function or class returning { reset, step }) nor a map of them by name`, { setting: 'env' });
}

function checkMessages(v: unknown, what: () => string): Message[] {
  if (!Array.isArray(v)) throw new UserError(`${what()}: "messages" must be an array of chat messages`);
  v.forEach((m, i) => {
    const x = m as Message;
    if (!x || typeof x !== 'object' || !ROLES.has(x.role) || typeof x.content !== 'string') {
      throw new UserError(`${what()}: messages[${i}] must be { role: system|user|assistant|tool, content: string }`);
    }
  });
  return v as Message[];
}

/** One rollout's environment. Every call into user code is guarded: a throw becomes the one line. */
export class EnvSession {
  /** Tools the episode offers (from `reset`), as specs for the template. */
  toolSpecs: ToolSpec[] = [];
  /** Those of them with a `run` (or `execute`): a ToolExecutor may answer them instead of `step`. */
  tools: LoadedTool[] = [];
  /** Set once `step` said `done`. */
  done = false;
  /** The prompt `reset` gave (replacing the row's), or null when it gave none. */
  prompt: string | Message[] | null = null;

  constructor(
    readonly spec: string,
    private readonly env: Environment,
    readonly where?: string,
  ) {}

  /** `--env M: step() threw for the prompt at F:L: detail` */
  private fail(fn: string, verb: string, detail: string): EnvironmentError {
    return new EnvironmentError(`--env ${this.spec}: ${fn}() ${verb}${this.where ? ` for the prompt at ${this.where}` : ''}: ${detail}`, this.spec, fn);
  }

  private async guard<T>(fn: string, body: () => T | Promise<T>): Promise<T> {
    try {
      return await body();
    } catch (e) {
      if (e instanceof EnvironmentError) throw e;
      throw this.fail(fn, 'threw', firstLine(e));
    }
  }

  private shape(fn: string, problem: string): EnvironmentError {
    return this.fail(fn, 'answered in the wrong shape', problem);
  }

  /**
   * Starts the episode: its opening messages (to append after the prompt). The prompt `reset` gave
   * (a string, or `{ prompt }`), if any, is left in `prompt`.
   */
  async reset(row: Record<string, unknown>, seed: number): Promise<Message[]> {
    const given = await this.guard('reset', () => this.env.reset(row, { seed }));
    if (given === undefined || given === null) return [];
    // TRL's reset returns the prompt as a string; `{ prompt }` says it beside messages and tools.
    const start = typeof given === 'string' ? { prompt: given } : given;
    if (typeof start !== 'object' || Array.isArray(start)) throw this.shape('reset', 'expected a prompt string or { prompt?, messages?, tools? }');
    if (start.prompt !== undefined && start.prompt !== null) {
      const p = start.prompt;
      if (typeof p === 'string') {
        if (p.length === 0) throw this.shape('reset', 'the prompt is empty');
        this.prompt = p;
      } else {
        try {
          if (Array.isArray(p) && p.length === 0) throw new Error('"prompt" is an empty list of messages');
          this.prompt = checkMessages(p, () => 'prompt').map((m) => ({ ...m }));
        } catch (e) {
          throw this.shape('reset', `${(e as Error).message} (a prompt is a string or a list of { role, content } messages)`);
        }
      }
    }
    let messages: Message[] = [];
    try {
      if (start.messages !== undefined) messages = checkMessages(start.messages, () => 'messages');
    } catch (e) {
      throw this.shape('reset', (e as Error).message);
    }
    if (start.tools !== undefined) {
      if (!Array.isArray(start.tools)) throw this.shape('reset', '"tools" must be an array');
      start.tools.forEach((t, i) => {
        if ((t as ToolSpec)?.type === 'function' && (t as ToolSpec).function) {
          this.toolSpecs.push(t as ToolSpec);
          return;
        }
        let loaded: LoadedTool | null;
        try {
          loaded = toolFromExport(`tools[${i}]`, t, `--env ${this.spec}`);
        } catch (e) {
          throw this.shape('reset', (e as Error).message);
        }
        if (!loaded) throw this.shape('reset', `tools[${i}] is neither a tool spec ({ type: 'function', function }) nor a tool ({ name, parameters, run })`);
        this.tools.push(loaded);
        this.toolSpecs.push(loaded.spec);
      });
    }
    return messages;
  }

  /** One assistant turn: the environment's messages, its reward so far, and whether the episode ended. */
  async step(action: EnvironmentAction): Promise<EnvironmentStep> {
    const out = await this.guard('step', () => this.env.step(action));
    if (!out || typeof out !== 'object') throw this.shape('step', 'expected { messages, reward?, done }');
    let messages: Message[];
    try {
      messages = out.messages === undefined ? [] : checkMessages(out.messages, () => 'messages');
    } catch (e) {
      throw this.shape('step', (e as Error).message);
    }
    if (typeof out.done !== 'boolean') throw this.shape('step', '"done" must be true or false');
    if (out.reward !== undefined && out.reward !== null && (typeof out.reward !== 'number' || !Number.isFinite(out.reward))) throw this.shape('step', `"reward" must be a finite number, got ${JSON.stringify(out.reward)}`);
    this.done = out.done;
    const r: EnvironmentStep = { messages, done: out.done };
    if (typeof out.reward === 'number') r.reward = out.reward;
    return r;
  }

  /** The episode's reward from `reward()`, or null when the environment has none. */
  async reward(): Promise<number | null> {
    if (typeof this.env.reward !== 'function') return null;
    const r = await this.guard('reward', () => this.env.reward!());
    if (r === null || r === undefined) return null;
    if (typeof r !== 'number' || !Number.isFinite(r)) throw this.shape('reward', `expected a finite number or null, got ${JSON.stringify(r)}`);
    return r;
  }

  async close(): Promise<void> {
    if (typeof this.env.close === 'function') await this.guard('close', () => this.env.close!());
  }
}
