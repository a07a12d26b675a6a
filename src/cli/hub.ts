/**
 * Hub names on the command line: the flags every command that takes a model or data shares
 * (`--revision`, `--offline`, `--split`, `--subset`), and the resolution of a flag's value (a folder,
 * or `ORG/NAME[@revision]`) into a local path with src/hub, each resolved name printed on stderr and
 * kept for the run's config.json.
 */
import type { Command } from 'commander';
import { existsSync, readFileSync } from 'node:fs';
import { join } from 'node:path';
import { UserError } from '../errors.ts';
import { isHubName, resolveDataset, resolveModel, type HubSnapshot, type ModelWant } from '../hub/index.ts';
import { terminalReporter } from './progress.ts';
import type { Reporter } from '../progress.ts';

/** The flags of a command whose models may be Hub names. */
export function modelHubFlags(cmd: Command): Command {
  return cmd
    .option('--revision <rev>', 'branch, tag or commit of a --model given as a Hub name ORG/NAME (default main; ORG/NAME@rev works for any name)')
    .option('--offline', 'use only the Hugging Face cache, never the network (as HF_HUB_OFFLINE=1)');
}

/** And of a command whose data may be a Hub dataset name. */
export function dataHubFlags(cmd: Command): Command {
  return cmd
    .option('--split <name>', 'split of a --data given as a Hub dataset name ORG/NAME (default train)')
    .option('--subset <name>', 'subset (config) of a --data given as a Hub dataset name');
}

export interface HubFlags {
  revision?: string;
  offline?: boolean;
  split?: string;
  subset?: string;
  quiet?: boolean;
}

/** Every name this process resolved, by flag (model, data, ref, adapter): what a run's config.json records. */
const RESOLVED: Record<string, HubSnapshot> = {};

/** The names resolved so far, or undefined when none was a Hub name. */
export function hubRecord(): Record<string, HubSnapshot> | undefined {
  return Object.keys(RESOLVED).length ? { ...RESOLVED } : undefined;
}

/** Resolves the names one command was given; `record` is what its config.json records. */
export class Names {
  readonly resolved = RESOLVED;

  private readonly reporter: Reporter;

  constructor(private readonly o: HubFlags) {
    this.reporter = terminalReporter(o.quiet);
  }

  private hubOptions(revision?: string) {
    return { revision, offline: this.o.offline, reporter: this.reporter };
  }

  private note(key: string, flag: string, value: string, s: HubSnapshot): void {
    this.resolved[key] = s;
    this.reporter.info(`${flag} ${value} → ${s.path} (commit ${s.commit.slice(0, 12)}, ${s.from === 'cache' ? 'from the cache' : 'downloaded'})`);
  }

  /** A model flag's value as a folder; `--revision` applies to `--model` only. */
  async model(key: string, flag: string, value: string, want?: ModelWant): Promise<string>;
  async model(key: string, flag: string, value: string | undefined, want?: ModelWant): Promise<string | undefined>;
  async model(key: string, flag: string, value: string | undefined, want: ModelWant = 'model'): Promise<string | undefined> {
    if (value === undefined) return undefined;
    const r = await resolveModel(value, want, this.hubOptions(flag === '--model' || flag === '--config' ? this.o.revision : undefined));
    if (r.hub) this.note(key, flag, value, r.hub);
    return r.path;
  }

  /** Like {@link model}, also saying whether the repo is a PEFT adapter. */
  async modelOrAdapter(key: string, flag: string, value: string): Promise<{ path: string; adapter: boolean }> {
    const r = await resolveModel(value, 'model', this.hubOptions(flag === '--model' ? this.o.revision : undefined));
    if (r.hub) this.note(key, flag, value, r.hub);
    return { path: r.path, adapter: r.adapter };
  }

  /** A data flag's value as what the data readers take (a file or a glob), and its files. */
  async data(key: string, flag: string, value: string, revision?: string): Promise<{ spec: string; files: string[] }>;
  async data(key: string, flag: string, value: string | undefined, revision?: string): Promise<{ spec: string; files: string[] } | undefined>;
  async data(key: string, flag: string, value: string | undefined, revision?: string): Promise<{ spec: string; files: string[] } | undefined> {
    if (value === undefined) return undefined;
    if ((this.o.split !== undefined || this.o.subset !== undefined) && !isHubName(value)) {
      throw new UserError(`${this.o.split !== undefined ? '--split' : '--subset'} applies to a Hub dataset name (ORG/NAME); ${flag} ${value} is a local path`, { setting: this.o.split !== undefined ? 'split' : 'subset' });
    }
    const r = await resolveDataset(value, { ...this.hubOptions(revision), split: this.o.split, subset: this.o.subset });
    if (r.hub) this.note(key, flag, value, r.hub);
    return { spec: r.spec, files: r.files.length ? r.files : [value] };
  }

  /** The record for config.json, or undefined when no name was resolved. */
  get record(): Record<string, HubSnapshot> | undefined {
    return hubRecord();
  }
}

/** Options that take a model, by what the command reads of it. */
const MODEL_OPTIONS: Readonly<Record<string, ModelWant>> = { model: 'model', ref: 'model', teacher: 'model', 'teacher-ref': 'model', adapter: 'adapter', tokenizer: 'tokenizer' };

/** An option's key in commander's values: `--teacher-ref` is `teacherRef`. */
const optionKey = (flag: string) => flag.replace(/-(\w)/g, (_, c: string) => c.toUpperCase());

/** Commands whose first argument may be a Hub dataset name. */
const DATA_ARGUMENT = new Set(['convert', 'inspect']);

function has(cmd: Command, long: string): boolean {
  return cmd.options.some((o) => o.long === long);
}

/**
 * Gives every command that takes a model or data the Hub flags, and resolves Hub names in its
 * options and data arguments before its action runs, so the commands see local paths.
 */
export function installHubNames(program: Command): void {
  for (const cmd of program.commands) {
    const models = Object.keys(MODEL_OPTIONS).some((k) => has(cmd, `--${k}`)) || cmd.name() === 'init-model';
    const data = has(cmd, '--data') || DATA_ARGUMENT.has(cmd.name());
    if (!models && !data) continue;
    if (!has(cmd, '--revision')) cmd.option('--revision <rev>', `branch, tag or commit of a ${models ? '--model' : 'dataset'} given as a Hub name ORG/NAME (default main; NAME@rev works for any name)`);
    if (!has(cmd, '--offline')) cmd.option('--offline', 'use only the Hugging Face cache, never the network (as HF_HUB_OFFLINE=1)');
    if (data && !has(cmd, '--split')) dataHubFlags(cmd);
  }
  program.hook('preAction', async (_program, cmd) => {
    const o = cmd.opts() as HubFlags & Record<string, unknown>;
    const names = new Names(o);
    const name = cmd.name();
    const before = Object.keys(names.resolved).length;
    await resolveNames(cmd, names, o);
    // train resolves a TRL config's model_name_or_path itself; anywhere else --revision needs a name.
    if (o.revision !== undefined && name !== 'train' && Object.keys(names.resolved).length === before) {
      throw new UserError(`--revision ${o.revision}: no Hub name (ORG/NAME) was given to apply it to`, { setting: 'revision' });
    }
  });
}

async function resolveNames(cmd: Command, names: Names, o: HubFlags & Record<string, unknown>): Promise<void> {
  const name = cmd.name();
  // --revision is the model's where the command takes one, else the dataset's.
  const dataRevision = has(cmd, '--model') || name === 'init-model' ? undefined : o.revision;
  if (name === 'export' && typeof o.model === 'string') return exportNames(cmd, names, o);
  for (const [flag, want] of Object.entries(MODEL_OPTIONS)) {
    const key = optionKey(flag);
    const v = o[key];
    if (typeof v === 'string') cmd.setOptionValue(key, await names.model(key, `--${flag}`, v, want));
  }
  if (name === 'init-model' && typeof o.config === 'string') {
    const dir = await names.model('config', '--config', o.config, 'config');
    if (dir !== o.config) cmd.setOptionValue('config', join(dir, 'config.json'));
  }
  if (typeof o.data === 'string') cmd.setOptionValue('data', (await names.data('data', '--data', o.data, dataRevision)).spec);
  if (DATA_ARGUMENT.has(name)) {
    const args = cmd.processedArgs as unknown[];
    const given = args[0];
    const list = Array.isArray(given) ? (given as string[]) : [given as string];
    const files: string[] = [];
    for (const v of list) files.push(...(await names.data('data', name, v, dataRevision)).files);
    // inspect reads one file: a split of several shards is shown by its first.
    args[0] = Array.isArray(given) ? files : files[0];
  }
}

/**
 * `export --model`: a Hub model, or a PEFT adapter (a Hub name, or a folder) whose
 * base_model_name_or_path is a Hub name, resolved to the base folder plus `--adapter`.
 */
async function exportNames(cmd: Command, names: Names, o: HubFlags & Record<string, unknown>): Promise<void> {
  let model = o.model as string;
  let adapter = typeof o.adapter === 'string' ? await names.model('adapter', '--adapter', o.adapter, 'adapter') : undefined;
  const r = await names.modelOrAdapter('model', '--model', model);
  model = r.path;
  const adapterConfig = join(model, 'adapter_config.json');
  if (!adapter && !existsSync(join(model, 'config.json')) && existsSync(adapterConfig)) {
    let base: unknown;
    try {
      base = (JSON.parse(readFileSync(adapterConfig, 'utf8')) as { base_model_name_or_path?: unknown }).base_model_name_or_path;
    } catch {
      base = undefined; // readExportSource names the broken file
    }
    if (typeof base === 'string' && !existsSync(base) && !existsSync(join(model, base))) {
      const adapterRecord = names.resolved.model;
      const resolved = await names.model('model', 'base_model_name_or_path', base);
      if (resolved !== base) {
        if (adapterRecord) names.resolved.adapter = adapterRecord;
        adapter = model;
        model = resolved;
      }
    }
  }
  cmd.setOptionValue('model', model);
  if (adapter !== undefined) cmd.setOptionValue('adapter', adapter);
}
