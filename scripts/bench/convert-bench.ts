/**
 * Convert throughput: generates a JSONL preference file, then times `prefzoo convert` on it against a
 * plain read + JSON.parse of every line (the floor any JSONL converter sits on), and prints MB/s of
 * each, their ratio, and the peak RSS of the convert process.
 *
 *   scripts/bench/convert [--size MB] [--file PATH] [--keep] [--runs N]
 */
import { spawnSync } from 'node:child_process';
import { createWriteStream, existsSync, mkdirSync, readFileSync, rmSync, statSync } from 'node:fs';
import { once } from 'node:events';
import { dirname, join, resolve } from 'node:path';
import { fileURLToPath } from 'node:url';
import { cpus, loadavg, tmpdir } from 'node:os';
import { parseArgs } from 'node:util';

const here = dirname(fileURLToPath(import.meta.url));
const repo = resolve(here, '..', '..');

const { values: args } = parseArgs({
  options: {
    size: { type: 'string', default: '200' },
    file: { type: 'string' },
    keep: { type: 'boolean', default: false },
    runs: { type: 'string', default: '1' },
    help: { type: 'boolean', default: false },
  },
});
if (args.help) {
  process.stdout.write('usage: scripts/bench/convert [--size MB (default 200)] [--file PATH to reuse] [--keep] [--runs N]\n');
  process.exit(0);
}

/** xorshift32: a fixed stream of pseudo-random numbers, so every run benchmarks the same file. */
function rng(seed: number): () => number {
  let s = seed >>> 0 || 1;
  return () => {
    s ^= s << 13;
    s >>>= 0;
    s ^= s >>> 17;
    s ^= s << 5;
    s >>>= 0;
    return s / 4294967296;
  };
}

const WORDS = (
  'the of and to in is that for it as with was on be by this are from or an at which not have but one all ' +
  'model training preference reward policy gradient token sequence answer question explain because however ' +
  'data value function example result first second people time would there their what about more when ' +
  'naïve café résumé Übung größer 日本語 中文 русский ελληνικά emoji🙂 “quoted” — dash\ttab "quote" back\\slash'
).split(' ');

function text(r: () => number, minWords: number, maxWords: number): string {
  const n = minWords + Math.floor(r() * (maxWords - minWords));
  const out: string[] = new Array(n);
  for (let i = 0; i < n; i++) out[i] = WORDS[Math.floor(r() * WORDS.length)];
  // Sprinkle newlines the way multi-paragraph answers have them.
  for (let i = 12; i < n; i += 40) out[i] += '\n';
  return out.join(' ');
}

/** Writes about `mb` MB of trl-style pairwise JSONL (prompt ~50-150 words, responses ~80-500). */
async function generate(path: string, mb: number): Promise<void> {
  const r = rng(20240601);
  const target = mb * 1024 * 1024;
  const ws = createWriteStream(path);
  let bytes = 0;
  let i = 0;
  while (bytes < target) {
    const rec = { id: `ex-${i++}`, prompt: text(r, 50, 150), chosen: text(r, 80, 500), rejected: text(r, 80, 500) };
    const line = JSON.stringify(rec) + '\n';
    bytes += Buffer.byteLength(line);
    if (!ws.write(line)) await once(ws, 'drain');
  }
  ws.end();
  await once(ws, 'finish');
}

interface Timed {
  seconds: number;
  rssKiB: number;
  /** CPU seconds over all threads (convert encodes Parquet on a second thread). */
  cpu: number;
  stdout: string;
}

function timed(cmd: string, argv: string[]): Timed {
  const rssFile = join(tmpdir(), `prefzoo-bench-rss-${process.pid}`);
  rmSync(rssFile, { force: true });
  const t0 = process.hrtime.bigint();
  const res = spawnSync(cmd, ['--import', join(here, 'convert-rss.mjs'), ...argv], {
    cwd: repo,
    env: { ...process.env, PREFZOO_BENCH_RSS_FILE: rssFile },
    encoding: 'utf8',
    maxBuffer: 1 << 24,
  });
  const seconds = Number(process.hrtime.bigint() - t0) / 1e9;
  if (res.status !== 0) throw new Error(`${argv.join(' ')} failed (${res.status}):\n${res.stderr}`);
  const usage = existsSync(rssFile) ? (JSON.parse(readFileSync(rssFile, 'utf8')) as { maxRSS: number; cpu: number }) : { maxRSS: NaN, cpu: NaN };
  rmSync(rssFile, { force: true });
  return { seconds, rssKiB: usage.maxRSS, cpu: usage.cpu, stdout: res.stdout };
}

const workDir = join(tmpdir(), 'prefzoo-bench-convert');
mkdirSync(workDir, { recursive: true });
const input = args.file ?? join(workDir, `pairs-${args.size}MB.jsonl`);
if (!existsSync(input)) {
  process.stdout.write(`generating ${input} (~${args.size} MB)...\n`);
  await generate(input, Number(args.size));
}
const mb = statSync(input).size / (1024 * 1024);
const out = join(workDir, 'out.parquet');
const runs = Math.max(1, Number(args.runs));

let best: { parse: Timed; convert: Timed } | null = null;
for (let k = 0; k < runs; k++) {
  const parse = timed(process.execPath, [join(here, 'convert-baseline.mjs'), input]);
  const convert = timed(process.execPath, [join(repo, 'bin', 'prefzoo.mjs'), 'convert', input, '-o', out]);
  if (!best || convert.seconds / parse.seconds < best.convert.seconds / best.parse.seconds) best = { parse, convert };
}
const { parse, convert } = best!;
const outMb = statSync(out).size / (1024 * 1024);
const line = (name: string, t: Timed) =>
  `${name.padEnd(22)} ${t.seconds.toFixed(2).padStart(7)} s  ${(mb / t.seconds).toFixed(1).padStart(7)} MB/s  CPU ${t.cpu.toFixed(2).padStart(6)} s  peak RSS ${(t.rssKiB / 1024).toFixed(0).padStart(5)} MB`;
process.stdout.write(`input: ${input} (${mb.toFixed(1)} MB); output ${outMb.toFixed(1)} MB Parquet (zstd)\n`);
process.stdout.write(convert.stdout.replace(/^/gm, '  '));
process.stdout.write(`${line('read + JSON.parse', parse)}\n${line('prefzoo convert', convert)}\n`);
process.stdout.write(`ratio convert / parse: ${(convert.seconds / parse.seconds).toFixed(2)}x wall (target <= 3x), ${(convert.cpu / parse.cpu).toFixed(2)}x CPU\n`);
// Wall-clock figures depend on what else the two cores are doing; say how busy they were.
process.stdout.write(`load average (1 min) at the end: ${loadavg()[0].toFixed(2)} on ${cpus().length} cores\n`);
if (!args.keep) rmSync(out, { force: true });
