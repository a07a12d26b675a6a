import type { Command } from 'commander';
import { gradcheck } from '../../autodiff/gradcheck.ts';

/** Largest accepted relative error of an analytic gradient against float64 finite differences. */
const TOLERANCE = 1e-6;

export function register(program: Command): void {
  program
    .command('gradcheck')
    .description('check every autodiff rule against central finite differences in float64 (ONNX Runtime)')
    .option('--json', 'print one line {"ops_checked": N, "max_rel_err": x}')
    .action(async (o: { json?: boolean }) => {
      const r = await gradcheck();
      const failed = r.results.filter((c) => !(c.maxRelErr <= TOLERANCE));
      if (o.json) {
        process.stdout.write(`${JSON.stringify({ ops_checked: r.opsChecked, max_rel_err: r.maxRelErr })}\n`);
      } else {
        const rows = r.results.map((c) => [c.op, c.name, c.symbolic ? 'symbolic' : 'static', c.maxRelErr.toExponential(2), c.maxRelErr <= TOLERANCE ? 'ok' : 'FAIL']);
        const head = ['op', 'case', 'shapes', 'max rel err', ''];
        const width = head.map((h, i) => Math.max(h.length, ...rows.map((row) => row[i].length)));
        const line = (cells: string[]) => cells.map((s, i) => s.padEnd(width[i])).join('  ').trimEnd();
        process.stdout.write([line(head), ...rows.map(line)].join('\n') + '\n');
        process.stdout.write(`${r.opsChecked} ops, ${r.results.length} cases, max rel err ${r.maxRelErr.toExponential(2)} (tolerance ${TOLERANCE})\n`);
      }
      if (failed.length) {
        process.stderr.write(`prefzoo: gradcheck failed for ${failed.map((c) => `${c.op} (${c.name})`).join(', ')}\n`);
        process.exitCode = 1;
      }
    });
}
