import { describe, it, expect } from 'vitest';
import { uniform as rng } from '../src/random.ts';
import { pairwiseMetrics, ndcg, kendallTau, rocAuc, listwiseMetrics, groupBy } from '../src/eval/metrics.ts';


describe('eval metrics', () => {
  it('pairwise accuracy counts ties as wrong', () => {
    const m = pairwiseMetrics([1, 2, 3, 0], [0, 2, 4, -1]);
    expect(m.accuracy).toBe(0.5);
    expect(m.margin).toBeCloseTo((1 + 0 - 1 + 1) / 4, 15);
    expect(m.chosen_reward).toBe(1.5);
  });

  it('ROC-AUC equals the brute-force pair count', () => {
    const r = rng(7);
    const scores = Array.from({ length: 60 }, () => Math.round(r() * 10) / 10); // many ties
    const labels = scores.map((s) => r() < 0.3 + s * 0.4);
    let wins = 0;
    let pairs = 0;
    for (let i = 0; i < scores.length; i++)
      for (let j = 0; j < scores.length; j++)
        if (labels[i] && !labels[j]) {
          pairs++;
          wins += scores[i] > scores[j] ? 1 : scores[i] === scores[j] ? 0.5 : 0;
        }
    expect(rocAuc(scores, labels)).toBeCloseTo(wins / pairs, 12);
    expect(rocAuc([1, 2, 3], [false, true, true])).toBe(1);
  });

  it('NDCG by hand and Kendall tau on known orders', () => {
    // scores rank items [2,0,1]; labels 0,1,2 → DCG = 3/log2(2) + 0/log2(3) + 1/log2(4)
    const dcg = 3 / 1 + 0 + 1 / 2;
    const idcg = 3 / 1 + 1 / Math.log2(3) + 0;
    expect(ndcg([0.5, 0.1, 0.9], [0, 1, 2])).toBeCloseTo(dcg / idcg, 12);
    expect(ndcg([3, 2, 1], [2, 1, 0])).toBeCloseTo(1, 15);
    expect(kendallTau([1, 2, 3, 4], [10, 20, 30, 40])).toBe(1);
    expect(kendallTau([1, 2, 3, 4], [4, 3, 2, 1])).toBe(-1);
    // one discordant pair of six: (5 − 1) / 6
    expect(kendallTau([1, 2, 3, 4], [1, 2, 4, 3])).toBeCloseTo(4 / 6, 12);
    const l = listwiseMetrics([[0.1, 0.9, 0.5], [1, 1, 0]], [[0, 2, 1], [1, 0, 0]]);
    expect(l.top1_accuracy).toBe(0.5); // second list ties at the top: counts wrong
  });

  it('groups by source', () => {
    expect([...groupBy(['a', 'b', 'a', null]).entries()]).toEqual([['a', [0, 2]], ['b', [1]], ['(none)', [3]]]);
  });
});
