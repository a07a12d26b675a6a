/** `prefzoo bench`: flags and the printed table; the measuring code is in scripts/bench/ (step.ts, decode-bench.ts, rollout-bench.ts, serve-bench.ts, distill-bench.ts). */
import { existsSync } from 'node:fs';
import type { Command } from 'commander';
import { productQuant } from '../../models/quantize.ts';
import { UserError } from '../../errors.ts';
import { Progress } from '../progress.ts';
import type { OptLevel } from '../../runtime/session.ts';
import type { BenchOptions } from '../../../scripts/bench/step.ts';
import { ARCHES, type Arch, PRESETS, type Preset } from '../../models/config.ts';
import { DEVICE_HELP, device, positiveInt } from '../flags.ts';
import { coerceSetting, TRAIN_SETTINGS } from '../../train/settings.ts';
import type { TrainConfig } from '../../train/config.ts';

/** Refuses, in one line, the first of `flags` given that the `mode` benchmark does not use. */
function refuseUnused(mode: string, flags: Record<string, unknown>): void {
  const bad = Object.entries(flags).find(([, v]) => v !== undefined);
  if (bad) throw new UserError(`${bad[0]}: ${mode} does not use it`);
}

export function register(program: Command): void {
  program
    .command('bench')
    .description('time DPO training steps (forward, backward, AdamW) of the init-model llama through the training artifacts, and the MatMul peak of this machine; --generate, --rollout, --serve and --distill time generation, a GRPO round, the OpenAI-compatible server and an on-policy distillation step instead')
    .option('--preset <preset>', `model: tiny, small (the init-model llama; 56M parameters, vocabulary 32000) or a released shape with random weights: ${PRESETS.slice(2).join(', ')}`, 'small')
    .option('--lora [rank]', 'train LoRA adapters (alpha = 2·rank) on every projection instead of every weight (rank default 16); with --rollout: the policy is base + such adapters, the base frozen (a LoRA run\'s rollouts)')
    .option('--gradient-checkpointing', "recompute each layer's activations in the backward (train's gradient_checkpointing=true)")
    .option('--base-dtype <dtype>', `with --lora: hold the frozen base weights in ${TRAIN_SETTINGS.base_dtype.choices.join(' or ')} (train's base_dtype)`, TRAIN_SETTINGS.base_dtype.default)
    .option('--load-in-4bit [block]', "with --lora: hold the frozen projection weights in 4-bit blocks of this many values (train's load_in_4bit=true, quant_block_size; default 64)")
    .option('--steps <n>', 'timed steps, after the warm-up (default 5)')
    .option('--warmup <n>', "untimed steps first (default 5: ONNX Runtime's memory arena and the allocator settle over the first runs)")
    .option('--pairs <n>', 'preference pairs per batch (default 4)')
    .option('--seq <n>', 'tokens per sequence, half prompt and half completion (default 256)')
    .option('--device <device>', `${DEVICE_HELP}; on a device the JSON also says where each graph's nodes run`, 'cpu')
    .option('--compute-dtype <dtype>', `${TRAIN_SETTINGS.compute_dtype.choices.join(' or ')}: ${TRAIN_SETTINGS.compute_dtype.doc} (train's compute_dtype)`, TRAIN_SETTINGS.compute_dtype.default)
    .option('--threads <n>', 'intra-op threads (default: one per core; with --serve, 2)')
    .option('--opt-level <level>', 'graph optimisation level: disabled, basic, extended or all (default extended)')
    .option('--no-peak', 'skip the MatMul peak measurement')
    .option('--no-share-prompt', "one sequence per response, each computing its prompt (the trainer's share_prompt=false)")
    .option('--update <where>', 'where the AdamW update runs: host (in place, in this process), graph (in the fused step graph) or auto (default: host on the CPU)')
    .option('--generate', 'time generation instead: prefill, then KV-cache decoding with multinomial sampling and the weights fed live (as the online loops sample)')
    .option('--arch <arch>', `with --generate: ${ARCHES.join(', ')} (default: the preset's own, llama for tiny and small)`)
    .option('--batch <n>', 'with --generate: sequences decoded together (default 8); with --rollout: rows decoded together at most (default 32)')
    .option('--prompt <n>', 'with --generate: prompt tokens per sequence (default 32; --rollout: 160)')
    .option('--new <n>', 'with --generate: new tokens per sequence (default 64); with --rollout: the largest token budget, each row\'s drawn between an eighth of it and it (default 128)')
    .option('--runs <n>', 'with --generate: timed generations, the median counts (default 3); with --rollout and --serve: rounds each way (default 1)')
    .option('--baked', 'with --generate: bake the weights into the graphs (as prefzoo generate) instead of feeding them')
    .option('--dtype <dtype>', 'with --generate and --rollout: precision of the products, f32 or q8/q4 (the fed weights block-quantized, MatMulNBits; CPU only) (default f32)')
    .option('--unfused', "with --generate: the decode graphs without ONNX Runtime's fused ops (SkipSimplifiedLayerNormalization, RotaryEmbedding), which are the CPU default; the JSON's nodes_per_step counts either")
    .option('--block-size <n>', 'with --generate --dtype q8/q4: values per quantization block (default 32)')
    .option('--rollout', 'time a GRPO-shaped generation round instead, with and without shared prompts and continuous batching (scripts/bench/rollout-bench.ts)')
    .option('--prompts <n>', 'with --rollout: prompts in the round (default 8)')
    .option('--generations <n>', "with --rollout: samples per prompt (GRPO's num_generations; default 8)")
    .option('--serve', 'time `prefzoo serve` instead: --clients streamed chat requests with a tool from the openai SDK, one after another and all at once (scripts/bench/serve-bench.ts)')
    .option('--clients <n>', 'with --serve: requests, and clients at once (default 16)')
    .option('--max-tokens <n>', "with --serve: each request's max_tokens (default 64)")
    .option('--model <dir>', 'with --serve: a model folder instead of --preset (made with init-model, seed 0)')
    .option('--peer <engine>', 'with --serve: also time llama.cpp (node-llama-cpp, a dev dependency) on the same model exported to GGUF: llama.cpp')
    .option('--distill', "time an on-policy distillation step instead (scripts/bench/distill-bench.ts): the student's sampling, the teacher's top-K scoring (a teacher of about 4× the --preset's parameters) and the update, and the top-K cache's bytes per token")
    .option('--rows <n>', 'with --distill: prompts per step (batch_size; default 8)')
    .option('--topk <n>', 'with --distill: K of the teacher\'s top K (distill_topk; default 32)')
    .option('--teacher-dtype <list>', "with --distill: the teacher's precisions (teacher_dtype: f32, q8, q4), comma-separated, each timed by its own run on the same models, and each after the first compared with the first's top K (default f32)")
    .option('--json', 'print one JSON line')
    .action(async (o: { distill?: boolean; rows?: string; topk?: string; teacherDtype?: string; serve?: boolean; clients?: string; maxTokens?: string; model?: string; peer?: string; rollout?: boolean; prompts?: string; generations?: string; generate?: boolean; arch?: string; batch?: string; prompt?: string; new?: string; runs?: string; baked?: boolean; unfused?: boolean; dtype?: string; blockSize?: string; preset: string; lora?: string | boolean; gradientCheckpointing?: boolean; baseDtype: string; loadIn4bit?: string | boolean; steps?: string; warmup?: string; pairs?: string; seq?: string; threads?: string; optLevel?: string; peak: boolean; sharePrompt: boolean; update?: string; json?: boolean; device: string; computeDtype: string }) => {
      // The dtype flags are train's settings of the same names: checked against their rows of the table.
      const computeDtype = coerceSetting('compute_dtype', TRAIN_SETTINGS.compute_dtype, o.computeDtype, '--compute-dtype') as TrainConfig['compute_dtype'];
      const baseDtype = coerceSetting('base_dtype', TRAIN_SETTINGS.base_dtype, o.baseDtype, '--base-dtype') as TrainConfig['base_dtype'];
      if (o.computeDtype === 'float16' && o.device === 'cpu') throw new UserError('--compute-dtype float16 is for the GPU (--device webgpu or cuda)');
      if (!(PRESETS as readonly string[]).includes(o.preset)) throw new UserError(`--preset: "${o.preset}" is not one of ${PRESETS.join(', ')}`);
      if (o.distill) {
        const other = { '--serve': o.serve, '--rollout': o.rollout, '--generate': o.generate, '--arch': o.arch, '--baked': o.baked, '--unfused': o.unfused, '--dtype': o.dtype, '--block-size': o.blockSize, '--batch': o.batch, '--runs': o.runs, '--prompts': o.prompts, '--generations': o.generations, '--clients': o.clients, '--max-tokens': o.maxTokens, '--model': o.model, '--peer': o.peer, '--lora': o.lora, '--gradient-checkpointing': o.gradientCheckpointing, '--load-in-4bit': o.loadIn4bit, '--pairs': o.pairs, '--seq': o.seq, '--update': o.update, '--opt-level': o.optLevel, '--no-share-prompt': o.sharePrompt === false ? true : undefined };
        refuseUnused('--distill', other);
        if (o.device !== 'cpu') throw new UserError('--device: --distill times the CPU (distill runs on the CPU only)');
        if (o.computeDtype !== 'float32') throw new UserError('--compute-dtype: --distill trains in float32');
        const { formatDistillBench, runDistillBench } = await import('../../../scripts/bench/distill-bench.ts');
        const r = await runDistillBench({
          preset: o.preset as Preset,
          rows: positiveInt('--rows', o.rows, 8),
          prompt: positiveInt('--prompt', o.prompt, 32),
          newTokens: positiveInt('--new', o.new, 64),
          steps: positiveInt('--steps', o.steps, 2),
          warmup: positiveInt('--warmup', o.warmup, 1),
          topk: positiveInt('--topk', o.topk, 32),
          threads: o.threads === undefined ? undefined : positiveInt('--threads', o.threads, 1),
          teacherDtypes: teacherDtypes(o.teacherDtype),
          log: (line) => process.stderr.write(`bench: ${line}\n`),
        });
        process.stdout.write(o.json ? JSON.stringify(r) + '\n' : formatDistillBench(r));
        return;
      }
      for (const [flag, v] of [['--rows', o.rows], ['--topk', o.topk], ['--teacher-dtype', o.teacherDtype]] as const) if (v !== undefined) throw new UserError(`${flag} is a --distill setting`);
      const serveOnly = { '--clients': o.clients, '--max-tokens': o.maxTokens, '--model': o.model, '--peer': o.peer };
      if (o.serve) {
        const other = { '--rollout': o.rollout, '--generate': o.generate, '--arch': o.arch, '--baked': o.baked, '--unfused': o.unfused, '--dtype': o.dtype, '--block-size': o.blockSize, '--batch': o.batch, '--prompt': o.prompt, '--new': o.new, '--prompts': o.prompts, '--generations': o.generations, '--lora': o.lora, '--gradient-checkpointing': o.gradientCheckpointing, '--load-in-4bit': o.loadIn4bit, '--steps': o.steps, '--warmup': o.warmup, '--pairs': o.pairs, '--seq': o.seq, '--update': o.update, '--opt-level': o.optLevel, '--no-share-prompt': o.sharePrompt === false ? true : undefined };
        refuseUnused('--serve', other);
        if (o.device !== 'cpu') throw new UserError('--device: --serve times the CPU server (prefzoo serve --device webgpu is not benchmarked here)');
        if (o.computeDtype !== 'float32') throw new UserError('--compute-dtype: --serve decodes in float32');
        if (o.peer !== undefined && o.peer !== 'llama.cpp') throw new UserError(`--peer: "${o.peer}" is not llama.cpp (the one peer --serve runs)`);
        if (o.model !== undefined && !existsSync(o.model)) throw new UserError(`--model ${o.model}: no such folder`);
        const { formatServeBench, runServeBench } = await import('../../../scripts/bench/serve-bench.ts');
        const r = await runServeBench({
          model: o.model,
          preset: o.preset as Preset,
          clients: positiveInt('--clients', o.clients, 16),
          maxTokens: positiveInt('--max-tokens', o.maxTokens, 64),
          threads: positiveInt('--threads', o.threads, 2),
          runs: positiveInt('--runs', o.runs, 1),
          peer: o.peer as 'llama.cpp' | undefined,
          log: (line) => process.stderr.write(`bench: ${line}\n`),
        });
        process.stdout.write(o.json ? JSON.stringify(r) + '\n' : formatServeBench(r));
        return;
      }
      const serveFlag = Object.entries(serveOnly).find(([, v]) => v !== undefined);
      if (serveFlag) throw new UserError(`${serveFlag[0]} is a --serve setting`);
      if (o.rollout) {
        if (o.generate) throw new UserError('--rollout and --generate are two benchmarks: choose one');
        const other = { '--arch': o.arch, '--baked': o.baked, '--unfused': o.unfused, '--gradient-checkpointing': o.gradientCheckpointing, '--load-in-4bit': o.loadIn4bit, '--steps': o.steps, '--warmup': o.warmup, '--pairs': o.pairs, '--seq': o.seq, '--update': o.update, '--opt-level': o.optLevel };
        refuseUnused('--rollout', other);
        if (o.computeDtype !== 'float32') throw new UserError('--compute-dtype: --rollout decodes in float32 (--dtype q8/q4 quantizes its weights)');
        const quant = productQuant(o.dtype ?? 'f32', positiveInt('--block-size', o.blockSize, 32), device(o.device), { dtype: '--dtype', block: '--block-size' });
        const { formatRolloutBench, runRolloutBench } = await import('../../../scripts/bench/rollout-bench.ts');
        const r = await runRolloutBench({
          preset: o.preset as Preset,
          prompts: positiveInt('--prompts', o.prompts, 8),
          generations: positiveInt('--generations', o.generations, 8),
          prompt: positiveInt('--prompt', o.prompt, 160),
          newTokens: positiveInt('--new', o.new, 128),
          batch: positiveInt('--batch', o.batch, 32),
          runs: positiveInt('--runs', o.runs, 1),
          quant,
          lora: o.lora === undefined || o.lora === false ? 0 : o.lora === true ? 16 : positiveInt('--lora', o.lora, 16),
          runtime: { ep: device(o.device), threads: o.threads === undefined ? undefined : positiveInt('--threads', o.threads, 1) },
          log: (line) => process.stderr.write(`bench: ${line}\n`),
        });
        process.stdout.write(o.json ? JSON.stringify(r) + '\n' : formatRolloutBench(r));
        return;
      }
      for (const [flag, v] of [['--prompts', o.prompts], ['--generations', o.generations]] as const) if (v !== undefined) throw new UserError(`${flag} is a --rollout setting`);
      const generateOnly = { '--arch': o.arch, '--batch': o.batch, '--prompt': o.prompt, '--new': o.new, '--runs': o.runs, '--baked': o.baked, '--unfused': o.unfused, '--dtype': o.dtype, '--block-size': o.blockSize };
      if (!o.generate) {
        const bad = Object.entries(generateOnly).find(([, v]) => v !== undefined);
        if (bad) throw new UserError(`${bad[0]} is a --generate setting`);
      } else {
        if (o.arch !== undefined && !(ARCHES as readonly string[]).includes(o.arch)) throw new UserError(`--arch: "${o.arch}" is not one of ${ARCHES.join(', ')}`);
        const training = { '--lora': o.lora, '--gradient-checkpointing': o.gradientCheckpointing, '--load-in-4bit': o.loadIn4bit, '--steps': o.steps, '--warmup': o.warmup, '--pairs': o.pairs, '--seq': o.seq, '--update': o.update, '--no-share-prompt': o.sharePrompt === false ? true : undefined };
        const bad = Object.entries(training).find(([, v]) => v !== undefined && v !== false);
        if (bad) throw new UserError(`${bad[0]} is a training-step setting; --generate does not use it`);
        if (o.computeDtype !== 'float32') throw new UserError('--compute-dtype: --generate decodes in float32');
        if (o.optLevel !== undefined) throw new UserError('--opt-level: --generate uses the decode sessions\' own level');
        const quant = productQuant(o.dtype ?? 'f32', positiveInt('--block-size', o.blockSize, 32), device(o.device), { dtype: '--dtype', block: '--block-size' });
        if (quant && o.baked) throw new UserError('--baked: --dtype q8/q4 bakes its quantized weights itself; leave --baked out');
        // Imported here, as the training bench below: a process that times generation does not hold the training code (its peak RSS is compared with PyTorch's).
        const { formatGenerateBench, runGenerateBench } = await import('../../../scripts/bench/decode-bench.ts');
        const r = await runGenerateBench({
          arch: o.arch as Arch | undefined,
          preset: o.preset as Preset,
          batch: positiveInt('--batch', o.batch, 8),
          prompt: positiveInt('--prompt', o.prompt, 32),
          newTokens: positiveInt('--new', o.new, 64),
          runs: positiveInt('--runs', o.runs, 3),
          baked: o.baked ?? false,
          quant,
          fused: o.unfused ? false : undefined,
          runtime: { ep: device(o.device), threads: o.threads === undefined ? undefined : positiveInt('--threads', o.threads, 1) },
          skipPeak: !o.peak,
          log: (line) => process.stderr.write(`bench: ${line}\n`),
        });
        process.stdout.write(o.json ? JSON.stringify(r) + '\n' : formatGenerateBench(r));
        return;
      }
      const loraRank = o.lora === undefined || o.lora === false ? 0 : o.lora === true ? 16 : positiveInt('--lora', o.lora, 16);
      if (o.baseDtype === 'float16' && !loraRank) throw new UserError('--base-dtype float16 needs --lora (only frozen weights can be held in float16)');
      const quantBlock = o.loadIn4bit === undefined || o.loadIn4bit === false ? 0 : o.loadIn4bit === true ? TRAIN_SETTINGS.quant_block_size.default : positiveInt('--load-in-4bit', o.loadIn4bit, 64);
      if (quantBlock && !loraRank) throw new UserError('--load-in-4bit needs --lora (only frozen weights can be held in 4 bits)');
      if (quantBlock && o.device !== 'cpu') throw new UserError(`--load-in-4bit runs on the CPU only (as train's load_in_4bit); leave --device ${o.device} out`);
      const levels = ['disabled', 'basic', 'extended', 'all'];
      if (o.optLevel !== undefined && !levels.includes(o.optLevel)) throw new UserError(`--opt-level: "${o.optLevel}" is not one of ${levels.join(', ')}`);
      if (o.update !== undefined && !['auto', 'graph', 'host'].includes(o.update)) throw new UserError(`--update: "${o.update}" is not one of auto, graph, host`);
      const seqLen = positiveInt('--seq', o.seq, 256);
      if (seqLen < 4 || seqLen % 2) throw new UserError(`--seq must be an even number ≥ 4, got ${seqLen}`);
      const { runBench } = await import('../../../scripts/bench/step.ts');
      const r = await runBench({
        preset: o.preset as Preset,
        loraRank,
        gradientCheckpointing: o.gradientCheckpointing ?? false,
        baseDtype,
        quantBlock: quantBlock || undefined,
        steps: positiveInt('--steps', o.steps, 5),
        warmup: o.warmup === '0' ? 0 : positiveInt('--warmup', o.warmup, 5),
        pairs: positiveInt('--pairs', o.pairs, 4),
        seqLen,
        runtime: { ep: device(o.device), threads: o.threads === undefined ? undefined : positiveInt('--threads', o.threads, 1), optLevel: o.optLevel as OptLevel | undefined },
        skipPeak: !o.peak,
        sharePrompt: o.sharePrompt,
        update: o.update as BenchOptions['update'],
        computeDtype,
        progress: (label, total) => new Progress(label, total, { plainEverySeconds: 0 }),
        log: (line) => process.stderr.write(`bench: ${line}\n`),
      });
      if (o.json) {
        process.stdout.write(JSON.stringify(r) + '\n');
        return;
      }
      const lines: [string, string][] = [
        ['device', r.placement ? `${r.device}: ${Object.entries(r.placement).map(([g, p]) => `${g} ${p.cpu_fallbacks} CPU fallbacks`).join(', ')}` : r.device],
        ['model', `${r.arch} ${r.preset}, ${r.params.toLocaleString('en-US')} parameters (${r.matmul_params.toLocaleString('en-US')} in matmuls)`],
        ['training', `${r.lora_rank ? `LoRA r=${r.lora_rank} on every projection, base ${r.base_dtype}${r.quant_block ? `, projections in 4 bits (blocks of ${r.quant_block})` : ''}` : 'every weight'} (${r.trainable_params.toLocaleString('en-US')} trainable)${r.gradient_checkpointing ? ', activations recomputed' : ''}`],
        ['batch', `${r.tokens_per_step} tokens per step (${r.share_prompt ? `prompts shared: ${r.computed_tokens_per_step} computed` : 'one sequence per response'})`],
        ['optimizer_update', r.optimizer_update === 'host' ? 'host (AdamW in place, in this process)' : 'graph (AdamW inside the step graph)'],
        ['tokens_per_s', String(r.tokens_per_s)],
        ['seconds_per_step', `${r.seconds_per_step} (median of ${r.step_seconds.join(', ')})`],
        ['model_gflop_per_step', String(r.model_gflop_per_step)],
        ['achieved_gflops', String(r.achieved_gflops)],
        ['matmul_peak_gflops', String(r.matmul_peak_gflops ?? 'not measured')],
        ['mfu', r.mfu === null ? 'n/a' : `${(r.mfu * 100).toFixed(1)} % (model FLOPs)`],
        ['executed_gflop_per_step', `${r.executed_gflop_per_step} (prompt-only head rows${r.share_prompt ? ' and repeated prompts' : ''} skipped)`],
        ['hfu', r.hfu === null ? 'n/a' : `${(r.hfu * 100).toFixed(1)} % (executed FLOPs)`],
        ['eval_tokens_per_s', String(r.eval_tokens_per_s)],
        ['peak_rss_mb', String(r.peak_rss_mb)],
        ['malloc_mmap_threshold', r.malloc_mmap_threshold === null ? "none (glibc's adaptive default)" : `${r.malloc_mmap_threshold} bytes`],
        ['cpu_seconds_per_step', String(r.cpu_seconds_per_step)],
        ['load_average', `${r.load_average} (other work on the machine slows every figure)`],
      ];
      const w = Math.max(...lines.map(([k]) => k.length));
      process.stdout.write(lines.map(([k, v]) => `${k.padEnd(w)}  ${v}`).join('\n') + '\n');
    });
}

/** --teacher-dtype's list, each checked as distill's teacher_dtype is (f16 and unknown names refused in one line). */
function teacherDtypes(list: string | undefined): string[] | undefined {
  if (list === undefined) return undefined;
  const dtypes = list.split(',').map((d) => d.trim());
  for (const d of dtypes) productQuant(d, 32, 'cpu', { dtype: '--teacher-dtype', block: 'teacher_block_size' });
  return dtypes;
}
