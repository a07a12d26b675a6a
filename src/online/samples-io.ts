/**
 * The Parquet file `prefzoo generate` writes: one row per sample with columns `prompt` (text, or a
 * message list when the prompts were conversations, with canonical data's tool-call fields when a
 * message has them: datasets/schema.ts `messageType`), `prompt_index`, `sample`, `response`,
 * `response_tokens` (how many ids were generated, the stop token included) and `stopped` (false when
 * max_new_tokens cut the answer). Written to a temporary name, then renamed.
 */
import { writeFileAtomic } from '../io/atomic.ts';
import * as arrow from '../../datasets/arrow.ts';
import * as pw from 'parquet-wasm';
import { columnBuilder } from '../../datasets/columns.ts';
import { columnType, hasToolFields } from '../../datasets/schema.ts';
import type { Sample } from './policy.ts';

export function writeSamples(file: string, samples: readonly Sample[]): void {
  const text = samples.some((s) => typeof s.prompt !== 'string') ? 'messages' : 'plain';
  const prompt = columnBuilder('prompt', text);
  const toolFields = samples.some((s) => typeof s.prompt !== 'string' && s.prompt.some(hasToolFields));
  for (const s of samples) prompt.push(text === 'messages' && typeof s.prompt === 'string' ? [{ role: 'user', content: s.prompt }] : s.prompt);
  const table = new arrow.Table({
    prompt: arrow.makeVector(prompt.finish(columnType('prompt', text, toolFields))),
    prompt_index: arrow.vectorFromArray(Int32Array.from(samples, (s) => s.promptIndex)),
    sample: arrow.vectorFromArray(Int32Array.from(samples, (s) => s.sample)),
    response: arrow.vectorFromArray(samples.map((s) => s.response), new arrow.Utf8()),
    response_tokens: arrow.vectorFromArray(Int32Array.from(samples, (s) => s.ids.length)),
    stopped: arrow.vectorFromArray(samples.map((s) => s.stopped), new arrow.Bool()),
  });
  const props = new pw.WriterPropertiesBuilder().setCompression(pw.Compression.ZSTD).setCreatedBy('prefzoo generate').build();
  const bytes = pw.writeParquet(pw.Table.fromIPCStream(arrow.tableToIPC(table, 'stream')), props);
  writeFileAtomic(file, bytes);
}
