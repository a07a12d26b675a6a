/** A run folder's metrics.jsonl rows without the wall-clock field (`tokens/s`), for comparing runs. */
import { readFileSync } from 'node:fs';
import { join } from 'node:path';

export function metricsRows(out: string): Record<string, unknown>[] {
  return readFileSync(join(out, 'metrics.jsonl'), 'utf8')
    .trim()
    .split('\n')
    .map((l) => {
      const { 'tokens/s': _, ...r } = JSON.parse(l);
      return r;
    });
}
