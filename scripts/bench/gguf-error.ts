/**
 * The RMS and largest error of each GGUF dtype's quantization against a model's float32 matrices
 * (what llama.cpp decodes from the file, through src/export's own decoder), per tensor type chosen:
 *
 *   node --import tsx scripts/bench/gguf-error.ts --model DIR
 *
 * Without --model, a noisy qwen2 of hidden 256, FFN 512 and 4 layers (init-model's tiny preset made
 * wider, N(0, 0.02) weights) in a temporary folder.
 */
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import path from 'node:path';
import { parseArgs } from 'node:util';
import { initModelFolder } from '../../src/models/init.ts';
import { readExportSource } from '../../src/export/source.ts';
import { ggufNames, ggufTensors } from '../../src/export/gguf.ts';
import { decodeTensor, encodeTensor } from '../../src/export/gguf-file.ts';

const { values } = parseArgs({ options: { model: { type: 'string' } } });
const tmp = values.model ? null : mkdtempSync(path.join(tmpdir(), 'pz-gguf-error-'));
const dir = values.model ?? path.join(tmp!, 'wide');
if (tmp) initModelFolder(dir, 'qwen2', 'tiny', 1, {}, { hidden_size: 256, intermediate_size: 512, num_attention_heads: 4, num_key_value_heads: 2, head_dim: 64, num_hidden_layers: 4 });
try {
  const src = readExportSource(dir);
  const names = ggufNames(src.config);
  console.log(`| dtype | matrix values | RMS error | RMS / RMS weight | largest error | types |`);
  console.log(`|---|---|---|---|---|---|`);
  for (const dtype of ['q8_0', 'q4_0', 'q4_k_m'] as const) {
    let se = 0, sw = 0, n = 0, max = 0;
    const counts = new Map<string, number>();
    for (const t of ggufTensors(src.config, src.weights, names, dtype)) {
      if (t.shape.length < 2) continue;
      const back = decodeTensor(t.type, encodeTensor(t), t.data.length);
      for (let i = 0; i < back.length; i++) {
        const e = back[i] - t.data[i];
        se += e * e;
        sw += t.data[i] * t.data[i];
        max = Math.max(max, Math.abs(e));
      }
      n += back.length;
      counts.set(t.type, (counts.get(t.type) ?? 0) + t.data.length);
    }
    const mix = [...counts].map(([k, v]) => `${k} ${((100 * v) / n).toFixed(0)}%`).join(', ');
    console.log(`| ${dtype} | ${n} | ${Math.sqrt(se / n).toExponential(3)} | ${Math.sqrt(se / sw).toFixed(4)} | ${max.toExponential(3)} | ${mix} |`);
  }
} finally {
  if (tmp) rmSync(tmp, { recursive: true, force: true });
}
