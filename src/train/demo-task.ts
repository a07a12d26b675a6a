/**
 * The demo's built-in preference task: modular addition, whose preferred answer is verifiable.
 * Prompt "3+4=", chosen "7" (the sum mod 10), rejected a different digit. Every response is one
 * digit, so chosen and rejected have equal length and a model's raw preference (which of the two it
 * assigns more log-probability) is a fair measure before any training.
 */
import { SeededRandom } from './random.ts';

export interface DemoPair {
  prompt: string;
  chosen: string;
  rejected: string;
  /** Reward-model-like scores (MPO splits pairs by their margin): 10 for the right digit, less the nearer a wrong one is. */
  chosen_score: number;
  rejected_score: number;
  source: string;
}

/** Circular distance between two digits mod 10. */
function digitDistance(a: number, b: number): number {
  const d = (a - b + DEMO_MODULUS) % DEMO_MODULUS;
  return Math.min(d, DEMO_MODULUS - d);
}

export interface DemoListItem {
  prompt: string;
  responses: string[];
  /** Higher is better: 1 for the correct digit, 0 otherwise… graded by distance for ranking losses. */
  scores: number[];
}

export interface DemoSingle {
  prompt: string;
  response: string;
  label: boolean;
}

export const DEMO_MODULUS = 10;

export function demoAnswer(a: number, b: number): number {
  return (a + b) % DEMO_MODULUS;
}

function promptOf(a: number, b: number): string {
  return `${a}+${b}=`;
}

/** Every (a, b) prompt, in a seeded order. */
function prompts(rand: SeededRandom): [number, number][] {
  const all: [number, number][] = [];
  for (let a = 0; a < DEMO_MODULUS; a++) for (let b = 0; b < DEMO_MODULUS; b++) all.push([a, b]);
  return rand.shuffle(all);
}

function wrongDigit(rand: SeededRandom, right: number): number {
  const d = rand.int(DEMO_MODULUS - 1);
  return d >= right ? d + 1 : d;
}

/**
 * Pairwise train and held-out sets. Every prompt appears in training with `perPrompt` wrong answers
 * (by default all but one); held-out pairs use the (prompt, wrong answer) combinations that training
 * never shows, so the held-out accuracy measures whether the right answer itself was learned.
 */
export function demoPairs(seed: number, perPrompt = 8, heldOutPerPrompt = 1): { train: DemoPair[]; test: DemoPair[] } {
  const rand = new SeededRandom(seed);
  const train: DemoPair[] = [];
  const test: DemoPair[] = [];
  for (const [a, b] of prompts(rand)) {
    const right = demoAnswer(a, b);
    const wrongs = rand.shuffle(Array.from({ length: DEMO_MODULUS }, (_, i) => i).filter((d) => d !== right));
    const source = `add_${a < 5 ? 'low' : 'high'}`;
    const pair = (w: number): DemoPair => ({ prompt: promptOf(a, b), chosen: `${right}`, rejected: `${w}`, chosen_score: 10, rejected_score: 5 - digitDistance(w, right), source });
    wrongs.slice(0, perPrompt).forEach((w) => train.push(pair(w)));
    wrongs.slice(perPrompt, perPrompt + heldOutPerPrompt).forEach((w) => test.push(pair(w)));
  }
  return { train: rand.shuffle(train), test };
}

/** Listwise version: K answers per prompt scored by closeness to the right digit (10 − circular distance). */
export function demoLists(seed: number, k = 4): { train: DemoListItem[]; test: DemoListItem[] } {
  const rand = new SeededRandom(seed);
  const all = prompts(rand).map(([a, b]) => {
    const right = demoAnswer(a, b);
    const answers = [right, ...rand.shuffle(Array.from({ length: DEMO_MODULUS }, (_, i) => i).filter((d) => d !== right)).slice(0, k - 1)];
    const order = rand.shuffle(answers);
    return { prompt: promptOf(a, b), responses: order.map(String), scores: order.map((d) => (d === right ? 10 : 5 - digitDistance(d, right))) };
  });
  const cut = Math.floor(all.length * 0.8);
  return { train: all.slice(0, cut), test: all.slice(cut) };
}

/** Single-trajectory version: right answers labelled true, wrong ones false, balanced. */
export function demoSingles(seed: number, perPrompt = 2): { train: DemoSingle[]; test: DemoSingle[] } {
  const { train, test } = demoPairs(seed, perPrompt, 1);
  const toSingles = (pairs: DemoPair[]) =>
    pairs.flatMap((p) => [
      { prompt: p.prompt, response: p.chosen, label: true },
      { prompt: p.prompt, response: p.rejected, label: false },
    ]);
  const rand = new SeededRandom(seed + 1);
  return { train: rand.shuffle(toSingles(train)), test: toSingles(test) };
}
