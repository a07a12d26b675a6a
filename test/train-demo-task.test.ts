import { describe, it, expect } from 'vitest';
import { SeededRandom } from '../src/train/random.ts';
import { demoPairs, demoLists, demoSingles, demoAnswer } from '../src/train/demo-task.ts';

describe('seeded random', () => {
  it('matches xoshiro128** computed independently (Python, state [1,2,3,4])', () => {
    const r = new SeededRandom([1, 2, 3, 4]);
    expect([r.nextU32(), r.nextU32(), r.nextU32()]).toEqual([11520, 0, 5927040]);
  });
  it('resumes from a saved state', () => {
    const a = new SeededRandom(42);
    a.next();
    const b = new SeededRandom(a.state);
    expect(Array.from({ length: 5 }, () => a.nextU32())).toEqual(Array.from({ length: 5 }, () => b.nextU32()));
  });
});

describe('demo task', () => {
  it('pairs: chosen is the right sum mod 10, rejected differs, held-out pairs are unseen', () => {
    const { train, test } = demoPairs(1);
    expect(train.length).toBe(800);
    expect(test.length).toBe(100);
    const seen = new Set(train.map((p) => `${p.prompt}|${p.rejected}`));
    for (const p of [...train, ...test]) {
      const [a, b] = p.prompt.slice(0, -1).split('+').map(Number);
      expect(p.chosen).toBe(String(demoAnswer(a, b)));
      expect(p.rejected).not.toBe(p.chosen);
    }
    for (const p of test) expect(seen.has(`${p.prompt}|${p.rejected}`)).toBe(false);
    expect(demoPairs(1)).toEqual(demoPairs(1));
  });
  it('lists rank the right answer first; singles are balanced', () => {
    const { train } = demoLists(3);
    for (const l of train) {
      const best = l.scores.indexOf(Math.max(...l.scores));
      const [a, b] = l.prompt.slice(0, -1).split('+').map(Number);
      expect(l.responses[best]).toBe(String(demoAnswer(a, b)));
    }
    const s = demoSingles(3).train;
    expect(s.filter((x) => x.label).length).toBe(s.length / 2);
  });
});
