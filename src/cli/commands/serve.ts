import type { Command } from 'commander';
import { DEVICE_HELP, device, positiveInt } from '../flags.ts';
import { hubRecord } from '../hub.ts';
import { UserError } from '../../errors.ts';
import { readExportSource } from '../../export/source.ts';
import { Decoder } from '../../models/generate.ts';
import { loadTokenizer } from '../../tokenize/index.ts';
import { SERVE_RUNTIME, ServeEngine } from '../../serve/engine.ts';
import { DEFAULT_LIMITS, isLoopback, startServer } from '../../serve/http.ts';

export function register(program: Command): void {
  program
    .command('serve')
    .description('an OpenAI-compatible HTTP server on the generation session: /v1/chat/completions (tools, n, seeds, logprobs, streaming), /v1/completions, /v1/models, /health (docs/serve.md)')
    .requiredOption('--model <dir>', 'Hugging Face model folder (or Hub name)')
    .option('--adapter <dir>', 'a PEFT LoRA adapter merged into --model and served')
    .option('--device <device>', DEVICE_HELP, 'cpu')
    .option('--host <host>', 'address to listen on; other than loopback needs --api-key', '127.0.0.1')
    .option('--port <n>', 'port to listen on (0: any free one)', '8080')
    .option('--api-key <key>', 'required as "Authorization: Bearer KEY" on every request (also read from PREFZOO_API_KEY)')
    .option('--served-model-name <name>', "the model's name in requests and /v1/models (default: --model as given)")
    .option('--chat-template <file>', "a Jinja chat-template file used instead of the model's own")
    .option('--max-concurrency <n>', 'requests decoding at once; more wait in the queue', String(DEFAULT_LIMITS.maxConcurrency))
    .option('--max-queue <n>', 'requests waiting at most; past it, 429', String(DEFAULT_LIMITS.maxQueue))
    .option('--max-batch <n>', 'rows decoded together in one step', '32')
    .option('--max-body <bytes>', 'request bodies larger than this get 413', String(DEFAULT_LIMITS.maxBodyBytes))
    .option('--quiet', 'print only the line saying where it listens')
    .action(async (o: { model: string; adapter?: string; device: string; host: string; port: string; apiKey?: string; servedModelName?: string; chatTemplate?: string; maxConcurrency: string; maxQueue: string; maxBatch: string; maxBody: string; quiet?: boolean }) => {
      const apiKey = o.apiKey ?? process.env.PREFZOO_API_KEY;
      if (!isLoopback(o.host) && !apiKey) throw new UserError(`--host ${o.host} reaches beyond this machine: give --api-key KEY (or PREFZOO_API_KEY), checked on every request`);
      if (!/^\d+$/.test(o.port) || Number(o.port) > 65535) throw new UserError(`--port must be an integer from 0 to 65535, got "${o.port}"`);
      if (!/^\d+$/.test(o.maxQueue)) throw new UserError(`--max-queue must be a non-negative integer, got "${o.maxQueue}"`);
      const limits = { maxConcurrency: positiveInt('--max-concurrency', o.maxConcurrency, 0), maxQueue: Number(o.maxQueue), maxBodyBytes: positiveInt('--max-body', o.maxBody, 0) };
      const maxBatch = positiveInt('--max-batch', o.maxBatch, 32);
      const ep = device(o.device);
      const src = readExportSource(o.model, o.adapter);
      const tok = loadTokenizer(src.dir, { chatTemplateFile: o.chatTemplate });
      const decoder = await Decoder.create(src.config, src.weights, { runtime: { ...SERVE_RUNTIME, ep }, bake: true });
      const engine = new ServeEngine(decoder, tok, { maxBatch });
      // A Hub name is served under that name, not its cache folder's.
      const name = o.servedModelName ?? hubRecord()?.model?.repo ?? o.model;
      const server = await startServer({ engine, model: name, host: o.host, port: Number(o.port), apiKey, limits });
      process.stdout.write(`prefzoo: serving ${name} at ${server.url}\n`);
      if (!o.quiet) process.stderr.write(`prefzoo: ${src.config.model_type} on ${ep}${src.adapter ? ` with the adapter ${src.adapter}` : ''}; Ctrl-C stops (requests in flight finish, a second Ctrl-C cancels them)\n`);
      await new Promise<void>((resolve) => {
        let stopping = false;
        const stop = () => {
          if (stopping) {
            // A second signal: cancel what is still decoding.
            void server.close({ cancel: true });
            return;
          }
          stopping = true;
          if (!o.quiet) process.stderr.write('prefzoo: shutting down (new requests get 503)\n');
          void server.close().then(resolve);
        };
        // In place of the CLI's own handlers (which exit at once): serving writes no temporary files.
        for (const sig of ['SIGINT', 'SIGTERM'] as const) {
          process.removeAllListeners(sig);
          process.on(sig, stop);
        }
      });
      await engine.close();
      await decoder.release();
    });
}
