// The agent of `prefzoo demo --method agent`, written as an app would be with the Vercel AI SDK: one
// generateText call with a tool and a step limit. It imports nothing of prefzoo: the run gives it an
// OpenAI-compatible base URL (the live policy) and scores the text it returns with `--reward accuracy`
// against the task's `answer` column.
//
// The task: a question "c?" asks for the value of key c in a table of eight digits (keys a–h) that
// only the tool get({ k }) reads — the task row's `table` column, never shown to the model.
import { createOpenAICompatible } from '@ai-sdk/openai-compatible';
import { generateText, jsonSchema, stepCountIs, tool } from 'ai';

const KEYS = 'abcdefgh';

export default async function lookupAgent(task, { baseURL, apiKey, model, signal }) {
  const provider = createOpenAICompatible({ name: 'policy', baseURL, apiKey });
  const table = String(task.table);
  const get = tool({
    description: 'value of k',
    inputSchema: jsonSchema({ type: 'object', properties: { k: { type: 'string' } } }),
    execute: async ({ k }) => {
      const at = typeof k === 'string' && k.length === 1 ? KEYS.indexOf(k) : -1;
      return at < 0 ? JSON.stringify({ error: `no key ${JSON.stringify(k)}` }) : table[at];
    },
  });
  const { text } = await generateText({
    model: provider.chatModel(model),
    prompt: String(task.prompt),
    tools: { get },
    // The call, then the answer: two model calls at most.
    stopWhen: stepCountIs(2),
    maxRetries: 0,
    abortSignal: signal,
  });
  return text;
}
