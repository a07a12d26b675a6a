import type { Command } from 'commander';

/** Every `prefzoo` subcommand: one module each, one line here each. */
export const commands: Array<(program: Command) => void> = [
];
