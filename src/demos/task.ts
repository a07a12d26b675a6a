/**
 * The demo's built-in preference task: recall the first digit, whose preferred answer is
 * verifiable. A prompt is four distinct digits and a colon, "4719:"; the chosen answer repeats the
 * first digit ("4"), the rejected one is another digit of the same prompt ("1"). Both answers occur
 * in the prompt and are one digit long, so a random model has no reason to prefer either (its
 * accuracy starts near 0.5), and held-out prompts the training never showed test whether the rule
 * itself was learned rather than memorised.
 */
import { DEMO_MODULUS } from '../online/judges.ts';
import { SeededRandom } from '../random.ts';

export interface DemoPair {
  prompt: string;
  chosen: string;
  rejected: string;
  /** Reward-model-like scores (MPO splits pairs by their margin): 10 for the right digit, less the later a wrong one stands. */
  chosen_score: number;
  rejected_score: number;
  source: string;
}

export interface DemoListItem {
  prompt: string;
  responses: string[];
  /** Higher is better: 10 for the first digit, then 3, 2, 1 by the position the digit stands at. */
  scores: number[];
}

export interface DemoSingle {
  prompt: string;
  response: string;
  label: boolean;
}

export const DEMO_DIGITS = 4;

/** The answer the task prefers for a prompt. */
export function firstDigitAnswer(prompt: string): string {
  return prompt[0];
}

/**
 * Modular addition ("3+4=" → "7"): the verifiable task of the online demos (SPPO, Nash-MD), whose
 * built-in judge checks sums; sampling explores it well, while offline DPO on it learns slowly. Its
 * modulus, `DEMO_MODULUS`, is the judge's (online/judges.ts), which sits below the demos.
 */
export function demoAnswer(a: number, b: number): number {
  return (a + b) % DEMO_MODULUS;
}

/** Score of the digit at position `pos` (0-based) of a prompt. */
function scoreAt(pos: number): number {
  return pos === 0 ? 10 : DEMO_DIGITS - pos;
}

function randomPrompt(rand: SeededRandom): number[] {
  return rand.shuffle([0, 1, 2, 3, 4, 5, 6, 7, 8, 9]).slice(0, DEMO_DIGITS);
}

/** `count` distinct prompts, none of them in `avoid`. */
function prompts(rand: SeededRandom, count: number, avoid: Set<string> = new Set()): number[][] {
  const out: number[][] = [];
  const seen = new Set(avoid);
  while (out.length < count) {
    const p = randomPrompt(rand);
    const key = p.join('');
    if (seen.has(key)) continue;
    seen.add(key);
    out.push(p);
  }
  return out;
}

function pairOf(rand: SeededRandom, digits: number[]): DemoPair {
  const pos = 1 + rand.int(DEMO_DIGITS - 1);
  return {
    prompt: `${digits.join('')}:`,
    chosen: String(digits[0]),
    rejected: String(digits[pos]),
    chosen_score: scoreAt(0),
    rejected_score: scoreAt(pos),
    source: `rejected_at_${pos + 1}`,
  };
}

/** Pairwise train and held-out sets; held-out prompts never occur in training. */
export function demoPairs(seed: number, trainCount = 3000, testCount = 200): { train: DemoPair[]; test: DemoPair[] } {
  const rand = new SeededRandom(seed);
  const train = prompts(rand, trainCount);
  const test = prompts(rand, testCount, new Set(train.map((p) => p.join(''))));
  return { train: train.map((p) => pairOf(rand, p)), test: test.map((p) => pairOf(rand, p)) };
}

/** Listwise version: every digit of the prompt as a response, ranked by where it stands. */
export function demoLists(seed: number, trainCount = 1500, testCount = 100): { train: DemoListItem[]; test: DemoListItem[] } {
  const rand = new SeededRandom(seed);
  const train = prompts(rand, trainCount);
  const test = prompts(rand, testCount, new Set(train.map((p) => p.join(''))));
  const list = (digits: number[]): DemoListItem => {
    const order = rand.shuffle(digits.map((_, pos) => pos));
    return { prompt: `${digits.join('')}:`, responses: order.map((pos) => String(digits[pos])), scores: order.map(scoreAt) };
  };
  return { train: train.map(list), test: test.map(list) };
}

/** Single-trajectory version: the first digit labelled true, another digit of the prompt false. */
export function demoSingles(seed: number, trainCount = 1500, testCount = 100): { train: DemoSingle[]; test: DemoSingle[] } {
  const { train, test } = demoPairs(seed, trainCount, testCount);
  const toSingles = (pairs: DemoPair[]) =>
    pairs.flatMap((p) => [
      { prompt: p.prompt, response: p.chosen, label: true },
      { prompt: p.prompt, response: p.rejected, label: false },
    ]);
  const rand = new SeededRandom(seed + 1);
  return { train: rand.shuffle(toSingles(train)), test: toSingles(test) };
}
