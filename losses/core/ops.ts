/**
 * Graph helpers of the loss emitters: exact, overflow-free primitives built from standard ONNX ops.
 *
 * ONNX Runtime's CPU Softplus has no float64 kernel and its Sigmoid is approximate in the tails
 * (σ(−30) off by 0.1 %), so softplus, σ and log σ are composed here from Exp/Log/Where. Each
 * primitive's value is computed in an exact form (Kahan's log1p) and its derivative is attached
 * through `withSlope`, so autodiff sees one multiply by an exact slope instead of differentiating
 * through rounding tricks.
 */
import type { Graph, Tensor } from '../../src/onnx/graph.ts';

/** Stands in for −∞ in masked reductions (finite, so no NaN from ∞ − ∞ or 0·∞). */
export const MASKED = -1e30;

/**
 * A tensor whose value is `value` and whose derivative w.r.t. `x` is `slope` (elementwise).
 * value + slope·(x − x): the second term is 0 forward, and autodiff sees only it.
 */
export function withSlope(g: Graph, value: Tensor, x: Tensor, slope: Tensor): Tensor {
  return g.add(g.stopGradient(value), g.mul(g.stopGradient(slope), g.sub(x, g.stopGradient(x))));
}

/** log(1 + v) for v > −1 without cancellation (Kahan: v·log(w)/(w − 1), w = 1 + v). No gradient. */
function log1pValue(g: Graph, v: Tensor): Tensor {
  const w = g.add(v, 1);
  const exact = g.equal(w, 1);
  const den = g.where(exact, 1, g.sub(w, 1));
  return g.where(exact, v, g.div(g.mul(v, g.log(w)), den));
}

/** e^(−|x|) ∈ (0, 1], and σ(x) from it. */
function expNegAbs(g: Graph, x: Tensor): Tensor {
  return g.exp(g.neg(g.abs(x)));
}

function sigmoidValue(g: Graph, x: Tensor, u: Tensor): Tensor {
  return g.div(g.where(g.greaterOrEqual(x, 0), 1, u), g.add(u, 1));
}

/** softplus(x) = log(1 + eˣ) = relu(x) + log1p(e^(−|x|)); slope σ(x). */
export function softplus(g: Graph, x: Tensor): Tensor {
  return g.scope('softplus', () => {
    const u = expNegAbs(g, x);
    const value = g.add(g.relu(x), log1pValue(g, u));
    return withSlope(g, value, x, sigmoidValue(g, x, u));
  });
}

/** σ(x); slope σ(x)σ(−x) = e^(−|x|)/(1 + e^(−|x|))². */
export function sigmoid(g: Graph, x: Tensor): Tensor {
  return g.scope('sigmoid', () => {
    const u = expNegAbs(g, x);
    const d = g.add(u, 1);
    return withSlope(g, sigmoidValue(g, x, u), x, g.div(u, g.mul(d, d)));
  });
}

/** log σ(x) = −softplus(−x). */
export function logSigmoid(g: Graph, x: Tensor): Tensor {
  return g.neg(softplus(g, g.neg(x)));
}

/** −log σ(x) = softplus(−x). */
export function negLogSigmoid(g: Graph, x: Tensor): Tensor {
  return softplus(g, g.neg(x));
}

/** log(1 − eᵃ) for a < 0: log(−expm1 a) near 0, log1p(−eᵃ) below −ln 2; slope −eᵃ/(1 − eᵃ). */
export function log1mexp(g: Graph, a: Tensor): Tensor {
  return g.scope('log1mexp', () => {
    const u = g.exp(a);
    // expm1(a) for a ∈ (−ln 2, 0] by Kahan's trick: (u − 1)·a / log u, exactly a when u rounds to 1.
    const one = g.equal(u, 1);
    const logu = g.log(g.where(one, 0.5, u));
    const expm1 = g.where(one, a, g.div(g.mul(g.sub(u, 1), a), logu));
    const near = g.log(g.neg(g.where(g.greater(a, -Math.LN2), expm1, -1)));
    const far = log1pValue(g, g.neg(g.where(g.greater(a, -Math.LN2), 0.5, u)));
    const value = g.where(g.greater(a, -Math.LN2), near, far);
    return withSlope(g, value, a, g.neg(g.exp(g.sub(a, value))));
  });
}

/** x·x. */
export function square(g: Graph, x: Tensor): Tensor {
  return g.mul(x, x);
}

/** 1 where the 0/1 float mask is set (as bool). */
export function isSet(g: Graph, mask: Tensor): Tensor {
  return g.greater(mask, 0.5);
}

/** Bool → float of `like`'s dtype. */
export function toFloat(g: Graph, b: Tensor, like: Tensor): Tensor {
  return g.cast(b, like.dtype);
}

/**
 * log Σ_{mask} exp(x) along `axis` (dropped), stable by a stop-gradient max shift. Rows with no set
 * entry give MASKED (finite), so callers multiply them by a zero mask without NaN.
 */
export function logSumExpMasked(g: Graph, x: Tensor, mask: Tensor, axis: number): Tensor {
  return g.scope('lse', () => {
    const xm = g.where(isSet(g, mask), x, MASKED);
    const m = g.stopGradient(g.reduceMax(xm, [axis], true));
    const s = g.reduceSum(g.mul(g.exp(g.sub(xm, m)), mask), [axis], true);
    const empty = g.sub(1, g.reduceMax(mask, [axis], true));
    return g.squeeze(g.add(g.log(g.add(s, empty)), m), [axis]);
  });
}

/** Mean over all elements (a scalar). */
export function mean(g: Graph, x: Tensor): Tensor {
  return g.reduceMean(x, undefined, false);
}
