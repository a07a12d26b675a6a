/**
 * TensorBoard event files (`report_to=tensorboard`), written by prefzoo itself: no maintained npm
 * package writes them without TensorFlow's native library (@tensorflow/tfjs-node downloads
 * libtensorflow at install, which an offline install cannot do).
 *
 * An event file is a TFRecord stream: each record is
 *   uint64 length (little-endian) · uint32 masked_crc32c(length bytes) · data · uint32 masked_crc32c(data)
 * where masked_crc(x) = ((crc >>> 15) | (crc << 17)) + 0xa282ead8 (mod 2^32) over the CRC-32C
 * (Castagnoli) checksum. Each record's data is one `tensorflow.Event` protobuf; the first holds
 * `file_version: "brain.Event:2"`, later ones a `Summary` of scalar values (`simple_value`) at a step.
 * TensorBoard finds files whose name contains `tfevents` in the folder it is pointed at.
 */
import { appendFileSync, mkdirSync } from 'node:fs';
import { hostname } from 'node:os';
import { createRequire } from 'node:module';
import { join } from 'node:path';
import type * as Protobuf from 'protobufjs';

/** CRC-32C lookup table (reflected polynomial 0x82F63B78). */
const CRC_TABLE = (() => {
  const t = new Uint32Array(256);
  for (let n = 0; n < 256; n++) {
    let c = n;
    for (let k = 0; k < 8; k++) c = c & 1 ? (c >>> 1) ^ 0x82f63b78 : c >>> 1;
    t[n] = c >>> 0;
  }
  return t;
})();

/** CRC-32C (Castagnoli) of `bytes`. */
export function crc32c(bytes: Uint8Array): number {
  let c = 0xffffffff;
  for (let i = 0; i < bytes.length; i++) c = CRC_TABLE[(c ^ bytes[i]) & 0xff] ^ (c >>> 8);
  return (c ^ 0xffffffff) >>> 0;
}

/** TFRecord's masked checksum: a rotated, offset CRC, so a CRC of data holding CRCs stays strong. */
export function maskedCrc32c(bytes: Uint8Array): number {
  const c = crc32c(bytes);
  return ((((c >>> 15) | (c << 17)) >>> 0) + 0xa282ead8) >>> 0;
}

/** One TFRecord: length, its masked CRC, the data, the data's masked CRC. */
export function tfRecord(data: Uint8Array): Buffer {
  const out = Buffer.alloc(8 + 4 + data.length + 4);
  out.writeBigUInt64LE(BigInt(data.length), 0);
  out.writeUInt32LE(maskedCrc32c(out.subarray(0, 8)), 8);
  out.set(data, 12);
  out.writeUInt32LE(maskedCrc32c(data), 12 + data.length);
  return out;
}

/**
 * The parts of tensorflow/core/util/event.proto and framework/summary.proto this writer emits, built
 * when the first writer opens: protobufjs is required then, not with every training command.
 */
let eventType: Protobuf.Type | null = null;
function tfEvent(): Protobuf.Type {
  if (eventType) return eventType;
  const protobuf = createRequire(import.meta.url)('protobufjs') as typeof Protobuf;
  const root = protobuf.Root.fromJSON({
    nested: {
      tensorflow: {
        nested: {
          Event: {
            oneofs: { what: { oneof: ['file_version', 'summary', 'session_log'] } },
            fields: {
              wall_time: { type: 'double', id: 1 },
              step: { type: 'int64', id: 2 },
              file_version: { type: 'string', id: 3 },
              summary: { type: 'Summary', id: 5 },
              session_log: { type: 'SessionLog', id: 7 },
            },
          },
          Summary: {
            fields: { value: { rule: 'repeated', type: 'Value', id: 1 } },
            nested: {
              Value: {
                // A oneof member is written even when 0 (proto3 drops plain zero fields); TensorBoard
                // tells a scalar by which member of `value` is set.
                oneofs: { value: { oneof: ['simple_value'] } },
                fields: {
                  tag: { type: 'string', id: 1 },
                  simple_value: { type: 'float', id: 2 },
                },
              },
            },
          },
          SessionLog: {
            fields: { status: { type: 'SessionStatus', id: 1 }, msg: { type: 'string', id: 3 } },
            nested: { SessionStatus: { values: { STATUS_UNSPECIFIED: 0, START: 1, STOP: 2, CHECKPOINT: 3 } } },
          },
        },
      },
    },
  });
  eventType = root.lookupType('tensorflow.Event');
  return eventType;
}

/** The version string TensorBoard expects in the first event of a file. */
export const FILE_VERSION = 'brain.Event:2';

/** Appends events to one file; each write opens, appends and closes it, so nothing is left open. */
export class TensorBoardWriter {
  private constructor(readonly file: string) {}

  /**
   * Opens a new event file in `dir` (created if needed). A run resumed from the checkpoint of step
   * `resumeStep` starts its file with a SessionLog START at resumeStep + 1: TensorBoard then keeps
   * only the events of earlier files at steps before it, so the steps logged again replace the
   * first attempt's instead of doubling its curve.
   */
  static open(dir: string, o: { resumeStep?: number } = {}): TensorBoardWriter {
    mkdirSync(dir, { recursive: true });
    const now = Date.now();
    const name = `events.out.tfevents.${Math.floor(now / 1000)}.${hostname().replace(/[^\w.-]/g, '_')}.${process.pid}.${now % 1000}`;
    const w = new TensorBoardWriter(join(dir, name));
    w.write({ wall_time: now / 1000, file_version: FILE_VERSION });
    if (o.resumeStep !== undefined) w.write({ wall_time: now / 1000, step: o.resumeStep + 1, session_log: { status: 1, msg: `resumed after step ${o.resumeStep}` } });
    return w;
  }

  private write(event: Record<string, unknown>): void {
    const type = tfEvent();
    appendFileSync(this.file, tfRecord(type.encode(type.fromObject(event)).finish()));
  }

  /** One event holding every finite number of `values` as a scalar under its tag, at `step`. */
  scalars(step: number, values: Record<string, unknown>, wallTime = Date.now() / 1000): void {
    const value = Object.entries(values)
      .filter(([k, v]) => k !== 'step' && typeof v === 'number' && Number.isFinite(v))
      .map(([tag, v]) => ({ tag, simple_value: v as number }));
    if (value.length) this.write({ wall_time: wallTime, step, summary: { value } });
  }
}
