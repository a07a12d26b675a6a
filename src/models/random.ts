/**
 * A seeded source of uniform and normal numbers (splitmix64 state stepping, Box–Muller pairs).
 * The 64-bit arithmetic runs on pairs of 32-bit halves (BigInt steps cost about 20× more, which is
 * minutes for the half-billion weights of a 0.5B model); the stream is splitmix64's, bit for bit.
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
