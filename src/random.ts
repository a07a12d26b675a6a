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

/**
 * A seeded source of uniform and normal numbers (splitmix64 state stepping, Box–Muller pairs). The
 * 64-bit arithmetic runs on pairs of 32-bit halves (BigInt steps cost about 20× more, which is minutes
 * for the half-billion weights of a 0.5B model); the stream is splitmix64's, bit for bit.
 */
const GOLDEN_HI = 0x9e3779b9;
const GOLDEN_LO = 0x7f4a7c15;

/** (aHi·2³² + aLo) · (bHi·2³² + bLo) mod 2⁶⁴ → [hi, lo]. */
function mul64(aHi: number, aLo: number, bHi: number, bLo: number): [number, number] {
  const a0 = aLo & 0xffff;
  const a1 = aLo >>> 16;
  const b0 = bLo & 0xffff;
  const b1 = bLo >>> 16;
  const p00 = a0 * b0;
  const p01 = a0 * b1;
  const p10 = a1 * b0;
  const mid = (p00 >>> 16) + (p01 & 0xffff) + (p10 & 0xffff);
  const lo = (((mid & 0xffff) << 16) | (p00 & 0xffff)) >>> 0;
  const hi = (a1 * b1 + (p01 >>> 16) + (p10 >>> 16) + (mid >>> 16) + Math.imul(aHi, bLo) + Math.imul(aLo, bHi)) >>> 0;
  return [hi, lo];
}

export class Normal {
  private hi: number;
  private lo: number;
  private spare: number | null = null;

  constructor(seed: number) {
    const s = BigInt.asUintN(64, BigInt(Math.trunc(seed)) * 0x9e3779b97f4a7c15n + 0x632be59bd9b4e019n);
    this.hi = Number(s >> 32n);
    this.lo = Number(s & 0xffffffffn);
  }

  /** Uniform in [0, 1) with 53 random bits. */
  uniform(): number {
    // state += golden gamma
    const lo = this.lo + GOLDEN_LO;
    this.hi = (this.hi + GOLDEN_HI + (lo > 0xffffffff ? 1 : 0)) >>> 0;
    this.lo = lo >>> 0;
    // z = (z ^ z >> 30) · 0xbf58476d1ce4e5b9; z = (z ^ z >> 27) · 0x94d049bb133111eb; z ^= z >> 31
    let zh = this.hi;
    let zl = this.lo;
    [zh, zl] = mul64(zh ^ (zh >>> 30), (zl ^ ((zl >>> 30) | (zh << 2))) >>> 0, 0xbf58476d, 0x1ce4e5b9);
    [zh, zl] = mul64(zh ^ (zh >>> 27), (zl ^ ((zl >>> 27) | (zh << 5))) >>> 0, 0x94d049bb, 0x133111eb);
    zl = (zl ^ ((zl >>> 31) | (zh << 1))) >>> 0;
    zh = (zh ^ (zh >>> 31)) >>> 0;
    // the top 53 bits: z >> 11
    return (zh * 2 ** 21 + (zl >>> 11)) / 2 ** 53;
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
