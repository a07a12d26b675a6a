/**
 * The format adapters, one file each. `DETECTED` is the detection order (the most specific
 * signatures first; trl, which any chosen/rejected record matches, last); csv is chosen by file
 * type, not detected. The names the CLI offers derive from this list, so a new format is one file,
 * one entry here, and its fixture under test/fixtures/formats/ (a test asks for it).
 */
import type { Rec } from '../values.ts';
import type { Adapter } from './adapter.ts';
import { chat } from './chat.ts';
import { csvAdapter } from './csv.ts';
import { hh } from './hh.ts';
import { kto } from './kto.ts';
import { llamafactory } from './llamafactory.ts';
import { listwise } from './listwise.ts';
import { openai } from './openai.ts';
import { rewards } from './rewards.ts';
import { sharegpt } from './sharegpt.ts';
import { trl } from './trl.ts';
import { ultrafeedback } from './ultrafeedback.ts';

export { type Adapter, type AdapterContext, type Row } from './adapter.ts';
export { splitCommonPrefix } from './trl.ts';

/** Detection order: a record is read by the first adapter whose signature it has. */
export const DETECTED = [openai, sharegpt, llamafactory, ultrafeedback, listwise, kto, rewards, chat, hh, trl] as const;

/** The adapter whose signature the record has, or null when it looks like no known format. */
export function detectFormat(rec: Rec): Adapter | null {
  for (const a of DETECTED) if (a.detect(rec)) return a;
  return null;
}

/** Every adapter: the detected ones in detection order, then csv. */
export const FORMATS = [...DETECTED, csvAdapter(detectFormat)] as const;

export type FormatName = (typeof FORMATS)[number]['name'];

export const FORMAT_NAMES: readonly FormatName[] = FORMATS.map((a) => a.name);

export const ADAPTERS = Object.fromEntries(FORMATS.map((a) => [a.name, a])) as Readonly<Record<FormatName, Adapter>>;

/** What "preference data" means, listed for the refusal message. */
export function expectedShapes(): string {
  return DETECTED.map((a) => `${a.name} ${a.shape}`).join('; ');
}
