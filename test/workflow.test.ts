/**
 * The training workflow: a separate reference model (`--ref`), TR-DPO reference syncing, PEFT
 * adapters out and in, rationale-enriched pairs, and LD-DPO's `ld_alpha`. Expected values come from
 * float64 forward passes (test/helpers/reference-forward.ts) and the papers' formulas, not from the
 * trainer's own graphs.
 */
import { describe, it, expect, beforeAll } from 'vitest';
import { mkdtempSync, writeFileSync, readFileSync, existsSync, readdirSync, cpSync, openSync, readSync, closeSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join, resolve } from 'node:path';
import { initModelFolder } from '../src/models/init.ts';
import { trainAny } from '../src/train/mpo.ts';
import { loadModel } from '../src/models/load.ts';
import { loadTokenizer } from '../src/tokenize/index.ts';
import { loadData, tokenizeExamples, type TokenizedExample } from '../datasets/examples.ts';
import { tokenizeRationales } from '../src/train/rationale.ts';
import { readSafetensors, tensorToFloat32 } from '../src/models/safetensors.ts';
import { loadAdapter, saveAdapter } from '../src/models/peft.ts';
import { initLora } from '../src/models/lora.ts';
import { parseConfig } from '../src/models/config.ts';
import { convert } from '../datasets/convert.ts';
import { readCanonical } from '../datasets/parquet.ts';
import { referenceLogits, referenceLogps, type RefLora } from './helpers/reference-forward.ts';

const SHORT = ['max_length=64', 'max_prompt_length=32', 'pad_to_multiple_of=16', 'lr_scheduler=constant', 'logging_steps=1'];
const LN2 = Math.log(2);

let dir: string;
let model: string;
let sft: string;
let gpt2: string;
let pairs: string;
let rationales: string;

function jsonl(file: string, rows: unknown[]): string {
  writeFileSync(file, rows.map((r) => JSON.stringify(r)).join('\n') + '\n');
  return file;
}

function metrics(run: string): Record<string, number>[] {
  return readFileSync(join(run, 'metrics.jsonl'), 'utf8').trim().split('\n').map((l) => JSON.parse(l));
}

const softplus = (x: number) => (x > 0 ? x + Math.log1p(Math.exp(-x)) : Math.log1p(Math.exp(x)));

/** Float64 log p of each response token (after its own prefix) of prompt ++ response. */
const models = new Map<string, ReturnType<typeof loadModel>>();
function tokenLogps(dirOf: string, prompt: number[], response: number[]): number[] {
  if (!models.has(dirOf)) models.set(dirOf, loadModel(dirOf));
  const m = models.get(dirOf)!;
  const ids = [...prompt, ...response];
  const logits = referenceLogits(m.config, m.weights, ids);
  return response.map((id, j) => {
    const row = logits[prompt.length + j - 1];
    const mx = Math.max(...row);
    const lse = mx + Math.log(row.reduce((a, x) => a + Math.exp(x - mx), 0));
    return row[id] - lse;
  });
}

const sum = (xs: number[]) => xs.reduce((a, b) => a + b, 0);
const mean = (xs: number[]) => sum(xs) / xs.length;

/** The rows exactly as the trainer tokenizes them (settings of SHORT). */
async function tokenized(file: string, withRationales = false): Promise<TokenizedExample[]> {
  const tok = loadTokenizer(model);
  const data = await loadData(file, join(dir, 'tok-work'));
  const cfg = { max_length: 64, max_prompt_length: 32, truncation: 'keep_end' as const };
  const { rows } = tokenizeExamples(data.examples, tok, cfg, data.tokens);
  if (withRationales) tokenizeRationales(rows, tok, cfg);
  return rows;
}

beforeAll(() => {
  dir = mkdtempSync(join(tmpdir(), 'pz-workflow-'));
  model = join(dir, 'model');
  sft = join(dir, 'sft');
  gpt2 = join(dir, 'gpt2');
  initModelFolder(model, 'llama', 'tiny', 3);
  initModelFolder(sft, 'llama', 'tiny', 4);
  initModelFolder(gpt2, 'gpt2', 'tiny', 5);
  // Responses of different lengths (LD-DPO's public length is the shorter one's).
  const words = ['a', 'bb', 'ccc dd', 'e f g h', 'ijk', 'lm no pq rs'];
  pairs = jsonl(join(dir, 'pairs.jsonl'), words.map((w, i) => ({ prompt: `q${i}:`, chosen: ` ${w}`, rejected: ` ${words[(i + 2) % 6]} x` })));
  // Rationales on rows 0, 1, 3 and 4; rows 2 and 5 have none (absent, and an empty string).
  rationales = jsonl(
    join(dir, 'rationales.jsonl'),
    words.map((w, i) => ({
      prompt: `q${i}:`,
      chosen: ` ${w}`,
      rejected: ` ${words[(i + 1) % 6]}`,
      ...(i === 2 ? {} : { explanation: i === 5 ? '' : `because ${w} fits q${i}` }),
    })),
  );
});

describe('a separate reference model (train --ref)', () => {
  it('scores the reference with the --ref model (any architecture with the same tokenizer) and records it with the cache', async () => {
    const rows = await tokenized(pairs);
    // Step 1: the policy is the starting model; the rewards are β·(logp_model − logp_ref) in float64.
    const lp = (d: string, k: number) => rows.map((r) => sum(tokenLogps(d, r.promptIds, r.responseIds[k])));
    const [pw, pl] = [lp(model, 0), lp(model, 1)];
    for (const [refDir, name] of [[sft, 'ref-sft'], [gpt2, 'ref-gpt2']] as const) {
      const out = join(dir, name);
      await trainAny({ model, data: pairs, loss: 'dpo', out, params: [...SHORT, 'batch_size=6', 'max_steps=1', 'beta=0.5'], refModel: refDir });
      const [row] = metrics(out);
      const [rw, rl] = [lp(refDir, 0), lp(refDir, 1)];
      expect(row['rewards/chosen']).toBeCloseTo(mean(pw.map((x, i) => 0.5 * (x - rw[i]))), 4);
      expect(row.loss).toBeCloseTo(mean(pw.map((x, i) => softplus(-0.5 * (x - rw[i] - (pl[i] - rl[i]))))), 4);
      expect(JSON.parse(readFileSync(join(out, 'data', 'reference.json'), 'utf8')).reference).toBe(`model:${resolve(refDir)}`);
    }
    // A run with --ref sft is not resumed by a run whose reference is the policy itself.
    await expect(trainAny({ model, data: pairs, loss: 'dpo', out: join(dir, 'ref-sft'), params: [...SHORT, 'batch_size=6', 'max_steps=2'], resume: true })).rejects.toThrow(
      /--resume: .*ref-sft was started with --ref .*sft; /,
    );
    // A reference with another tokenizer cannot score the policy's ids.
    const other = join(dir, 'other-tok');
    cpSync(sft, other, { recursive: true });
    const tj = JSON.parse(readFileSync(join(other, 'tokenizer.json'), 'utf8'));
    tj.added_tokens = [...(tj.added_tokens ?? []), { id: 511, content: '<extra>', single_word: false, lstrip: false, rstrip: false, normalized: false, special: true }];
    writeFileSync(join(other, 'tokenizer.json'), JSON.stringify(tj));
    await expect(trainAny({ model, data: pairs, loss: 'dpo', out: join(dir, 'ref-bad'), params: SHORT, refModel: other })).rejects.toThrow(/tokenizer\.json differs/);
  });
});

describe('TR-DPO (sync_ref_model)', () => {
  it('soft-updates the reference as α·policy + (1 − α)·ref every ref_model_sync_steps (float64 reference of the update)', async () => {
    const out = join(dir, 'trdpo-soft');
    const alpha = 0.3;
    await trainAny({
      model, data: pairs, loss: 'dpo', out,
      params: [...SHORT, 'batch_size=3', 'max_steps=4', 'save_steps=1', 'learning_rate=1e-2', 'sync_ref_model=true', `ref_model_mixup_alpha=${alpha}`, 'ref_model_sync_steps=2'],
      refModel: sft,
    });
    const ck = (s: number) => join(out, 'checkpoints', `step-${String(s).padStart(8, '0')}`);
    const read = (file: string) => new Map([...readSafetensors(file).tensors].map(([k, t]) => [k, tensorToFloat32(t)]));
    let prev = new Map([...loadModel(sft).weights].map(([k, t]) => [k, t.data]));
    let compared = 0;
    for (let s = 1; s <= 4; s++) {
      const policy = read(join(ck(s), 'params.safetensors'));
      const got = read(join(ck(s), 'reference.safetensors'));
      expect([...got.keys()].sort()).toEqual([...prev.keys()].sort());
      let worst = 0;
      let where = '';
      for (const [name, r] of prev) {
        const p = policy.get(name)!;
        const g = got.get(name)!;
        for (let i = 0; i < r.length; i++) {
          // Synced after steps 2 and 4 only; in between the reference stays as it was. Float64, then
          // one rounding to float32: at most half an ulp (2^-24 relative) from the stored value.
          const want = s % 2 === 0 ? r[i] + alpha * (p[i] - r[i]) : r[i];
          const err = Math.abs(g[i] - want) / Math.max(Math.abs(want), 1e-30);
          if (err > worst) [worst, where] = [err, `${name}[${i}]`];
          compared++;
        }
      }
      expect(worst, `step ${s}, worst at ${where}`).toBeLessThanOrEqual(2 ** -24);
      prev = got;
    }
    expect(compared).toBeGreaterThan(100_000);
    // The reference really moved (the policy trained away from the SFT start).
    const moved = read(join(ck(2), 'reference.safetensors')).get('model.norm.weight')!;
    expect(moved.some((v, i) => v !== loadModel(sft).weights.get('model.norm.weight')!.data[i])).toBe(true);
  });

  it('scores the moving reference for every batch (α = 1, every step: every loss is ln 2) and resumes to the same figures', async () => {
    const params = [...SHORT, 'batch_size=3', 'learning_rate=1e-2', 'sync_ref_model=true', 'ref_model_mixup_alpha=1', 'ref_model_sync_steps=1', 'save_steps=1'];
    const full = join(dir, 'trdpo-hard');
    await trainAny({ model, data: pairs, loss: 'dpo', out: full, params: [...params, 'max_steps=4'] });
    const rows = metrics(full);
    expect(rows.length).toBe(4);
    // A stale (cached) reference would leave the policy's progress in the log-ratios after step 1.
    for (const r of rows) {
      expect(r.loss).toBeCloseTo(LN2, 4);
      expect(Math.abs(r['rewards/margins'])).toBeLessThan(1e-4);
    }
    const part = join(dir, 'trdpo-resume');
    await trainAny({ model, data: pairs, loss: 'dpo', out: part, params: [...params, 'max_steps=2'] });
    await trainAny({ model, data: pairs, loss: 'dpo', out: part, params: [...params, 'max_steps=4'], resume: true });
    const resumed = metrics(part);
    for (const k of ['loss', 'grad_norm', 'logps/chosen']) expect(resumed.map((r) => r[k])).toEqual(rows.map((r) => r[k]));
  });

  it('evaluates against the reference it started from, resumed or not: a resumed run writes the same eval rows', async () => {
    // α = 1 every step: by step 4 the moving reference is the policy, so an evaluation scored
    // against where it had moved (a resumed run's restored reference) would show no margin at all.
    const params = [...SHORT, 'batch_size=3', 'learning_rate=1e-2', 'sync_ref_model=true', 'ref_model_mixup_alpha=1', 'ref_model_sync_steps=1', 'save_steps=1', 'threads=1', `eval_data=${pairs}`, 'eval_steps=2'];
    const evals = (run: string) => metrics(run).filter((r) => (r as Record<string, unknown>).split === 'eval');
    const full = join(dir, 'trdpo-eval');
    await trainAny({ model, data: pairs, loss: 'dpo', out: full, params: [...params, 'max_steps=4'] });
    expect(evals(full).map((r) => r.step)).toEqual([2, 4]);
    expect(Math.abs(evals(full)[1].margin)).toBeGreaterThan(1e-3);
    const part = join(dir, 'trdpo-eval-resume');
    await trainAny({ model, data: pairs, loss: 'dpo', out: part, params: [...params, 'max_steps=2'] });
    await trainAny({ model, data: pairs, loss: 'dpo', out: part, params: [...params, 'max_steps=4'], resume: true });
    expect(evals(part)).toEqual(evals(full));
  });

  it('refuses a reference whose parameters differ from the policy\'s', async () => {
    await expect(trainAny({ model, data: pairs, loss: 'dpo', out: join(dir, 'trdpo-gpt2'), params: [...SHORT, 'sync_ref_model=true'], refModel: gpt2 })).rejects.toThrow(/different parameters/);
  });
});

/** The tensor names and shapes of a safetensors file, read straight from its JSON header. */
function safetensorsHeader(file: string): Record<string, { dtype: string; shape: number[] }> {
  const fd = openSync(file, 'r');
  const len = Buffer.alloc(8);
  readSync(fd, len, 0, 8, 0);
  const n = Number(len.readBigUInt64LE(0));
  const json = Buffer.alloc(n);
  readSync(fd, json, 0, n, 8);
  closeSync(fd);
  const h = JSON.parse(json.toString('utf8'));
  delete h.__metadata__;
  return h;
}

describe('PEFT adapters (save_adapter, train --adapter)', () => {
  it('writes PEFT\'s layout and names; the adapter reloads bit for bit and gives the merged model\'s log-probs; training continues from it', async () => {
    const out = join(dir, 'lora');
    await trainAny({
      model, data: pairs, loss: 'dpo', out,
      params: [...SHORT, 'batch_size=6', 'max_steps=3', 'learning_rate=2e-2', 'lora_r=4', 'lora_alpha=8', 'lora_target_modules=q_proj,v_proj', 'save_adapter=true'],
    });
    const adir = join(out, 'adapter');
    expect(readdirSync(adir).sort()).toEqual(['adapter_config.json', 'adapter_model.safetensors']);
    const cfg = JSON.parse(readFileSync(join(adir, 'adapter_config.json'), 'utf8'));
    expect(cfg).toMatchObject({ peft_type: 'LORA', task_type: 'CAUSAL_LM', r: 4, lora_alpha: 8, target_modules: ['q_proj', 'v_proj'], fan_in_fan_out: false, bias: 'none', use_dora: false, use_rslora: false });
    expect(cfg.base_model_name_or_path).toBe(resolve(model));
    const header = safetensorsHeader(join(adir, 'adapter_model.safetensors'));
    const want: Record<string, number[]> = {};
    for (const l of [0, 1]) {
      for (const [m, outDim] of [['q_proj', 64], ['v_proj', 32]] as const) {
        want[`base_model.model.model.layers.${l}.self_attn.${m}.lora_A.weight`] = [4, 64];
        want[`base_model.model.model.layers.${l}.self_attn.${m}.lora_B.weight`] = [outDim, 4];
      }
    }
    expect(Object.fromEntries(Object.entries(header).map(([k, v]) => [k, v.shape]))).toEqual(want);
    expect(new Set(Object.values(header).map((v) => v.dtype))).toEqual(new Set(['F32']));

    // The adapter file holds exactly the trained adapter (the last checkpoint's values, bit for bit).
    const trained = readSafetensors(join(out, 'checkpoints', 'step-00000003', 'params.safetensors')).tensors;
    const loaded = loadAdapter(adir, loadModel(model).config);
    expect(loaded.lora).toEqual({ rank: 4, alpha: 8, targets: ['q_proj', 'v_proj'] });
    for (const [name, t] of loaded.weights) expect(Buffer.from(t.data.buffer).equals(Buffer.from(tensorToFloat32(trained.get(name)!).buffer)), name).toBe(true);
    expect(loaded.weights.get('model.layers.0.self_attn.q_proj.lora_B.weight')!.data.some((v) => v !== 0)).toBe(true);

    // Base + loaded adapter (float64, unmerged) gives the log-probs of the merged final model.
    const base = loadModel(model);
    const merged = loadModel(join(out, 'final'));
    const withAdapter = new Map([...base.weights, ...loaded.weights]);
    const lora: RefLora = { rank: 4, alpha: 8, modules: [0, 1].flatMap((l) => ['q_proj', 'v_proj'].map((m) => `model.layers.${l}.self_attn.${m}`)) };
    for (const r of (await tokenized(pairs)).slice(0, 3)) {
      const ids = [...r.promptIds, ...r.responseIds[0]];
      const mask = ids.map((_, t) => (t >= r.promptIds.length ? 1 : 0));
      const a = referenceLogps(base.config, withAdapter, ids, mask, lora).logp;
      const b = referenceLogps(merged.config, merged.weights, ids, mask).logp;
      expect(a).toBeCloseTo(b, 4);
      expect(Math.abs(a - referenceLogps(base.config, base.weights, ids, mask).logp)).toBeGreaterThan(1e-3);
    }

    // train --adapter: the policy starts at base + adapter, which is also the reference (loss ln 2 at step 1).
    const more = join(dir, 'lora-more');
    const r2 = await trainAny({ model, data: pairs, loss: 'dpo', out: more, params: [...SHORT, 'batch_size=6', 'max_steps=2', 'learning_rate=2e-2', 'save_adapter=true', 'save_merged=false'], adapter: adir });
    const m2 = metrics(more);
    expect(m2[0].loss).toBeCloseTo(LN2, 5);
    expect(m2[1].loss).not.toBeCloseTo(LN2, 5);
    expect(r2.finalDir).toBe(join(more, 'adapter'));
    expect(existsSync(join(more, 'final'))).toBe(false);
    const again = loadAdapter(join(more, 'adapter'), base.config);
    const q = 'model.layers.1.self_attn.v_proj.lora_B.weight';
    expect(again.weights.get(q)!.data.some((v, i) => v !== loaded.weights.get(q)!.data[i])).toBe(true);
  });

  it('GPT-2 adapters use PEFT\'s Conv1D convention; unsupported adapter configs are named', () => {
    const c = parseConfig({ model_type: 'gpt2', vocab_size: 53, n_embd: 24, n_layer: 1, n_head: 3, n_positions: 32 });
    const lora = { rank: 2, alpha: 4, targets: ['c_attn'] };
    const out = join(dir, 'gpt2-adapter');
    saveAdapter(out, initLora(c, lora, 1), { config: c, lora, baseModel: gpt2 });
    expect(JSON.parse(readFileSync(join(out, 'adapter_config.json'), 'utf8')).fan_in_fan_out).toBe(true);
    const h = safetensorsHeader(join(out, 'adapter_model.safetensors'));
    expect(Object.fromEntries(Object.entries(h).map(([k, v]) => [k, v.shape]))).toEqual({
      'base_model.model.transformer.h.0.attn.c_attn.lora_A.weight': [2, 24],
      'base_model.model.transformer.h.0.attn.c_attn.lora_B.weight': [72, 2],
    });
    const cfgFile = join(out, 'adapter_config.json');
    writeFileSync(cfgFile, JSON.stringify({ ...JSON.parse(readFileSync(cfgFile, 'utf8')), use_dora: true }));
    expect(() => loadAdapter(out, c)).toThrow(/adapter_config\.json: "use_dora" is true; only plain LoRA/);
    writeFileSync(cfgFile, JSON.stringify({ peft_type: 'LORA', r: 2, lora_alpha: 4, target_modules: ['c_fc'] }));
    expect(() => loadAdapter(out, c)).toThrow(/c_attn\.lora_A\.weight" is not an adapter of this gpt2 model/);
  });
});

describe('rationales (rationale_weight)', () => {
  it('convert maps rationale fields (aliases and --map); empty or absent rationales are null', async () => {
    const out = join(dir, 'rationales.parquet');
    await convert([rationales], out);
    const { table } = await readCanonical(out);
    expect(Array.from({ length: 6 }, (_, i) => table.getChild('rationale')!.get(i))).toEqual(['because a fits q0', 'because bb fits q1', null, 'because e f g h fits q3', 'because ijk fits q4', null]);
    const mapped = jsonl(join(dir, 'why.jsonl'), [{ prompt: 'p', chosen: ' a', rejected: ' b', why: 'w' }]);
    await convert([mapped], join(dir, 'why.parquet'), { map: { rationale: 'why' } });
    expect((await readCanonical(join(dir, 'why.parquet'))).table.getChild('rationale')!.get(0)).toBe('w');
  });

  it('adds γ·(−log π(rationale | prompt, chosen, rejected)) over the rows that have one (float64 forward)', async () => {
    const gamma = 0.25;
    const base = [...SHORT, 'batch_size=6', 'max_steps=1', 'beta=0.1'];
    const a = join(dir, 'rat-on');
    const b = join(dir, 'rat-off');
    await trainAny({ model, data: rationales, loss: 'dpo', out: a, params: [...base, `rationale_weight=${gamma}`] });
    await trainAny({ model, data: rationales, loss: 'dpo', out: b, params: base });
    const rows = await tokenized(rationales, true);
    expect(rows.map((r) => !!r.rationale)).toEqual([true, true, false, true, true, false]);
    const nll = rows.filter((r) => r.rationale).map((r) => -sum(tokenLogps(model, r.rationale!.promptIds, r.rationale!.responseIds)));
    const [on] = metrics(a);
    const [off] = metrics(b);
    expect(on['nll/rationale']).toBeCloseTo(mean(nll), 3);
    // The pairwise part is unchanged; rows without a rationale add nothing (sum over 4 rows, mean over 6).
    expect(on['rewards/margins']).toBeCloseTo(off['rewards/margins'], 6);
    expect(on.loss - off.loss).toBeCloseTo((gamma * sum(nll)) / 6, 3);
    await expect(trainAny({ model, data: pairs, loss: 'dpo', out: join(dir, 'rat-none'), params: [...base, 'rationale_weight=1'] })).rejects.toThrow(/no row has a rationale/);
  });
});

describe('LD-DPO (ld_alpha)', () => {
  it('weights the policy\'s tokens past the shorter response by α; reference and token counts unchanged (float64 reference values)', async () => {
    const alpha = 0.3;
    const beta = 0.5;
    const rows = await tokenized(pairs);
    expect(new Set(rows.map((r) => r.responseIds[0].length - r.responseIds[1].length)).size).toBeGreaterThan(2);
    const tl = rows.map((r) => [0, 1].map((k) => tokenLogps(model, r.promptIds, r.responseIds[k])));
    // LD-DPO: the first min(n_w, n_l) tokens count fully, the rest α-weighted (policy side only).
    const ld = tl.map(([w, l]) => {
      const m = Math.min(w.length, l.length);
      const f = (x: number[]) => sum(x.slice(0, m)) + alpha * sum(x.slice(m));
      return [f(w), f(l)];
    });
    const ref = tl.map(([w, l]) => [sum(w), sum(l)]);
    const n = rows.map((r) => [r.responseIds[0].length, r.responseIds[1].length]);
    const dpo = mean(ld.map(([w, l], i) => softplus(-beta * (w - ref[i][0] - (l - ref[i][1])))));
    const simpoGamma = 0.5;
    const simpo = mean(ld.map(([w, l], i) => softplus(-(beta * (w / n[i][0] - l / n[i][1]) - simpoGamma))));
    expect(Math.abs(dpo - LN2)).toBeGreaterThan(1e-3);

    const base = [...SHORT, 'batch_size=6', 'max_steps=1', `beta=${beta}`, `ld_alpha=${alpha}`];
    const a = join(dir, 'ld-dpo');
    await trainAny({ model, data: pairs, loss: 'dpo', out: a, params: base });
    const [m] = metrics(a);
    expect(m.loss).toBeCloseTo(dpo, 4);
    expect(m['logps/chosen']).toBeCloseTo(mean(ld.map((x) => x[0])), 3);
    // SimPO divides by the token counts: they must stay counts (one sequence per response here).
    const s = join(dir, 'ld-simpo');
    await trainAny({ model, data: pairs, loss: 'simpo', out: s, params: [...base, `gamma=${simpoGamma}`, 'share_prompt=false'] });
    expect(metrics(s)[0].loss).toBeCloseTo(simpo, 4);
    await expect(trainAny({ model, data: pairs, loss: 'dpo', out: join(dir, 'ld-bad'), params: [...SHORT, 'ld_alpha=1.5'] })).rejects.toThrow(/ld_alpha must be a number in \[0, 1\]/);
  });
});
