/**
 * Progress for long jobs: a live bar on a TTY (cli-progress), plain periodic lines otherwise so
 * logs stay readable in CI and files.
 */
import cliProgress from 'cli-progress';
import { SILENT, type ProgressFactory, type ProgressFields, type Reporter, type ProgressReporter } from '../progress.ts';

export class Progress implements ProgressReporter {
  private bar?: cliProgress.SingleBar;
  private lastLine = 0;
  private start = Date.now();

  constructor(
    readonly label: string,
    readonly total: number,
    private readonly opts: { stream?: NodeJS.WriteStream; quiet?: boolean; plainEverySeconds?: number } = {},
  ) {
    const stream = opts.stream ?? process.stderr;
    if (!opts.quiet && stream.isTTY) {
      this.bar = new cliProgress.SingleBar(
        {
          stream,
          format: `${label} [{bar}] {value}/{total} {fields} | ETA {eta_formatted}`,
          hideCursor: true,
          clearOnComplete: false,
          etaBuffer: 20,
        },
        cliProgress.Presets.shades_classic,
      );
      this.bar.start(total, 0, { fields: '' });
    }
  }

  private static fmtFields(f: ProgressFields): string {
    return Object.entries(f)
      .map(([k, v]) => `${k} ${typeof v === 'number' ? (Number.isInteger(v) ? v : v.toPrecision(4)) : v}`)
      .join(' | ');
  }

  update(value: number, fields: ProgressFields = {}): void {
    if (this.opts.quiet) return;
    const text = Progress.fmtFields(fields);
    if (this.bar) {
      this.bar.update(value, { fields: text });
      return;
    }
    const now = Date.now();
    const every = (this.opts.plainEverySeconds ?? 5) * 1000;
    if (value === this.total || now - this.lastLine >= every) {
      this.lastLine = now;
      const elapsed = (now - this.start) / 1000;
      const eta = value > 0 ? (elapsed / value) * (this.total - value) : NaN;
      (this.opts.stream ?? process.stderr).write(
        `${this.label} ${value}/${this.total}${text ? ' | ' + text : ''} | ${elapsed.toFixed(0)}s elapsed${Number.isFinite(eta) ? `, ETA ${eta.toFixed(0)}s` : ''}\n`,
      );
    }
  }

  stop(): void {
    this.bar?.stop();
  }
}

/** What commands pass to the library as `log`: each line to stderr (stdout carries the command's result). */
export const terminalLog = (line: string): void => {
  process.stderr.write(line + '\n');
};

/** What commands pass to the library: a bar (or plain lines) on stderr for each job. */
export const terminalProgress: ProgressFactory = (label, total) => new Progress(label, total);

/**
 * What a command passes to the library: bars and notes on stderr (stdout carries the command's
 * result). `quiet` silences the bars and, unless `notes` says otherwise, the notes.
 */
export function terminalReporter(quiet = false, notes = !quiet): Reporter {
  return { progress: quiet ? SILENT.progress : terminalProgress, info: notes ? terminalLog : SILENT.info };
}
