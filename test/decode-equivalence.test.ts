/**
 * The optimised decode path samples exactly what the original did: every case of
 * test/fixtures/decode/cases.ts (greedy and seeded sampling with temperature/top-k/top-p, baked and
 * fed weights, mixtures, ModelSampler over a model folder; llama, gpt2, mistral's sliding window, qwen3)
 * against the tokens record.ts wrote from the decode path of commit 6f64f25.
 */
import { readFileSync } from 'node:fs';
import { describe, expect, it } from 'vitest';
import { runCases, type Recorded } from './fixtures/decode/cases.ts';

const recorded: Recorded[] = JSON.parse(readFileSync(new URL('./fixtures/decode/tokens.json', import.meta.url), 'utf8'));

describe('decode equivalence with the recorded tokens', () => {
  it('every case generates the recorded ids, stop flags included', async () => {
    const got = await runCases();
    expect(got.map((c) => c.name)).toEqual(recorded.map((c) => c.name));
    for (let i = 0; i < got.length; i++) {
      // Same weights first: a different initialisation is not a decode change.
      expect(got[i].weightSum, recorded[i].name).toBeCloseTo(recorded[i].weightSum, 6);
      expect(got[i].out, recorded[i].name).toEqual(recorded[i].out);
    }
  }, 120_000);
});
