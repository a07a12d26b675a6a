/** Float64 scalar functions of the references, in forms that stay exact at large |x|. */

/** softplus(x) = log(1 + eˣ). */
export function softplus(x: number): number {
  return x > 0 ? x + Math.log1p(Math.exp(-x)) : Math.log1p(Math.exp(x));
}

/** σ(x) = 1 / (1 + e⁻ˣ). */
export function sigmoid(x: number): number {
  if (x >= 0) return 1 / (1 + Math.exp(-x));
  const e = Math.exp(x);
  return e / (1 + e);
}

/** log σ(x) = −softplus(−x). */
export function logSigmoid(x: number): number {
  return -softplus(-x);
}

/** log(1 − eᵃ) for a < 0 (the log of a complement probability). */
export function log1mexp(a: number): number {
  return a > -Math.LN2 ? Math.log(-Math.expm1(a)) : Math.log1p(-Math.exp(a));
}

/** d/da log(1 − eᵃ) = −1 / (e⁻ᵃ − 1). */
export function dlog1mexp(a: number): number {
  return -1 / Math.expm1(-a);
}

/** log Σ exp(xᵢ) over the given values (−∞ for none). */
export function logSumExp(xs: readonly number[]): number {
  if (xs.length === 0) return -Infinity;
  const m = Math.max(...xs);
  let s = 0;
  for (const x of xs) s += Math.exp(x - m);
  return m + Math.log(s);
}

/** Softmax of the given values. */
export function softmax(xs: readonly number[]): number[] {
  const l = logSumExp(xs);
  return xs.map((x) => Math.exp(x - l));
}
