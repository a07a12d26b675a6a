import { Command, CommanderError } from 'commander';
import { UserError } from '../errors.ts';
import { fileError, removeAllTemps } from '../io/atomic.ts';
import { commands } from './commands/index.ts';

/** Builds the `prefzoo` program; every command module adds itself through `commands`. */
export function buildProgram(): Command {
  const program = new Command('prefzoo')
    .description('Offline preference alignment of causal language models on ONNX Runtime')
    .version('0.1.0')
    .showHelpAfterError('(run with --help for usage)')
    .exitOverride();
  for (const register of commands) register(program);
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
  const program = buildProgram();
  cleanupOnSignals();
  try {
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
