import { describe, it, expect } from 'vitest';
import type { Arch } from '../src/models/config.ts';
import { Normal } from '../src/models/init.ts';
import { referenceLogits, referenceLogps } from './helpers/reference-forward.ts';
import { pad, randomIds, randomWeights, runModel, testConfig, type Row } from './helpers/model-fixtures.ts';

const ARCHS: Arch[] = ['llama', 'qwen2', 'gpt2'];

function rowsFor(vocab: number, seed: number, lengths: number[]): Row[] {
  const rng = new Normal(seed);
  return lengths.map((n) => ({ ids: randomIds(n, vocab, rng), loss: Array.from({ length: n }, (_, t) => (t >= 2 ? 1 : 0)) }));
}

describe.each(ARCHS)('%s graph vs the float64 reference forward', (arch) => {
  const c = testConfig(arch);
  const w = randomWeights(c, 11);
  const rows = rowsFor(c.vocab_size, 5, [6, 3, 8, 5]);
  const batch = pad(rows, 9, ['right', 'left', 'left', 'right']);

  for (const dtype of ['float64', 'float32'] as const) {
    it(`logits and log-probs agree with padding (${dtype})`, async () => {
      const out = await runModel(c, w, batch, { dtype });
      const tol = dtype === 'float64' ? 1e-10 : 1e-5;
      const T = batch.ids[0].length;
      let maxAbs = 0;
      rows.forEach((r, b) => {
        const ref = referenceLogits(c, w, r.ids);
        ref.forEach((row, t) => {
          const base = ((b * T + batch.offset[b] + t) * c.vocab_size);
          row.forEach((v, j) => {
            const got = out.logits[base + j];
            maxAbs = Math.max(maxAbs, Math.abs(v));
            expect(Math.abs(got - v)).toBeLessThan(tol * Math.max(1, Math.abs(v)));
          });
        });
        const rl = referenceLogps(c, w, r.ids, r.loss);
        expect(out.tokens[b]).toBe(rl.tokens);
        expect(Math.abs(out.logp[b] - rl.logp)).toBeLessThan(tol * Math.max(1, Math.abs(rl.logp)));
      });
      // The weights are large enough that logits are far from uniform.
      expect(maxAbs).toBeGreaterThan(1);
    });
  }
});
