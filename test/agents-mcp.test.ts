// MCP servers from npm (the protocol's reference servers) and a small SDK server of our own, through
// the executor; a server that dies; the tool journal's replay on --resume.
import { afterEach, describe, expect, it } from 'vitest';
import { execFileSync, spawnSync } from 'node:child_process';
import { appendFileSync, existsSync, mkdtempSync, readFileSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { ToolExecutor, ToolJournal, JOURNAL_FILE, ProviderDiedError, McpServer, readMcpConfig, splitCommand, toolMetrics, type RolloutContext } from '../src/agents/index.ts';
import type { ToolCall } from '../src/chat.ts';
import { CommandTools } from '../src/agents/index.ts';
import { LineProcess } from '../src/online/line-process.ts';

const ROOT = join(__dirname, '..');
const EVERYTHING = join(ROOT, 'node_modules/@modelcontextprotocol/server-everything/dist/index.js');
const MEMORY = join(ROOT, 'node_modules/@modelcontextprotocol/server-memory/dist/index.js');
const CRASHY = join(__dirname, 'fixtures/agents/crash-server.mjs');
const call = (name: string, args: unknown, id?: string): ToolCall => ({ ...(id ? { id } : {}), type: 'function', function: { name, arguments: args as Record<string, unknown> } });
const ctx = (over: Partial<RolloutContext> = {}): RolloutContext => ({ row: {}, seed: 1, step: 0, rollout: 0, turn: 0, where: 'prompts.jsonl:3', ...over });

const open: ToolExecutor[] = [];
async function executor(options: Parameters<typeof ToolExecutor.open>[0]): Promise<ToolExecutor> {
  const ex = await ToolExecutor.open(options);
  open.push(ex);
  return ex;
}
afterEach(async () => {
  await Promise.all(open.splice(0).map((e) => e.close()));
});

describe('MCP servers', () => {
  it('lists and calls server-everything\'s tools over stdio; non-text content is named as omitted', async () => {
    const ex = await executor({ mcp: [`node ${EVERYTHING} stdio`] });
    const names = ex.specs.map((s) => s.function.name);
    expect(names).toEqual(expect.arrayContaining(['echo', 'get-sum', 'get-tiny-image']));
    const sum = ex.specs.find((s) => s.function.name === 'get-sum')!;
    expect(sum.function.parameters).toMatchObject({ type: 'object', properties: { a: { type: 'number' }, b: { type: 'number' } }, required: ['a', 'b'] });
    expect(sum.function.parameters.$schema).toBeUndefined();
    const r = await ex.execute([call('get-sum', { a: 2, b: 40 }, 'x1'), call('echo', '{"message": "hi"}'), call('get-tiny-image', {}), call('get-sum', { a: 'two', b: 1 })], ctx());
    expect(r.messages.slice(0, 2)).toEqual([
      { role: 'tool', content: 'The sum of 2 and 40 is 42.', name: 'get-sum', tool_call_id: 'x1' },
      { role: 'tool', content: 'Echo: hi', name: 'echo' },
    ]);
    expect(r.messages[2].content).toContain('[image (image/png) omitted: not text]');
    expect(JSON.parse(r.messages[3].content)).toEqual({ error: 'invalid arguments for get-sum: argument a must be number' });
    expect(r.records.map((x) => x.ok)).toEqual([true, true, true, false]);
    expect(toolMetrics([r.records])).toEqual({ 'tools/call_frequency': 4, 'tools/failure_frequency': 0.25 });
  });

  it('reads an mcp.json; a name two servers list is prefixed with each server\'s name; isError counts as a failure', async () => {
    const dir = mkdtempSync(join(tmpdir(), 'pz-mcp-'));
    const memoryFile = join(dir, 'memory.jsonl');
    const config = join(dir, 'mcp.json');
    writeFileSync(
      config,
      JSON.stringify({
        mcpServers: {
          memory: { command: 'node', args: [MEMORY], env: { MEMORY_FILE_PATH: memoryFile } },
          everything: { command: 'node', args: [EVERYTHING, 'stdio'] },
          crashy: { command: 'node', args: [CRASHY] },
          off: { command: 'nonexistent-binary', disabled: true },
        },
      }),
    );
    expect(readMcpConfig(config).map((s) => s.name)).toEqual(['memory', 'everything', 'crashy']);
    const ex = await executor({ mcpConfig: config });
    const names = ex.specs.map((s) => s.function.name);
    expect(names).toEqual(expect.arrayContaining(['create_entities', 'read_graph', 'get-sum', 'ping', 'everything__echo', 'crashy__echo']));
    expect(names).not.toContain('echo');
    const r = await ex.execute(
      [
        call('create_entities', { entities: [{ name: 'Ada', entityType: 'person', observations: ['wrote the first program'] }] }),
        call('read_graph', {}),
        call('everything__echo', { message: 'a' }),
        call('crashy__echo', { message: 'b' }),
        call('fail', {}),
      ],
      ctx(),
    );
    expect(JSON.parse(r.messages[1].content).entities).toEqual([{ name: 'Ada', entityType: 'person', observations: ['wrote the first program'] }]);
    expect(readFileSync(memoryFile, 'utf8')).toContain('wrote the first program');
    expect(r.messages.slice(2, 4).map((m) => m.content)).toEqual(['Echo: a', 'crashy says b']);
    expect(r.messages[4]).toEqual({ role: 'tool', name: 'fail', content: '{"error":"the database is read-only"}' });
    expect(r.records.map((x) => x.ok)).toEqual([true, true, true, true, false]);
  });

  it('a call past tool_timeout is a failure and the server lives on', async () => {
    const server = await McpServer.start({ command: 'node', args: [EVERYTHING, 'stdio'] });
    const hasty = new ToolExecutor({ providers: [server], toolTimeout: 0.5 });
    const patient = new ToolExecutor({ providers: [server], toolTimeout: 60 });
    open.push(patient);
    const r = await hasty.execute([call('trigger-long-running-operation', { duration: 3, steps: 3 })], ctx());
    expect(JSON.parse(r.messages[0].content)).toEqual({ error: 'trigger-long-running-operation ran past tool_timeout (0.5 s) and was stopped' });
    expect(r.records[0].ok).toBe(false);
    const after = await patient.execute([call('echo', { message: 'still here' })], ctx());
    expect(after.messages[0].content).toBe('Echo: still here');
  });

  it('a server that exits stops the run with one line naming it, the tool, the prompt and its last stderr line', async () => {
    const ex = await executor({ mcp: [`node ${CRASHY}`] });
    const first = await ex.execute([call('ping', { n: 1 })], ctx());
    expect(first.messages[0].content).toBe('pong 1');
    const e = await ex.execute([call('crash', {})], ctx({ where: 'data/prompts.jsonl:7' })).catch((x) => x);
    expect(e).toBeInstanceOf(ProviderDiedError);
    expect(e.message).toBe(`MCP server "crashy" (node ${CRASHY}) exited during the call of tool "crash" for the prompt at data/prompts.jsonl:7; its last stderr line: crashy: fatal: out of cheese`);
    // The next call to the dead server says the same, not a tool message.
    await expect(ex.execute([call('ping', {})], ctx({ where: 'data/prompts.jsonl:8' }))).rejects.toThrow(/exited before the call of tool "ping" for the prompt at data\/prompts.jsonl:8/);
  });

  it('a server killed mid-call (kill -9) gives the same one line', async () => {
    const server = await McpServer.start({ command: 'node', args: [EVERYTHING, 'stdio'], name: 'everything' });
    const ex = new ToolExecutor({ providers: [server] });
    open.push(ex);
    const pending = ex.execute([call('trigger-long-running-operation', { duration: 10, steps: 10 })], ctx({ where: 'p.jsonl:2' }));
    setTimeout(() => process.kill(server.pid!, 'SIGKILL'), 300);
    const e = await pending.catch((x) => x);
    expect(e).toBeInstanceOf(ProviderDiedError);
    expect(e.message).toMatch(new RegExp(`^MCP server "everything" \\(node ${EVERYTHING} stdio\\) exited during the call of tool "trigger-long-running-operation" for the prompt at p\\.jsonl:2; (its last stderr line: .+|it wrote nothing to stderr)$`));
  });

  it('nothing of the server reaches the terminal before our line', () => {
    // A child process does what the CLI does: opens the executor, calls the crashing tool, prints the one line.
    const script = join(mkdtempSync(join(tmpdir(), 'pz-mcp-')), 'run.mts');
    writeFileSync(
      script,
      `import { ToolExecutor } from ${JSON.stringify(join(ROOT, 'src/agents/index.ts'))};
const ex = await ToolExecutor.open({ mcp: [${JSON.stringify(`node ${CRASHY}`)}] });
try {
  await ex.execute([{ function: { name: 'crash', arguments: {} } }], { row: {}, seed: 0, step: 0, rollout: 0, turn: 0, where: 'x.jsonl:1' });
} catch (e) {
  process.stderr.write('prefzoo: ' + e.message + '\\n');
}
await ex.close();
`,
    );
    const r = spawnSync(process.execPath, ['--import', 'tsx', script], { cwd: ROOT, encoding: 'utf8', timeout: 60_000 });
    expect(r.stdout).toBe('');
    expect(r.stderr).toBe(`prefzoo: MCP server "crashy" (node ${CRASHY}) exited during the call of tool "crash" for the prompt at x.jsonl:1; its last stderr line: crashy: fatal: out of cheese\n`);
  });

  it('a server that does not start is one line', async () => {
    await expect(ToolExecutor.open({ mcp: ['nonexistent-mcp-binary --flag'] })).rejects.toThrow(/^--mcp 'nonexistent-mcp-binary --flag': the server did not start \(.*ENOENT.*\)/);
    await expect(ToolExecutor.open({ mcp: [`node -e "process.stderr.write('bad config\\\\n'); process.exit(2)"`] })).rejects.toThrow(/the server did not start .*; its last stderr line: bad config$/);
  });

  it('splits command lines as a shell would for words and quotes', () => {
    expect(splitCommand(`node 'my server.mjs' --name "a \\"b\\"" c\\ d ''`)).toEqual(['node', 'my server.mjs', '--name', 'a "b"', 'c d', '']);
    expect(() => splitCommand('node "open')).toThrow(/unclosed/);
  });
});

describe('cmd: tools', () => {
  const CMD = `node ${join(__dirname, 'fixtures/agents/cmd-tools.mjs')}`;
  it('lists and calls a JSON-lines program through the online loop\'s LineProcess; errors, timeouts and a dead program', async () => {
    const dir = mkdtempSync(join(tmpdir(), 'pz-cmd-'));
    const journal = ToolJournal.open(join(dir, JOURNAL_FILE));
    await expect(ToolExecutor.open({ tools: [`cmd:${CMD}`] })).rejects.toThrow(/no lineProcess given/);
    // As `--tools cmd:…` reaches it from the online loop, which owns LineProcess.
    const ex = await executor({ tools: [`cmd:${CMD}`], lineProcess: (c) => new LineProcess(c), toolTimeout: 60, journal });
    const cmd = (ex as unknown as { providers: CommandTools[] }).providers[0];
    expect(cmd).toBeInstanceOf(CommandTools);
    expect(ex.specs.map((s) => s.function.name)).toEqual(['lookup', 'count', 'slow', 'die']);
    const r = await ex.execute([call('lookup', { key: 'city' }), call('lookup', { key: 'zip' }), call('count', {}), call('count', {}), call('lookup', {})], ctx({ row: { city: 'Oslo' }, seed: 77 }));
    expect(r.messages.map((m) => m.content)).toEqual(['Oslo (seed 77)', '{"error":"no column zip"}', '1', '2', `{"error":"invalid arguments for lookup: arguments must have required property 'key'"}`]);
    expect(r.records.map((x) => x.ok)).toEqual([true, false, true, true, false]);
    // A call past tool_timeout (an executor with a short one, on the same program) kills the program ...
    const hasty = new ToolExecutor({ providers: [cmd], toolTimeout: 0.3 });
    const slow = await hasty.execute([call('slow', {})], ctx());
    expect(slow.messages[0].content).toBe('{"error":"slow ran past tool_timeout (0.3 s) and was stopped"}');
    expect(slow.records[0].ok).toBe(false);
    // ... and the next call starts a fresh one: its count starts again.
    expect((await ex.execute([call('count', {})], ctx({ turn: 1 }))).messages[0].content).toBe('1');
    // Results of the program are journaled (the schema fault, found before the call, is not).
    expect(readFileSync(join(dir, JOURNAL_FILE), 'utf8').trim().split('\n').map((l) => JSON.parse(l).name)).toEqual(['lookup', 'lookup', 'count', 'count', 'count']);
    await expect(ex.execute([call('die', {})], ctx({ where: 'q.jsonl:4' }))).rejects.toThrow(`tool command "${CMD}" closed its output during the call of tool "die" for the prompt at q.jsonl:4; its stderr ends: cmd-tools: giving up`);
  });
});

describe('the tool journal', () => {
  it('journals MCP results and replays them on resume: the same messages, no live call', async () => {
    const dir = mkdtempSync(join(tmpdir(), 'pz-journal-'));
    const file = join(dir, JOURNAL_FILE);
    const memory = (name: string) => ({ command: 'node', args: [MEMORY], env: { MEMORY_FILE_PATH: join(dir, name) } });
    const rounds = [
      { key: { step: 0, rollout: 0, turn: 0 }, calls: [call('create_entities', { entities: [{ name: 'Bo', entityType: 'cat', observations: ['naps'] }] })] },
      { key: { step: 1, rollout: 0, turn: 0 }, calls: [call('read_graph', {}), call('nosuch', {})] },
      { key: { step: 1, rollout: 1, turn: 1 }, calls: [call('search_nodes', { query: 'naps' }), call('add_observations', { observations: [{ entityName: 'Bo', contents: ['purrs'] }] })] },
    ];
    const runAll = async (ex: ToolExecutor, from = 0) => {
      const out = [];
      for (const r of rounds) if (r.key.step >= from) out.push(await ex.execute(r.calls, ctx(r.key)));
      return out;
    };

    const live = new ToolExecutor({ providers: [await McpServer.start({ ...memory('live.jsonl'), name: 'memory' })], journal: ToolJournal.open(file) });
    open.push(live);
    const first = await runAll(live);
    expect(first[1].messages[0].content).toContain('naps');
    const lines = readFileSync(file, 'utf8').trim().split('\n').map((l) => JSON.parse(l));
    // Only the calls that reached the server are journaled (the unknown tool is deterministic).
    expect(lines.map((l) => [l.step, l.rollout, l.turn, l.call, l.name])).toEqual([
      [0, 0, 0, 0, 'create_entities'],
      [1, 0, 0, 0, 'read_graph'],
      [1, 1, 1, 0, 'search_nodes'],
      [1, 1, 1, 1, 'add_observations'],
    ]);

    // The run was killed while writing a line; it resumes from step 1 with a fresh, empty server.
    appendFileSync(file, '{"step":1,"rollout":2,"tu');
    const journal = ToolJournal.open(file, { resumeFrom: 1 });
    expect(journal.tornLines).toBe(1);
    expect(journal.size).toBe(3);
    expect(readFileSync(file, 'utf8').endsWith('"}\n') || readFileSync(file, 'utf8').endsWith('}\n')).toBe(true);
    const freshFile = join(dir, 'fresh.jsonl');
    const resumed = new ToolExecutor({ providers: [await McpServer.start({ ...memory('fresh.jsonl'), name: 'memory' })], journal });
    open.push(resumed);
    const again = await runAll(resumed, 1);
    expect(again.map((r) => r.messages)).toEqual(first.slice(1).map((r) => r.messages));
    expect(again.map((r) => r.records.map((x) => ({ ok: x.ok, replayed: !!x.replayed })))).toEqual([
      [{ ok: true, replayed: true }, { ok: false, replayed: false }],
      [{ ok: true, replayed: true }, { ok: true, replayed: true }],
    ]);
    expect(journal.replayed).toBe(3);
    // The server was never asked: its memory file was never written.
    expect(existsSync(freshFile)).toBe(false);

    // A call that asks something else at a journaled key runs live and is journaled anew.
    const diverged = await resumed.execute([call('search_nodes', { query: 'cat' })], ctx({ step: 1, rollout: 1, turn: 1 }));
    expect(diverged.records[0].replayed).toBeUndefined();
    expect(journal.diverged).toBe(1);
    expect(readFileSync(file, 'utf8').trim().split('\n').pop()).toContain('"query":"cat"');
  });

  it('a damaged line inside the journal is one line naming file and line', () => {
    const dir = mkdtempSync(join(tmpdir(), 'pz-journal-'));
    const file = join(dir, JOURNAL_FILE);
    writeFileSync(file, '{"step":0,"rollout":0,"turn":0,"call":0,"name":"a","arguments":{},"content":"x","ok":true}\nnot json\n{"step":1}\n');
    expect(() => ToolJournal.open(file, { resumeFrom: 0 })).toThrow(`${file}:2: not a JSON line; the tool journal is damaged`);
    // A fresh run starts the journal over.
    const j = ToolJournal.open(file);
    j.close();
    expect(readFileSync(file, 'utf8')).toBe('');
  });
});
