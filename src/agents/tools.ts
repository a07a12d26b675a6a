/**
 * Tools written as code: a `--tools` module's exports made into one shape, `LoadedTool`, whose
 * arguments are checked against the tool's JSON Schema (ajv) before it runs. Two shapes are read: the
 * project's own `{ name, description, parameters, run(args, ctx) }` with a JSON Schema, and the Vercel
 * AI SDK's `tool({ description, inputSchema, execute })` with a zod schema, converted by zod's own
 * `z.toJSONSchema` (the input side: fields with defaults are optional to the model).
 */
import { existsSync } from 'node:fs';
import { createRequire } from 'node:module';
import { isAbsolute, resolve } from 'node:path';
import { pathToFileURL } from 'node:url';
import type { Ajv, ValidateFunction } from 'ajv';
import type { Ajv2019 } from 'ajv/dist/2019.js';
import type { Ajv2020 } from 'ajv/dist/2020.js';
import type { z } from 'zod';
import { UserError } from '../errors.ts';
import type { ToolSpec } from '../chat.ts';
import type { ToolContext, ToolDef } from './types.ts';

/** A tool ready to call: its spec for the template, a validator, and how to run it. */
export interface LoadedTool {
  name: string;
  spec: ToolSpec;
  /** Checks the arguments: null when they fit the schema, else what is wrong (one short phrase). */
  check(args: Record<string, unknown>): string | null;
  /** Runs the tool on checked arguments. */
  run(args: Record<string, unknown>, ctx: ToolContext): unknown;
  /** Where the tool came from, for messages (`tools.mjs`, `MCP server memory`). */
  origin: string;
}

// ajv and zod are required when a schema is first compiled or converted, not with every command that
// could load tools (with the MCP SDK, ~0.5 s of CPU at start-up). zod keeps its registry on
// globalThis, so this copy reads the descriptions of schemas made by a tools module's own import.
const require = createRequire(import.meta.url);

type Validators = { d7: Ajv; d2019: Ajv2019; d2020: Ajv2020 };
let validators: Validators | null = null;

/** A validator for a JSON Schema, by the draft its `$schema` names (draft-07 when it names none). */
export function compileSchema(schema: Record<string, unknown>, what: string): ValidateFunction {
  if (!validators) {
    const options = { strict: false, allErrors: false, validateFormats: false };
    validators = {
      d7: new (require('ajv') as typeof import('ajv')).Ajv(options),
      d2019: new (require('ajv/dist/2019.js') as typeof import('ajv/dist/2019.js')).Ajv2019(options),
      d2020: new (require('ajv/dist/2020.js') as typeof import('ajv/dist/2020.js')).Ajv2020(options),
    };
  }
  const id = typeof schema.$schema === 'string' ? schema.$schema : '';
  const ajv = id.includes('2020-12') ? validators.d2020 : id.includes('2019-09') ? validators.d2019 : validators.d7;
  try {
    return ajv.compile(schema);
  } catch (e) {
    throw new UserError(`${what}: its parameters are not a usable JSON Schema (${(e as Error).message.split('\n')[0]})`);
  }
}

/** The first thing a validator found wrong, short enough for a tool message. */
export function schemaProblem(validate: ValidateFunction): string {
  const e = validate.errors?.[0];
  if (!e) return 'arguments do not match the schema';
  const at = e.instancePath ? `argument ${e.instancePath.slice(1).replace(/\//g, '.')}` : 'arguments';
  const extra = e.keyword === 'additionalProperties' ? ` (${(e.params as { additionalProperty?: string }).additionalProperty})` : e.keyword === 'enum' ? ` (${(e.params as { allowedValues?: unknown[] }).allowedValues?.map((v) => JSON.stringify(v)).join(', ')})` : '';
  return `${at} ${e.message ?? 'invalid'}${extra}`;
}

/** The spec a template receives: the schema without `$schema` (noise in a prompt). */
function specOf(name: string, description: string | undefined, parameters: Record<string, unknown>): ToolSpec {
  const { $schema: _drop, ...rest } = parameters;
  const fn: ToolSpec['function'] = { name, parameters: rest };
  if (description) fn.description = description;
  return { type: 'function', function: fn };
}

/** Tool names as the chat formats accept them (OpenAI's rule: letters, digits, `_`, `-`, at most 64). */
export const TOOL_NAME = /^[A-Za-z0-9_-]{1,64}$/;

function isZod(x: unknown): x is z.ZodType {
  return !!x && typeof x === 'object' && '_zod' in x;
}

function isZod3(x: unknown): boolean {
  return !!x && typeof x === 'object' && '_def' in x && !('_zod' in x);
}

/** The JSON Schema of an AI SDK tool's input: zod v4, the SDK's `jsonSchema()` wrapper, or a plain schema. */
function inputSchemaOf(schema: unknown, what: string): { json: Record<string, unknown>; zod: z.ZodType | null } {
  if (isZod(schema)) {
    let json: Record<string, unknown>;
    try {
      json = (require('zod') as typeof import('zod')).z.toJSONSchema(schema, { target: 'draft-7', io: 'input', unrepresentable: 'any' }) as Record<string, unknown>;
    } catch (e) {
      throw new UserError(`${what}: zod cannot export its schema as JSON Schema (${(e as Error).message.split('\n')[0]})`);
    }
    return { json, zod: schema };
  }
  if (isZod3(schema)) throw new UserError(`${what}: its schema is a zod v3 schema; use zod v4 (import { z } from 'zod', version 4), whose z.toJSONSchema converts it`);
  if (schema && typeof schema === 'object') {
    const wrapped = (schema as { jsonSchema?: unknown }).jsonSchema;
    if (wrapped && typeof wrapped === 'object') return { json: wrapped as Record<string, unknown>, zod: null };
    return { json: schema as Record<string, unknown>, zod: null };
  }
  throw new UserError(`${what}: it has no schema (inputSchema, parameters)`);
}

function checkName(name: unknown, what: string): string {
  if (typeof name !== 'string' || !TOOL_NAME.test(name)) throw new UserError(`${what}: tool name ${JSON.stringify(name)} must be 1–64 letters, digits, _ or -`);
  return name;
}

/**
 * One exported value as a tool, or null when it is no tool (a helper function, a constant). `key` is
 * the export's name (the AI SDK shape's tool name unless the tool names itself); `origin` names the
 * module in messages.
 */
export function toolFromExport(key: string, value: unknown, origin: string): LoadedTool | null {
  if (!value || typeof value !== 'object') return null;
  const v = value as Record<string, unknown>;
  if (typeof v.run === 'function') {
    const what = `${origin}: export ${key}`;
    const name = checkName(v.name, what);
    if (!v.parameters || typeof v.parameters !== 'object') throw new UserError(`${what} (tool ${name}): "parameters" must be a JSON Schema object`);
    const parameters = v.parameters as Record<string, unknown>;
    if (isZod(parameters)) return aiSdkTool(name, v, origin, what, v.run as ZodRun);
    const validate = compileSchema(parameters, `${what} (tool ${name})`);
    const run = v.run as (args: Record<string, unknown>, ctx: ToolContext) => unknown;
    return {
      name,
      origin,
      spec: specOf(name, typeof v.description === 'string' ? v.description : undefined, parameters),
      check: (args) => (validate(args) ? null : schemaProblem(validate)),
      run: (args, ctx) => run.call(value, args, ctx),
    };
  }
  if (typeof v.execute === 'function') {
    const name = checkName(typeof v.name === 'string' ? v.name : key, `${origin}: export ${key}`);
    return aiSdkTool(name, v, origin, `${origin}: export ${key}`, v.execute as ZodRun);
  }
  return null;
}

type ZodRun = (args: unknown, options: unknown) => unknown;

function aiSdkTool(name: string, v: Record<string, unknown>, origin: string, what: string, execute: ZodRun): LoadedTool {
  const { json, zod } = inputSchemaOf(v.inputSchema ?? v.parameters, `${what} (tool ${name})`);
  const validate = compileSchema(json, `${what} (tool ${name})`);
  return {
    name,
    origin,
    spec: specOf(name, typeof v.description === 'string' ? v.description : undefined, json),
    check(args) {
      if (!validate(args)) return schemaProblem(validate);
      // Refinements and transforms JSON Schema cannot say: zod has the last word.
      if (zod) {
        const r = zod.safeParse(args);
        if (!r.success) return r.error.issues[0] ? `${r.error.issues[0].path.length ? `argument ${r.error.issues[0].path.join('.')}` : 'arguments'}: ${r.error.issues[0].message}` : 'arguments do not match the schema';
      }
      return null;
    },
    run(args, ctx) {
      // The SDK hands execute the parsed value (defaults filled in) and { toolCallId, messages, abortSignal }.
      const parsed = zod ? zod.parse(args) : args;
      return execute.call(v, parsed, { ...ctx, toolCallId: ctx.toolCallId ?? '', messages: [], abortSignal: ctx.signal });
    },
  };
}

/** Tools of a module's exports, in export order; a default export may be one tool or an array/object of them. */
export function toolsFromModule(mod: Record<string, unknown>, origin: string): LoadedTool[] {
  return toolsFromEntries(Object.entries(mod), origin);
}

function toolsFromEntries(entries: [string, unknown][], origin: string): LoadedTool[] {
  const out: LoadedTool[] = [];
  const visit = (key: string, value: unknown, nested: boolean): void => {
    if (Array.isArray(value)) {
      value.forEach((t, i) => visit(`${key}[${i}]`, t, true));
      return;
    }
    const t = toolFromExport(key, value, origin);
    if (t) out.push(t);
    else if (key === 'default' && !nested && value && typeof value === 'object') {
      for (const [k, x] of Object.entries(value)) visit(k, x, true);
    }
  };
  for (const [key, value] of entries) visit(key, value, false);
  const seen = new Map<string, string>();
  for (const t of out) {
    if (seen.has(t.name)) throw new UserError(`${origin}: two tools are named "${t.name}"`);
    seen.set(t.name, origin);
  }
  return out;
}

/** Imports a `--tools` module (`.mjs`, `.js`, `.ts`, `.mts`) and reads its tools; none is an error. */
export async function loadToolsModule(spec: string, flag = '--tools'): Promise<LoadedTool[]> {
  if (!/\.(?:mjs|cjs|js|ts|mts)$/.test(spec)) throw new UserError(`${flag} ${spec}: a tools module must be a .mjs, .js or .ts file`);
  const file = isAbsolute(spec) ? spec : resolve(spec);
  if (!existsSync(file)) throw new UserError(`${flag} ${spec}: ${file} does not exist`);
  let mod: Record<string, unknown>;
  try {
    mod = (await import(pathToFileURL(file).href)) as Record<string, unknown>;
  } catch (e) {
    throw new UserError(`${flag} ${spec}: cannot load the module (${(e as Error).message.split('\n')[0]})`);
  }
  const tools = toolsFromModule(mod, spec);
  if (tools.length === 0) throw new UserError(`${flag} ${spec}: the module exports no tool (an object with name, parameters and run, or an AI SDK tool with inputSchema and execute)`);
  return tools;
}

/** Tools given as values (the library's `tools: [...]`), in the same shapes a module exports. */
export function toolsFromValues(values: readonly (ToolDef | Record<string, unknown>)[], origin = 'tools'): LoadedTool[] {
  const tools = toolsFromEntries(
    values.map((v, i) => [typeof (v as { name?: unknown }).name === 'string' ? (v as { name: string }).name : `tools[${i}]`, v]),
    origin,
  );
  if (tools.length !== values.length) throw new UserError(`${origin}: ${values.length - tools.length} of the ${values.length} values given are no tool (an object with name, parameters and run, or an AI SDK tool with inputSchema and execute)`);
  return tools;
}
