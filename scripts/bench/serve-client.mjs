// The clients of `prefzoo bench --serve` (serve-bench.ts), in a process of their own: a real client is
// never in the server's process, the openai SDK's parsing of each streamed chunk would otherwise run
// between the server's decode steps, and the server's process CPU is then the server's alone (this
// process reports its own beside each answer). Plain JavaScript (the compiled bench has no
// TypeScript loader). Started with `{ baseURL, tools }` as JSON in its one argument. Each message asks
// for requests sent together and answers with their token ids and when they were sent, and when the
// first and last tokens arrived (this process's clock: only differences are read).
import OpenAI from 'openai';

const { baseURL, tools } = JSON.parse(process.argv[2]);
const client = new OpenAI({ baseURL, apiKey: 'bench', maxRetries: 0 });

/** One streamed chat request (seeded, one chunk per drawn token with vLLM's return_token_ids). */
async function ask(i, maxTokens) {
  const sent = performance.now();
  const stream = await client.chat.completions.create({
    model: 'bench',
    messages: [{ role: 'user', content: `Look up the key k${i} and tell me its value.` }],
    tools,
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

/** This process's CPU so far (user + system), µs. */
const cpu = () => {
  const u = process.cpuUsage();
  return u.user + u.system;
};

process.on('message', async ({ id, requests }) => {
  try {
    const answers = await Promise.all(requests.map((r) => ask(r.i, r.maxTokens)));
    process.send({ id, answers, cpu: cpu() });
  } catch (e) {
    process.send({ id, error: String(e?.message ?? e), cpu: cpu() });
  }
});
process.on('disconnect', () => process.exit(0));
