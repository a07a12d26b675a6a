import { Command, CommanderError } from 'commander';
import { UserError } from '../errors.ts';
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

export async function main(argv: string[]): Promise<void> {
  const program = buildProgram();
  try {
    await program.parseAsync(argv);
  } catch (e) {
    if (e instanceof CommanderError) {
      process.exitCode = e.exitCode;
      return;
    }
    if (e instanceof UserError) {
      process.stderr.write(`prefzoo: ${e.message}\n`);
      process.exitCode = 1;
      return;
    }
    throw e;
  }
}
