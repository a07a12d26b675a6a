/**
 * What a GRPO run with tools or an environment holds beside the rollout: the `--tools` modules (and
 * `cmd:` programs), the MCP servers (`--mcp`, `--mcp-config`), the `--env` module, the tool journal
 * in the run folder (replayed on `--resume`), and the environment's reward as a reward function
 * (`rewards/env/mean`). Modules are loaded before the run folder is touched; servers and programs start
 * with the run (`start`), the journal knowing from which step it replays.
 */
import { join } from 'node:path';
import { UserError } from '../../errors.ts';
import { ToolExecutor } from '../../agents/executor.ts';
import { loadToolsModule, toolsFromValues, type LoadedTool } from '../../agents/tools.ts';
import { environmentFrom, loadEnvironment, type Environments } from '../../agents/env.ts';
import { mcpSpecFromCommand, readMcpConfig, startMcpServers, type McpServerSpec, type ToolProvider } from '../../agents/mcp.ts';
import { CommandTools } from '../../agents/command.ts';
import { JOURNAL_FILE, ToolJournal } from '../../agents/journal.ts';
import type { EnvironmentFactories, EnvironmentFactory, ToolDef, ZodToolDef } from '../../agents/types.ts';
import { checkTemplateExtends } from '../../tokenize/conversation.ts';
import { LineProcess } from '../line-process.ts';
import type { OnlineContext } from '../../train/loop.ts';
import type { RewardFunction } from '../rewards/index.ts';
import type { PromptRow } from '../prompts.ts';
import { AGENT_SETTINGS, refuseAgentSettings } from './agent-settings.ts';
import { agentRollout, type AgentRolloutInfo, type AgentRolloutSettings } from './agent-rollout.ts';
import type { Rollout } from './rollout.ts';

/** What a run's agent sources read of its settings: the rollout's, and the tool and environment settings (GRPO's, distill's). */
export type AgentRunSettings = AgentRolloutSettings & { mcp_tools: string; env_column: string; tool_timeout: number };

export interface AgentOptions {
  /**
   * Tools: `--tools` modules (`./tools.mjs`, `.ts`), `cmd:COMMAND` programs speaking JSON lines, or
   * tools given as values (`{ name, description, parameters, run }`, or AI SDK `tool({…})` objects).
   */
  tools?: readonly (string | ToolDef | ZodToolDef)[];
  /** MCP servers to start, each a command line (`--mcp`, repeatable). */
  mcp?: readonly string[];
  /** An `{"mcpServers": {…}}` file (`--mcp-config`). */
  mcpConfig?: string;
  /**
   * An environment: an `--env` module (`./env.mjs[:export]`), a factory making one per rollout, or a
   * map of factories by name, each prompt row picking one by its `env_column` column.
   */
  env?: string | EnvironmentFactory | EnvironmentFactories;
}

/** Whether any tool, MCP server or environment is given: the rollouts are then multi-turn. */
export function agentSourcesGiven(o: AgentOptions): boolean {
  return (o.tools?.length ?? 0) > 0 || (o.mcp?.length ?? 0) > 0 || !!o.mcpConfig || o.env !== undefined;
}

export class AgentRun {
  private executor: ToolExecutor | null = null;
  private providers: ToolProvider[] = [];
  private closed = false;
  readonly rollout: Rollout;
  /** The environment's reward as a reward function (when an --env is given). */
  readonly envReward: RewardFunction | null;

  private constructor(
    private readonly local: LoadedTool[],
    private readonly commands: string[],
    private readonly mcp: McpServerSpec[],
    /** The run's environments (rows picking by `env_column` from a map), or null. */
    readonly env: Environments | null,
    private readonly s: AgentRunSettings,
    /** What config.json records of the agent sources. */
    readonly record: Record<string, unknown>,
    /** The command whose run it is, naming it in messages. */
    private readonly command: string,
  ) {
    this.rollout = agentRollout(s, { executor: () => this.executor, env });
    this.envReward = env
      ? {
          name: 'env',
          source: `--env ${env.spec}`,
          rerunnable: true,
          score: ({ rollouts }) => (rollouts ?? []).map((r) => (r as unknown as AgentRolloutInfo).env_reward ?? null),
        }
      : null;
  }

  /**
   * The agent sources of a run, loaded (modules, not servers), or null when there are none — then
   * any agent setting given away from its default is refused, since nothing would use it.
   */
  static async open(o: AgentOptions, s: AgentRunSettings, command = 'grpo'): Promise<AgentRun | null> {
    if (!agentSourcesGiven(o)) {
      refuseAgentSettings(command, s as unknown as Record<string, unknown>);
      return null;
    }
    const local: LoadedTool[] = [];
    const commands: string[] = [];
    const values: (ToolDef | ZodToolDef)[] = [];
    for (const t of o.tools ?? []) {
      if (typeof t === 'string' && t.startsWith('cmd:')) commands.push(t.slice(4));
      else if (typeof t === 'string') local.push(...(await loadToolsModule(t)));
      else values.push(t);
    }
    if (values.length) local.push(...toolsFromValues(values as unknown as Record<string, unknown>[]));
    const mcp = [...(o.mcpConfig ? readMcpConfig(o.mcpConfig) : []), ...(o.mcp ?? []).map(mcpSpecFromCommand)];
    const loaded = o.env === undefined ? null : typeof o.env === 'string' ? await loadEnvironment(o.env) : environmentFrom(o.env, 'env');
    // env_column picks among a map's environments: with one factory (or none) nothing would read it.
    if (s.env_column !== AGENT_SETTINGS.env_column.default && !(loaded && !loaded.single)) {
      throw new UserError(`${command}: env_column=${s.env_column} picks among a map of environments; ${loaded ? `--env ${loaded.spec} exports one factory` : 'no --env is given'}: leave env_column out`, { setting: 'env_column' });
    }
    const env = loaded ? loaded.withColumn(s.env_column) : null;
    const record = {
      tools: (o.tools ?? []).map((t) => (typeof t === 'string' ? t : ((t as { name?: string }).name ?? 'tool'))),
      mcp: o.mcp ?? [],
      ...(o.mcpConfig ? { mcp_config: o.mcpConfig } : {}),
      ...(o.env !== undefined ? { env: typeof o.env === 'string' ? o.env : env!.single ? 'factory' : 'factories' } : {}),
      ...(env && !env.single ? { environments: env.names } : {}),
    };
    return new AgentRun(local, commands, mcp, env, s, record, command);
  }

  /**
   * Each row's environment checked before the run: with a map, every row names one of it by its
   * `env_column` column (one line naming the row's file:line and the names otherwise).
   */
  checkRows(rows: readonly PromptRow[]): void {
    if (this.env) for (const r of rows) this.env.pick(r.row, r.at);
  }

  /**
   * The rows of a run without a prompts file, whose environments give the prompts: one round's
   * worth, `{ index }` for k = 0…n−1, a map's environments taken in turn by index (row k gets the
   * map's (k mod count)-th name in its `env_column`). Every round draws each of them once, in the
   * loop's seeded order; the episode seed (step, place in the round) tells the rounds apart.
   */
  generatedRows(n: number): PromptRow[] {
    const names = this.env?.names ?? [];
    return Array.from({ length: n }, (_, k) => ({
      prompt: null,
      row: { index: k, ...(names.length ? { [this.env!.column]: names[k % names.length] } : {}) },
      at: `generated row ${k}`,
    }));
  }

  /**
   * Without --reward, every environment of a map must have `reward()`, the only reward its rows
   * would get (one made of each to see); one line naming those without.
   */
  async checkEnvRewards(): Promise<void> {
    if (!this.env || this.env.single) return;
    const lacking: string[] = [];
    for (const [k, m] of this.env.modules.entries()) if (!(await m.hasReward())) lacking.push(this.env.names[k]);
    if (lacking.length) {
      throw new UserError(`grpo: no --reward, and the --env ${this.env.spec} environment${lacking.length > 1 ? 's' : ''} ${lacking.join(', ')} ${lacking.length > 1 ? 'have' : 'has'} no reward(): ${lacking.length > 1 ? 'their' : 'its'} rows would go unscored; give --reward, or a reward() to each of ${this.env.names.join(', ')}`, { setting: 'reward' });
    }
  }

  /**
   * Starts the servers and programs and opens the executor with the run folder's journal
   * (`resumeFrom`: the first step a resumed run re-collects; its calls are answered from the journal).
   * Checks that the chat template extends its own render, so tool results can be appended.
   */
  async start(ctx: OnlineContext, resumeFrom: number | undefined): Promise<void> {
    checkTemplateExtends(ctx.tok, {});
    try {
      if (this.mcp.length) this.providers.push(...(await startMcpServers(this.mcp)));
      for (const c of this.commands) this.providers.push(await CommandTools.start(c, (cmd) => new LineProcess(cmd)));
      const offered = selectTools(this.providers, this.s.mcp_tools, this.command);
      const journal = this.providers.length ? ToolJournal.open(join(ctx.run, JOURNAL_FILE), resumeFrom === undefined ? {} : { resumeFrom }) : null;
      if (this.local.length || this.providers.length) {
        this.executor = new ToolExecutor({ tools: this.local, providers: offered, toolTimeout: this.s.tool_timeout, journal });
      }
      if (journal && journal.size > 0) ctx.info(`${this.command}: ${journal.size} journaled tool results from step ${resumeFrom} on will be replayed`);
    } catch (e) {
      await this.close();
      throw e;
    }
  }

  async close(): Promise<void> {
    if (this.closed) return;
    this.closed = true;
    if (this.executor) await this.executor.close();
    else await Promise.all(this.providers.map((p) => p.close()));
  }
}

/** The providers with only the tools `mcp_tools` names (all when it is empty); a name no provider lists is refused. */
function selectTools(providers: readonly ToolProvider[], list: string, command: string): ToolProvider[] {
  const names = list.split(',').map((x) => x.trim()).filter(Boolean);
  if (names.length === 0) return [...providers];
  const listed = new Set(providers.flatMap((p) => p.tools.map((t) => t.function.name)));
  const missing = names.filter((n) => !listed.has(n));
  if (missing.length) throw new UserError(`${command}: mcp_tools names ${missing.join(', ')}, which no server or program lists (they list ${[...listed].slice(0, 20).join(', ')})`, { setting: 'mcp_tools' });
  return providers.map((p) => ({ label: p.label, name: p.name, tools: p.tools.filter((t) => names.includes(t.function.name)), call: (n, a, o) => p.call(n, a, o), close: () => p.close() }));
}
