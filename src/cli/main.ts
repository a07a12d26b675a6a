import { Command, CommanderError } from 'commander';
import { existsSync, readFileSync } from 'node:fs';
import { dirname, join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { UserError } from '../errors.ts';
import { fileError, removeAllTemps } from '../io/atomic.ts';
import { COMMANDS } from './commands/index.ts';

/** The package's version, from the nearest package.json above this file (the same from src/ and dist/). */
function version(): string {
  let dir = dirname(fileURLToPath(import.meta.url));
  while (!existsSync(join(dir, 'package.json')) && dirname(dir) !== dir) dir = dirname(dir);
  try {
    return (JSON.parse(readFileSync(join(dir, 'package.json'), 'utf8')) as { version: string }).version;
  } catch {
    return 'unknown';
  }
}

/**
 * The command `args` (argv without node and the script) runs: the first word that is not a flag, or
 * the one after `help`. Undefined for the program's own --help and --version.
 */
export function commandOf(args: readonly string[]): string | undefined {
  const words = args.filter((a) => !a.startsWith('-'));
  return words[0] === 'help' ? words[1] : words[0];
}

/**
 * Builds the `prefzoo` program. Only the modules of the commands named in `load` (all when absent)
 * are imported; every other command is listed by its name and summary (src/cli/commands/index.ts).
 */
export async function buildProgram(load?: readonly string[]): Promise<Command> {
  const program = new Command('prefzoo')
    .description('Offline preference alignment of causal language models on ONNX Runtime')
    .version(version())
    .showHelpAfterError('(run with --help for usage)')
    .exitOverride();
  // Modules first (one may register more than one command: reward-train and reward-score), then the
  // summaries of the others.
  const modules = new Set<{ register(program: Command): void }>();
  for (const entry of COMMANDS) if (!load || load.includes(entry.name)) modules.add(await entry.load());
  for (const m of modules) m.register(program);
  // Hub names (ORG/NAME) in the loaded commands' model and data flags become cache folders before their actions.
  if (modules.size) (await import('./hub.ts')).installHubNames(program);
  for (const entry of COMMANDS) {
    const loaded = program.commands.find((c) => c.name() === entry.name);
    if (loaded) loaded.summary(entry.summary);
    else program.command(entry.name).summary(entry.summary).description(entry.summary);
  }
  return program;
}

/** Ctrl-C and SIGTERM remove this process's temporaries before it exits (128 + signal number, as shells do). */
function cleanupOnSignals(): void {
  for (const [sig, n] of [['SIGINT', 2], ['SIGTERM', 15], ['SIGHUP', 1]] as const) {
    process.once(sig, () => {
      removeAllTemps();
      process.stderr.write(`prefzoo: stopped by ${sig}; temporary files removed\n`);
      process.exit(128 + n);
    });
  }
}

export async function main(argv: string[]): Promise<void> {
  cleanupOnSignals();
  // `prefzoo train --help | head`: a reader that stops early is not an error.
  process.stdout.on('error', (e: NodeJS.ErrnoException) => {
    if (e.code !== 'EPIPE') throw e;
    process.exit(0);
  });
  try {
    const name = commandOf(argv.slice(2));
    const program = await buildProgram(name ? [name] : []);
    await program.parseAsync(argv);
  } catch (e) {
    if (e instanceof CommanderError) {
      process.exitCode = e.exitCode;
      return;
    }
    // A full disk, a read-only folder, a missing path: the environment, not a bug; one line.
    const err = fileError(e);
    if (err instanceof UserError) {
      process.stderr.write(`prefzoo: ${err.message.split('\n')[0]}\n`);
      process.exitCode = 1;
      return;
    }
    throw e;
  }
}
