// Runs a `prefzoo grpo --agent` module once, outside prefzoo: the process a cluster framework starts per
// rollout (docs/trl-handoff.md, "The agent you already wrote, at cluster scale"). It reads
//
//   TASK                 the task row, as JSON (else the whole of stdin)
//   AGL_OPENAI_BASE_URL  Agent Lightning's rollout URL, else OPENAI_BASE_URL: the base URL handed to the agent
//   AGL_KEY              else OPENAI_API_KEY, else "EMPTY": its API key
//   MODEL                the model name (default: the first of GET /models)
//   SEED                 the agent's seed (default 0); AGENT_TIMEOUT seconds before its signal aborts (default 300)
//
// and prints the outcome as one JSON line, {"reward": number|null, "text", ...what else it returned}.
// With AGL_EVENT_URL set it also posts the reward as Agent Lightning's reward event
// ({"event_type": "reward", "data": {"value": R}}, Bearer AGL_KEY); an agent that gave no number then
// fails (exit 1): that framework reads the reward from the agent process only.
//
//   node run-agent.mjs ./scored.mjs            (TASK='{"prompt":"c?",...}' OPENAI_BASE_URL=http://127.0.0.1:8080/v1)
import { readFileSync } from 'node:fs';
import { resolve } from 'node:path';
import { pathToFileURL } from 'node:url';

const fail = (msg) => {
  process.stderr.write(`run-agent: ${msg}\n`);
  process.exit(1);
};

const [spec] = process.argv.slice(2);
if (!spec) fail('usage: node run-agent.mjs AGENT.mjs[:export]');
const [file, name = 'default'] = spec.split(/:(?=[A-Za-z_$][\w$]*$)/);
const fn = (await import(pathToFileURL(resolve(file)).href))[name];
if (typeof fn !== 'function') fail(`${spec}: the ${name === 'default' ? 'default export' : `export ${name}`} is not a function`);

let task;
try {
  task = JSON.parse(process.env.TASK ?? readFileSync(0, 'utf8'));
} catch (e) {
  fail(`the task (TASK, else stdin) is not JSON: ${e.message}`);
}
const baseURL = process.env.AGL_OPENAI_BASE_URL ?? process.env.OPENAI_BASE_URL;
if (!baseURL) fail('no base URL: set AGL_OPENAI_BASE_URL or OPENAI_BASE_URL');
const apiKey = process.env.AGL_KEY || process.env.OPENAI_API_KEY || 'EMPTY';
const headers = { authorization: `Bearer ${apiKey}` };
let model = process.env.MODEL;
if (!model) {
  const r = await fetch(`${baseURL.replace(/\/$/, '')}/models`, { headers });
  if (!r.ok) fail(`GET ${baseURL}/models answered ${r.status}; set MODEL`);
  model = (await r.json()).data?.[0]?.id;
  if (!model) fail(`GET ${baseURL}/models lists no model; set MODEL`);
}
const seed = Number(process.env.SEED ?? 0);
const signal = AbortSignal.timeout(Number(process.env.AGENT_TIMEOUT ?? 300) * 1000);

const result = await fn(task, { baseURL, apiKey, model, seed, signal });
const outcome =
  typeof result === 'number' ? { reward: result, text: '' }
  : typeof result === 'string' ? { reward: null, text: result }
  : Array.isArray(result) ? { reward: null, text: [...result].reverse().find((m) => m.role === 'assistant')?.content ?? '', messages: result }
  : { ...result, reward: typeof result?.reward === 'number' ? result.reward : null, text: result?.text ?? '' };
process.stdout.write(JSON.stringify(outcome) + '\n');

if (process.env.AGL_EVENT_URL) {
  if (typeof outcome.reward !== 'number' || !Number.isFinite(outcome.reward)) fail(`${spec} gave no reward, and Agent Lightning reads it from the agent: return a number or { reward }`);
  const r = await fetch(process.env.AGL_EVENT_URL, {
    method: 'POST',
    headers: { ...headers, 'content-type': 'application/json' },
    body: JSON.stringify({ event_type: 'reward', data: { value: outcome.reward } }),
  });
  if (!r.ok) fail(`posting the reward to ${process.env.AGL_EVENT_URL} answered ${r.status}`);
}
