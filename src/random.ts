/**
 * The project's seeded random numbers, in one module. Three streams, each kept because results are
 * reproduced from it: `SeededRandom` (xoshiro128**; shuffles and sampling, its state saved in a run's
 * state.json), `Normal` (splitmix64 + Box–Muller; initial weights of init-model, LoRA and value
 * heads), and `uniform` (mulberry32; binarizing with --seed, gradcheck data, test data).
 */

/** Uniform in [0, 1) from one 32-bit seed (mulberry32): a draw is one closure call. */
export function uniform(seed: number): () => number {
  let a = seed >>> 0;
  return () => {
    a = (a + 0x6d2b79f5) >>> 0;
    let t = a;
    t = Math.imul(t ^ (t >>> 15), t | 1);
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  };
}

/**
 * A small seeded PRNG (xoshiro128**) whose whole state is four 32-bit words, so a training run can
 * save it in `state.json` and resume with the same shuffles.
 */
export class SeededRandom {
  private s: Uint32Array;

  constructor(seed: number | number[]) {
    this.s = new Uint32Array(4);
    if (Array.isArray(seed)) {
      this.s.set(seed.map((v) => v >>> 0));
    } else {
      // splitmix32 expands one seed into four well-mixed words.
      let x = seed >>> 0;
      for (let i = 0; i < 4; i++) {
        x = (x + 0x9e3779b9) >>> 0;
        let z = x;
        z = Math.imul(z ^ (z >>> 16), 0x85ebca6b) >>> 0;
        z = Math.imul(z ^ (z >>> 13), 0xc2b2ae35) >>> 0;
        this.s[i] = (z ^ (z >>> 16)) >>> 0;
      }
    }
    if (this.s.every((v) => v === 0)) this.s[0] = 1;
  }

  /** The state, for checkpoints. */
  get state(): number[] {
    return Array.from(this.s);
  }

  /** Next 32-bit unsigned integer. */
  nextU32(): number {
    const s = this.s;
    const result = Math.imul(rotl(Math.imul(s[1], 5) >>> 0, 7), 9) >>> 0;
    const t = (s[1] << 9) >>> 0;
    s[2] ^= s[0];
    s[3] ^= s[1];
    s[1] ^= s[2];
    s[0] ^= s[3];
    s[2] ^= t;
    s[3] = rotl(s[3], 11);
    return result;
  }

  /** Uniform in [0, 1). */
  next(): number {
    return this.nextU32() / 4294967296;
  }

  /** Uniform integer in [0, n). */
  int(n: number): number {
    return Math.floor(this.next() * n);
  }

  /** Standard normal (Box–Muller). */
  normal(): number {
    const u = 1 - this.next();
    const v = this.next();
    return Math.sqrt(-2 * Math.log(u)) * Math.cos(2 * Math.PI * v);
  }

  /** Fisher–Yates shuffle of a copy. */
  shuffle<T>(xs: readonly T[]): T[] {
    const a = [...xs];
    for (let i = a.length - 1; i > 0; i--) {
      const j = this.int(i + 1);
      [a[i], a[j]] = [a[j], a[i]];
    }
    return a;
  }
}

function rotl(x: number, k: number): number {
  return ((x << k) | (x >>> (32 - k))) >>> 0;
}

/** A seeded source of uniform and normal numbers (splitmix64 state stepping, Box–Muller pairs). */
export class Normal {
  private state: bigint;
  private spare: number | null = null;

  constructor(seed: number) {
    this.state = BigInt.asUintN(64, BigInt(Math.trunc(seed)) * 0x9e3779b97f4a7c15n + 0x632be59bd9b4e019n);
  }

  /** Uniform in [0, 1) with 53 random bits. */
  uniform(): number {
    this.state = BigInt.asUintN(64, this.state + 0x9e3779b97f4a7c15n);
    let z = this.state;
    z = BigInt.asUintN(64, (z ^ (z >> 30n)) * 0xbf58476d1ce4e5b9n);
    z = BigInt.asUintN(64, (z ^ (z >> 27n)) * 0x94d049bb133111ebn);
    z ^= z >> 31n;
    return Number(z >> 11n) / 2 ** 53;
  }

  /** Standard normal. */
  next(): number {
    if (this.spare !== null) {
      const s = this.spare;
      this.spare = null;
      return s;
    }
    const u = 1 - this.uniform();
    const v = this.uniform();
    const r = Math.sqrt(-2 * Math.log(u));
    this.spare = r * Math.sin(2 * Math.PI * v);
    return r * Math.cos(2 * Math.PI * v);
  }

  fill(n: number, std: number): Float32Array {
    const a = new Float32Array(n);
    for (let i = 0; i < n; i++) a[i] = this.next() * std;
    return a;
  }
}
