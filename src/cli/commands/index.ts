import type { Command } from 'commander';

/**
 * Every `prefzoo` subcommand, as a light manifest: the name, the one-line summary `prefzoo --help`
 * lists, and the module that registers it (flags, long description, action). A module is imported only
 * when its command runs or shows its own --help, so `prefzoo --help` loads none of ONNX Runtime, Arrow
 * or the model code. A new command is one line here plus its module exporting `register(program)`.
 */
export interface CommandEntry {
  name: string;
  summary: string;
  load: () => Promise<{ register(program: Command): void }>;
}

export const COMMANDS: readonly CommandEntry[] = [
  { name: 'convert', summary: 'convert preference data (JSON, JSONL, CSV/TSV, Parquet, Arrow; .gz too) to canonical Parquet', load: () => import('./convert.ts') },
  { name: 'gradcheck', summary: 'check every autodiff rule against central finite differences in float64', load: () => import('./gradcheck.ts') },
  { name: 'inspect', summary: 'show a data file: schema, kind, rows, length statistics of its text fields', load: () => import('./inspect.ts') },
  { name: 'init-model', summary: 'write a random-initialised model in Hugging Face layout for demos, tests and benchmarks', load: () => import('./init-model.ts') },
  { name: 'logps', summary: 'score sequences: summed log-probabilities of the masked tokens of each input line', load: () => import('./logps.ts') },
  { name: 'report', summary: 'write RUN/report.html: loss, accuracy and margin curves, final eval, config', load: () => import('./report.ts') },
  { name: 'train', summary: 'fine-tune a model on preference data with a loss from the zoo', load: () => import('./train.ts') },
  { name: 'eval', summary: 'implicit-reward metrics of a policy against a reference (accuracy, margins, NDCG, ROC-AUC, per source)', load: () => import('./eval.ts') },
  { name: 'demo', summary: 'the main job end to end on a built-in task and a tiny llama; prints accuracy before and after', load: () => import('./demo.ts') },
  { name: 'tokenize', summary: "add model-ready token columns to a canonical dataset with the model's tokenizer and chat template", load: () => import('./tokenize.ts') },
  { name: 'loss', summary: 'evaluate a loss of the zoo (or a mixture) on a batch of per-sequence statistics', load: () => import('./loss.ts') },
  { name: 'bench', summary: 'time training steps of the init-model llama, and the MatMul peak of this machine', load: () => import('./bench.ts') },
  { name: 'serve', summary: 'an OpenAI-compatible HTTP server (chat with tools, completions, streaming) on the generation session', load: () => import('./serve.ts') },
  { name: 'generate', summary: 'sample responses to prompts with a KV cache (seeded) and write them as Parquet', load: () => import('./generate.ts') },
  { name: 'sppo', summary: 'SPPO iterations: sample, judge win-rates against the current policy, train the sppo loss', load: () => import('./sppo.ts') },
  { name: 'distill', summary: "offline distillation: a teacher's cached top-K log-probs, then KD steps (gkd) on the student", load: () => import('./distill.ts') },
  { name: 'nash-md', summary: 'on-policy Nash-MD: sample from the policy and its mixture with the reference, judge, step', load: () => import('./nash-md.ts') },
  { name: 'reward-train', summary: 'train a reward model (the LM plus a scalar head) on preference pairs (Bradley–Terry)', load: () => import('./reward-train.ts') },
  { name: 'reward-score', summary: 'add chosen_score/rejected_score from a reward model to pairwise data', load: () => import('./reward-train.ts') },
  { name: 'doctor', summary: 'which devices can run models here (cpu, webgpu, cuda); what is missing and how to get it', load: () => import('./doctor.ts') },
  { name: 'artifacts', summary: 'write the training artifacts of a model and a loss (graphs, starting checkpoint, artifacts.json)', load: () => import('./artifacts.ts') },
  { name: 'export', summary: 'write a model for the apps: a transformers.js ONNX folder or a llama.cpp GGUF file', load: () => import('./export.ts') },
  { name: 'grpo', summary: 'GRPO / DAPO / Dr. GRPO / GSPO / CISPO / RLOO with reward functions (accuracy, format, modules, commands)', load: () => import('./grpo.ts') },
];
