// The clients of `prefzoo bench --serve` (serve-bench.ts), in a thread of their own: a real client is
// never in the server's thread, and the openai SDK's parsing of each streamed chunk would otherwise
// run between the server's decode steps. Plain JavaScript (a worker is started from a file URL, and
// the compiled bench has no TypeScript loader). Each message asks for requests sent together and
// answers with their token ids and when they were sent, and when the first and last tokens arrived
// (this thread's clock: only differences are read).
import { parentPort, workerData } from 'node:worker_threads';
import OpenAI from 'openai';

const client = new OpenAI({ baseURL: workerData.baseURL, apiKey: 'bench', maxRetries: 0 });

/** One streamed chat request (seeded, one chunk per drawn token with vLLM's return_token_ids). */
async function ask(i, maxTokens) {
  const sent = performance.now();
  const stream = await client.chat.completions.create({
    model: 'bench',
    messages: [{ role: 'user', content: `Look up the key k${i} and tell me its value.` }],
    tools: workerData.tools,
    max_tokens: maxTokens,
    temperature: 1,
    seed: 1000 + i,
    stream: true,
    stream_options: { include_usage: true },
    return_token_ids: true,
  });
  const ids = [];
  let first = 0;
  let last = 0;
  let prompt = 0;
  for await (const chunk of stream) {
    const c = chunk.choices[0];
    if (c?.token_ids?.length) {
      if (!ids.length) first = performance.now();
      last = performance.now();
      ids.push(...c.token_ids);
    }
    if (chunk.usage) {
      prompt = chunk.usage.prompt_tokens;
      if (chunk.usage.completion_tokens !== ids.length) throw new Error(`bench --serve: request ${i} streamed ${ids.length} token ids, its usage says ${chunk.usage.completion_tokens}`);
    }
  }
  if (!ids.length) throw new Error(`bench --serve: request ${i} streamed no token`);
  return { ids, prompt, sent, first, last: Math.max(last, performance.now()) };
}

parentPort.on('message', async ({ id, requests }) => {
  try {
    parentPort.postMessage({ id, answers: await Promise.all(requests.map((r) => ask(r.i, r.maxTokens))) });
  } catch (e) {
    parentPort.postMessage({ id, error: String(e?.message ?? e) });
  }
});
