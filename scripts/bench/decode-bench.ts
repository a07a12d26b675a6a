/**
 * Decode throughput: tokens per second of batched KV-cache sampling (prefill excluded and reported
 * apart), for a random-initialised preset, with the weights baked into the graphs or fed as inputs
 * (the Nash-MD policy). No stop tokens, so every row decodes exactly --new tokens.
 *
 *   scripts/bench/decode [--arch llama|qwen2|gpt2] [--preset tiny|small] [--batch N] [--prompt N] [--new N] [--json]
 */
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { initModelFolder } from '../../src/models/init.ts';
import { loadModel } from '../../src/models/load.ts';
import { Decoder, generateIds } from '../../src/models/generate.ts';
import { sampleRandom } from '../../src/models/sampling.ts';

function arg(name: string, dflt: string): string {
  const i = process.argv.indexOf(`--${name}`);
  return i >= 0 ? process.argv[i + 1] : dflt;
}

if (process.argv.includes('--help')) {
  process.stdout.write('scripts/bench/decode [--arch llama|qwen2|gpt2] [--preset tiny|small] [--batch 8] [--prompt 32] [--new 64] [--json]\n');
  process.exit(0);
}
const arch = arg('arch', 'llama') as 'llama' | 'qwen2' | 'gpt2';
const preset = arg('preset', 'small') as 'tiny' | 'small';
const B = Number(arg('batch', '8'));
const P = Number(arg('prompt', '32'));
const N = Number(arg('new', '64'));
const dir = mkdtempSync(join(tmpdir(), 'prefzoo-decode-bench-'));
try {
  initModelFolder(dir, arch, preset, 0);
  const m = loadModel(dir);
  const rows: Record<string, unknown>[] = [];
  for (const bake of [true, false]) {
    const dec = await Decoder.create(m.config, m.weights, { bake });
    const reqs = (seed: number) => Array.from({ length: B }, (_, i) => ({ promptIds: Array.from({ length: P }, (_, t) => (i * 7 + t * 13) % 200), rng: sampleRandom(seed, i, 0) }));
    const opts = { stopIds: [], padId: 0, batchSize: B };
    await generateIds([{ decoder: dec, weight: 1 }], reqs(1), { ...opts, maxNewTokens: 2 }); // warm-up
    const t0 = performance.now();
    await generateIds([{ decoder: dec, weight: 1 }], reqs(2), { ...opts, maxNewTokens: 1 });
    const prefill = performance.now() - t0;
    const t1 = performance.now();
    await generateIds([{ decoder: dec, weight: 1 }], reqs(3), { ...opts, maxNewTokens: N });
    const total = performance.now() - t1;
    const decodeMs = Math.max(1e-3, total - prefill);
    rows.push({
      arch,
      preset,
      weights: bake ? 'baked' : 'inputs',
      batch: B,
      prompt_tokens: P,
      new_tokens: N,
      prefill_ms: Math.round(prefill * 10) / 10,
      'decode_tokens/s': Math.round((B * (N - 1)) / (decodeMs / 1000)),
      'ms/step': Math.round((decodeMs / (N - 1)) * 100) / 100,
    });
    await dec.release();
  }
  if (process.argv.includes('--json')) for (const r of rows) process.stdout.write(JSON.stringify(r) + '\n');
  else for (const r of rows) process.stdout.write(`${r.arch} ${r.preset} (${r.weights} weights) batch ${B}, prompt ${P}, ${N} new: prefill ${r.prefill_ms} ms, decode ${r['decode_tokens/s']} tokens/s (${r['ms/step']} ms/step)\n`);
} finally {
  rmSync(dir, { recursive: true, force: true });
}
