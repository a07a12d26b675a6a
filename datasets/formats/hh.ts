/** Anthropic HH-RLHF: full `\n\nHuman: … \n\nAssistant: …` transcripts, split at the last assistant turn. */
import { RecordError, describe, need } from '../values.ts';
import { type Adapter, type Row, addOptional } from './adapter.ts';

const HH_ASSISTANT = '\n\nAssistant:';

export const hh: Adapter<'hh'> = {
  name: 'hh',
  kind: 'pairwise',
  shape: '{chosen, rejected} transcripts "\\n\\nHuman: ...\\n\\nAssistant: ..."',
  detect: (r) =>
    r.prompt === undefined && typeof r.chosen === 'string' && (r.chosen.includes(HH_ASSISTANT) || r.chosen.startsWith('Human:')),
  toRow(rec, ctx) {
    const chosen = need(rec, 'chosen', ctx);
    const rejected = need(rec, 'rejected', ctx);
    if (typeof chosen !== 'string') throw new RecordError(`field "chosen": expected a transcript, found ${describe(chosen)}`, 'chosen');
    if (typeof rejected !== 'string') throw new RecordError(`field "rejected": expected a transcript, found ${describe(rejected)}`, 'rejected');
    const cut = chosen.lastIndexOf(HH_ASSISTANT);
    if (cut < 0) throw new RecordError('field "chosen": no "\\n\\nAssistant:" turn in the transcript', 'chosen');
    const prompt = chosen.slice(0, cut + HH_ASSISTANT.length);
    if (!rejected.startsWith(prompt)) {
      throw new RecordError('field "rejected": its transcript does not start with the same conversation as "chosen"', 'rejected');
    }
    const row: Row = { prompt, chosen: chosen.slice(prompt.length), rejected: rejected.slice(prompt.length) };
    addOptional(rec, row, 'pairwise', ctx);
    return row;
  },
};
