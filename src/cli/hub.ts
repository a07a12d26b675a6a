/**
 * Hub names on the command line: the flags every command that takes a model or data shares
 * (`--revision`, `--offline`, `--split`, `--subset`), and the resolution of a flag's value (a folder,
 * or `ORG/NAME[@revision]`) into a local path with src/hub, each resolved name printed on stderr and
 * kept for the run's config.json.
 */
import type { Command } from 'commander';
import { UserError } from '../errors.ts';
import { isHubName, resolveDataset, resolveModel, type HubSnapshot, type ModelWant } from '../hub/index.ts';
import { terminalLog, terminalProgress } from './progress.ts';

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

/** Resolves the names one command was given; `resolved` is what its config.json records. */
export class Names {
  readonly resolved: Record<string, HubSnapshot> = {};

  constructor(private readonly o: HubFlags) {}

  private hubOptions(revision?: string) {
    return { revision, offline: this.o.offline, progress: this.o.quiet ? undefined : terminalProgress, log: this.o.quiet ? undefined : terminalLog };
  }

  private note(key: string, flag: string, value: string, s: HubSnapshot): void {
    this.resolved[key] = s;
    if (!this.o.quiet) terminalLog(`${flag} ${value} → ${s.path} (commit ${s.commit.slice(0, 12)}, ${s.from === 'cache' ? 'from the cache' : 'downloaded'})`);
  }

  /** A model flag's value as a folder; `--revision` applies to `--model` only. */
  async model(key: string, flag: string, value: string, want?: ModelWant): Promise<string>;
  async model(key: string, flag: string, value: string | undefined, want?: ModelWant): Promise<string | undefined>;
  async model(key: string, flag: string, value: string | undefined, want: ModelWant = 'model'): Promise<string | undefined> {
    if (value === undefined) return undefined;
    const r = await resolveModel(value, want, this.hubOptions(flag === '--model' ? this.o.revision : undefined));
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
    if ((this.o.split !== undefined || this.o.subset !== undefined) && !isHubName(value, { data: true })) {
      throw new UserError(`${this.o.split !== undefined ? '--split' : '--subset'} applies to a Hub dataset name (ORG/NAME); ${flag} ${value} is a local path`, { setting: this.o.split !== undefined ? 'split' : 'subset' });
    }
    const r = await resolveDataset(value, { ...this.hubOptions(revision), split: this.o.split, subset: this.o.subset });
    if (r.hub) this.note(key, flag, value, r.hub);
    return { spec: r.spec, files: r.files.length ? r.files : [value] };
  }

  /** The record for config.json, or undefined when no name was resolved. */
  get record(): Record<string, HubSnapshot> | undefined {
    return Object.keys(this.resolved).length ? this.resolved : undefined;
  }
}
