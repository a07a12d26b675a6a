// Preloaded into a benchmarked child process: on exit, writes its peak RSS (KiB) and CPU seconds
// (all threads) to the file named by PREFZOO_BENCH_RSS_FILE.
import { writeFileSync } from 'node:fs';
const out = process.env.PREFZOO_BENCH_RSS_FILE;
if (out) {
  process.on('exit', () => {
    const u = process.resourceUsage();
    writeFileSync(out, JSON.stringify({ maxRSS: u.maxRSS, cpu: (u.userCPUTime + u.systemCPUTime) / 1e6 }));
  });
}
