/**
 * An MCP server as a tool provider, without a model: the protocol's reference server
 * (`@modelcontextprotocol/server-everything`) started over stdio, its tools listed as the specs a chat
 * template receives, two calls answered (one with arguments its schema refuses), and the results
 * journaled in a run folder as `--resume` replays them.
 *
 *   npx tsx examples/agent-mcp.mts [RUN_DIR]
 *   MCP='node my-server.mjs' npx tsx examples/agent-mcp.mts      (any stdio server)
 *
 * Then GRPO against the same server for two steps on a tiny random model (`grpo({ mcp, … })`), its
 * tools cut to one with `mcp_tools` (a whole server's list does not fit a tiny model's 512 positions).
 */
import { mkdtempSync, readFileSync, writeFileSync } from 'node:fs';
import { createRequire } from 'node:module';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { JOURNAL_FILE, ToolExecutor, ToolJournal, UserError, grpo, initModel } from 'prefzoo';

const dir = process.argv[2] ?? mkdtempSync(join(tmpdir(), 'prefzoo-mcp-'));
// The reference server where it is installed (a clone of prefzoo has it as a dev dependency), else
// through npx: starting npx can take longer than the protocol's start-up timeout on a busy machine.
function everything(): string {
  try {
    return `node ${JSON.stringify(createRequire(import.meta.url).resolve('@modelcontextprotocol/server-everything/dist/index.js'))} stdio`;
  } catch {
    return 'npx -y @modelcontextprotocol/server-everything stdio';
  }
}
const command = process.env.MCP ?? everything();
const journal = ToolJournal.open(join(dir, JOURNAL_FILE));

let tools: ToolExecutor;
try {
  tools = await ToolExecutor.open({ mcp: [command], toolTimeout: 30, journal });
} catch (e) {
  if (e instanceof UserError) {
    console.error(e.message);
    process.exit(1);
  }
  throw e;
}
console.log(`${tools.specs.length} tools:`, tools.specs.map((s) => s.function.name).join(', '));

const names = new Set(tools.specs.map((s) => s.function.name));
const calls = names.has('get-sum')
  ? [
      { id: 'c1', function: { name: 'get-sum', arguments: { a: 19, b: 23 } } },
      { id: 'c2', function: { name: 'get-sum', arguments: { a: 'nineteen', b: 23 } } },
    ]
  : [{ id: 'c1', function: { name: tools.specs[0].function.name, arguments: {} } }];
try {
  const round = await tools.execute(calls, { row: {}, seed: 0, step: 0, rollout: 0, turn: 0, where: 'example:1' });
  for (const [i, m] of round.messages.entries()) console.log(`${m.name} → ${m.content}  (${round.records[i].ok ? 'ok' : 'failed'})`);
} catch (e) {
  // A server that dies mid-run: one line naming it, the tool and the prompt, with its last stderr line.
  if (e instanceof UserError) console.error(e.message);
  else throw e;
} finally {
  await tools.close();
}
console.log(`journal ${join(dir, JOURNAL_FILE)}:\n${readFileSync(join(dir, JOURNAL_FILE), 'utf8')}`);

initModel({ output: join(dir, 'model'), preset: 'tiny' });
writeFileSync(join(dir, 'prompts.jsonl'), JSON.stringify({ prompt: 'Add 19 and 23.' }) + '\n');
const one = names.has('get-sum') ? 'get-sum' : tools.specs[0].function.name;
const r = await grpo({
  model: join(dir, 'model'), prompts: join(dir, 'prompts.jsonl'), rewards: ['format:42'], mcp: [command], out: join(dir, 'grpo'),
  settings: { mcp_tools: one, max_steps: 2, batch_size: 2, num_generations: 2, max_completion_length: 24, threads: 1 },
});
console.log(`GRPO: ${r.steps} steps; tools/call_frequency ${r.last['tools/call_frequency']}; the run's journal in ${join(dir, 'grpo', JOURNAL_FILE)}`);
