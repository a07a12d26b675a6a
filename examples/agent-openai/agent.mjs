// The tools demo's task (`prefzoo demo --method tools`) as an agent written with the `openai` SDK's own
// tool loop, knowing nothing of prefzoo. A task row is { prompt: "c?", answer: "7", table: "31759270" }:
// the question names a key a–h, and the table holds one digit per key, in that order, in a column the
// model never sees. The tool `get({ k })` answers the table's digit for key k. The loop: ask with the
// tool offered, run the calls the model wrote, feed their results back as tool messages, at most two
// model calls; the final text is the answer (`--reward accuracy` compares it with the row's `answer`).
//
//   npx prefzoo grpo --model M --prompts tasks.jsonl --agent examples/agent-openai/agent.mjs --reward accuracy -o RUN
//
// Under `prefzoo grpo --agent` the base URL is the rollout's own path on the run's endpoint; pointed at
// `prefzoo serve`, vLLM or any OpenAI-compatible server, the same function runs unchanged.
import OpenAI from 'openai';

const KEYS = 'abcdefgh';

const tools = [
  {
    type: 'function',
    function: { name: 'get', description: 'value of k', parameters: { type: 'object', properties: { k: { type: 'string' } }, required: ['k'] } },
  },
];

/** The tool: the table's digit for key k, or an error the model reads. */
export function get(table, args) {
  let k;
  try {
    k = JSON.parse(args || '{}').k;
  } catch {
    return `error: the arguments are not JSON: ${args}`;
  }
  const at = typeof k === 'string' && k.length === 1 ? KEYS.indexOf(k) : -1;
  return at < 0 ? `error: no key ${JSON.stringify(k)}; the keys are a to h` : String(table)[at];
}

export default async function agent(task, { baseURL, apiKey, model, signal }) {
  const client = new OpenAI({ baseURL, apiKey, maxRetries: 0 });
  const messages = [{ role: 'user', content: task.prompt }];
  let text = '';
  for (let call = 0; call < 2; call++) {
    const r = await client.chat.completions.create({ model, messages, tools, max_tokens: 64 }, { signal });
    const m = r.choices[0].message;
    text = m.content ?? '';
    if (!m.tool_calls?.length) break;
    // The assistant message as it came back, then one tool message per call.
    messages.push(m);
    for (const c of m.tool_calls) messages.push({ role: 'tool', tool_call_id: c.id, content: get(task.table, c.function.arguments) });
  }
  return text;
}
