import { describe, it, expect } from 'vitest';
import { SeededRandom } from '../src/random.ts';
import { demoPairs, demoLists, demoSingles, firstDigitAnswer } from '../src/demos/task.ts';

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
  it('pairs: chosen is the first digit, rejected another digit of the prompt, held-out prompts unseen', () => {
    const { train, test } = demoPairs(1);
    expect(train.length).toBe(3000);
    expect(test.length).toBe(200);
    for (const p of [...train, ...test]) {
      expect(p.prompt).toMatch(/^\d{4}:$/);
      expect(new Set(p.prompt.slice(0, 4)).size).toBe(4);
      expect(p.chosen).toBe(p.prompt[0]);
      expect(p.prompt.slice(1, 4)).toContain(p.rejected);
      expect(p.chosen_score).toBeGreaterThan(p.rejected_score);
    }
    const seen = new Set(train.map((p) => p.prompt));
    for (const p of test) expect(seen.has(p.prompt)).toBe(false);
    expect(demoPairs(1)).toEqual(demoPairs(1));
  });
  it('lists rank the first digit best; singles are balanced', () => {
    for (const l of demoLists(3).train) {
      const best = l.scores.indexOf(Math.max(...l.scores));
      expect(l.responses[best]).toBe(firstDigitAnswer(l.prompt));
      expect([...l.responses].sort().join('')).toBe(l.prompt.slice(0, 4).split('').sort().join(''));
    }
    const s = demoSingles(3).train;
    expect(s.filter((x) => x.label).length).toBe(s.length / 2);
    for (const x of s) expect(x.label).toBe(x.response === firstDigitAnswer(x.prompt));
  });
});
