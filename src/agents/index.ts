/**
 * Agents: tools (in-process modules, MCP servers), environments, the executor that answers a turn's
 * tool calls, the tool journal for `--resume`, and the tool metrics. The rollout (src/online) drives
 * them; nothing here generates text.
 */
export type { ToolDef, ZodToolDef, ToolContext, ToolOutput, Environment, EnvironmentFactory, EnvironmentFactories, EnvironmentStart, EnvironmentAction, EnvironmentStep, RolloutContext, CallRecord, ToolRound } from './types.ts';
export { loadToolsModule, toolsFromModule, toolsFromValues, toolFromExport, compileSchema, TOOL_NAME, type LoadedTool } from './tools.ts';
export { McpServer, startMcpServers, readMcpConfig, mcpSpecFromCommand, splitCommand, mcpResultText, ProviderDiedError, type McpServerSpec, type ToolProvider, type ProviderResult, type ProviderCallOptions } from './mcp.ts';
export { CommandTools, type LineChannel } from './command.ts';
export { ToolExecutor, DEFAULT_TOOL_TIMEOUT, errorContent, toolOutputText, type ToolExecutorOptions, type ToolSources } from './executor.ts';
export { loadEnvironment, environmentFrom, EnvironmentModule, Environments, EnvSession, EnvironmentError } from './env.ts';
export { ToolJournal, JOURNAL_FILE, canonicalJson, type JournalEntry, type JournalKey } from './journal.ts';
export { toolMetrics, turnMetrics, stopReasonMetrics, type ToolMetrics } from './metrics.ts';
export { episodeSeed, callRandom, mixSeed } from './seeds.ts';
