/**
 * TRL's monitoring metrics (logits/chosen, logits/rejected, entropy,
 * num_tokens) against a float64 forward pass, save_total_limit, load_best_model_at_end by an eval
 * metric, and eval_generate's greedy samples (against a float64 greedy decode) in the HTML report.
 */
import { describe, it, expect, beforeAll, afterAll } from 'vitest';
import { existsSync, mkdirSync, mkdtempSync, readdirSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { initModelFolder } from '../src/models/init.ts';
import { loadModel } from '../src/models/load.ts';
import { loadTokenizer } from '../src/tokenize/index.ts';
import { demoPairs } from '../src/demos/task.ts';
import { train } from '../src/train/trainer.ts';
import { loadData, tokenizeExamples } from '../datasets/examples.ts';
import { resolveConfig } from '../src/train/config.ts';
import { pruneCheckpoints, improves, bestMetricName } from '../src/train/checkpoints.ts';
import { readCheckpoint } from '../src/artifacts/checkpoint.ts';
import { renderReport } from '../src/train/report.ts';
import { responseText } from '../src/models/generate.ts';
import { referenceLogits } from './helpers/reference-forward.ts';

const root = mkdtempSync(join(tmpdir(), 'pz-logging-'));
afterAll(() => rmSync(root, { recursive: true, force: true }));
const BASE = ['learning_rate=3e-3', 'lr_scheduler=constant', 'max_length=32', 'max_prompt_length=16', 'pad_to_multiple_of=16'];

let model: string;
let data: string;
beforeAll(() => {
  model = join(root, 'model');
  initModelFolder(model, 'llama', 'tiny', 7);
  data = join(root, 'pairs.jsonl');
  writeFileSync(data, demoPairs(4, 12, 0).train.map((p) => JSON.stringify(p)).join('\n') + '\n');
});

function metricsRows(run: string): Record<string, number | string>[] {
  return readFileSync(join(run, 'metrics.jsonl'), 'utf8').trim().split('\n').map((l) => JSON.parse(l));
}

/** Float64 token statistics over the response tokens of every pair (TRL's definitions). */
async function referenceStats() {
  const { config } = resolveConfig({ params: BASE });
  const m = loadModel(model);
  const d = await loadData(data, join(root, 'ref-data'));
  const { rows } = tokenizeExamples(d.examples, loadTokenizer(model), config);
  const sums = [
    { logit: 0, entropy: 0, n: 0 },
    { logit: 0, entropy: 0, n: 0 },
  ];
  for (const r of rows) {
    r.responseIds.forEach((resp, k) => {
      const ids = [...r.promptIds, ...resp];
      const logits = referenceLogits(m.config, m.weights, ids);
      for (let t = r.promptIds.length; t < ids.length; t++) {
        const row = logits[t - 1];
        const max = Math.max(...row);
        const z = row.reduce((a, x) => a + Math.exp(x - max), 0);
        const lse = max + Math.log(z);
        let h = 0;
        for (const x of row) h -= Math.exp(x - lse) * (x - lse);
        sums[k].logit += row.reduce((a, x) => a + x, 0) / row.length;
        sums[k].entropy += h;
        sums[k].n++;
      }
    });
  }
  return {
    'logits/chosen': sums[0].logit / sums[0].n,
    'logits/rejected': sums[1].logit / sums[1].n,
    entropy: (sums[0].entropy + sums[1].entropy) / (sums[0].n + sums[1].n),
  };
}

describe("TRL's token metrics", () => {
  for (const share of [true, false]) {
    it(`logits/chosen, logits/rejected and entropy match a float64 forward (share_prompt=${share}); num_tokens adds up`, async () => {
      const run = join(root, `metrics-${share}`);
      // One batch holds all 12 pairs, so step 1's metrics (computed before its update) cover them all.
      await train({ model, data, loss: 'dpo', out: run, params: [...BASE, 'batch_size=12', 'max_steps=3', `share_prompt=${share}`] });
      const rows = metricsRows(run);
      const ref = await referenceStats();
      for (const [k, v] of Object.entries(ref)) expect(Math.abs((rows[0][k] as number) - v), k).toBeLessThan(1e-4 * Math.max(1, Math.abs(v)));
      // The metrics move once the weights do (they are read from the step's own forward pass).
      expect(rows[2].entropy).not.toBe(rows[0].entropy);
      let total = 0;
      for (const r of rows) {
        total += r.tokens as number;
        expect(r.num_tokens).toBe(total);
      }
    });
  }
});

describe('save_total_limit and load_best_model_at_end', () => {
  it('keeps the newest checkpoints and the best; never the others', () => {
    const run = join(root, 'prune');
    for (const s of [2, 4, 6, 8, 10]) {
      const d = join(run, 'checkpoints', `step-${String(s).padStart(8, '0')}`);
      mkdirSync(d, { recursive: true });
      writeFileSync(join(d, 'state.json'), '{}');
    }
    mkdirSync(join(run, 'checkpoints', 'step-00000012'));
    const best = join(run, 'checkpoints', 'step-00000004');
    const gone = pruneCheckpoints(run, 2, best).map((d) => d.split('/').pop());
    expect(gone).toEqual(['step-00000002', 'step-00000006']);
    // An unfinished folder (no state.json) is not a checkpoint and is left alone.
    expect(readdirSync(join(run, 'checkpoints')).sort()).toEqual(['step-00000004', 'step-00000008', 'step-00000010', 'step-00000012']);
    expect(pruneCheckpoints(run, 0)).toEqual([]);
    expect(improves(0.5, null, 'accuracy')).toBe(true);
    expect(improves(0.5, { step: 1, metric: 'accuracy', value: 0.5, checkpoint: '' }, 'accuracy')).toBe(false);
    expect(improves(0.4, { step: 1, metric: 'loss', value: 0.5, checkpoint: '' }, 'loss')).toBe(true);
    expect(improves(Number.NaN, null, 'accuracy')).toBe(false);
    expect(bestMetricName('listwise', '')).toBe('ndcg');
    expect(bestMetricName('pairwise', 'eval_margin')).toBe('margin');
  });

  it('a run saves the best-scoring checkpoint as final/, keeps save_total_limit checkpoints, and writes samples into the report', async () => {
    const run = join(root, 'best');
    // A high learning rate makes the eval metric move (and fall back) between evaluations.
    const params = [...BASE, 'learning_rate=2e-2', 'batch_size=4', 'max_steps=8', 'eval_steps=2', `eval_data=${data}`, 'eval_samples=8', 'load_best_model_at_end=true', 'metric_for_best_model=margin', 'save_total_limit=1', 'eval_generate=2', 'eval_generate_max_new_tokens=4'];
    const r = await train({ model, data, loss: 'dpo', out: run, params });
    const evals = metricsRows(run).filter((x) => x.split === 'eval');
    expect(evals.map((e) => e.step)).toEqual([2, 4, 6, 8]);
    expect(evals.every((e) => e.count === 8)).toBe(true);
    const bestRow = evals.reduce((a, b) => ((b.margin as number) > (a.margin as number) ? b : a));
    const best = JSON.parse(readFileSync(join(run, 'best.json'), 'utf8'));
    expect(best).toMatchObject({ step: bestRow.step, metric: 'margin', value: bestRow.margin });
    // save_total_limit=1: the newest checkpoint, and the best one when it is older.
    const kept = readdirSync(join(run, 'checkpoints')).sort();
    const bestDir = `step-${String(best.step).padStart(8, '0')}`;
    expect(kept).toEqual([...new Set([bestDir, 'step-00000008'])].sort());
    // final/ holds the best checkpoint's weights, and its evaluation is that step's.
    const ck = readCheckpoint(join(run, 'checkpoints', bestDir));
    const fin = loadModel(r.finalDir);
    for (const [name, t] of ck.params) expect(Buffer.from(fin.weights.get(name)!.data.buffer).equals(Buffer.from(t.data)), name).toBe(true);
    expect(r.eval!.overall.margin).toBeCloseTo(bestRow.margin as number, 5);

    // eval_generate: one file per evaluation, the reference's greedy completions those of a float64 decode.
    const files = readdirSync(join(run, 'samples')).sort();
    expect(files).toEqual(['step-00000002.jsonl', 'step-00000004.jsonl', 'step-00000006.jsonl', 'step-00000008.jsonl']);
    const read = (f: string) => readFileSync(join(run, 'samples', f), 'utf8').trim().split('\n').map((l) => JSON.parse(l));
    const first = read(files[0]);
    expect(first).toHaveLength(2);
    const tok = loadTokenizer(model);
    const m = loadModel(model);
    const { config } = resolveConfig({ params: BASE });
    const d = await loadData(data, join(root, 'gen-data'));
    const { rows } = tokenizeExamples(d.examples.slice(0, 2), tok, config);
    rows.forEach((row, i) => {
      const ids = [...row.promptIds];
      const out: number[] = [];
      for (let n = 0; n < 4; n++) {
        const logits = referenceLogits(m.config, m.weights, ids).at(-1)!;
        let arg = 0;
        for (let v = 1; v < tok.vocabSize; v++) if (logits[v] > logits[arg]) arg = v;
        out.push(arg);
        ids.push(arg);
        if (tok.stopIds.includes(arg)) break;
      }
      const stopped = tok.stopIds.includes(out.at(-1)!);
      expect(first[i].reference).toBe(responseText(tok, out, stopped));
      expect(first[i].prompt).toEqual(d.examples[i].prompt);
      for (const f of files) expect(read(f)[i].reference).toBe(first[i].reference);
    });
    // The policy's completions change as it trains (the reference's never do).
    expect(files.map((f) => read(f).map((x) => x.policy).join('|')).some((p) => p !== first.map((x) => x.reference).join('|'))).toBe(true);
    const html = renderReport(run);
    expect(html).toContain('Sample generations');
    expect(html).toContain('step 8 (2 prompts)');
    expect(existsSync(join(run, 'final', 'config.json'))).toBe(true);
  });

  it('rejects load_best_model_at_end without evaluation, and eval_generate without eval_data, naming the setting', () => {
    expect(() => resolveConfig({ params: ['load_best_model_at_end=true'] })).toThrow(/load_best_model_at_end needs eval_data/);
    expect(() => resolveConfig({ params: ['eval_generate=2'] })).toThrow(/eval_generate needs eval_data/);
    expect(() => resolveConfig({ params: ['report_to=wandb'] })).toThrow(/report_to must be one of none, tensorboard/);
    expect(() => resolveConfig({ params: ['save_total_limit=-1'] })).toThrow(/save_total_limit must be an integer/);
  });
});
