/**
 * The generation loop's backend on the host (see backend.ts): per part of the mixture one batch
 * `SlotCache` whose rows step together, and for each parked row a one-row `SlotCache` of its own.
 * Rows leave the batch by the last rows moving into their places; a parked row joins by being copied into
 * the next free row; a fork is a copy of the row's filled slots. New rows are prefilled straight
 * into the batch.
 */
import { cacheShape } from './decode.ts';
import { SLOT_CHUNK, SlotCache, alignUp, type Decoder, type Pick, type Picked } from './decoder.ts';
import type { DecodeBackend, PickSpec, PrefillGroup, RunOut } from './backend.ts';

export interface CpuBackendOptions {
  /** Rows that decode together at most. */
  maxBatch: number;
  /** Slots a row is expected to need at most (the room a batch reserves when rows join it empty); it grows past it if needed. */
  slots: number;
  /** Id fed under the mask for left padding. */
  padId: number;
}

export class CpuBackend implements DecodeBackend {
  readonly padPrefill = false;
  readonly copiesPrefix = true;
  private batch: SlotCache[] | null = null;
  private order: number[] = [];
  private readonly parked = new Map<number, SlotCache[]>();
  /**
   * Buffers of one-row caches let go (a parked row joined the batch or was freed), per part, for the
   * next one-row cache: a server parks, copies and joins a row per request, and a new cache's
   * buffers are zeroed pages the kernel maps on first touch. At most `maxBatch` sets are kept.
   */
  private readonly spare: Float32Array[][][] = [];

  constructor(
    private readonly decoders: Decoder[],
    private readonly o: CpuBackendOptions,
  ) {}

  canPick(_pick: PickSpec): boolean {
    return this.decoders.length === 1 && this.decoders[0].picksTokens;
  }

  batchRows(): readonly number[] {
    return this.order;
  }

  /**
   * The batch caches, made when the batch is empty with `slots` slots to start and `room` reserved
   * (a generation of left-padded batches gets the cache each batch got before rows could join).
   */
  private batchCaches(slots: number, room = this.o.slots): SlotCache[] {
    if (!this.batch) {
      room = Math.max(room, slots);
      // A multiple of STEP_ALIGN from the start, as a step needs it (else its first step moves the rows apart).
      const capacity = alignUp(Math.max(slots, Math.min(Math.ceil((slots + 1) / SLOT_CHUNK) * SLOT_CHUNK, room)));
      this.batch = this.decoders.map((d) => d.newCache(this.o.maxBatch, capacity, room));
    }
    return this.batch;
  }

  private rowCaches(slots: number): SlotCache[] {
    const cap = Math.ceil((slots + 1) / SLOT_CHUNK) * SLOT_CHUNK;
    return this.rowCache(cap, cap);
  }

  /** One-row caches (one per part) of `capacity` slots and `maxCapacity` reserved, on kept buffers where some are long enough. */
  private rowCache(capacity: number, maxCapacity: number): SlotCache[] {
    return this.decoders.map((d, k) => {
      const shape = cacheShape(d.config);
      const size = shape.kvHeads * Math.max(capacity, maxCapacity) * shape.headDim;
      const kept = this.spare[k] ?? [];
      const i = kept.findIndex((set) => set[0].length >= size);
      return new SlotCache(shape, 1, capacity, d.vocabSize, maxCapacity, i < 0 ? [] : kept.splice(i, 1)[0]);
    });
  }

  /** Keeps a one-row cache's buffers for `rowCache` (stale values are masked, as in a grown cache). */
  private letGo(own: SlotCache[] | undefined): void {
    own?.forEach((c, k) => {
      const kept = (this.spare[k] ??= []);
      if (kept.length < this.o.maxBatch) kept.push(c.release());
    });
  }

  async leave(rows: readonly number[], park: (row: number) => boolean): Promise<void> {
    if (rows.length === 0) return;
    const going = new Set(rows);
    this.order.forEach((r, b) => {
      if (!going.has(r) || !park(r)) return;
      const own = this.rowCaches(this.batch![0].cols[b]);
      own.forEach((c, k) => (c.addRows(1), c.copyRow(this.batch![k], b, 0)));
      this.parked.set(r, own);
    });
    // Each hole is filled by the batch's last staying row: a leave moves as many rows as leave, not
    // every row after it (the rows' order in the batch changes no row's tokens).
    const order = this.order;
    let end = order.length;
    for (let b = 0; b < end; b++) {
      if (!going.has(order[b])) continue;
      while (end > b + 1 && going.has(order[end - 1])) end--;
      end--;
      if (end > b) {
        for (const c of this.batch!) c.moveRow(end, b);
        order[b] = order[end];
      }
    }
    order.length = end;
    for (const c of this.batch ?? []) c.rows = end;
    if (end === 0) this.recycle();
  }

  async join(rows: readonly number[], room?: number): Promise<void> {
    for (const r of rows) {
      const own = this.parked.get(r);
      if (!own) throw new Error(`generation: row ${r} has no parked cache`);
      const batch = this.batchCaches(own[0].cols[0], room);
      batch.forEach((c, k) => c.copyRow(own[k], 0, c.addRows(1)));
      this.parked.delete(r);
      this.letGo(own);
      this.order.push(r);
    }
  }

  private pick(spec: PickSpec | null, uniform: Float64Array | null): Pick | undefined {
    if (!spec) return undefined;
    return spec.head === 'greedy' ? spec : { head: 'sample', limit: spec.limit, temperature: spec.temperature, uniform: uniform! };
  }

  private answer(results: Picked[]): RunOut {
    const [r] = results;
    if (!r.tokens) return { logits: results.map((x) => x.logits!) };
    return r.logps ? { tokens: r.tokens, logps: r.logps } : { tokens: r.tokens };
  }

  async step(tokens: readonly number[], pick: PickSpec | null, uniform: Float64Array | null): Promise<RunOut> {
    const ids = BigInt64Array.from(tokens, BigInt);
    const p = this.pick(pick, uniform);
    const results: Picked[] = [];
    for (let k = 0; k < this.decoders.length; k++) results.push(await this.decoders[k].step(ids, this.batch![k], p));
    return this.answer(results);
  }

  async extend(row: number, tokens: readonly number[], pick: PickSpec | null, uniform: Float64Array | null): Promise<RunOut> {
    const own = this.parked.get(row);
    if (!own) throw new Error(`generation: row ${row} has no parked cache`);
    const p = this.pick(pick, uniform);
    const results: Picked[] = [];
    for (let k = 0; k < this.decoders.length; k++) results.push(await this.decoders[k].extend(own[k], 0, tokens, p));
    return this.answer(results);
  }

  async extendRows(rows: readonly number[], tokens: readonly (readonly number[])[], pick: PickSpec | null, uniform: Float64Array | null): Promise<RunOut> {
    const owns = rows.map((r) => {
      const own = this.parked.get(r);
      if (!own) throw new Error(`generation: row ${r} has no parked cache`);
      return own;
    });
    // One run per capacity: a row's numbers depend on its cache's columns, not on the rows beside it.
    const byCap = new Map<number, number[]>();
    owns.forEach((own, i) => byCap.set(own[0].capacity, [...(byCap.get(own[0].capacity) ?? []), i]));
    const parts: { at: number[]; out: RunOut }[] = [];
    for (const at of byCap.values()) {
      const p = this.pick(pick, uniform && Float64Array.from(at, (i) => uniform[i]));
      const results: Picked[] = [];
      for (let k = 0; k < this.decoders.length; k++) {
        results.push(
          await this.decoders[k].extendRows(
            at.map((i) => owns[i][k]),
            at.map((i) => tokens[i]),
            p,
          ),
        );
      }
      parts.push({ at, out: this.answer(results) });
    }
    return gatherRuns(parts, rows.length, this.decoders.map((d) => d.vocabSize));
  }

  async prefill(group: PrefillGroup, pick: PickSpec | null, uniform: Float64Array | null): Promise<RunOut> {
    const n = group.rows.length;
    const S = Math.max(1, ...group.prompts.map((p) => p.length));
    const ids = new BigInt64Array(n * S).fill(BigInt(this.o.padId));
    const mask = new BigInt64Array(n * S);
    group.prompts.forEach((p, b) => {
      if (!group.pad && p.length !== S) throw new Error('generation: an unpadded prefill group with prompts of unequal lengths');
      for (let t = 0; t < p.length; t++) {
        ids[b * S + S - p.length + t] = BigInt(p[t]);
        mask[b * S + S - p.length + t] = 1n;
      }
    });
    const batch = this.batchCaches(S, group.room);
    const first = batch[0].rows;
    for (const c of batch) c.addRows(n);
    const p = this.pick(pick, uniform);
    const results: Picked[] = [];
    for (let k = 0; k < this.decoders.length; k++) results.push(await this.decoders[k].prefill(batch[k], first, ids, mask, n, p));
    this.order.push(...group.rows);
    return this.answer(results);
  }

  async copy(from: number, to: number, slots?: number, room = 0): Promise<void> {
    const src = this.parked.get(from);
    const b = src ? 0 : this.order.indexOf(from);
    if (b < 0) throw new Error(`generation: row ${from} has no cache`);
    const caches = src ?? this.batch!;
    const n = slots ?? caches[0].cols[b];
    if (n > caches[0].cols[b]) throw new Error(`generation: row ${from} has ${caches[0].cols[b]} slots, not ${n}`);
    // A cut copy holds exactly its slots: an extend run after it then sees the prompt's positions at
    // the columns a prefill of the whole prompt has, so its numbers are the prefill's to the bit.
    const own = slots === undefined ? this.rowCaches(n) : this.rowCache(n, Math.max(n, room));
    own.forEach((c, k) => (c.addRows(1), c.copyRow(caches[k], b, 0, n)));
    this.parked.set(to, own);
  }

  async clone(from: number, to: number): Promise<void> {
    const src = this.parked.get(from);
    const b = src ? 0 : this.order.indexOf(from);
    if (b < 0) throw new Error(`generation: row ${from} has no cache`);
    const caches = src ?? this.batch!;
    const batch = this.batchCaches(caches[0].cols[b]);
    batch.forEach((c, k) => c.copyRow(caches[k], b, c.addRows(1)));
    this.order.push(to);
  }

  free(row: number): void {
    this.letGo(this.parked.get(row));
    this.parked.delete(row);
  }

  private recycle(): void {
    this.batch?.forEach((c, k) => this.decoders[k].recycle(c));
    this.batch = null;
  }

  async close(): Promise<void> {
    this.recycle();
    this.order = [];
    this.parked.clear();
    this.spare.length = 0;
  }
}

/** The outputs of runs over subsets `at` of `n` rows, put back in the rows' order. */
function gatherRuns(parts: { at: number[]; out: RunOut }[], n: number, vocab: number[]): RunOut {
  if (parts.length === 1 && parts[0].at.every((i, j) => i === j)) return parts[0].out;
  if (parts[0].out.logits) {
    const logits = vocab.map((V) => new Float32Array(n * V));
    for (const { at, out } of parts) at.forEach((i, j) => out.logits!.forEach((l, k) => logits[k].set(l.subarray(j * vocab[k], (j + 1) * vocab[k]), i * vocab[k])));
    return { logits };
  }
  const tokens = new BigInt64Array(n);
  const logps = parts.every(({ out }) => out.tokens && out.logps) ? new Float64Array(n) : null;
  for (const { at, out } of parts) {
    if (!out.tokens) throw new Error('generation: runs of one pick answered in different forms');
    at.forEach((i, j) => {
      tokens[i] = BigInt(out.tokens[j]);
      if (logps) logps[i] = out.logps![j];
    });
  }
  return logps ? { tokens, logps } : { tokens };
}
