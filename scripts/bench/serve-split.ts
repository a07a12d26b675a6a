/**
 * Where `prefzoo bench --serve`'s time goes: the same 16 seeded chat requests with a tool (the
 * bench's prompts, seeds and budget), one after another and all at once, each way twice in one
 * process — on the serving engine alone (`ServeEngine.run`, no HTTP) and through the server with the
 * bench's `openai`-SDK clients in their own process (serve-bench.ts). Per pass: tokens/s, the
 * server process's CPU (user and system; the clients' own process apart, printed beside it), and the generation session's
 * timers (forward: the batch's steps; prefill; sample; bookkeeping: the rest, the rows' extend runs
 * and cache copies and the turns the HTTP side gets between steps). The engine's own ratio is the
 * ceiling the HTTP side can only lower; the CPU added per token through HTTP is the server's and the
 * clients' share.
 *
 *   node --import tsx scripts/bench/serve-split.ts [--preset small] [--clients 16] [--max-tokens 64] [--threads 2] [--rounds 2]
 */
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { parseArgs } from 'node:util';
import type { ToolSpec } from '../../src/chat.ts';
import { readExportSource } from '../../src/export/source.ts';
import { presetArch, type Preset } from '../../src/models/config.ts';
import { Decoder, setGenerateTimer } from '../../src/models/generate.ts';
import { initModelFolder } from '../../src/models/init.ts';
import { SERVE_RUNTIME, ServeEngine } from '../../src/serve/engine.ts';
import { choiceRandom, startServer } from '../../src/serve/http.ts';
import { loadTokenizer } from '../../src/tokenize/index.ts';
import { clientProcess, TOOLS } from './serve-bench.ts';

const { values: a } = parseArgs({ options: { preset: { type: 'string', default: 'small' }, clients: { type: 'string', default: '16' }, 'max-tokens': { type: 'string', default: '64' }, threads: { type: 'string', default: '2' }, rounds: { type: 'string', default: '2' } } });
const N = Number(a.clients);
const MAX = Number(a['max-tokens']);
const tmp = mkdtempSync(join(tmpdir(), 'prefzoo-serve-split-'));
const dir = join(tmp, 'model');
initModelFolder(dir, presetArch(a.preset as Preset) ?? 'llama', a.preset as Preset, 0);
const src = readExportSource(dir);
const tok = loadTokenizer(src.dir);
const decoder = await Decoder.create(src.config, src.weights, { runtime: { ...SERVE_RUNTIME, ep: 'cpu', threads: Number(a.threads) }, bake: true });
const engine = new ServeEngine(decoder, tok, { maxBatch: Math.max(32, N) });
const server = await startServer({ engine, model: 'bench', port: 0, limits: { maxConcurrency: Math.max(64, N) } });
const clients = clientProcess(server.url);
const timers = new Map<string, number>();
setGenerateTimer((label, ms) => timers.set(label, (timers.get(label) ?? 0) + ms));

// The bench's requests on the engine alone: the same chat render, seed and budget.
const tools = TOOLS.map((t) => ({ type: 'function' as const, function: (t as { function: ToolSpec['function'] }).function }));
const prompt = (i: number) => engine.chatPrompt([{ role: 'user', content: `Look up the key k${i} and tell me its value.` }], tools, null).promptIds;
const alone = async (i: number) => (await engine.run({ promptIds: prompt(i), sampling: { temperature: 1, topP: 1, topK: 0 }, maxTokens: MAX, rngs: [choiceRandom(1000 + i, 0)], onToken: () => {} }))[0].ids.length;
const served = async (is: number[]) => (await clients.ask(is.map((i) => ({ i, maxTokens: MAX })))).reduce((s, x) => s + x.ids.length, 0);
const all = Array.from({ length: N }, (_, i) => i);
const passes: [string, () => Promise<number>][] = [
  ['engine, one after another', async () => { let n = 0; for (const i of all) n += await alone(i); return n; }],
  ['engine, all at once', async () => (await Promise.all(all.map(alone))).reduce((s, x) => s + x, 0)],
  ['HTTP, one after another', async () => { let n = 0; for (const i of all) n += await served([i]); return n; }],
  ['HTTP, all at once', () => served(all)],
];
try {
  for (const [, f] of passes) await f(); // warm-up: every shape built
  for (let r = 0; r < Number(a.rounds); r++) {
    for (const [name, f] of passes) {
      timers.clear();
      const c0 = process.cpuUsage();
      const k0 = clients.cpu();
      const t0 = performance.now();
      const n = await f();
      const s = (performance.now() - t0) / 1000;
      const c = process.cpuUsage(c0);
      const t = Object.fromEntries([...timers].map(([k, v]) => [k, Math.round(v)]));
      console.log(`${name.padEnd(26)} ${n} tokens, ${s.toFixed(2)} s, ${(n / s).toFixed(1)} tokens/s, CPU ${((c.user + c.system) / 1e6).toFixed(2)} s (system ${(c.system / 1e6).toFixed(2)}), clients' CPU ${(clients.cpu() - k0).toFixed(2)} s, ms ${JSON.stringify(t)}`);
    }
  }
} finally {
  setGenerateTimer(null);
  await clients.close();
  await server.close({ cancel: true });
  await engine.close();
  await decoder.release();
  rmSync(tmp, { recursive: true, force: true });
}
