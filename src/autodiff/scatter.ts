/**
 * A scatter-add of rows that repeats to the bit whatever the thread count: data[idx[i]] += rows[i].
 * ONNX Runtime's CPU ScatterND(add) splits its updates over the thread pool, so the rows of a
 * repeated index land in varying order; ScatterElements(add) is repeatable but adds element by
 * element. Here the rows are sorted by index (a stable TopK), summed per run of equal indices as
 * differences of a float64 running sum (CumSum, sequential), and placed with a ScatterND(add) whose
 * indices are now distinct, so that no two updates meet.
 */
import { Graph, Tensor, attr } from '../onnx/graph.ts';

/**
 * data [V, ...rest] plus, at each row idx[i], rows[i] ([N, ...rest]; idx [N], int64 or int32,
 * within [-V, V); N may be 0). Each index's sum is off the exact one by the float64 running sum's
 * rounding (at most N · 2⁻⁵³ · Σ|rows| per column), then rounded once to data's dtype; every
 * operation's order depends on the values only, not on the threads.
 */
export function sortedScatterAdd(g: Graph, data: Tensor, idx: Tensor, rows: Tensor): Tensor {
  const i64 = idx.dtype === 'int64' ? idx : g.cast(idx, 'int64');
  // Negative indices count from the end (as Gather's do): one form per row, so that equal rows sort together.
  const dim0 = (t: Tensor) => (typeof t.shape?.[0] === 'number' ? g.ints([t.shape[0]]) : g.dim(t, 0));
  const id = g.op('Mod', [i64, dim0(data)], {}, [{ dtype: 'int64', shape: idx.shape }])[0];
  // TopK breaks ties by position: a stable sort, so each index's rows are summed in their order.
  const [sorted, perm] = g.op('TopK', [id, dim0(idx)], { axis: attr.int(0), largest: attr.int(0), sorted: attr.int(1) }, [
    { dtype: 'int64', shape: idx.shape },
    { dtype: 'int64', shape: idx.shape },
  ]);
  const [uniq, , , counts] = g.op('Unique', [sorted], { sorted: attr.int(1) }, [
    { dtype: 'int64', shape: ['?'] },
    { dtype: 'int64', shape: ['?'] },
    { dtype: 'int64', shape: idx.shape },
    { dtype: 'int64', shape: ['?'] },
  ]);
  const wide = rows.dtype === 'float64' ? g.gather(rows, perm, 0) : g.cast(g.gather(rows, perm, 0), 'float64');
  const running = g.cumSum(wide, 0);
  // The running sum at each run's last row, and at the one before it (0 before the first run).
  const last = g.sub(g.cumSum(counts, 0), g.constant(1, 'int64'));
  const atLast = g.gather(running, last, 0);
  const r = data.rank; // rows' too (their shape may be unknown in a graph read back from a file)
  // Shifted down a row: a zero row on top, the last row off (a negative pad crops).
  const pads = Array(2 * r).fill(0);
  pads[0] = 1;
  pads[r] = -1;
  const before = g.op('Pad', [atLast, g.ints(pads)], {}, [{ dtype: 'float64', shape: atLast.shape }])[0];
  const sums = g.sub(atLast, before);
  const out = sums.dtype === data.dtype ? sums : g.cast(sums, data.dtype);
  return g.scatterND(data, g.unsqueeze(uniq, [-1]), out, 'add');
}
