/**
 * prefzoo as a library: the `prefzoo` commands as typed functions.
 *
 * ```ts
 * import { convert, initModel, train, evaluate } from 'prefzoo';
 * initModel({ output: 'm' });
 * await convert('pairs.jsonl', 'd.parquet');
 * const run = await train({ model: 'm', data: 'd.parquet', loss: 'dpo', out: 'run', settings: { max_steps: 10, beta: 0.1 } });
 * const metrics = await evaluate({ model: run.finalDir, ref: 'm', data: 'd.parquet' });
 * ```
 *
 * Every long job takes `signal` (an AbortSignal: the job stops at its next unit of work — a step, a
 * batch — with an {@link AbortedError}, its outputs left as before), `progress` (a
 * {@link ProgressFactory}: called once per stage with its label and size, then told each unit done;
 * the CLI's progress bars are one such factory) and `log` (notes such as "resuming from step 40").
 * Nothing here writes to the terminal or exits the process. Errors a user can fix are
 * {@link UserError}s: {@link BadInputError} (malformed data, out-of-range settings),
 * {@link DamagedFileError} (truncated or corrupt files), {@link DeviceUnavailableError} (no WebGPU
 * adapter, no CUDA build); each carries `file`, `line`, `row` or `setting` where known. Any other
 * error is a bug.
 *
 * @packageDocumentation
 */
import { mkdtempSync, readFileSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { AbortedError, BadInputError } from './errors.ts';
import { reporterOf, SILENT, type ProgressFactory, type Reporter } from './progress.ts';
import { convert as convertFiles, type ConvertOptions as ConvertFileOptions, type ConvertSummary } from '../datasets/convert.ts';
import { inspectFile, type InspectReport } from '../datasets/inspect.ts';
import type { Text } from '../datasets/names.ts';
import { tokenReport, type TokenReport } from './train/token-stats.ts';
import { tokenizeDataset, type TokenizeOptions as TokenizeFileOptions, type TokenizeSummary } from './train/tokenize-data.ts';
import { trainAny } from './train/mpo.ts';
import type { TrainOptions as TrainerOptions, TrainResult } from './train/trainer.ts';
import type { TrainConfig } from './train/config.ts';
import type { LoopOptions } from './train/run.ts';
import { evaluateRows, type EvalOptions, type EvalSummary, type ModelSource } from './eval/evaluate.ts';
import { ModelSampler } from './online/policy.ts';
import type { Sample } from './online/policy.ts';
import { readPrompts } from './online/prompts.ts';
import { writeSamples } from './online/samples-io.ts';
import { generateSampling, type GenerateSettings } from './online/sampling.ts';
import type { Judge } from './online/judges.ts';
import { runSppo, type SppoOptions as SppoLoopOptions, type SppoResult } from './online/sppo.ts';
import { runNashMd, type NashMdOptions as NashMdLoopOptions, type NashMdResult } from './online/nash-md.ts';
import { distill as runDistill, type DistillOptions as RunDistillOptions, type DistillResult } from './train/distill.ts';
import { rewardTrain as trainRewardModel, scorePairs as scoreWithRewardModel, type RewardTrainResult, type ScorePairsResult } from './online/reward-model.ts';
import { initModelFolder, initModelFromConfig, type InitModelResult } from './models/init.ts';
import { ARCHES, PRESETS, type Arch, type Preset, presetArch } from './models/config.ts';
import type { SamplingOptions } from './models/sampling.ts';
import type { ExecutionProvider, RuntimeOptions } from './runtime/session.ts';
import type { TruncationConfig } from '../datasets/examples.ts';
import { GGUF_DTYPES, exportGguf, type GgufDtype } from './export/gguf.ts';
import { ONNX_DTYPES, exportOnnx, type OnnxDtype } from './export/onnx.ts';
import { readExportSource } from './export/source.ts';
import { SERVE_RUNTIME, ServeEngine } from './serve/engine.ts';
import { startServer, type RunningServer, type ServerLimits } from './serve/http.ts';
import { Decoder } from './models/generate.ts';
import { productQuant } from './models/quantize.ts';
import { loadTokenizer } from './tokenize/index.ts';
import { grpo as runGrpo, type GrpoOptions as GrpoLoopOptions, type GrpoResult, type GrpoSettings } from './online/grpo/index.ts';
import type { AgentOptions } from './online/grpo/index.ts';
import { distillAgents } from './online/distill-agents.ts';
import { resolveDataset, resolveModel, type HubSnapshot, type ModelWant } from './hub/index.ts';

export { UserError, BadInputError, DamagedFileError, DeviceUnavailableError, AbortedError, type ErrorLocation, type UserErrorKind } from './errors.ts';
export type { ProgressFactory, ProgressReporter, ProgressFields } from './progress.ts';
export type { ConvertSummary, InspectReport, TokenReport, TokenizeSummary, TrainResult, TrainConfig, EvalSummary, ModelSource, Sample, SamplingOptions, Text, Judge, SppoResult, NashMdResult, DistillResult, RewardTrainResult, ScorePairsResult, InitModelResult, Arch, Preset, ExecutionProvider, RuntimeOptions, TruncationConfig };
export type { Comparison } from './online/judges.ts';
export type { Message, Role } from '../datasets/names.ts';
export type { InputFormat } from '../datasets/readers.ts';
export type { PrefzooMeta } from '../datasets/schema.ts';
export type { LengthStats } from '../datasets/inspect.ts';
export type { TokenLengths } from './train/token-stats.ts';
export type { ModelConfig } from './models/config.ts';
export type { FloatTensor } from './models/checkpoint.ts';
export type { OptLevel } from './runtime/session.ts';
export type { SppoIteration } from './online/sppo.ts';
export type { GrpoResult, GrpoSettings };
export type { GenerateSettings };
/** A GRPO run's tools, MCP servers and environment (`grpo({ tools, mcp, mcpConfig, env })`), and what a multi-turn rollout records (the rewards' third argument). */
export type { AgentOptions, AgentRolloutInfo, AgentStopReason } from './online/grpo/index.ts';
/**
 * `grpo({ agent })`: an agent written against an OpenAI-compatible API, `(task, { baseURL, apiKey,
 * model, seed, signal }) => reward`, trained through the run's endpoint (docs/agents.md, "Training the
 * agent you already wrote"); `CallPredicate` is a `train_calls` module's function.
 */
export type { AgentFunction, AgentContext, AgentResult, CallPredicate } from './online/grpo/agent-harness.ts';
export type { RewardSpec, RewardFunction, RewardBatch, RewardRow } from './online/rewards/index.ts';
import type { RewardSpec } from './online/rewards/index.ts';
export type { Kind, LossModule, ParamSpec, Schedule } from '../losses/index.ts';
/** The loss zoo: every loss by name, mixtures such as `dpo:0.8,sft:0.2`, and binding parameters. */
export { listLosses, getLoss, parseLossSpec, resolveLoss, scheduleOf, type LossTerm, BoundLoss } from '../losses/index.ts';
export { ARCHES, PRESETS };
export { DEFAULT_CONFIG } from './train/config.ts';
// Agents: tools, MCP servers, environments (docs/agents.md). The rollout that drives them is GRPO's.
export type { ToolCall, ToolSpec } from './chat.ts';
export { ToolExecutor, loadToolsModule, toolsFromValues, startMcpServers, readMcpConfig, McpServer, loadEnvironment, environmentFrom, Environments, EnvSession, EnvironmentError, ProviderDiedError, ToolJournal, JOURNAL_FILE, toolMetrics, turnMetrics, stopReasonMetrics, episodeSeed, DEFAULT_TOOL_TIMEOUT } from './agents/index.ts';
export type { ToolDef, ZodToolDef, ToolContext, Environment, EnvironmentFactory, EnvironmentFactories, EnvironmentStart, EnvironmentAction, EnvironmentStep, RolloutContext, CallRecord, ToolRound, LoadedTool, McpServerSpec, ToolProvider, ToolExecutorOptions, ToolMetrics, JournalEntry } from './agents/index.ts';
export type { HubSnapshot };
export { hubCacheDir } from './hub/index.ts';

/** What every long job takes. */
export interface JobOptions {
  /** Stops the job at its next unit of work (step, batch) with an {@link AbortedError}; outputs are left as before. */
  signal?: AbortSignal;
  /** Progress of each stage: called with its label and size, then told each unit done. */
  progress?: ProgressFactory;
  /** Notes on what the job does ("resuming from …", per-iteration summaries); none by default. */
  log?: (line: string) => void;
}

/**
 * Training settings and loss parameters by name, as `prefzoo train --param key=value` takes them:
 * the keys of {@link TrainConfig} (`max_steps`, `learning_rate`, `device`, …) and the loss's own
 * (`beta`, `label_smoothing`, …). Values are checked as the CLI checks them.
 */
export type Settings = Partial<TrainConfig> & { [key: string]: string | number | boolean | null | undefined };

/** `settings` as `key=value` strings, after `params`. */
function paramsOf(o: { settings?: Settings; params?: string[] }): string[] {
  const out = [...(o.params ?? [])];
  for (const [k, v] of Object.entries(o.settings ?? {})) if (v !== undefined) out.push(`${k}=${v === null ? '' : v}`);
  return out;
}

/** The signal's reason as an AbortedError (an Error given as the reason is kept as its cause). */
function abortedBy(signal: AbortSignal): AbortedError {
  const e = new AbortedError();
  (e as { cause?: unknown }).cause = signal.reason;
  return e;
}

/**
 * Runs `job` under `o.signal` with the caller's `progress` and `log` as one {@link Reporter}: refused
 * at once when already aborted; while it runs, the progress it reports goes through a factory that
 * stops it at the next unit once aborted. Aborts surface as AbortedError whatever the inner code threw.
 */
async function guarded<T>(o: JobOptions, job: (reporter: Reporter) => Promise<T>): Promise<T> {
  const { signal, progress } = o;
  if (signal?.aborted) throw abortedBy(signal);
  const watched: ProgressFactory | undefined = !signal
    ? progress
    : (label, total) => {
        const inner = progress?.(label, total);
        return {
          update(value, fields) {
            if (signal.aborted) throw abortedBy(signal);
            inner?.update(value, fields);
          },
          stop() {
            inner?.stop();
          },
        };
      };
  try {
    return await job(reporterOf({ progress: watched, info: o.log }));
  } catch (e) {
    if (signal?.aborted && !(e instanceof AbortedError)) throw abortedBy(signal);
    throw e;
  }
}

/**
 * Models and datasets by Hugging Face Hub name (`ORG/NAME`, `ORG/NAME@revision`) wherever a folder
 * or data file goes: found in the shared cache (HF_HUB_CACHE, else HF_HOME/hub, else
 * ~/.cache/huggingface/hub), else downloaded into it (HF_ENDPOINT, HF_TOKEN); see docs/hub.md.
 */
export interface HubNameOptions {
  /** Branch, tag or commit of `model` when it is a Hub name (default main). */
  revision?: string;
  /** Only the cache, never the network (as HF_HUB_OFFLINE=1). */
  offline?: boolean;
  /** Split of `data` when it is a Hub dataset name (default train). */
  split?: string;
  /** Subset (config) of `data` when it is a Hub dataset name. */
  subset?: string;
}

/** Resolves the Hub names of one job into local paths, keeping what each resolved to. */
class JobNames {
  readonly record: Record<string, HubSnapshot> = {};
  constructor(private readonly o: HubNameOptions, private readonly reporter: Reporter) {}

  async model(key: string, value: string, want?: ModelWant): Promise<string>;
  async model(key: string, value: string | undefined, want?: ModelWant): Promise<string | undefined>;
  async model(key: string, value: string | undefined, want: ModelWant = 'model'): Promise<string | undefined> {
    if (value === undefined) return undefined;
    const r = await resolveModel(value, want, { revision: key === 'model' ? this.o.revision : undefined, offline: this.o.offline, reporter: this.reporter });
    if (r.hub) this.record[key] = r.hub;
    return r.path;
  }

  async data(value: string): Promise<string> {
    const r = await resolveDataset(value, { offline: this.o.offline, split: this.o.split, subset: this.o.subset, reporter: this.reporter });
    if (r.hub) this.record.data = r.hub;
    return r.spec;
  }

  async dataFiles(value: string): Promise<string[]> {
    const r = await resolveDataset(value, { revision: this.o.revision, offline: this.o.offline, split: this.o.split, subset: this.o.subset, reporter: this.reporter });
    if (r.hub) this.record.data = r.hub;
    return r.files.length ? r.files : [value];
  }

  get hub(): Record<string, HubSnapshot> | undefined {
    return Object.keys(this.record).length ? this.record : undefined;
  }
}

/** A temporary folder for the duration of `f`. */
async function withTempDir<T>(prefix: string, f: (dir: string) => Promise<T>): Promise<T> {
  const dir = mkdtempSync(join(tmpdir(), prefix));
  try {
    return await f(dir);
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
}

// ─── data ─────────────────────────────────────────────────────────────────────────────────────────

/** Options of {@link convert}: format detection, field mapping, validation, sharding. */
export interface ConvertOptions extends Omit<ConvertFileOptions, 'signal'>, Pick<JobOptions, 'signal'>, Omit<HubNameOptions, 'revision'> {
  /** Revision of an input given as a Hub dataset name (default main). */
  revision?: string;
}

/**
 * Converts preference data (JSON, JSONL, CSV/TSV, Parquet, Arrow; .gz too; the formats of
 * docs/data.md, detected) to canonical Parquet at `output` (`prefzoo convert`).
 */
export function convert(inputs: string | string[], output: string, options: ConvertOptions = {}): Promise<ConvertSummary> {
  return guarded(options, async () => {
    const names = new JobNames(options, SILENT);
    const files: string[] = [];
    for (const input of Array.isArray(inputs) ? inputs : [inputs]) files.push(...(await names.dataFiles(input)));
    return convertFiles(files, output, options);
  });
}

/** Options of {@link inspect}. */
export interface InspectOptions extends HubNameOptions {
  /** Also count the tokens of a preference dataset with this model folder's (or Hub model's) tokenizer and chat template. */
  tokenizer?: string;
}

/** Schema, kind, rows and length statistics of a data file (`prefzoo inspect`). */
export async function inspect(file: string, options: InspectOptions = {}): Promise<InspectReport & { tokens?: TokenReport }> {
  const names = new JobNames(options, SILENT);
  file = (await names.dataFiles(file))[0];
  const report = await inspectFile(file);
  if (!options.tokenizer) return report;
  options = { ...options, tokenizer: await names.model('tokenizer', options.tokenizer, 'tokenizer') };
  if (!report.kind) throw new BadInputError(`${file}: a tokenizer counts tokens of preference data; this file is not preference data`, { file });
  const tokens = await withTempDir('prefzoo-inspect-', (dir) => tokenReport(file, options.tokenizer!, dir));
  return { ...report, tokens };
}

/** Options of {@link tokenize}. */
export interface TokenizeOptions extends Omit<TokenizeFileOptions, 'signal' | 'progress'>, Pick<JobOptions, 'signal' | 'progress'> {}

/** Adds model-ready token columns to canonical Parquet `input`, written to `output` (`prefzoo tokenize`). */
export function tokenize(input: string, output: string, options: TokenizeOptions): Promise<TokenizeSummary> {
  return guarded(options, (reporter) => tokenizeDataset(input, output, { ...options, progress: reporter.progress, signal: options.signal }));
}

// ─── models ───────────────────────────────────────────────────────────────────────────────────────

/** Options of {@link initModel}. */
export interface InitModelOptions {
  /** Folder to write (created if missing; model files in it are replaced). */
  output: string;
  /** Architecture (default: the preset's own, else llama). */
  arch?: Arch;
  /** Size (default tiny: under a million parameters). */
  preset?: Preset;
  /** A Hugging Face config.json (its path, or the parsed object) instead of arch/preset. */
  config?: string | Record<string, unknown>;
  /** The same seed writes the same weights (default 0). */
  seed?: number;
}

/** Writes a random-initialised model in Hugging Face layout with a generated tokenizer (`prefzoo init-model`). */
export function initModel(options: InitModelOptions): InitModelResult {
  const seed = options.seed ?? 0;
  if (!Number.isSafeInteger(seed) || seed < 0) throw new BadInputError(`seed must be a non-negative integer, got ${seed}`, { setting: 'seed' });
  if (options.config !== undefined) {
    if (options.arch !== undefined) throw new BadInputError('config and arch: give one (the config names its model_type)', { setting: 'arch' });
    const file = typeof options.config === 'string' ? options.config : 'config';
    let raw: unknown = options.config;
    if (typeof options.config === 'string') {
      try {
        raw = JSON.parse(readFileSync(options.config, 'utf8'));
      } catch (e) {
        throw new BadInputError(`${options.config}: cannot read a JSON config (${(e as Error).message.split('\n')[0]})`, { file: options.config });
      }
    }
    return initModelFromConfig(options.output, raw, file, seed);
  }
  const preset = options.preset ?? 'tiny';
  if (!PRESETS.includes(preset)) throw new BadInputError(`preset "${preset}" is not one of ${PRESETS.join(', ')}`, { setting: 'preset' });
  const arch = options.arch ?? presetArch(preset) ?? 'llama';
  if (!ARCHES.includes(arch)) throw new BadInputError(`arch "${arch}" is not one of ${ARCHES.join(', ')}`, { setting: 'arch' });
  return initModelFolder(options.output, arch, preset, seed);
}

// ─── training and evaluation ──────────────────────────────────────────────────────────────────────

/** Options of {@link train}: the model, data, loss and run folder, and settings by name. */
export interface TrainOptions extends Omit<TrainerOptions, 'reporter' | 'rows' | 'base' | 'hub'>, JobOptions, HubNameOptions {
  /** Settings and loss parameters by name; applied after `configFile` and `params`. */
  settings?: Settings;
}

/**
 * Fine-tunes `model` on `data` with a loss of the zoo or a mixture (`dpo`, `ipo`, `dpo:0.8,sft:0.2`,
 * `mpo`'s two stages), writing the run folder `out`: metrics.jsonl, checkpoints/, final/ (`prefzoo train`).
 */
export function train(options: TrainOptions): Promise<TrainResult> {
  return guarded(options, async (reporter) => {
    const names = new JobNames(options, reporter);
    const model = await names.model('model', options.model);
    const data = await names.data(options.data);
    const refModel = await names.model('ref', options.refModel);
    const adapter = await names.model('adapter', options.adapter, 'adapter');
    return trainAny({ ...options, model, data, refModel, adapter, hub: names.hub, params: paramsOf(options), reporter });
  });
}

/** Options of {@link evaluate}. */
export interface EvaluateOptions extends JobOptions, HubNameOptions {
  /** The policy: a model folder (HF layout, e.g. RUN/final). */
  model: ModelSource;
  /** The reference model, usually the starting model. */
  ref: ModelSource;
  /** Canonical Parquet (file, shards, folder, glob) or any file `convert` accepts. */
  data: string;
  /** Scales the implicit rewards (default 0.1). */
  beta?: number;
  /** Examples per forward pass (default 8). */
  batchSize?: number;
  /** Truncation of prompt + response (default 512 / 256 tokens, keeping the prompt's end). */
  truncation?: TruncationConfig;
  /** Evaluate the first N rows only. */
  maxRows?: number;
  /** Execution provider and threads (default: the CPU). */
  runtime?: RuntimeOptions;
  /** Tokenizer folder (default: the policy's, else the reference's). */
  tokenizer?: string;
}

/**
 * Implicit-reward metrics of a policy against a reference (`prefzoo eval`): pairwise accuracy and
 * margins, listwise NDCG / Kendall τ / top-1, single-trajectory ROC-AUC, overall and per source.
 */
export function evaluate(options: EvaluateOptions): Promise<EvalSummary> {
  return guarded(options, async (reporter) => {
    const names = new JobNames(options, reporter);
    const named = async (key: string, m: ModelSource): Promise<ModelSource> => (typeof m === 'string' ? names.model(key, m) : m);
    const policy = await named('model', options.model);
    const ref = await named('ref', options.ref);
    const data = await names.data(options.data);
    const tokenizer = await names.model('tokenizer', options.tokenizer, 'tokenizer');
    return withTempDir('prefzoo-eval-', (workDir) => {
      const o: EvalOptions = {
        policy,
        ref,
        data,
        tokenizer,
        workDir,
        params: options.beta !== undefined ? { beta: options.beta } : undefined,
        runtime: options.runtime,
        reporter,
        truncation: options.truncation,
        batchSize: options.batchSize,
        maxRows: options.maxRows,
      };
      return evaluateRows(o);
    });
  });
}

// ─── generation and online methods ───────────────────────────────────────────────────────────────

/**
 * Options of {@link generate}: sampling, count, seed. The sampling settings are `prefzoo generate`'s
 * (`max_completion_length` 64, `temperature` 1, `top_p` 1, `top_k` 0; docs/settings.md), given in
 * `settings` or under their older names `maxNewTokens`, `temperature`, `topK`, `topP`.
 */
export interface GenerateOptions extends SamplingOptions, Pick<JobOptions, 'signal'>, Pick<HubNameOptions, 'revision' | 'offline'> {
  /** Model folder (HF layout). */
  model: string;
  /** Prompts, or a file of them: .txt (one a line) or records with a "prompt" field. */
  prompts: string | readonly Text[];
  /** Tokens to generate at most per response (`max_completion_length`; default 64). */
  maxNewTokens?: number;
  /** Sampling settings by name, typed; applied after the older names. */
  settings?: Partial<GenerateSettings>;
  /** Responses per prompt (default 1). */
  n?: number;
  /** A sample depends only on (seed, prompt index, sample index) (default 0). */
  seed?: number;
  /** Sequences decoded together (default 32). */
  batchSize?: number;
  /** Also write the samples as Parquet here. */
  out?: string;
  runtime?: RuntimeOptions;
  /** A Jinja chat-template file used instead of the model's own. */
  chatTemplateFile?: string;
  /** Precision of the products (`--dtype`, default f32): q8/q4 block-quantize the weights (MatMulNBits, CPU only); f16 is refused. */
  dtype?: 'f32' | 'f16' | 'q8' | 'q4';
  /** Values per quantization block of q8/q4 (`--block-size`, default 32). */
  blockSize?: number;
}

/** Samples responses to prompts with a KV cache (`prefzoo generate`); prompt-major order. */
export async function generate(options: GenerateOptions): Promise<Sample[]> {
  return guarded(options, async () => {
    const sampling = generateSampling(options);
    const prompts = typeof options.prompts === 'string' ? await readPrompts(options.prompts) : options.prompts;
    options.signal?.throwIfAborted();
    const model = await new JobNames(options, SILENT).model('model', options.model);
    const quant = productQuant(options.dtype ?? 'f32', options.blockSize ?? 32, options.runtime?.ep ?? 'cpu', { dtype: 'dtype', block: 'blockSize' });
    const policy = await ModelSampler.load(model, options.runtime, options.chatTemplateFile, quant);
    try {
      options.signal?.throwIfAborted();
      const samples = await policy.sample(prompts, { ...sampling, n: options.n ?? 1, seed: options.seed ?? 0, batchSize: options.batchSize ?? 32 });
      if (options.out) writeSamples(options.out, samples);
      return samples;
    } finally {
      await policy.release();
    }
  });
}

/** The judge of an online method: `task`, `reward:DIR`, `cmd:COMMAND`, or your own {@link Judge}. */
export type JudgeSpec = string | Judge;


/** What the online methods share: prompts, a judge, sampling, settings. */
export interface OnlineOptions extends Omit<LoopOptions, 'reporter' | 'base' | 'hub'>, JobOptions, SamplingOptions, Pick<HubNameOptions, 'revision' | 'offline'> {
  /** Prompts, or a file of them (.txt, one a line, or records with a "prompt" field). */
  prompts: string | readonly Text[];
  /** Compares responses; a string is loaded on the run's device (and released) by the method. */
  judge: JudgeSpec;
  /** The longest response (the `max_completion_length` setting under its older name; default 64). */
  maxNewTokens?: number;
  settings?: Settings;
}

/** Options of {@link sppo}: T iterations of K samples per prompt. */
export interface SppoOptions extends OnlineOptions, Pick<SppoLoopOptions, 'iterations' | 'samples'> {}

/** SPPO iterations on the online loop (`prefzoo sppo`): sample K responses per prompt from π_t, estimate win-rates with the judge, train the sppo loss against π_t, with checkpoints every save_steps. */
export function sppo(options: SppoOptions): Promise<SppoResult> {
  return guarded(options, async (reporter) => {
    const prompts = typeof options.prompts === 'string' ? await readPrompts(options.prompts) : options.prompts;
    const names = new JobNames(options, reporter);
    const model = await names.model('model', options.model);
    return runSppo({ ...options, model, hub: names.hub, prompts, params: options.params, settings: options.settings, reporter });
  });
}

/** Options of {@link nashMd}. */
export interface NashMdOptions extends OnlineOptions {}

/** On-policy Nash-MD (`prefzoo nash-md`): each step samples from the policy and its mixture with the reference, judges, steps. */
export function nashMd(options: NashMdOptions): Promise<NashMdResult> {
  return guarded(options, async (reporter) => {
    const prompts = typeof options.prompts === 'string' ? await readPrompts(options.prompts) : options.prompts;
    const names = new JobNames(options, reporter);
    const model = await names.model('model', options.model);
    return runNashMd({ ...options, model, hub: names.hub, prompts, params: options.params, settings: options.settings, reporter } satisfies NashMdLoopOptions);
  });
}

/** Options of {@link distill}. */
export interface DistillOptions extends Omit<LoopOptions, 'reporter' | 'base' | 'hub'>, JobOptions, HubNameOptions {
  /** The teacher: a model folder or Hub name with the student's tokenizer. */
  teacher: string;
  /** AlignDistil: the DPO model `teacher`'s reference (folder or Hub name); the teacher's logits are z_ref + teacher_weight·(z_dpo − z_ref). */
  teacherRef?: string;
  /** Any data {@link train} reads: single rows, pairs (their chosen responses), conversations. */
  data: string;
  /** Continue the run in `out` from its newest checkpoint (the teacher cache is reused). */
  resume?: boolean;
  /** Replace the run already in `out`. */
  overwrite?: boolean;
  /** Settings, `distill_topk`, `lmbda` and the on-policy sampling settings, and gkd's `beta` / `temperature` by name; applied after `params`. */
  settings?: Settings;
  /** With lmbda > 0: called with each on-policy micro-batch (the step, its data rows, their prompt ids, the student's sampled ids; multi-turn: their masks). */
  onSamples?: RunDistillOptions['onSamples'];
  /** With lmbda > 0: tools, MCP servers or an environment make the on-policy micro-batches multi-turn rollouts (as {@link grpo}'s; docs/distill.md, Multi-turn). */
  tools?: AgentOptions['tools'];
  mcp?: AgentOptions['mcp'];
  mcpConfig?: AgentOptions['mcpConfig'];
  env?: AgentOptions['env'];
}

/**
 * Distillation (`prefzoo distill`): KD steps of the `gkd` loss on the student `model` against the
 * teacher's top-K log-probs — on the data's responses (computed once and cached in `out`), and with
 * `lmbda` > 0 on the student's own samples for the data's prompts (scored fresh each step; docs/distill.md).
 */
export function distill(options: DistillOptions): Promise<DistillResult> {
  return guarded(options, async (reporter) => {
    const names = new JobNames(options, reporter);
    const model = await names.model('model', options.model);
    const teacher = await names.model('teacher', options.teacher);
    const teacherRef = await names.model('teacherRef', options.teacherRef);
    const data = await names.data(options.data);
    const multiTurn = distillAgents({ tools: options.tools, mcp: options.mcp, mcpConfig: options.mcpConfig, env: options.env });
    return runDistill({ ...options, model, teacher, teacherRef, data, hub: names.hub, params: paramsOf(options), settings: undefined, reporter, multiTurn });
  });
}

/** Options of {@link rewardTrain}. */
export interface RewardTrainOptions extends Omit<LoopOptions, 'reporter' | 'base' | 'hub'>, JobOptions, HubNameOptions {
  /** Pairwise preference data (canonical Parquet or any file `convert` accepts). */
  data: string;
  settings?: Settings;
}

/** Trains a reward model (the LM plus a scalar head) with the Bradley–Terry loss (`prefzoo reward-train`). */
export function rewardTrain(options: RewardTrainOptions): Promise<RewardTrainResult> {
  return guarded(options, async (reporter) => {
    const names = new JobNames(options, reporter);
    const model = await names.model('model', options.model);
    const data = await names.data(options.data);
    return trainRewardModel({ ...options, model, data, hub: names.hub, params: options.params, settings: options.settings, reporter });
  });
}

/** Adds chosen_score/rejected_score from a reward model to pairwise data (`prefzoo reward-score`). */
export function rewardScore(options: { rewardModel: string; data: string; out: string; runtime?: RuntimeOptions }): Promise<ScorePairsResult> {
  return scoreWithRewardModel(options);
}

// ─── export ───────────────────────────────────────────────────────────────────────────────────────

export type { GgufDtype, OnnxDtype };

/** Options of {@link exportModel}. */
export interface ExportModelOptions {
  /** A Hugging Face model folder (a run's final/ included), or a PEFT adapter folder naming its base. */
  model: string;
  /** `onnx`: a folder transformers.js loads; `gguf`: one GGUF v3 file llama.cpp loads. */
  format: 'onnx' | 'gguf';
  /** onnx: the folder to write (replaced when complete); gguf: the .gguf file. */
  out: string;
  /** A PEFT LoRA adapter folder merged into `model` first. */
  adapter?: string;
  /** onnx: the weight types to write (default fp32). */
  onnxDtypes?: OnnxDtype[];
  /** gguf: the tensor type (default f32). */
  ggufDtype?: GgufDtype;
}

/** What {@link exportModel} wrote: the files (onnx) or the file's size (gguf). */
export interface ExportModelResult {
  format: 'onnx' | 'gguf';
  out: string;
  model_type: string;
  files?: string[];
  bytes?: number;
}

/** Writes a model for the apps (`prefzoo export`): transformers.js's ONNX folder or llama.cpp's GGUF file. */
export function exportModel(options: ExportModelOptions): ExportModelResult {
  const { model, format, out, adapter } = options;
  if (format !== 'onnx' && format !== 'gguf') throw new BadInputError(`format "${format}" is not one of onnx, gguf`, { setting: 'format' });
  const bad = options.onnxDtypes?.find((d) => !(d in ONNX_DTYPES));
  if (bad !== undefined) throw new BadInputError(`onnxDtypes: "${bad}" is not one of ${Object.keys(ONNX_DTYPES).join(', ')}`, { setting: 'dtype' });
  if (options.ggufDtype !== undefined && !GGUF_DTYPES.includes(options.ggufDtype)) throw new BadInputError(`ggufDtype: "${options.ggufDtype}" is not one of ${GGUF_DTYPES.join(', ')}`, { setting: 'dtype' });
  const src = readExportSource(model, adapter);
  if (format === 'onnx') return { format, out, model_type: src.config.model_type, files: exportOnnx(src, out, { dtypes: options.onnxDtypes }) };
  return { format, out, model_type: src.config.model_type, bytes: exportGguf(src, out, options.ggufDtype ?? 'f32') };
}

/** Options of {@link grpo}: a prompts file, reward specs and settings with TRL's GRPOConfig names. */
export interface GrpoOptions extends Omit<GrpoLoopOptions, 'reporter' | 'base' | 'params' | 'rewards' | 'settings' | 'hub'>, JobOptions, Pick<HubNameOptions, 'revision' | 'offline'> {
  /** Settings by name, typed: GRPO's own (`num_generations`, `temperature`, …), the trainer's and the loss's, checked as `--param` is. */
  settings?: Settings & Partial<GrpoSettings>;
  /**
   * Reward specs, in order (`reward_weights` follows it): the kinds of the reward registry, see
   * {@link RewardSpec}; any string is accepted too (a module's path computed at run time), checked when loaded.
   */
  rewards: readonly (RewardSpec | (string & {}))[];
  /** Settings as `key=value` strings, applied before `settings`. */
  params?: string[];
}

/**
 * GRPO and its descendants (`prefzoo grpo`): DAPO, Dr. GRPO, GSPO, CISPO and RLOO by `loss_type`,
 * `importance_sampling_level` and `advantage`; groups of `num_generations` completions per prompt,
 * scored by `rewards` (the reward registry's kinds: {@link RewardSpec}). With `teacher` (a model
 * folder or Hub name with the policy's tokenizer), teacher-guided RL: the loss adds
 * `distill_coef` × the per-token KL to the teacher (docs/distill.md).
 */
export function grpo(options: GrpoOptions): Promise<GrpoResult> {
  return guarded(options, async (reporter) => {
    const names = new JobNames(options, reporter);
    const model = await names.model('model', options.model);
    const teacher = await names.model('teacher', options.teacher);
    const teacherRef = await names.model('teacherRef', options.teacherRef);
    return runGrpo({ ...options, model, teacher, teacherRef, hub: names.hub, params: options.params, settings: options.settings, reporter });
  });
}

// ─── serving ─────────────────────────────────────────────────────────────────────────────────────

export { ServeEngine, type EngineRequest, type ChoiceResult, type DrawnToken, type TopToken, type Sampling as ServeSampling } from './serve/engine.ts';
export { startServer, choiceRandom, DEFAULT_LIMITS, type ServerOptions, type ServerLimits, type RunningServer, type Rollout, type RolloutCall, type RolloutSampling } from './serve/http.ts';
export { Decoder };

/** Options of {@link serve} (`prefzoo serve`'s flags). */
export interface ServeOptions extends Pick<HubNameOptions, 'revision' | 'offline'> {
  /** Model folder or Hub name. */
  model: string;
  /** A PEFT LoRA adapter folder (or Hub name) merged into the model. */
  adapter?: string;
  runtime?: RuntimeOptions;
  /** Default 127.0.0.1; any other needs `apiKey`. */
  host?: string;
  /** Default 8080; 0 picks a free port. */
  port?: number;
  apiKey?: string;
  /** The model's name in requests (default: `model` as given). */
  servedModelName?: string;
  chatTemplateFile?: string;
  limits?: Partial<ServerLimits>;
  /** Rows decoded together in one step (default 32). */
  maxBatch?: number;
}

/**
 * Serves a model over OpenAI's API (`prefzoo serve`; docs/serve.md); resolves once listening.
 * `close()` stops the server (requests in flight finish) and frees the model.
 */
export async function serve(options: ServeOptions): Promise<RunningServer> {
  const names = new JobNames(options, SILENT);
  const model = await names.model('model', options.model);
  const adapter = await names.model('adapter', options.adapter, 'adapter');
  const src = readExportSource(model, adapter);
  const tok = loadTokenizer(src.dir, { chatTemplateFile: options.chatTemplateFile });
  const decoder = await Decoder.create(src.config, src.weights, { runtime: { ...SERVE_RUNTIME, ...options.runtime }, bake: true });
  const engine = new ServeEngine(decoder, tok, { maxBatch: options.maxBatch });
  try {
    const server = await startServer({ engine, model: options.servedModelName ?? options.model, host: options.host, port: options.port, apiKey: options.apiKey, limits: options.limits });
    return {
      url: server.url,
      async close(o) {
        await server.close(o);
        await engine.close();
        await decoder.release();
      },
    };
  } catch (e) {
    await engine.close();
    await decoder.release();
    throw e;
  }
}
