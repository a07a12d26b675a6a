/**
 * The tool journal: results of tools that are not a function of the seed (MCP servers, `cmd:`
 * programs) kept in the run folder, one JSON line per call, keyed by step, rollout, turn and call.
 * Each line is written to the file as the call returns, so a run killed mid-step keeps what it had
 * (the kernel holds it: a kill -9 loses nothing; a power cut may lose the last lines). On `--resume`
 * the calls of the steps being re-run are answered from the journal, so the resumed run sees the same
 * tool outputs and takes the same updates. In-process tools and environments are not journaled: they
 * draw only from their seed.
 */
import * as fs from 'node:fs';
import { DamagedFileError } from '../errors.ts';
import { fileError, writeFileAtomic } from '../io/atomic.ts';

/** Where a call stands in the run. */
export interface JournalKey {
  step: number;
  rollout: number;
  turn: number;
  call: number;
}

/** One journaled call: its key, what was asked, and what the tool answered (the tool message's content). */
export interface JournalEntry extends JournalKey {
  name: string;
  arguments: Record<string, unknown>;
  content: string;
  ok: boolean;
  error?: string;
}

/** The journal's file name in a run folder. */
export const JOURNAL_FILE = 'tool-journal.jsonl';

const keyOf = (k: JournalKey): string => `${k.step}/${k.rollout}/${k.turn}/${k.call}`;

/** Arguments in one canonical text (keys sorted), so replays compare what was asked, not key order. */
export function canonicalJson(v: unknown): string {
  if (Array.isArray(v)) return `[${v.map(canonicalJson).join(',')}]`;
  if (v && typeof v === 'object') {
    return `{${Object.keys(v)
      .sort()
      .map((k) => `${JSON.stringify(k)}:${canonicalJson((v as Record<string, unknown>)[k])}`)
      .join(',')}}`;
  }
  return JSON.stringify(v) ?? 'null';
}

export class ToolJournal {
  private entries = new Map<string, JournalEntry>();
  private fd: number | null = null;
  /** A torn last line (the process was killed while writing it), dropped when the journal was opened. */
  readonly tornLines: number = 0;
  /** Calls answered from the journal, and calls whose journaled question differed (run live instead). */
  replayed = 0;
  diverged = 0;

  private constructor(readonly file: string) {}

  /**
   * Opens the journal of a run folder. A fresh run (`resumeFrom` undefined) starts an empty file; a
   * resumed run keeps the file, drops a torn last line, and replays the entries of steps ≥ `resumeFrom`.
   */
  static open(file: string, options: { resumeFrom?: number } = {}): ToolJournal {
    const j = new ToolJournal(file);
    if (options.resumeFrom === undefined || !fs.existsSync(file)) {
      writeFileAtomic(file, '');
    } else {
      (j as { tornLines: number }).tornLines = j.load(options.resumeFrom);
    }
    try {
      j.fd = fs.openSync(file, 'a');
    } catch (e) {
      throw fileError(e, file);
    }
    return j;
  }

  private load(from: number): number {
    let text: string;
    try {
      text = fs.readFileSync(this.file, 'utf8');
    } catch (e) {
      throw fileError(e, this.file);
    }
    const lines = text.split('\n');
    const lastComplete = text.lastIndexOf('\n') + 1;
    let torn = 0;
    if (lastComplete < text.length) {
      // The last line has no newline: the write was cut off. Cut the file back to whole lines.
      torn = 1;
      lines.pop();
      try {
        fs.truncateSync(this.file, Buffer.byteLength(text.slice(0, lastComplete)));
      } catch (e) {
        throw fileError(e, this.file);
      }
    }
    lines.forEach((line, i) => {
      if (!line.trim()) return;
      let e: JournalEntry;
      try {
        e = JSON.parse(line) as JournalEntry;
      } catch {
        throw new DamagedFileError(`${this.file}:${i + 1}: not a JSON line; the tool journal is damaged`, { file: this.file, line: i + 1 });
      }
      if (typeof e.step !== 'number' || typeof e.rollout !== 'number' || typeof e.turn !== 'number' || typeof e.call !== 'number' || typeof e.content !== 'string') {
        throw new DamagedFileError(`${this.file}:${i + 1}: not a tool journal entry (step, rollout, turn, call, content)`, { file: this.file, line: i + 1 });
      }
      if (e.step >= from) this.entries.set(keyOf(e), e);
    });
    return torn;
  }

  /** The journaled answer for a call, when one exists and it asked the same tool with the same arguments. */
  lookup(key: JournalKey, name: string, args: Record<string, unknown>): JournalEntry | undefined {
    const e = this.entries.get(keyOf(key));
    if (!e) return undefined;
    if (e.name !== name || canonicalJson(e.arguments) !== canonicalJson(args)) {
      this.diverged++;
      return undefined;
    }
    this.replayed++;
    return e;
  }

  /** Appends one call's result (one write of one whole line). */
  record(entry: JournalEntry): void {
    if (this.fd === null) throw new Error(`tool journal ${this.file} is closed`);
    this.entries.set(keyOf(entry), entry);
    try {
      fs.writeSync(this.fd, JSON.stringify(entry) + '\n');
    } catch (e) {
      throw fileError(e, this.file);
    }
  }

  /** How many entries the journal holds for replay (the steps ≥ resumeFrom, plus those written since). */
  get size(): number {
    return this.entries.size;
  }

  close(): void {
    if (this.fd !== null) fs.closeSync(this.fd);
    this.fd = null;
  }
}
