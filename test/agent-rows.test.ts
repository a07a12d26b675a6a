import { describe, expect, it } from 'vitest';
import { perRolloutScale, rowsOfCalls, type RecordedCall } from '../src/online/grpo/agent-rows.ts';

const call = (promptIds: number[], completionIds: number[], finishReason = 'stop'): RecordedCall => ({
  promptIds, completionIds, logps: completionIds.map((id) => -id / 100), finishReason,
});

describe('agent calls → training rows', () => {
  it('a call whose prompt extends the previous prompt + completion is merged; the ids between are masked', () => {
    const { rows, stats } = rowsOfCalls([call([1, 2, 3], [10, 11, 99], 'tool_calls'), call([1, 2, 3, 10, 11, 99, 5, 6], [12, 99])]);
    expect(rows).toHaveLength(1);
    expect(rows[0].promptIds).toEqual([1, 2, 3]);
    expect(rows[0].ids).toEqual([10, 11, 99, 5, 6, 12, 99]);
    expect(rows[0].lossMask).toEqual([1, 1, 1, 0, 0, 1, 1]);
    expect(rows[0].logps).toEqual([-0.1, -0.11, -0.99, 0, 0, -0.12, -0.99]);
    expect(rows[0].calls).toEqual([0, 1]);
    expect(stats).toEqual({ calls: 2, rows: 1, merged: 1, forked: 0, retokenized: 0, untrained: 0 });
  });

  it('a re-rendered turn forks a new row (re-tokenisation); a rewritten history forks without it', () => {
    // call 1's prompt holds the first turn as [10, 13, 99] (re-tokenized), not the sampled [10, 11, 99]
    const retok = rowsOfCalls([call([1, 2, 3], [10, 11, 99]), call([1, 2, 3, 10, 13, 99, 5], [12, 99])]);
    expect(retok.rows.map((r) => r.promptIds)).toEqual([[1, 2, 3], [1, 2, 3, 10, 13, 99, 5]]);
    expect(retok.stats).toMatchObject({ rows: 2, merged: 0, forked: 1, retokenized: 1 });
    // call 1 summarised the history: it leaves the row inside its prompt
    const rewrite = rowsOfCalls([call([1, 2, 3], [10, 11, 99]), call([1, 7, 5], [12, 99])]);
    expect(rewrite.stats).toMatchObject({ rows: 2, forked: 1, retokenized: 0 });
    expect(rewrite.rows[1].lossMask).toEqual([1, 1]);
  });

  it('a call returning to an earlier row extends that row; untrained calls keep mask 0 and a row of none is dropped', () => {
    const calls = [call([1], [10, 99]), call([2], [20, 99]), call([1, 10, 99, 4], [11, 99], 'length')];
    const { rows, stats } = rowsOfCalls(calls);
    expect(rows.map((r) => r.calls)).toEqual([[0, 2], [1]]);
    expect(rows[0].stopped).toBe(false);
    expect(rows[1].stopped).toBe(true);
    expect(stats).toMatchObject({ merged: 1, forked: 1 });
    const only2 = rowsOfCalls(calls, (i) => i === 2);
    expect(only2.rows.map((r) => r.calls)).toEqual([[0, 2]]);
    expect(only2.rows[0].lossMask).toEqual([0, 0, 0, 1, 1]);
    expect(only2.stats).toMatchObject({ rows: 1, untrained: 2 });
  });

  it('per-rollout scale: Σ over a rollout\'s rows is R/N, the same for every rollout; one row each gives 1', () => {
    const k = [1, 3, 0, 2];
    const s = perRolloutScale(k);
    const R = 6;
    const N = 3;
    k.forEach((n, i) => expect(n * s[i]).toBeCloseTo(n ? R / N : 0, 12));
    expect(perRolloutScale([1, 1, 1])).toEqual([1, 1, 1]);
  });
});
