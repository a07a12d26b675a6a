/**
 * `cmd:COMMAND`: a program speaking JSON lines, started once and kept running: one
 * `{"prompt", "completion", "row"}` line in per completion, one `{"reward": number | null}` line out,
 * in order. The `cmd:` judge speaks the same protocol with other fields (judges.ts).
 */
import { UserError } from '../../errors.ts';
import { AnswerError, JsonLinesProgram } from '../line-process.ts';
import { after, RowError, type RewardBatch, type RewardFunction, type RewardKind } from './reward.ts';

class CommandReward implements RewardFunction {
  readonly name = 'cmd';
  readonly rerunnable = false;
  readonly source: string;
  private readonly program: JsonLinesProgram;
  constructor(command: string) {
    if (!command.trim()) throw new UserError('--reward cmd: the command is empty');
    this.source = `cmd:${command}`;
    this.program = new JsonLinesProgram(command);
  }

  async score({ completions, rows }: RewardBatch): Promise<(number | null)[]> {
    const read = (a: unknown) => {
      const r = (a as { reward?: unknown } | null)?.reward;
      return r === null || typeof r === 'number' ? r : undefined;
    };
    try {
      return await this.program.ask(completions.map((c, i) => ({ prompt: rows[i].prompt, completion: c, row: rows[i] })), read);
    } catch (e) {
      if (!(e instanceof AnswerError)) throw e;
      const shown = JSON.stringify(e.line.slice(0, 80));
      if (e.why === 'closed') throw new RowError(e.index, `the command closed its output${this.program.stderrNote()}`);
      if (e.why === 'json') throw new RowError(e.index, `answer is not JSON: ${shown}`);
      throw new RowError(e.index, `answer must be {"reward": number or null}, got ${shown}`);
    }
  }

  abandon(): void {
    this.program.abandon();
  }

  async release(): Promise<void> {
    await this.program.release();
  }
}

export const cmd: RewardKind<`cmd:${string}`> = {
  name: 'cmd',
  syntax: 'cmd:COMMAND',
  help: 'a program (sh -c COMMAND) reading {"prompt","completion","row"} JSON lines and answering {"reward": number | null} per line, in order',
  matches: (spec): spec is `cmd:${string}` => spec.startsWith('cmd:'),
  load: (spec) => [new CommandReward(after(spec, 'cmd:'))],
};
