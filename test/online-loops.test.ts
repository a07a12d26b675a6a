/**
 * Short runs of the online loops (on-policy Nash-MD) and the `generate` command (SPPO: test/sppo.test.ts).
 */
import { execFileSync, spawnSync } from 'node:child_process';
import { existsSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join, resolve } from 'node:path';
import { afterAll, describe, expect, it } from 'vitest';
import { TaskJudge, type Judge } from '../src/online/judges.ts';
import { runNashMd } from '../src/online/nash-md.ts';
import { demoSplit } from '../src/demos/online.ts';
import { initModelFolder } from '../src/models/init.ts';
import { loadModel } from '../src/models/load.ts';
import { generate } from '../src/index.ts';
import { generateSampling } from '../src/online/sampling.ts';
import { samplingAliasFlags } from '../src/online/options.ts';

const root = resolve(import.meta.dirname, '..');
const dir = mkdtempSync(join(tmpdir(), 'prefzoo-online-'));
afterAll(() => rmSync(dir, { recursive: true, force: true }));
const model = join(dir, 'model');
initModelFolder(model, 'llama', 'tiny', 2);
const prompts = ['1+2=', '3+4=', '5+6=', '7+8=', '9+0=', '2+2='];
const SETTINGS = { learning_rate: 1e-3, batch_size: 4, pad_to_multiple_of: 16, max_length: 32, max_prompt_length: 16, logging_steps: 1, warmup_steps: 0 };

/** Prefers the shorter text: a judge with a signal even for an untrained model's samples. */
const shorter: Judge = {
  name: 'shorter',
  async compare(items) {
    return items.map((c) => prefer(String(c.a), String(c.b)));
  },
  async release() {},
};
const prefer = (a: string, b: string) => (a.length < b.length ? 1 : a.length > b.length ? 0 : 0.5);

function differs(a: string, b: string): boolean {
  const wa = loadModel(a).weights;
  const wb = loadModel(b).weights;
  return [...wa].some(([k, t]) => t.data.some((v, i) => v !== wb.get(k)!.data[i]));
}

describe('Nash-MD', () => {
  it('on-policy steps: the first step sees π_θ = π_ref (KL estimate 0); the policy moves', async () => {
    const out = join(dir, 'nash');
    const r = await runNashMd({ model, prompts, judge: shorter, out, maxNewTokens: 3, params: ['max_steps=3', 'beta=0.1', 'mixture_coef=0.5'], base: SETTINGS });
    const rows = readFileSync(join(out, 'metrics.jsonl'), 'utf8').trim().split('\n').map((l) => JSON.parse(l));
    expect(rows.map((x) => x.step)).toEqual([1, 2, 3]);
    expect(Math.abs(rows[0]['objective/kl'])).toBeLessThan(1e-5);
    for (const x of rows) {
      expect(Number.isFinite(x.loss)).toBe(true);
      expect(x['objective/win_rate_vs_mixture']).toBeGreaterThanOrEqual(0);
      expect(x['objective/win_rate_vs_mixture']).toBeLessThanOrEqual(1);
    }
    expect(rows.some((x) => Math.abs(x['objective/kl']) > 0)).toBe(true);
    expect(differs(r.finalDir, model)).toBe(true);
  });
});

describe('demo split', () => {
  it('holds out 100 prompts of four distinct digits the 200 training prompts do not contain', () => {
    const { train, heldout } = demoSplit(0);
    expect(train).toHaveLength(200);
    expect(heldout).toHaveLength(100);
    const t = new Set(train);
    for (const p of [...train, ...heldout]) expect(new Set(p.slice(0, 4)).size === 4 && /^\d{4}:$/.test(p)).toBe(true);
    expect(heldout.some((p) => t.has(p))).toBe(false);
    expect(demoSplit(0)).toEqual({ train, heldout });
  });
});

describe('prefzoo generate', () => {
  it('writes n samples per prompt as Parquet; the sampling settings by --param, flag or library setting; bad values are one-line errors', async () => {
    const p = join(dir, 'prompts.jsonl');
    writeFileSync(p, ['{"prompt": "1+2="}', '{"prompt": [{"role": "user", "content": "hi"}]}'].join('\n') + '\n');
    const out = join(dir, 'gen.parquet');
    const bin = join(root, 'bin', 'prefzoo.mjs');
    const res = JSON.parse(execFileSync('node', [bin, 'generate', '--model', model, '--prompts', p, '-o', out, '--n', '3', '--max-new-tokens', '4', '--top-k', '20', '--json'], { encoding: 'utf8' }));
    expect(res).toMatchObject({ prompts: 2, samples: 6 });
    expect(existsSync(out)).toBe(true);
    const bad = spawnSync('node', [bin, 'generate', '--model', model, '--prompts', p, '-o', out, '--temperature', 'hot'], { encoding: 'utf8' });
    expect(bad.status).toBe(1);
    expect(bad.stderr.trim()).toBe('prefzoo: --temperature must be a number ≥ 0, got "hot"');
    // The sampling settings as --param (one declaration, src/online/sampling.ts), as flags, or as the library's fields.
    const byParam = JSON.parse(execFileSync('node', [bin, 'generate', '--model', model, '--prompts', p, '-o', join(dir, 'gen-param.parquet'), '--param', 'max_completion_length=2', '--param', 'temperature=0', '--json'], { encoding: 'utf8' }));
    expect(byParam.tokens).toBeLessThanOrEqual(2 * byParam.samples);
    const greedy2 = { temperature: 0, topK: 0, topP: 1, maxNewTokens: 2 };
    expect(generateSampling({ params: ['max_completion_length=2', 'temperature=0'] })).toEqual(greedy2);
    expect(generateSampling(samplingAliasFlags({ maxNewTokens: '2', temperature: '0' }))).toEqual(greedy2);
    expect(generateSampling({ settings: { max_completion_length: 2, temperature: 0 } })).toEqual(greedy2);
    expect(() => samplingAliasFlags({ topP: '2' })).toThrow(/^--top-p: top_p must be a number in \(0, 1\], got 2$/);
    expect(() => generateSampling({ params: ['device=cpu'] })).toThrow(/^setting device cannot be honoured by prefzoo generate \(it honours max_completion_length, temperature, top_p, top_k\)$/);
    // The library's generate: typed settings and the older names resolve through the same declaration.
    const typed = await generate({ model, prompts: ['1+2=', '3+4='], settings: { max_completion_length: 2, temperature: 0 } });
    const older = await generate({ model, prompts: ['1+2=', '3+4='], maxNewTokens: 2, temperature: 0 });
    expect(typed.map((x) => x.ids)).toEqual(older.map((x) => x.ids));
    expect(typed.every((x) => x.ids.length <= 2)).toBe(true);
    await expect(generate({ model, prompts: ['1+2='], settings: { top_p: 2 } })).rejects.toThrow(/^settings: top_p must be a number in \(0, 1\], got 2$/);
    writeFileSync(p, '{"prompt": "1+2="}\n{"question": "x"}\n');
    const missing = spawnSync('node', [bin, 'generate', '--model', model, '--prompts', p, '-o', out], { encoding: 'utf8' });
    expect(missing.stderr.trim()).toBe(`prefzoo: ${p}:2: missing field "prompt"`);
  });
});
