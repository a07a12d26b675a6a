/**
 * TensorBoard event files (report_to=tensorboard), read back by a reader written here from the
 * format's description alone: TFRecord framing (uint64 length, masked CRC-32C of the length bytes,
 * data, masked CRC-32C of the data) with a bit-by-bit CRC (no table, unlike the writer), and the
 * Event protobuf decoded from the wire format by hand (not with protobufjs, which the writer uses).
 */
import { describe, it, expect, beforeAll, afterAll } from 'vitest';
import { mkdtempSync, readdirSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { crc32c, maskedCrc32c, TensorBoardWriter, FILE_VERSION } from '../src/train/tensorboard.ts';
import { initModelFolder } from '../src/models/init.ts';
import { demoPairs } from '../src/demos/task.ts';
import { train } from '../src/train/trainer.ts';

/** CRC-32C one bit at a time (polynomial 0x1EDC6F41, reflected 0x82F63B78). */
function crcBitwise(bytes: Uint8Array): number {
  let c = 0xffffffff;
  for (const b of bytes) {
    c ^= b;
    for (let k = 0; k < 8; k++) c = c & 1 ? (c >>> 1) ^ 0x82f63b78 : c >>> 1;
  }
  return (c ^ 0xffffffff) >>> 0;
}

function masked(bytes: Uint8Array): number {
  const c = crcBitwise(bytes);
  const rot = ((c >>> 15) | (c << 17)) >>> 0;
  return (rot + 0xa282ead8) % 2 ** 32;
}

interface Decoded {
  wall_time?: number;
  step?: number;
  file_version?: string;
  values?: { tag: string; simple_value: number }[];
  session_status?: number;
}

/** Protobuf wire format: (field << 3 | type) varint keys; 0 varint, 1 fixed64, 2 length-delimited, 5 fixed32. */
function fields(buf: Buffer): { field: number; type: number; value: bigint | Buffer | number }[] {
  const out: { field: number; type: number; value: bigint | Buffer | number }[] = [];
  let i = 0;
  const varint = (): bigint => {
    let v = 0n;
    let shift = 0n;
    for (;;) {
      const b = buf[i++];
      v |= BigInt(b & 0x7f) << shift;
      if (!(b & 0x80)) return v;
      shift += 7n;
    }
  };
  while (i < buf.length) {
    const key = Number(varint());
    const field = key >> 3;
    const type = key & 7;
    if (type === 0) out.push({ field, type, value: varint() });
    else if (type === 1) {
      out.push({ field, type, value: buf.readDoubleLE(i) });
      i += 8;
    } else if (type === 2) {
      const n = Number(varint());
      out.push({ field, type, value: buf.subarray(i, i + n) });
      i += n;
    } else if (type === 5) {
      out.push({ field, type, value: buf.readFloatLE(i) });
      i += 4;
    } else throw new Error(`wire type ${type}`);
  }
  return out;
}

/** event.proto: wall_time 1, step 2, file_version 3, summary 5 (Value: tag 1, simple_value 2), session_log 7 (status 1). */
function decodeEvent(buf: Buffer): Decoded {
  const e: Decoded = {};
  for (const f of fields(buf)) {
    if (f.field === 1) e.wall_time = f.value as number;
    else if (f.field === 2) e.step = Number(f.value as bigint);
    else if (f.field === 3) e.file_version = (f.value as Buffer).toString('utf8');
    else if (f.field === 5) {
      e.values = fields(f.value as Buffer)
        .filter((v) => v.field === 1)
        .map((v) => {
          const inner = fields(v.value as Buffer);
          return { tag: (inner.find((x) => x.field === 1)!.value as Buffer).toString('utf8'), simple_value: inner.find((x) => x.field === 2)!.value as number };
        });
    } else if (f.field === 7) e.session_status = Number(fields(f.value as Buffer).find((x) => x.field === 1)?.value ?? 0n);
  }
  return e;
}

/** Reads a TFRecord file, checking both checksums of every record. */
function readEvents(file: string): Decoded[] {
  const buf = readFileSync(file);
  const out: Decoded[] = [];
  let i = 0;
  while (i < buf.length) {
    if (i + 12 > buf.length) throw new Error(`truncated record header at byte ${i}`);
    const len = Number(buf.readBigUInt64LE(i));
    if (buf.readUInt32LE(i + 8) !== masked(buf.subarray(i, i + 8))) throw new Error(`bad length checksum at byte ${i}`);
    const data = buf.subarray(i + 12, i + 12 + len);
    if (data.length !== len || i + 16 + len > buf.length) throw new Error(`truncated record at byte ${i}`);
    if (buf.readUInt32LE(i + 12 + len) !== masked(data)) throw new Error(`bad data checksum at byte ${i}`);
    out.push(decodeEvent(data));
    i += 16 + len;
  }
  return out;
}

const root = mkdtempSync(join(tmpdir(), 'pz-tb-'));
afterAll(() => rmSync(root, { recursive: true, force: true }));

describe('CRC-32C and TFRecord framing', () => {
  it('matches the published check values (RFC 3720 B.4 and "123456789")', () => {
    const enc = new TextEncoder();
    expect(crc32c(enc.encode('123456789'))).toBe(0xe3069283);
    expect(crc32c(new Uint8Array(32))).toBe(0x8a9136aa);
    expect(crc32c(new Uint8Array(32).fill(0xff))).toBe(0x62a8ab43);
    expect(crc32c(Uint8Array.from({ length: 32 }, (_, i) => i))).toBe(0x46dd794e);
    const random = Uint8Array.from({ length: 1000 }, (_, i) => (i * 7919 + 13) & 0xff);
    expect(crc32c(random)).toBe(crcBitwise(random));
    expect(maskedCrc32c(random)).toBe(masked(random));
  });

  it('writes records the independent reader accepts, and the reader rejects a flipped byte', () => {
    const dir = join(root, 'unit');
    const w = TensorBoardWriter.open(dir);
    w.scalars(3, { 'train/loss': 0.5, 'train/skipped': Number.NaN, note: 'text' });
    w.scalars(7, { 'train/loss': 0.25, 'train/big': 1e30 }, 1234.5);
    const file = join(dir, readdirSync(dir)[0]);
    expect(readdirSync(dir)[0]).toMatch(/^events\.out\.tfevents\.\d+\./);
    const ev = readEvents(file);
    expect(ev[0].file_version).toBe(FILE_VERSION);
    expect(ev[1]).toMatchObject({ step: 3, values: [{ tag: 'train/loss', simple_value: 0.5 }] });
    expect(ev[2]).toMatchObject({ step: 7, wall_time: 1234.5, values: [{ tag: 'train/loss', simple_value: 0.25 }, { tag: 'train/big', simple_value: Math.fround(1e30) }] });
    const bytes = readFileSync(file);
    bytes[bytes.length - 6] ^= 1;
    writeFileSync(file, bytes);
    expect(() => readEvents(file)).toThrow(/bad data checksum/);
  });
});

describe('train report_to=tensorboard', () => {
  let model: string;
  let data: string;
  beforeAll(() => {
    model = join(root, 'model');
    initModelFolder(model, 'llama', 'tiny', 5);
    data = join(root, 'pairs.jsonl');
    writeFileSync(data, demoPairs(3, 16, 0).train.map((p) => JSON.stringify(p)).join('\n') + '\n');
  });
  const params = ['batch_size=8', 'learning_rate=1e-3', 'max_length=32', 'max_prompt_length=16', 'pad_to_multiple_of=16', 'save_steps=2', 'report_to=tensorboard', `eval_steps=2`];

  it('logs every metrics.jsonl number under train/ and eval/, and a resumed run restarts at its checkpoint', async () => {
    const out = join(root, 'run');
        await train({ model, data, loss: 'dpo', out, params: [...params, 'max_steps=3', `eval_data=${data}`] });
    const rows = readFileSync(join(out, 'metrics.jsonl'), 'utf8').trim().split('\n').map((l) => JSON.parse(l));
    const files = readdirSync(join(out, 'runs')).sort();
    expect(files).toHaveLength(1);
    const events = readEvents(join(out, 'runs', files[0]));
    expect(events[0].file_version).toBe(FILE_VERSION);
    const logged = events.slice(1);
    expect(logged).toHaveLength(rows.length);
    rows.forEach((r, i) => {
      const prefix = r.split === 'eval' ? 'eval/' : 'train/';
      const expected = Object.entries(r).filter(([k, v]) => k !== 'step' && typeof v === 'number').map(([k, v]) => ({ tag: prefix + k, simple_value: Math.fround(v as number) }));
      expect(logged[i].step).toBe(r.step);
      expect(logged[i].values).toEqual(expected);
    });
    for (const tag of ['train/loss', 'train/logits/chosen', 'train/logits/rejected', 'train/entropy', 'train/num_tokens', 'eval/accuracy']) {
      expect(logged.some((e) => e.values!.some((v) => v.tag === tag)), tag).toBe(true);
    }
    await train({ model, data, loss: 'dpo', out, params: [...params, 'max_steps=4', `eval_data=${data}`], resume: true });
    const second = readdirSync(join(out, 'runs')).sort().filter((f) => !files.includes(f));
    expect(second).toHaveLength(1);
    const resumed = readEvents(join(out, 'runs', second[0]));
    // SessionLog START just after the checkpoint's step (3): TensorBoard keeps only earlier files'
    // events at steps before it, so the steps logged again are not doubled.
    expect(resumed[1]).toMatchObject({ step: 4, session_status: 1 });
    expect(resumed.slice(2).map((e) => e.step)).toEqual([4, 4]);
  });
});
