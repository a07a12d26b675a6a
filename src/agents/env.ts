/**
 * `--env ./env.mjs`: environments for games and simulators. The module exports a factory (a function
 * or a class) making one `Environment` per rollout; `EnvSession` wraps an instance so that whatever
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
import type { Environment, EnvironmentAction, EnvironmentFactory, EnvironmentStep } from './types.ts';

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

/** A loaded `--env` module: `open()` makes one environment session per rollout. */
export class EnvironmentModule {
  constructor(
    readonly spec: string,
    private readonly factory: EnvironmentFactory,
  ) {}

  /** A fresh environment for one rollout; `where` is the prompt's file:line, named if it breaks. */
  async open(where?: string): Promise<EnvSession> {
    let env: Environment;
    try {
      env = await this.factory();
    } catch (e) {
      throw new EnvironmentError(`--env ${this.spec}: the factory threw${where ? ` for the prompt at ${where}` : ''}: ${firstLine(e)}`, this.spec, 'factory');
    }
    if (!env || typeof env.reset !== 'function' || typeof env.step !== 'function') {
      throw new EnvironmentError(`--env ${this.spec}: the factory must return an object with reset(row, { seed }) and step({ text, toolCalls })`, this.spec, 'factory');
    }
    return new EnvSession(this.spec, env, where);
  }
}

function firstLine(e: unknown): string {
  return (e instanceof Error ? e.message : String(e)).split('\n')[0].slice(0, 300);
}

/** Loads an `--env` module: `FILE` (its default export, or its only function export) or `FILE:name`. */
export async function loadEnvironment(spec: string, flag = '--env'): Promise<EnvironmentModule> {
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
  else {
    const fns = Object.entries(mod).filter(([, v]) => typeof v === 'function');
    if (fns.length !== 1) throw new UserError(`${flag} ${spec}: export the environment factory as default, or name it (${spec}:name)${fns.length ? `; it exports ${fns.map(([k]) => k).join(', ')}` : ''}`, { setting: 'env' });
    value = fns[0][1];
  }
  return environmentFrom(value, spec, flag);
}

/** A factory from a value: a class (constructed), a function (called). One shared instance is refused. */
export function environmentFrom(value: unknown, spec = 'env', flag = '--env'): EnvironmentModule {
  if (typeof value === 'function') {
    const f = value as Function;
    const factory: EnvironmentFactory = isClass(f) ? () => new (f as new () => Environment)() : () => (f as () => Environment)();
    return new EnvironmentModule(spec, factory);
  }
  if (value && typeof value === 'object' && typeof (value as Environment).reset === 'function') {
    throw new UserError(`${flag} ${spec}: export a factory (a function or class returning { reset, step }), not one environment object: every rollout needs its own`, { setting: 'env' });
  }
  throw new UserError(`${flag} ${spec}: the export is not an environment factory (a function or class returning { reset, step })`, { setting: 'env' });
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

  /** Starts the episode: its opening messages (to append after the prompt). */
  async reset(row: Record<string, unknown>, seed: number): Promise<Message[]> {
    const start = await this.guard('reset', () => this.env.reset(row, { seed }));
    if (start === undefined || start === null) return [];
    if (typeof start !== 'object') throw this.shape('reset', 'expected { messages?, tools? }');
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
