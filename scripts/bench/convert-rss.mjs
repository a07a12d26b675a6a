// Preloaded into a benchmarked child process: reports its peak RSS (KiB) on exit through a file.
import { writeFileSync } from 'node:fs';
const out = process.env.PREFZOO_BENCH_RSS_FILE;
if (out) process.on('exit', () => writeFileSync(out, String(process.resourceUsage().maxRSS)));
