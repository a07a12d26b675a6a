/**
 * `./FILE.mjs|.js|.ts[:name]`: every exported function `(completions, rows) => (number | null)[]`,
 * sync or async (`:name` picks one), each named after itself; rows[i] is completion i's prompt record.
 */
import { existsSync } from 'node:fs';
import { isAbsolute, resolve } from 'node:path';
import { pathToFileURL } from 'node:url';
import { UserError } from '../../errors.ts';
import type { RewardKind, UserRewardFn } from './reward.ts';

type ModuleSpec = `${string}.${'mjs' | 'js' | 'ts' | 'mts'}` | `${string}.${'mjs' | 'js' | 'ts' | 'mts'}:${string}`;

export const module: RewardKind<ModuleSpec> = {
  name: 'module',
  syntax: './FILE.mjs|.ts[:function]',
  help: 'every function the module exports, (completions, rows) => (number | null)[] (sync or async; :function picks one), logged under its own name',
  matches: (spec): spec is ModuleSpec => /\.(mjs|js|ts|mts)(:[\w$]+)?$/.test(spec),
  async load(spec) {
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
      return { name: n, source: m[1], rerunnable: true, score: ({ completions, rows, rollouts }) => (rollouts ? fn(completions, rows, rollouts) : fn(completions, rows)) };
    });
  },
};
