/**
 * Seeds for rollouts, tools and environments: 32-bit values mixed from the run's seed and positions,
 * so that whatever an in-process tool or environment draws is a function of where it is drawn, and a
 * resumed run draws it again bit for bit.
 */
import { SeededRandom } from '../random.ts';

/** murmur3's 32-bit finalizer: every input bit moves every output bit. */
function fmix32(h: number): number {
  h ^= h >>> 16;
  h = Math.imul(h, 0x85ebca6b);
  h ^= h >>> 13;
  h = Math.imul(h, 0xc2b2ae35);
  h ^= h >>> 16;
  return h >>> 0;
}

/** One 32-bit seed from a sequence of integers (order matters; each is taken mod 2³²). */
export function mixSeed(...parts: number[]): number {
  let h = 0x243f6a88;
  for (const p of parts) {
    h = fmix32((h ^ fmix32((p >>> 0) + 0x9e3779b9)) >>> 0);
    h = (Math.imul(h, 5) + 0xe6546b64) >>> 0;
  }
  return fmix32(h);
}

/**
 * The seed of an episode: the run's seed, the optimizer step and the prompt's index in the step's
 * batch. The G members of a group share the prompt, hence the seed, hence the starting state.
 */
export function episodeSeed(runSeed: number, step: number, prompt: number): number {
  return mixSeed(runSeed, step, prompt);
}

/** The generator one tool call gets: from the episode seed, the turn and the call's index in the turn. */
export function callRandom(seed: number, turn: number, call: number): SeededRandom {
  return new SeededRandom(mixSeed(seed, turn, call, 0x700c));
}
