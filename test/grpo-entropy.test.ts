/**
 * GRPO's entropy control and sampler log-probs on the online run:
 *
 * - the training graph's per-token entropies and log-probs over the sampler's vocabulary (ids past
 *   the tokenizer's, padded embedding rows, left out) against a float64 reference forward, and the
 *   gradient of an entropy bonus through the whole model against central finite differences (the
 *   bonus reaches the weights), with the head over the counted positions and over every one (WebGPU's);
 * - `prefzoo grpo` with `use_adaptive_entropy=true`: the controller's coefficient applied once the
 *   entropy fell to the target and moved after every step, `entropy` and `entropy_coef` in every row,
 *   the sampler–trainer mismatch logged (float32 rounding on the CPU); killed with SIGKILL after its
 *   first checkpoint and resumed with the default threads, the same rows and weights.
 */
import { spawnSync } from 'node:child_process';
import { existsSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join, resolve } from 'node:path';
import { afterAll, describe, expect, it } from 'vitest';
import { Graph } from '../src/onnx/graph.ts';
import { serializeModel } from '../src/onnx/proto.ts';
import { Session, toOrt, type Feeds } from '../src/runtime/session.ts';
import { gradients } from '../src/autodiff/index.ts';
import { buildCausalLM, declareParameters } from '../src/models/index.ts';
import { sequenceLogps } from '../src/models/logps.ts';
import { initModelFolder } from '../src/models/init.ts';
import { Normal } from '../src/random.ts';
import { referenceLogits } from './helpers/reference-forward.ts';
import { pad, randomIds, randomWeights, testConfig } from './helpers/model-fixtures.ts';
import { killWhen } from './helpers/faults.ts';
import { grpoLoss, type GrpoSettings } from '../src/online/grpo/index.ts';
import { resolveConfig } from '../src/train/config.ts';
import type { GrpoParams } from '../losses/grpo.ts';

const bin = resolve(import.meta.dirname, '..', 'bin', 'prefzoo.mjs');
const dir = mkdtempSync(join(tmpdir(), 'prefzoo-grpo-entropy-'));
afterAll(() => rmSync(dir, { recursive: true, force: true }));

describe.each([false, true])('differentiable entropies (dense head: %s)', (dense) => {
  it('equal the float64 reference over the sampler\'s vocabulary; the bonus\'s gradient matches central finite differences', async () => {
    const c = testConfig('llama');
    const LIMIT = 47; // of 53 ids: the last 6 rows are padding a sampler never draws
    const w = randomWeights(c, 31);
    const rng = new Normal(3);
    const rows = [5, 3, 6].map((n) => ({ ids: randomIds(n, LIMIT, rng), loss: Array.from({ length: n }, (_, t) => (t >= 2 ? 1 : 0)) }));
    const T = 7;
    const batch = pad(rows, T, ['left', 'right', 'left']);
    const B = rows.length;

    const g = new Graph('entropy_grad');
    const inputIds = g.input('input_ids', 'int64', ['batch', 'seq']);
    const attentionMask = g.input('attention_mask', 'int64', ['batch', 'seq']);
    const lossMask = g.input('loss_mask', 'float64', ['batch', 'seq']);
    const params = declareParameters(g, c, { dtype: 'float64' });
    const model = buildCausalLM(g, c, params, { inputIds, attentionMask });
    const seq = sequenceLogps(g, model, lossMask, { perToken: true, stats: true, entropyGrad: true, dense, vocabLimit: LIMIT });
    g.output(seq.tokenEntropies!, 'entropies');
    g.output(seq.tokenLogps!, 'logps');
    // A bonus c·Σ_t u_t·H_t with mixed weights u, so no position's gradient is special.
    const u = Array.from({ length: B * T }, (_, i) => 0.3 + ((i * 7) % 5) / 4);
    const bonus = g.output(g.reduceSum(g.mul(seq.tokenEntropies!, g.constant(u, 'float64', [B, T])), undefined, false), 'bonus');
    const names = [...params.keys()];
    const grads = gradients(g, bonus, names.map((n) => params.get(n)!));
    grads.forEach((d, i) => g.output(d!, `grad:${names[i]}`));
    const session = await Session.create(serializeModel(g));
    const feeds: Feeds = {
      input_ids: toOrt('int64', BigInt64Array.from(batch.ids.flat().map(BigInt)), [B, T]),
      attention_mask: toOrt('int64', BigInt64Array.from(batch.attention.flat().map(BigInt)), [B, T]),
      loss_mask: toOrt('float64', Float64Array.from(batch.loss.flat()), [B, T]),
    };
    const data = new Map<string, Float64Array>();
    for (const n of names) {
      data.set(n, Float64Array.from(w.get(n)!.data));
      feeds[n] = toOrt('float64', data.get(n)!, params.get(n)!.staticShape!);
    }
    const all = await session.run(feeds);

    // The reference: softmax over the first LIMIT logits of the predicting position, at the token's own position.
    const H = all.entropies.data as Float64Array;
    const LP = all.logps.data as Float64Array;
    const refW = new Map([...w].map(([k, v]) => [k, { shape: v.shape, data: Float64Array.from(v.data) }]));
    rows.forEach((r, b) => {
      const logits = referenceLogits(c, refW, r.ids);
      for (let t = 0; t < r.ids.length; t++) {
        const at = b * T + batch.offset[b] + t;
        if (t === 0 || !r.loss[t]) {
          expect([H[at], LP[at]].map(Math.abs)).toEqual([0, 0]);
          continue;
        }
        const x = logits[t - 1].subarray(0, LIMIT);
        const m = Math.max(...x);
        const z = x.reduce((a, v) => a + Math.exp(v - m), 0);
        const p = Array.from(x, (v) => Math.exp(v - m) / z);
        expect(Math.abs(H[at] - -p.reduce((a, q) => a + q * Math.log(q), 0))).toBeLessThan(1e-10);
        expect(Math.abs(LP[at] - Math.log(p[r.ids[t]]))).toBeLessThan(1e-10);
      }
    });

    // Central finite differences on sampled coordinates of every parameter tensor.
    const bonusAt = async () => (await session.run(feeds, ['bonus'])).bonus.data[0] as number;
    const pick = new Normal(77);
    let nonzero = 0;
    let checked = 0;
    for (const n of names) {
      const x = data.get(n)!;
      const grad = all[`grad:${n}`].data as Float64Array;
      for (let s = 0; s < 2; s++) {
        let at = Math.floor(pick.uniform() * x.length);
        if (n.endsWith('embed_tokens.weight')) {
          const D = x.length / c.vocab_size;
          const used = batch.ids.flat();
          at = used[Math.floor(pick.uniform() * used.length)] * D + Math.floor(pick.uniform() * D);
        }
        const h = 1e-5;
        const x0 = x[at];
        x[at] = x0 + h;
        const up = await bonusAt();
        x[at] = x0 - h;
        const down = await bonusAt();
        x[at] = x0;
        const fd = (up - down) / (2 * h);
        const err = Math.abs(fd - grad[at]) / Math.max(1e-3, Math.abs(fd) + Math.abs(grad[at]));
        expect(err, `${n}[${at}]: autodiff ${grad[at]} vs finite difference ${fd}`).toBeLessThan(1e-6);
        checked++;
        if (Math.abs(fd) > 1e-6) nonzero++;
      }
    }
    // The head's padded rows get no gradient: their ids are out of the distribution.
    const head = all['grad:lm_head.weight'].data as Float64Array;
    expect(head.subarray(LIMIT * (head.length / c.vocab_size)).every((v) => v === 0)).toBe(true);
    expect(nonzero).toBeGreaterThan(0.75 * checked);
    await session.release();
  });
});

describe('the sampler correction of prefzoo grpo', () => {
  it('under loss_type=vespo defaults to token_truncate (vespo takes it per token); a mode given is kept', () => {
    const mode = (params: string[]) => {
      const { lossParams, own } = resolveConfig({ params, command: 'grpo' });
      return (grpoLoss(lossParams, own as unknown as GrpoSettings).terms[0].params as GrpoParams).vllm_importance_sampling_mode;
    };
    expect(mode(['loss_type=vespo'])).toBe('token_truncate');
    expect(mode(['loss_type=vespo', 'sampling_importance_sampling_mode=token_mask'])).toBe('token_mask');
    expect(mode(['loss_type=dapo'])).toBe('sequence_mask');
  });
});

describe('prefzoo grpo with use_adaptive_entropy', () => {
  const model = join(dir, 'model');
  const prompts = join(dir, 'prompts.jsonl');
  const rewards = join(dir, 'rewards.mjs');
  // The tiny model's entropy (about 6 nats) is under a target of 8: the bonus applies from step 2 on
  // and the coefficient climbs by delta every step.
  const SET = ['max_steps=4', 'save_steps=2', 'batch_size=4', 'num_generations=2', 'max_completion_length=6', 'learning_rate=3e-3', 'logging_steps=1',
    'use_adaptive_entropy=true', 'entropy_target=8', 'entropy_coef=0.01', 'entropy_coef_delta=0.02'];
  const args = (out: string, extra: string[] = []) => ['grpo', '--model', model, '--prompts', prompts, '--reward', `${rewards}:short`, '-o', out, '--quiet', ...SET.flatMap((s) => ['--param', s]), ...extra];
  const rows = (out: string) => readFileSync(join(out, 'metrics.jsonl'), 'utf8').trim().split('\n').map((l) => JSON.parse(l)).map(({ 'tokens/s': _, ...r }) => r);

  it('applies and moves the coefficient; killed with SIGKILL after its first checkpoint and resumed, the same rows and weights', async () => {
    initModelFolder(model, 'llama', 'tiny', 5);
    writeFileSync(prompts, ['1+2=', '3+4=', '5+6=', '7+1=', '9+0=', '2+2='].map((p) => JSON.stringify({ prompt: p }) + '\n').join(''));
    writeFileSync(rewards, 'export function short(completions) { return completions.map((c) => -c.length / 10); }\n');
    const straight = join(dir, 'straight');
    const a = spawnSync(process.execPath, [bin, ...args(straight)], { encoding: 'utf8' });
    expect(a.status, a.stderr).toBe(0);
    const want = rows(straight);
    expect(want.map((r) => r.step)).toEqual([1, 2, 3, 4]);
    for (const k of ['entropy', 'entropy_coef', 'policy_loss', 'sampling/sampling_logp_difference/mean', 'sampling/sampling_logp_difference/max', 'sampling/importance_sampling_ratio/min', 'sampling/importance_sampling_ratio/mean', 'sampling/importance_sampling_ratio/max']) {
      expect(want.every((r) => Number.isFinite(r[k])), k).toBe(true);
    }
    // After each step the coefficient rose by delta (entropy ≤ target); it applies from step 2 (none measured before step 1).
    let coef = 0.01;
    expect(want.map((r) => r.entropy_coef)).toEqual(want.map(() => (coef += 0.02)));
    expect(want[0].loss).toBe(want[0].policy_loss);
    for (const r of want.slice(1)) expect(r.loss as number).toBeLessThan((r.policy_loss as number) - 0.01);
    // The sampler and the training graph score the same float32 model: the mismatch is rounding.
    expect(Math.max(...want.map((r) => r['sampling/sampling_logp_difference/max'] as number))).toBeLessThan(1e-4);
    expect(Object.keys(want[0]).some((k) => k.startsWith('_'))).toBe(false);

    const broken = join(dir, 'broken');
    await killWhen(args(broken), () => existsSync(join(broken, 'checkpoints', 'step-00000002', 'state.json')));
    expect(existsSync(join(broken, 'final'))).toBe(false);
    const b = spawnSync(process.execPath, [bin, ...args(broken, ['--resume'])], { encoding: 'utf8' });
    expect(b.status, b.stderr).toBe(0);
    expect(rows(broken)).toEqual(want);
    expect(Buffer.compare(readFileSync(join(straight, 'final', 'model.safetensors')), readFileSync(join(broken, 'final', 'model.safetensors')))).toBe(0);
  });
});
