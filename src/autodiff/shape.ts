/**
 * Shape helpers shared by the gradient rules: shapes as int64 tensors (constants when known),
 * zeros/reshape/expand "like x", and unbroadcasting a gradient back to an input's shape.
 */
import { Graph, Tensor, attr, type Dim } from '../onnx/graph.ts';
import { typedArrayFrom } from '../onnx/dtype.ts';

/** Shape of x as a 1-D int64 tensor: a constant when every dim is known, else a Shape node. */
export function shapeTensor(g: Graph, x: Tensor): Tensor {
  const s = x.staticShape;
  return s ? g.ints(s) : g.shapeOf(x);
}

/** Zeros with x's dtype and shape. */
export function zerosLike(g: Graph, x: Tensor): Tensor {
  const value = attr.tensor({ dtype: x.dtype, dims: [1], data: typedArrayFrom(x.dtype, [0]) });
  return g.op('ConstantOfShape', [shapeTensor(g, x)], { value }, [{ dtype: x.dtype, shape: x.shape }])[0];
}

/** t reshaped to x's shape (same element count). */
export function reshapeLike(g: Graph, t: Tensor, x: Tensor): Tensor {
  const s = x.staticShape;
  if (s) return g.reshape(t, s);
  return g.op('Reshape', [t, g.shapeOf(x)], {}, [{ dtype: t.dtype, shape: x.shape }])[0];
}

/** t broadcast up to x's shape. */
export function expandLike(g: Graph, t: Tensor, x: Tensor): Tensor {
  if (sameShape(t.shape, x.shape)) return t;
  return g.op('Expand', [t, shapeTensor(g, x)], {}, [{ dtype: t.dtype, shape: x.shape }])[0];
}

/** True when both shapes are known and dim-for-dim identical (symbolic names included, '?' never). */
export function sameShape(a: Dim[] | null, b: Dim[] | null): boolean {
  return !!a && !!b && a.length === b.length && a.every((d, i) => d === b[i] && d !== '?');
}

/**
 * Sums a gradient of the broadcast shape back to the shape of input x (numpy broadcasting: extra
 * leading axes, and axes where x has size 1). Static when shapes decide it, else at run time.
 */
export function unbroadcast(g: Graph, grad: Tensor, x: Tensor): Tensor {
  if (sameShape(grad.shape, x.shape)) return grad;
  if (!grad.shape || !x.shape) return unbroadcastDynamic(g, grad, x);
  const lead = grad.shape.length - x.shape.length;
  if (lead < 0) throw new Error(`unbroadcast: gradient ${grad.name} has lower rank than ${x.name}`);
  // Decide each aligned axis statically: size-1 in x → sum (harmless if grad's is 1 too);
  // equal dims or a known size ≠ 1 in x → keep; a symbolic dim that differs could be 1 at run time.
  const axes: number[] = [];
  for (let i = 0; i < lead; i++) axes.push(i);
  let decidable = true;
  x.shape.forEach((d, i) => {
    const gd = grad.shape![i + lead];
    if (d === 1) axes.push(i + lead);
    else if (!(d === gd && d !== '?') && typeof d !== 'number') decidable = false;
  });
  if (!decidable) return unbroadcastDynamic(g, grad, x, lead);
  if (axes.length === 0) return g.op('Identity', [grad], {}, [{ dtype: grad.dtype, shape: x.shape }])[0];
  if (axes.length === lead) return g.reduceSum(grad, axes, false);
  const r = g.reduceSum(grad, axes, true);
  return lead > 0 ? g.squeeze(r, axes.slice(0, lead)) : r;
}

/**
 * Run-time unbroadcast: drop the leading axes (a count known statically or from the ranks at run
 * time), then sum with keepdims over the axes where x's run-time size is 1.
 */
function unbroadcastDynamic(g: Graph, grad: Tensor, x: Tensor, lead?: number): Tensor {
  const noop = { keepdims: attr.int(0), noop_with_empty_axes: attr.int(1) };
  let r = grad;
  if (lead === undefined) {
    const rankOf = (t: Tensor) => g.op('Size', [g.shapeOf(t)], {}, [{ dtype: 'int64', shape: [] }])[0];
    const leading = g.range(0, g.sub(rankOf(grad), rankOf(x)), 1);
    r = g.op('ReduceSum', [grad, leading], noop, [{ dtype: grad.dtype, shape: null }])[0];
  } else if (lead > 0) {
    r = g.reduceSum(grad, [...Array(lead).keys()], false);
  }
  const ones = g.op('NonZero', [g.equal(g.shapeOf(x), g.ints([1]))], {}, [{ dtype: 'int64', shape: [1, '?'] }])[0];
  const attrs = { keepdims: attr.int(1), noop_with_empty_axes: attr.int(1) };
  return g.op('ReduceSum', [r, g.reshape(ones, [-1])], attrs, [{ dtype: grad.dtype, shape: x.shape }])[0];
}
