import { describe, it, expect, vi } from 'vitest';
import { benchPairs, stepFlops } from '../scripts/bench/step.ts';
import { countParameters, presetConfig, type LlamaConfig } from '../src/models/config.ts';
import { decodeStepFlops, matmulParams } from '../scripts/bench/decode-bench.ts';
import { prefzoo } from './helpers/cli.ts';
import { buildProgram } from '../src/cli/main.ts';
import { UserError } from '../src/errors.ts';
import { int8ExactHere } from '../src/models/quantize-int8.ts';

/**
 * Each of `cases` (bench's flags) is refused: exit code 1 and one line on stderr (starting `prefzoo: --`
 * when `flagFirst`). The first case runs the command line; the others run the same program in this
 * process, where the refusal must be what src/cli/main.ts prints as that one line and exit code 1 — a
 * UserError of one line (a commander usage error would print more) — with nothing else on stderr.
 */
async function refused(cases: string[][], flagFirst: boolean): Promise<void> {
  const [first, ...rest] = cases;
  const r = await prefzoo('bench', ...first);
  expect(r.code, first.join(' ')).toBe(1);
  expect(r.stderr.trim().split('\n'), first.join(' ')).toHaveLength(1);
  if (flagFirst) expect(r.stderr).toMatch(/^prefzoo: --/);
  for (const args of rest) {
    // A program per case: commander keeps a parse's option values on its commands.
    const program = await buildProgram(['bench']);
    const stderr = vi.spyOn(process.stderr, 'write');
    try {
      const e = await program.parseAsync(['node', 'prefzoo', 'bench', ...args]).then(() => null, (x: unknown) => x);
      expect(e, args.join(' ')).toBeInstanceOf(UserError);
      expect((e as Error).message, args.join(' ')).not.toContain('\n');
      if (flagFirst) expect(`prefzoo: ${(e as Error).message}`, args.join(' ')).toMatch(/^prefzoo: --/);
      expect(stderr, args.join(' ')).not.toHaveBeenCalled();
    } finally {
      stderr.mockRestore();
    }
  }
}

describe('bench FLOP count', () => {
  it('is 6·N per token over the matmul weights plus dense attention, for the small llama', () => {
    const c = presetConfig('llama', 'small') as LlamaConfig;
    // Counted by hand from the preset: per layer q, o (512×512), k, v (512×256), gate, up, down (512×1376),
    // two RMSNorm scales; the final norm; the untied head (32000×512). The embedding table is a gather.
    const layer = 2 * 512 * 512 + 2 * 512 * 256 + 3 * 512 * 1376 + 2 * 512;
    const N = 8 * layer + 512 + 32000 * 512;
    expect(N).toBe(39_592_448);
    const attention = 12 * 8 * 8 * 64 * 256;
    const { flops, matmulParams } = stepFlops(c, 2048, 256);
    expect(matmulParams).toBe(N);
    expect(flops).toBe(2048 * (6 * N + attention));
    expect(flops / 1e9).toBeCloseTo(512.3, 1);
  });

  it('counts a tied head once, through the embedding table', () => {
    const c = presetConfig('llama', 'tiny', { vocabSize: 512 }) as LlamaConfig;
    expect(c.tie_word_embeddings).toBe(true);
    const layer = 2 * 64 * 64 + 2 * 64 * 32 + 3 * 64 * 172 + 2 * 64;
    expect(stepFlops(c, 100, 10).matmulParams).toBe(2 * layer + 64 + 512 * 64);
  });
});

describe('bench batch', () => {
  it('is seeded pairs: half prompt, two completions of the rest, ids clear of the special tokens', () => {
    const a = benchPairs(1000, 4, 256);
    expect(a).toHaveLength(4);
    for (const r of a) {
      expect(r.promptIds).toHaveLength(128);
      expect(r.responseIds.map((x) => x.length)).toEqual([128, 128]);
      for (const id of [...r.promptIds, ...r.responseIds.flat()]) expect(id >= 16 && id < 1000 && Number.isInteger(id)).toBe(true);
    }
    expect(benchPairs(1000, 4, 256)).toEqual(a);
    expect(benchPairs(1000, 4, 256, 2)).not.toEqual(a);
  });
});

describe('prefzoo bench', () => {
  it('prints one JSON line with the figures of the issue', async () => {
    const r = await prefzoo('bench', '--preset', 'tiny', '--steps', '2', '--warmup', '1', '--no-peak', '--json');
    expect(r.code, r.stderr).toBe(0);
    const lines = r.stdout.trim().split('\n');
    expect(lines).toHaveLength(1);
    const j = JSON.parse(lines[0]);
    for (const k of ['tokens_per_s', 'seconds_per_step', 'model_gflop_per_step', 'achieved_gflops', 'eval_tokens_per_s', 'peak_rss_mb', 'cpu_seconds_per_step']) {
      expect(j[k], k).toBeGreaterThan(0);
    }
    expect(j.tokens_per_step).toBe(2048);
    expect(j.step_seconds).toHaveLength(2);
    // seconds_per_step is rounded to milliseconds, tokens_per_s is not.
    expect(Math.abs(j.tokens_per_s * j.seconds_per_step - 2048) / 2048).toBeLessThan(0.03);
    expect(j.matmul_peak_gflops).toBeNull();
    expect(j.mfu).toBeNull();
    expect(r.stderr).toContain('bench');
  }, 120_000);

  it('rejects bad flags with one line', async () => {
    await refused([['--preset', 'huge'], ['--steps', '0'], ['--seq', '7'], ['--opt-level', 'max']], true);
  });
});

describe('prefzoo bench --generate', () => {
  it('counts 2 FLOPs per matmul weight per row plus attention over the cache', () => {
    const c = presetConfig('llama', 'small');
    expect(matmulParams(c)).toBe(39_592_448); // the training count above
    expect(decodeStepFlops(c, 32, 64)).toBe(2 * 32 * 39_592_448 + 4 * 32 * 8 * 8 * 64 * 64);
    const g = presetConfig('gpt2', 'tiny', { vocabSize: 512 });
    expect(g.tie_word_embeddings).toBe(true);
    // Every weight but the position table (the token table is the head).
    expect(matmulParams(g)).toBe(countParameters(g) - 512 * 64); // n_positions 512 × n_embd 64
  });

  it('prints one JSON line: prefill, decode tokens/s, ms per step, bounds, peak RSS', async () => {
    const r = await prefzoo('bench', '--generate', '--preset', 'tiny', '--batch', '2', '--prompt', '5', '--new', '8', '--runs', '1', '--no-peak', '--json');
    expect(r.code, r.stderr).toBe(0);
    const j = JSON.parse(r.stdout.trim());
    for (const k of ['prefill_ms', 'decode_tokens_per_s', 'ms_per_step', 'gflop_per_step', 'bandwidth_bound_ms', 'peak_rss_mb']) expect(j[k], k).toBeGreaterThan(0);
    expect(j).toMatchObject({ weights: 'fed', batch: 2, prompt_tokens: 5, new_tokens: 8, flop_bound_ms: null });
    expect(j.decode_tokens_per_s).toBeCloseTo(2000 / j.ms_per_step, -1);
    // The fused decode graphs (the CPU default) and --unfused's: fewer nodes built and run per step fused.
    const u = await prefzoo('bench', '--generate', '--preset', 'tiny', '--batch', '2', '--prompt', '5', '--new', '4', '--runs', '1', '--no-peak', '--unfused', '--json');
    expect(u.code, u.stderr).toBe(0);
    const jf = j;
    const ju = JSON.parse(u.stdout.trim());
    expect([jf.fused, ju.fused]).toEqual([true, false]);
    expect(jf.nodes_per_step.graph).toBeLessThan(ju.nodes_per_step.graph);
    expect(jf.nodes_per_step.runtime).toBeGreaterThan(0);
    expect(jf.nodes_per_step.runtime).toBeLessThan(ju.nodes_per_step.runtime);
  }, 120_000);

  it('refuses the training step flags with --generate, and --generate flags without it', async () => {
    await refused([['--generate', '--steps', '3'], ['--generate', '--lora'], ['--batch', '4'], ['--unfused'], ['--generate', '--arch', 'bert']], false);
  });
});

describe('prefzoo bench --rollout', () => {
  it('prints one JSON line: prefill, decode and total of the round with and without shared prompts and continuous batching', async () => {
    const r = await prefzoo('bench', '--rollout', '--preset', 'tiny', '--prompts', '2', '--generations', '3', '--prompt', '6', '--new', '8', '--batch', '4', '--json');
    expect(r.code, r.stderr).toBe(0);
    const j = JSON.parse(r.stdout.trim());
    expect(j).toMatchObject({ rows: 6, prompts: 2, generations: 3, prompt_tokens: 6, max_new_tokens: 8, batch: 4 });
    // Budgets drawn between an eighth of --new and --new.
    expect(j.new_tokens).toBeGreaterThanOrEqual(6);
    expect(j.new_tokens).toBeLessThanOrEqual(48);
    for (const k of ['session', 'padded_batches']) for (const t of ['prefill_s', 'decode_s', 'total_s']) expect(j[k][t], `${k}.${t}`).toBeGreaterThan(0);
    expect(j.speedup).toBeGreaterThan(0);
    // The round draws the same tokens both ways (the bench says so on stderr otherwise).
    expect(r.stderr).not.toMatch(/different tokens/);
  }, 120_000);

  it('--dtype q4: each round pays its weight update (quantizing, new sessions); with --lora the frozen base makes none', async () => {
    const run = (extra: string[]) => prefzoo('bench', '--rollout', '--preset', 'tiny', '--prompts', '2', '--generations', '2', '--prompt', '6', '--new', '4', '--batch', '4', '--dtype', 'q4', '--block-size', '16', '--json', ...extra);
    const [full, lora] = await Promise.all([run([]), run(['--lora', '4'])]);
    for (const r of [full, lora]) expect(r.code, r.stderr).toBe(0);
    const [f, l] = [JSON.parse(full.stdout.trim()), JSON.parse(lora.stdout.trim())];
    expect([f.lora, l.lora]).toEqual([0, 4]);
    for (const k of ['session', 'padded_batches']) {
      expect(f[k].update_s, k).toBeGreaterThan(0);
      expect(l[k].update_s, k).toBe(0);
    }
  }, 120_000);

  it('refuses the training and --generate-only flags with --rollout', async () => {
    await refused([['--rollout', '--steps', '3'], ['--rollout', '--generate'], ['--rollout', '--baked'], ['--generations', '4']], false);
  });
});

describe('prefzoo bench --serve', () => {
  it('prints one JSON line: tokens/s one after another and all at once, latency and time-to-first-token percentiles, batch-1 decode beside bench --generate', async () => {
    const r = await prefzoo('bench', '--serve', '--preset', 'tiny', '--clients', '3', '--max-tokens', '5', '--json');
    expect(r.code, r.stderr).toBe(0);
    const lines = r.stdout.trim().split('\n');
    expect(lines).toHaveLength(1);
    const j = JSON.parse(lines[0]);
    expect(j).toMatchObject({ engine: 'prefzoo serve', clients: 3, max_tokens: 5, threads: 2, device: 'cpu', peer: null, same_tokens: true });
    expect(j.prompt_tokens).toBeGreaterThan(0);
    for (const pass of ['sequential', 'concurrent']) {
      const p = j[pass];
      // Tokens generated, at most the budget: each request's seed fixes its tokens, so both passes count the same.
      expect(p.tokens, pass).toBeGreaterThanOrEqual(3);
      expect(p.tokens, pass).toBeLessThanOrEqual(15);
      // seconds is rounded to the millisecond and tokens_per_s (to 0.1) taken from the unrounded time:
      // at a few tokens in a few milliseconds the rounding alone moves tokens / seconds by several percent.
      expect(p.tokens_per_s, pass).toBeGreaterThanOrEqual(p.tokens / (p.seconds + 0.0005) - 0.05);
      if (p.seconds > 0.0005) expect(p.tokens_per_s, pass).toBeLessThanOrEqual(p.tokens / (p.seconds - 0.0005) + 0.05);
      for (const k of ['latency_ms', 'ttft_ms']) {
        expect(p[k].p50, `${pass}.${k}`).toBeGreaterThan(0);
        expect(p[k].p50).toBeLessThanOrEqual(p[k].p90);
        expect(p[k].p90).toBeLessThanOrEqual(p[k].p99);
      }
      expect(p.ttft_ms.p99).toBeLessThanOrEqual(p.latency_ms.p99);
      // The server's process and the clients' (a process of their own) each did work in the pass.
      expect(p.cpu_s, pass).toBeGreaterThan(0);
      expect(p.client_cpu_s, pass).toBeGreaterThan(0);
    }
    expect(j.concurrent.tokens).toBe(j.sequential.tokens);
    expect(j.speedup).toBeCloseTo(j.concurrent.tokens_per_s / j.sequential.tokens_per_s, 1);
    for (const k of ['decode_batch1_tokens_per_s', 'generate_batch1_tokens_per_s', 'decode_ratio', 'cpu_speedup']) expect(j[k], k).toBeGreaterThan(0);
  }, 120_000);

  it('prints its fields as a table without --json', async () => {
    const r = await prefzoo('bench', '--serve', '--preset', 'tiny', '--clients', '2', '--max-tokens', '3', '--threads', '1');
    expect(r.code, r.stderr).toBe(0);
    for (const k of ['sequential', 'concurrent', 'speedup', 'latency_concurrent', 'ttft_concurrent', 'decode_batch1']) expect(r.stdout).toMatch(new RegExp(`^${k} +\\S`, 'm'));
    expect(r.stdout).toContain('2 streamed chat requests with a tool');
  }, 120_000);

  it('refuses flags it does not use, and its own flags without it, in one line', async () => {
    await refused([['--serve', '--steps', '3'], ['--serve', '--generate'], ['--serve', '--peer', 'vllm'], ['--serve', '--clients', '0'], ['--clients', '4'], ['--generate', '--max-tokens', '8'], ['--serve', '--model', '/no/such/folder']], true);
  });
});

describe('prefzoo bench --distill', () => {
  it("prints one JSON line: a distillation step's sampling, teacher scoring and update, the teacher about 4× the student, the cache's bytes per token", async () => {
    const r = await prefzoo('bench', '--distill', '--preset', 'tiny', '--rows', '2', '--prompt', '6', '--new', '6', '--steps', '2', '--warmup', '1', '--topk', '8', '--teacher-dtype', 'f32,q8,auto', '--json');
    expect(r.code, r.stderr).toBe(0);
    const lines = r.stdout.trim().split('\n');
    expect(lines).toHaveLength(1);
    const j = JSON.parse(lines[0]);
    expect(j).toMatchObject({ preset: 'tiny', rows: 2, prompt_tokens: 6, max_new_tokens: 6, topk: 8 });
    // The teacher: the student's preset widened 2×, the depth nearest 4× its parameters.
    const student = presetConfig('llama', 'tiny', { vocabSize: j.cache.full_logits_bytes_per_token / 4 });
    expect(j.student_params).toBe(countParameters(student));
    expect(j.teacher_params).toBe(countParameters({ ...student, ...j.teacher_shape }));
    expect(j.teacher_shape.hidden_size).toBe(2 * (student as LlamaConfig).hidden_size);
    expect(j.step_seconds).toHaveLength(2);
    for (const s of j.step_seconds) for (const k of ['sample', 'teacher', 'update', 'sample_cpu', 'teacher_cpu']) expect(s[k], k).toBeGreaterThan(0);
    expect(j.teacher_over_sampling).toBeCloseTo(j.teacher_s / j.sample_s, 1);
    expect(j.teacher_over_sampling_cpu).toBeCloseTo(j.teacher_cpu_s / j.sample_cpu_s, 1);
    expect(j.mean_completion_length).toBeGreaterThan(0);
    expect(j.mean_completion_length).toBeLessThanOrEqual(6);
    // The cache: 3 steps × 2 rows, each response cut to its 6 tokens; bytes per token from the file written.
    expect(j.cache.tokens).toBe(36);
    expect(j.cache.bytes_per_token).toBeCloseTo(j.cache.file_bytes / 36, 1);
    expect(j.cache.fraction).toBeCloseTo(j.cache.bytes_per_token / j.cache.full_logits_bytes_per_token, 4);
    // One run per teacher_dtype, in the order given (auto labelled as what it resolves to: int8 on a CPU with VNNI, else f32);
    // the first's figures are the top-level ones, the others compared with them.
    expect(j.variants.map((v: { teacher_dtype: string }) => v.teacher_dtype)).toEqual(['f32', 'q8', int8ExactHere() ? 'int8' : 'f32']);
    expect(j.variants[0].teacher_s).toBe(j.teacher_s);
    expect(j.variants[0].gap).toBeUndefined();
    for (const { gap } of j.variants.slice(1)) {
      expect(gap.max_abs_logp).toBeGreaterThan(0);
      expect(gap.mean_abs_logp).toBeLessThanOrEqual(gap.max_abs_logp);
      expect(gap.topk_agreement).toBeGreaterThan(0.5);
      expect(gap.topk_agreement).toBeLessThanOrEqual(1);
    }
  }, 120_000);

  it('refuses flags it does not use, and its own flags without it, in one line', async () => {
    await refused([['--distill', '--batch', '4'], ['--distill', '--serve'], ['--distill', '--rows', '0'], ['--rows', '3'], ['--topk', '8', '--generate'], ['--teacher-dtype', 'q8'], ['--distill', '--teacher-dtype', 'f32,f16']], true);
  });
});
