/**
 * Input readers: JSON array, JSON Lines, CSV/TSV, Parquet and Arrow IPC, any of them gzip-compressed.
 * Each yields records in small arrays (one await per chunk, not per record) with the line or row
 * each came from, so every later error can name its place in the file.
 */
import * as arrow from './arrow.ts';
import { createReadStream } from 'node:fs';
import { open, readFile, stat } from 'node:fs/promises';
import { Transform, type Readable } from 'node:stream';
import { StringDecoder } from 'node:string_decoder';
import { createGunzip, gunzipSync } from 'node:zlib';
import { BadInputError, UserError } from '../src/errors.ts';
import { errorText, readParquetBatches } from './parquet.ts';

export type InputFormat = 'json' | 'jsonl' | 'csv' | 'tsv' | 'parquet' | 'arrow';

/** One record, or the reason it could not be read. `pos` is a 1-based line or row number. */
export interface Item {
  pos: number;
  value?: unknown;
  error?: string;
}

export interface Source {
  path: string;
  format: InputFormat;
  gzip: boolean;
  /** Whether `pos` counts text lines or records. */
  unit: 'line' | 'row';
  /** Values are all strings (CSV), so numbers and booleans arrive as text. */
  textual: boolean;
  items(): AsyncGenerator<Item[]>;
}

/** `data.jsonl:7` or `data.csv:row 7`: the prefix of every record error. */
export function where(src: Pick<Source, 'path' | 'unit'>, pos: number): string {
  return src.unit === 'line' ? `${src.path}:${pos}` : `${src.path}:row ${pos}`;
}

const EXTENSIONS: Record<string, InputFormat> = {
  '.json': 'json',
  '.jsonl': 'jsonl',
  '.ndjson': 'jsonl',
  '.csv': 'csv',
  '.tsv': 'tsv',
  '.tab': 'tsv',
  '.parquet': 'parquet',
  '.pq': 'parquet',
  '.arrow': 'arrow',
  '.arrows': 'arrow',
  '.ipc': 'arrow',
  '.feather': 'arrow',
};

async function head(path: string, n: number): Promise<Buffer> {
  const fh = await open(path, 'r');
  try {
    const buf = Buffer.alloc(n);
    const { bytesRead } = await fh.read(buf, 0, n, 0);
    return buf.subarray(0, bytesRead);
  } finally {
    await fh.close();
  }
}

function firstNonSpace(buf: Buffer): number {
  let i = buf[0] === 0xef && buf[1] === 0xbb && buf[2] === 0xbf ? 3 : 0;
  while (i < buf.length && (buf[i] === 0x20 || buf[i] === 0x0a || buf[i] === 0x0d || buf[i] === 0x09)) i++;
  return i < buf.length ? buf[i] : -1;
}

function sniff(buf: Buffer): InputFormat | null {
  if (buf.subarray(0, 4).toString('latin1') === 'PAR1') return 'parquet';
  if (buf.subarray(0, 6).toString('latin1') === 'ARROW1' || (buf.length >= 4 && buf.readUInt32LE(0) === 0xffffffff)) return 'arrow';
  const c = firstNonSpace(buf);
  if (c === 0x5b) return 'json';
  if (c === 0x7b) return 'jsonl';
  return null;
}

/** Opens an input file, deciding its format from the extension (and from the bytes when unclear). */
export async function openSource(path: string): Promise<Source> {
  let st;
  try {
    st = await stat(path);
  } catch {
    throw new BadInputError(`${path}: no such file`, { file: path });
  }
  if (!st.isFile()) throw new BadInputError(`${path}: not a file`, { file: path });
  const raw = await head(path, 4096);
  const gzip = raw[0] === 0x1f && raw[1] === 0x8b;
  const name = path.toLowerCase().replace(/\.gz$/, '');
  const ext = name.slice(name.lastIndexOf('.'));
  let format: InputFormat | null = EXTENSIONS[ext] ?? null;
  let start = raw;
  if (gzip) {
    // Enough of the decompressed head to sniff; a truncated gzip tail is fine here.
    start = await gunzipHead(path);
  }
  if (start.length === 0) throw new BadInputError(`${path}: empty file`, { file: path });
  // Content beats the name for the JSON family: .json files are often JSON Lines, and the reverse.
  if (format === null || format === 'json' || format === 'jsonl') format = sniff(start) ?? format;
  if (format === 'jsonl' && ext === '.json') {
    const text = start.toString('utf8').replace(/^\ufeff/, '');
    const nl = text.indexOf('\n');
    if (nl > 0 && !isBlank(text.slice(0, nl))) {
      try {
        JSON.parse(text.slice(0, nl));
      } catch {
        throw new BadInputError(`${path}: one multi-line JSON object; expected a JSON array of records "[...]" or JSON Lines (one record per line)`, { file: path });
      }
    }
  }
  if (format === null) {
    throw new BadInputError(`${path}: unknown input format; expected .json, .jsonl, .csv, .tsv, .parquet or .arrow (optionally .gz)`, { file: path });
  }
  const unit = format === 'json' || format === 'jsonl' ? 'line' : 'row';
  const src: Source = { path, format, gzip, unit, textual: format === 'csv' || format === 'tsv', items: () => none() };
  switch (format) {
    case 'jsonl':
      src.items = () => jsonlItems(src);
      break;
    case 'json':
      src.items = () => jsonArrayItems(src);
      break;
    case 'csv':
    case 'tsv':
      src.items = () => csvItems(src, format === 'tsv' ? '\t' : ',');
      break;
    case 'parquet':
      src.items = () => arrowItems(readParquetBatches(path));
      break;
    case 'arrow':
      src.items = () => arrowItems(readArrowBatches(src));
      break;
  }
  return src;
}

async function* none(): AsyncGenerator<Item[]> {}

async function gunzipHead(path: string): Promise<Buffer> {
  const stream = createReadStream(path, { start: 0, end: 1 << 16 }).pipe(createGunzip());
  const parts: Buffer[] = [];
  let n = 0;
  try {
    for await (const chunk of stream as AsyncIterable<Buffer>) {
      parts.push(chunk);
      n += chunk.length;
      if (n >= 4096) break;
    }
  } catch {
    // The slice we read ends mid-stream; whatever decompressed before that is what we wanted.
  }
  stream.destroy();
  return Buffer.concat(parts);
}

/** Raw bytes of an input, decompressed when gzip'd. */
export function byteStream(src: Pick<Source, 'path' | 'gzip'>): Readable {
  const file = createReadStream(src.path, { highWaterMark: 1 << 20 });
  if (!src.gzip) return file;
  const gz = createGunzip({ chunkSize: 1 << 20 });
  file.on('error', (e) => gz.destroy(e));
  return file.pipe(gz);
}

function parseLine(text: string, pos: number): Item {
  try {
    return { pos, value: JSON.parse(text) };
  } catch (e) {
    return { pos, error: `invalid JSON (${errorText(e)})` };
  }
}

function isBlank(s: string): boolean {
  for (let i = 0; i < s.length; i++) {
    const c = s.charCodeAt(i);
    if (c !== 0x20 && c !== 0x09 && c !== 0x0d && c !== 0x0a) return false;
  }
  return true;
}

/** JSON Lines: one record per non-blank line, parsed as the text streams in. */
async function* jsonlItems(src: Source): AsyncGenerator<Item[]> {
  const decoder = new StringDecoder('utf8');
  let carry = '';
  let line = 0;
  let first = true;
  for await (const chunk of byteStream(src) as AsyncIterable<Buffer>) {
    let text = carry + decoder.write(chunk);
    if (first && text.length > 0) {
      if (text.charCodeAt(0) === 0xfeff) text = text.slice(1);
      first = false;
    }
    const out: Item[] = [];
    let start = 0;
    for (let nl = text.indexOf('\n'); nl !== -1; nl = text.indexOf('\n', start)) {
      line++;
      const s = text.slice(start, nl);
      start = nl + 1;
      if (s.charCodeAt(0) !== 0x7b && isBlank(s)) continue;
      out.push(parseLine(s, line));
    }
    carry = text.slice(start);
    if (out.length) yield out;
  }
  carry += decoder.end();
  if (first && carry.charCodeAt(0) === 0xfeff) carry = carry.slice(1);
  if (!isBlank(carry)) yield [parseLine(carry, line + 1)];
}

/**
 * A JSON array of records, split into elements by a scanner that tracks strings and nesting, so
 * each element is parsed alone (and named by the line it starts on) without holding the file.
 */
async function* jsonArrayItems(src: Source): AsyncGenerator<Item[]> {
  const decoder = new StringDecoder('utf8');
  let buf = ''; // text not yet consumed; an element in progress starts at buf[0]
  let scan = 0; // how far into buf the scanner has looked
  let line = 1;
  let state = 'before' as 'before' | 'between' | 'element' | 'after';
  let expectValue = true; // in 'between': true right after '[' or ','
  let depth = 0;
  let inString = false;
  let elemLine = 0;
  let first = true;
  const stringEnd = /["\\]/g;
  const fail = (msg: string): never => {
    throw new BadInputError(`${src.path}:${line}: invalid JSON (${msg})`, { file: src.path, line });
  };

  let bare = false; // the element in progress is a bare scalar (number, true, null)
  const finish = (end: number, out: Item[]) => {
    out.push(parseLine(buf.slice(0, end), elemLine));
    buf = buf.slice(end);
    state = 'between';
    expectValue = false;
  };

  const consume = (out: Item[]) => {
    let i = scan;
    while (i < buf.length) {
      if (state === 'element' && bare) {
        const m = /[,\]\s]/.exec(buf);
        if (!m) {
          i = buf.length;
          break;
        }
        finish(m.index, out);
        i = 0;
        continue;
      }
      if (state === 'element' && inString) {
        stringEnd.lastIndex = i;
        const m = stringEnd.exec(buf);
        if (!m) {
          i = buf.length;
          break;
        }
        if (buf.charCodeAt(m.index) === 0x5c) {
          if (m.index + 1 >= buf.length) {
            i = m.index; // the escaped character is in the next chunk
            break;
          }
          i = m.index + 2;
          continue;
        }
        inString = false;
        i = m.index + 1;
        if (depth === 0) {
          finish(i, out);
          i = 0;
        }
        continue;
      }
      const c = buf.charCodeAt(i);
      if (c === 0x0a) line++;
      if (state === 'element') {
        if (c === 0x22) inString = true;
        else if (c === 0x7b || c === 0x5b) depth++;
        else if ((c === 0x7d || c === 0x5d) && --depth === 0) {
          finish(i + 1, out);
          i = 0;
          continue;
        }
        i++;
        continue;
      }
      if (c === 0x20 || c === 0x09 || c === 0x0d || c === 0x0a) {
        i++;
        continue;
      }
      if (state === 'before') {
        if (c !== 0x5b) fail('expected a JSON array of records "[...]" or JSON Lines');
        state = 'between';
        expectValue = true;
        i++;
      } else if (state === 'after') {
        fail('unexpected text after the closing "]"');
      } else if (c === 0x5d) {
        state = 'after';
        i++;
      } else if (c === 0x2c) {
        if (expectValue) fail('unexpected ","');
        expectValue = true;
        i++;
      } else {
        if (!expectValue) fail('expected "," or "]" between records');
        buf = buf.slice(i);
        state = 'element';
        elemLine = line;
        depth = c === 0x7b || c === 0x5b ? 1 : 0;
        inString = c === 0x22;
        bare = depth === 0 && !inString;
        i = bare ? 0 : 1;
      }
    }
    if (state !== 'element') {
      buf = '';
      scan = 0;
    } else {
      scan = i;
    }
  };

  for await (const chunk of byteStream(src) as AsyncIterable<Buffer>) {
    let text = decoder.write(chunk);
    if (first && text.length > 0) {
      if (text.charCodeAt(0) === 0xfeff) text = text.slice(1);
      first = false;
    }
    buf += text;
    const out: Item[] = [];
    consume(out);
    if (out.length) yield out;
  }
  buf += decoder.end();
  const out: Item[] = [];
  consume(out);
  if (state === 'element') {
    if (bare) out.push(parseLine(buf.trim(), elemLine));
    else out.push({ pos: elemLine, error: 'invalid JSON (the file ends inside this record)' });
  } else if (state === 'before') {
    fail('expected a JSON array of records "[...]"');
  } else if (state === 'between' && out.length === 0) {
    fail('missing "]" at the end of the file');
  }
  if (out.length) yield out;
}

/** Drops a UTF-8 byte-order mark at the very start of a byte stream. */
function stripBom(): Transform {
  let first = true;
  return new Transform({
    transform(chunk: Buffer, _enc, cb) {
      if (first) {
        first = false;
        if (chunk[0] === 0xef && chunk[1] === 0xbb && chunk[2] === 0xbf) chunk = chunk.subarray(3);
      }
      cb(null, chunk);
    },
  });
}

/** CSV/TSV with a header row: RFC 4180 quoting, CRLF, BOM. Rows are numbered from 1 after the header. */
async function* csvItems(src: Source, delimiter: string): AsyncGenerator<Item[]> {
  // fast-csv is imported only for CSV/TSV input, not with every command that reads data.
  const { parse: parseCsv } = await import('@fast-csv/parse');
  const parser = parseCsv({ headers: false, delimiter, ignoreEmpty: true });
  const bytes = byteStream(src);
  bytes.on('error', (e) => parser.destroy(e));
  bytes.pipe(stripBom()).pipe(parser);
  let header: string[] | null = null;
  let row = 0;
  let out: Item[] = [];
  try {
    for await (const cells of parser as AsyncIterable<string[]>) {
      if (header === null) {
        header = cells.map((h) => h.trim());
        const seen = new Set<string>();
        for (const h of header) {
          if (h === '') throw new BadInputError(`${src.path}:1: empty column name in the header row`, { file: src.path, line: 1 });
          if (seen.has(h)) throw new BadInputError(`${src.path}:1: column "${h}" appears twice in the header row`, { file: src.path, line: 1 });
          seen.add(h);
        }
        continue;
      }
      row++;
      if (cells.length !== header.length) {
        out.push({ pos: row, error: `expected ${header.length} columns (as in the header), found ${cells.length}` });
      } else {
        const rec: Record<string, string> = {};
        for (let j = 0; j < header.length; j++) rec[header[j]] = cells[j];
        out.push({ pos: row, value: rec });
      }
      if (out.length >= 1024) {
        yield out;
        out = [];
      }
    }
  } catch (e) {
    if (e instanceof UserError) throw e;
    throw new BadInputError(`${src.path}:row ${row + 1}: unreadable CSV (${errorText(e)})`, { file: src.path, row: row + 1 });
  }
  if (header === null) throw new BadInputError(`${src.path}: no header row`, { file: src.path });
  if (out.length) yield out;
}

/** Arrow IPC (file or stream format). */
export async function* readArrowBatches(src: Pick<Source, 'path' | 'gzip'>): AsyncGenerator<arrow.RecordBatch> {
  let bytes: Uint8Array = await readFile(src.path);
  if (src.gzip) bytes = gunzipSync(bytes);
  let reader: arrow.RecordBatchReader;
  try {
    reader = arrow.RecordBatchReader.from(bytes);
    reader.open();
  } catch (e) {
    throw new BadInputError(`${src.path}: not a readable Arrow IPC file (${errorText(e)})`, { file: src.path });
  }
  for (const b of reader) yield b;
}

/** Arrow values → plain JSON-like values, so adapters see the same shapes as from JSON. */
export function toPlain(v: unknown): unknown {
  if (v === null || v === undefined) return null;
  switch (typeof v) {
    case 'bigint':
      return Number.isSafeInteger(Number(v)) ? Number(v) : String(v);
    case 'object':
      break;
    default:
      return v;
  }
  if (v instanceof arrow.Vector) return Array.from(v, toPlain);
  if (v instanceof Uint8Array) return Buffer.from(v.buffer, v.byteOffset, v.byteLength).toString('utf8');
  if (ArrayBuffer.isView(v)) return Array.from(v as unknown as ArrayLike<number | bigint>, toPlain);
  if (Array.isArray(v)) return v.map(toPlain);
  if (v instanceof Date) return v.getTime();
  if (v instanceof Map) return Object.fromEntries([...v].map(([k, x]) => [String(k), toPlain(x)]));
  const json = typeof (v as { toJSON?: unknown }).toJSON === 'function' ? (v as { toJSON(): unknown }).toJSON() : v;
  const out: Record<string, unknown> = {};
  for (const [k, x] of Object.entries(json as object)) out[k] = toPlain(x);
  return out;
}

/** Records of columnar inputs, row by row, numbered from 1. */
async function* arrowItems(batches: AsyncGenerator<arrow.RecordBatch>): AsyncGenerator<Item[]> {
  let row = 0;
  for await (const batch of batches) {
    const cols = batch.schema.fields.map((f, j) => [f.name, batch.getChildAt(j)!] as const);
    const out: Item[] = new Array(batch.numRows);
    for (let i = 0; i < batch.numRows; i++) {
      const rec: Record<string, unknown> = {};
      for (const [name, vec] of cols) rec[name] = toPlain(vec.get(i));
      out[i] = { pos: ++row, value: rec };
    }
    if (out.length) yield out;
  }
}
