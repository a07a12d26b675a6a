/**
 * The llama.cpp peer of `prefzoo bench --generate` (scripts/bench/compare --generate --peer llama.cpp):
 * node-llama-cpp's prebuilt CPU binary on a GGUF file (the same model, `prefzoo export --format
 * gguf`), `--batch` sequences of one context decoding together (node-llama-cpp batches the
 * sequences' tokens into one llama_decode), each with a `--prompt`-token prompt and `--new` sampled
 * tokens at temperature 1, `--threads` threads. Times the prompts' prefill (all but their last token)
 * and the decode (the last prompt token, then the new tokens), the median of `--runs`; prints one
 * JSON line with the fields compare reads (tokens_per_s = decode tokens/s) and `total_ms`, prefill and
 * decode of the batch end to end (bench --serve's peer).
 *
 *   node --import tsx scripts/bench/peer-llamacpp.ts --gguf model.gguf [--batch 8] [--prompt 32] [--new 64] [--threads 2] [--runs 3] [--vocab 32000]
 */
import os from 'node:os';
import { parseArgs } from 'node:util';
import { getLlama, type Token } from 'node-llama-cpp';

const { values: a } = parseArgs({
  options: {
    gguf: { type: 'string' },
    batch: { type: 'string', default: '8' },
    prompt: { type: 'string', default: '32' },
    new: { type: 'string', default: '64' },
    threads: { type: 'string' },
    runs: { type: 'string', default: '3' },
    vocab: { type: 'string', default: '32000' },
  },
  strict: false,
});
if (!a.gguf) throw new Error('peer-llamacpp: --gguf FILE is required');
const B = Number(a.batch);
const P = Number(a.prompt);
const N = Number(a.new);
const runs = Number(a.runs);
const threads = a.threads === undefined ? os.availableParallelism() : Number(a.threads);

const llama = await getLlama({ gpu: false, build: 'never', logLevel: 'error' as never });
const model = await llama.loadModel({ modelPath: String(a.gguf) });
// The prompt ids of scripts/bench/decode-bench.ts: below 4096 (or the vocabulary).
const V = Math.min(Number(a.vocab), 4096);
const prompt = (i: number) => Array.from({ length: P }, (_, t) => (16 + ((i * 7919 + t * 104729) % (V - 16))) as Token);
const median = (xs: number[]) => [...xs].sort((x, y) => x - y)[xs.length >> 1];

async function once(): Promise<{ prefill: number; decode: number }> {
  const ctx = await model.createContext({ contextSize: B * (P + N + 8), sequences: B, threads, batchSize: Math.max(512, B * P) });
  try {
    const seqs = Array.from({ length: B }, () => ctx.getSequence());
    let t0 = performance.now();
    await Promise.all(seqs.map((s, i) => s.evaluateWithoutGeneratingNewTokens(prompt(i).slice(0, -1))));
    const prefill = performance.now() - t0;
    t0 = performance.now();
    await Promise.all(
      seqs.map(async (s, i) => {
        let n = 0;
        for await (const _ of s.evaluate(prompt(i).slice(-1), { temperature: 1 })) if (++n === N) break;
      }),
    );
    return { prefill, decode: performance.now() - t0 };
  } finally {
    await ctx.dispose();
  }
}

await once(); // warm-up
const got: { prefill: number; decode: number }[] = [];
for (let r = 0; r < runs; r++) got.push(await once());
const decodeMs = median(got.map((g) => g.decode));
const tps = Math.round(((B * N) / (decodeMs / 1000)) * 10) / 10;
console.log(
  JSON.stringify({
    engine: 'llama.cpp (node-llama-cpp 3.21.1)',
    batch: B,
    prompt_tokens: P,
    new_tokens: N,
    threads,
    prefill_ms: Math.round(median(got.map((g) => g.prefill)) * 10) / 10,
    // Prefill and decode of the whole batch, end to end (what bench --serve compares with a server's wall).
    total_ms: Math.round(median(got.map((g) => g.prefill + g.decode)) * 10) / 10,
    decode_tokens_per_s: tps,
    tokens_per_s: tps,
    ms_per_step: Math.round((decodeMs / N) * 100) / 100,
    step_ms_runs: got.map((g) => Math.round((g.decode / N) * 100) / 100),
    peak_rss_mb: Math.round(process.resourceUsage().maxRSS / 1024),
    load_average: Math.round(os.loadavg()[0] * 100) / 100,
  }),
);
await model.dispose();
await llama.dispose();
