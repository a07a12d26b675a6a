import fs from 'node:fs';
import type { Command } from 'commander';
import { UserError } from '../../errors.ts';
import { writeFileAtomic } from '../../io/atomic.ts';
import { positionLimit } from '../../models/config.ts';
import { loadModel } from '../../models/load.ts';
import { buildLogpsGraph } from '../../models/logps.ts';
import { Session, toOrt } from '../../runtime/session.ts';
import { DEVICE_HELP, device, positiveInt } from '../flags.ts';

interface Row {
  ids: number[];
  loss: number[];
}

/** Reads `{"input_ids": [...], "loss_mask": [...]}` lines; blank lines are skipped. */
function readRows(file: string, vocab: number, limit: number | null): Row[] {
  let text: string;
  try {
    text = fs.readFileSync(file, 'utf8');
  } catch (e) {
    throw new UserError(`${file}: cannot read (${(e as NodeJS.ErrnoException).code ?? (e as Error).message})`);
  }
  const rows: Row[] = [];
  text.split('\n').forEach((line, i) => {
    const where = `${file}:${i + 1}`;
    if (line.trim() === '') return;
    let obj: unknown;
    try {
      obj = JSON.parse(line);
    } catch (e) {
      throw new UserError(`${where}: invalid JSON (${(e as Error).message})`);
    }
    if (obj === null || typeof obj !== 'object' || Array.isArray(obj)) throw new UserError(`${where}: expected an object {"input_ids": [...], "loss_mask": [...]}`);
    const { input_ids: ids, loss_mask: mask } = obj as Record<string, unknown>;
    if (!Array.isArray(ids) || ids.length === 0) throw new UserError(`${where}: "input_ids" must be a non-empty array of token ids`);
    const bad = ids.findIndex((v) => typeof v !== 'number' || !Number.isInteger(v) || v < 0 || v >= vocab);
    if (bad >= 0) throw new UserError(`${where}: input_ids[${bad}] = ${JSON.stringify(ids[bad])} is not a token id in [0, ${vocab})`);
    if (limit !== null && ids.length > limit) throw new UserError(`${where}: ${ids.length} tokens exceed the model's ${limit} positions`);
    if (!Array.isArray(mask) || mask.length !== ids.length) {
      throw new UserError(`${where}: "loss_mask" must be an array of the same length as input_ids (${ids.length})`);
    }
    const badMask = mask.findIndex((v) => v !== 0 && v !== 1 && v !== true && v !== false);
    if (badMask >= 0) throw new UserError(`${where}: loss_mask[${badMask}] = ${JSON.stringify(mask[badMask])} must be 0 or 1`);
    rows.push({ ids: ids as number[], loss: mask.map((v) => (v === true || v === 1 ? 1 : 0)) });
  });
  return rows;
}

export function register(program: Command): void {
  program
    .command('logps')
    .description('score sequences: per input line {"input_ids","loss_mask"} print {"logp","tokens"}, the sum of log p(ids[t] | ids before t) over t with loss_mask[t] = 1 (loss_mask[0] is ignored: the first token has no prediction)')
    .requiredOption('--model <dir>', 'Hugging Face model folder (config.json + safetensors)')
    .requiredOption('--input <file>', 'JSONL file, one {"input_ids": [...], "loss_mask": [...]} per line')
    .option('--batch-size <n>', 'sequences per forward pass', '8')
    .option('--device <device>', DEVICE_HELP, 'cpu')
    .option('--threads <n>', 'intra-op threads (default: one per core)')
    .option('-o, --output <file>', 'write the JSONL here instead of standard output')
    .action(async (o: { model: string; input: string; batchSize: string; device: string; threads?: string; output?: string }) => {
      const batchSize = positiveInt('--batch-size', o.batchSize, 8);
      const threads = positiveInt('--threads', o.threads);
      const ep = device(o.device);
      const { config, weights } = loadModel(o.model);
      const rows = readRows(o.input, config.vocab_size, positionLimit(config));
      const session = await Session.fromGraph(buildLogpsGraph(config, { weights, dense: ep === 'webgpu' }), { ep, threads });
      const lines: string[] = [];
      for (let start = 0; start < rows.length; start += batchSize) {
        const batch = rows.slice(start, start + batchSize);
        const B = batch.length;
        const T = Math.max(...batch.map((r) => r.ids.length));
        const ids = new BigInt64Array(B * T);
        const attn = new BigInt64Array(B * T);
        const loss = new Float32Array(B * T);
        batch.forEach((r, b) => {
          r.ids.forEach((id, t) => {
            ids[b * T + t] = BigInt(id);
            attn[b * T + t] = 1n;
            loss[b * T + t] = r.loss[t];
          });
        });
        const out = await session.run({
          input_ids: toOrt('int64', ids, [B, T]),
          attention_mask: toOrt('int64', attn, [B, T]),
          loss_mask: toOrt('float32', loss, [B, T]),
        });
        const logp = out.logp.data as Float32Array;
        const tokens = out.tokens.data as Float32Array;
        for (let b = 0; b < B; b++) lines.push(JSON.stringify({ logp: logp[b], tokens: tokens[b] }));
      }
      await session.release();
      const text = lines.map((l) => l + '\n').join('');
      if (o.output) {
        writeFileAtomic(o.output, text);
      } else process.stdout.write(text);
    });
}
