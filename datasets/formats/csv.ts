/** CSV and TSV files: each row is read as the record of the format its header names. */
import { type Rec, RecordError } from '../values.ts';
import type { Adapter } from './adapter.ts';

/** CSV: columns named as any of the other formats (after --map); the kind follows from the columns. */
export function csvAdapter(detect: (rec: Rec) => Adapter | null): Adapter<'csv'> {
  return {
    name: 'csv',
    kind: 'pairwise',
    shape: 'a header row naming the columns of one of the formats above',
    detect: () => false,
    toRow(rec, ctx) {
      const inner = detect(rec);
      if (!inner) throw new RecordError(`columns ${Object.keys(rec).join(', ')} match no format`);
      return inner.toRow(rec, ctx);
    },
  };
}
