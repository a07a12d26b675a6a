/**
 * The step graph's draw (`drawToken`: float32 exps cast to float64, float64 sums, a running sum in
 * blocks of 128 ids, then within the block the draw lands in) against a plain float64 draw written
 * here: Math.exp of the shifted logits, one running sum over the whole row, the first id past
 * uniform × total; and the drawn id's log-probability against (l − max)/t − log Σ e^((l − max)/t)
 * summed here in one float64 loop. The graph's weights are float32 exps: each within
 * (2 + c·|x|)·2⁻²⁴ of the float64 one (x the exponent; c = 1 at temperature 1, 3 with the division),
 * 2 units being the Exp kernel's own error (checked first, over float32 inputs down to −87). Summed
 * over a row that gives the error budget E = Σ_i w_i·(2 + c·|x_i|)·2⁻²⁴: the log-probability must be
 * within E/total of the reference, and the drawn id must be one a float64 draw gives for a uniform
 * moved by at most 2E/total (the graph's running sums and total are each within E of the exact
 * ones); the ids must equal the reference's wherever the uniform is further than that from a
 * boundary. Rows of several vocabulary sizes (a multiple of the block, one that is not, one smaller
 * than a block), a vocabulary limit below the size, temperatures, and uniforms at 0, near 1, on block
 * boundaries and just outside the budget of one; the logits are sharp enough that a few ids carry
 * most of the mass.
 */
import { describe, expect, it } from 'vitest';
import { Graph } from '../src/onnx/graph.ts';
import { Session, toOrt } from '../src/runtime/session.ts';
import { drawToken } from '../src/models/decode.ts';
import { SeededRandom } from '../src/random.ts';

const U = 2 ** -24;

/** The reference draw: float64 weights, their running sums over the ids below `limit`, and the error budget of the graph's float32 weights. */
function reference(logits: Float32Array, limit: number, t: number | null) {
  let max = -Infinity;
  for (let i = 0; i < limit; i++) max = Math.max(max, logits[i]);
  const c = t === null ? 1 : 3;
  const x = Array.from({ length: limit }, (_, i) => (logits[i] - max) / (t ?? 1));
  const w = x.map(Math.exp);
  const run: number[] = [];
  let total = 0;
  let budget = 0;
  for (let i = 0; i < limit; i++) {
    total += w[i];
    run.push(total);
    // A float32 exp may flush a result below float32's normal range to 0: an absolute 2⁻¹²⁶ each.
    budget += w[i] * (2 + c * Math.abs(x[i])) * U * 1.01 + 2 ** -126;
  }
  const logp = (id: number) => x[id] - Math.log(total);
  /** The id a float64 draw gives for `u`: the first whose running sum exceeds u·total, else the last. */
  const draw = (u: number) => {
    const i = run.findIndex((r) => r > u * total);
    return i < 0 ? limit - 1 : i;
  };
  // The float64 sums of the graph associate differently: ~1e-16 relative, covered by 1e-12.
  return { run, total, logp, draw, tol: budget / total + 1e-12 };
}

async function graphDraw(V: number, temperature: number | null): Promise<(logits: Float32Array, B: number, limit: number, u: Float64Array) => Promise<{ ids: number[]; logps: Float64Array }>> {
  const g = new Graph('draw');
  const x = g.input('logits', 'float32', ['batch', V]);
  const t = temperature === null ? null : g.input('temperature', 'float64', []);
  const draw = drawToken(g, x, g.input('vocab_limit', 'int64', [1]), t);
  g.output(draw.token, 'token');
  g.output(draw.logprob, 'logprob');
  const s = await Session.fromGraph(g);
  return async (logits, B, limit, u) => {
    const feeds = {
      logits: toOrt('float32', logits, [B, V]),
      vocab_limit: toOrt('int64', BigInt64Array.of(BigInt(limit)), [1]),
      uniform: toOrt('float64', u, [B, 1]),
      ...(temperature === null ? {} : { temperature: toOrt('float64', Float64Array.of(temperature), []) }),
    };
    const out = await s.run(feeds);
    return { ids: Array.from(out.token.data as BigInt64Array, Number), logps: out.logprob.data as Float64Array };
  };
}

describe('the graph draw (drawToken)', () => {
  it('the float32 Exp kernel is within 2 rounding units of Math.exp (the budget below assumes it)', async () => {
    const g = new Graph('exp');
    g.output(g.exp(g.input('x', 'float32', ['n'])), 'y');
    const s = await Session.fromGraph(g);
    // Every 997th float32 from −0 down to −87 (bit patterns in order), and 0.
    const bits = new Uint32Array(1);
    const f = new Float32Array(bits.buffer);
    f[0] = -87;
    const xs = Float32Array.from({ length: Math.floor((bits[0] - 0x80000000) / 997) + 1 }, (_, k) => {
      bits[0] = 0x80000000 + k * 997;
      return f[0];
    });
    const y = (await s.run({ x: toOrt('float32', xs, [xs.length]) })).y.data as Float32Array;
    let worst = 0;
    for (let i = 0; i < xs.length; i++) worst = Math.max(worst, Math.abs(y[i] - Math.exp(xs[i])) / Math.exp(xs[i]));
    expect(xs.length).toBeGreaterThan(1e6);
    expect(y[0]).toBe(1);
    expect(worst / U).toBeLessThanOrEqual(2);
    // And it is not exact: a float64 exp would leave nothing to budget for.
    expect(worst / U).toBeGreaterThan(0.25);
  });

  for (const V of [1000, 1024, 50]) {
    for (const temperature of [null, 0.7]) {
      it(`V ${V}, ${temperature === null ? 'temperature 1 (no division)' : `temperature ${temperature}`}`, async () => {
        const draw = await graphDraw(V, temperature);
        const rng = new SeededRandom([V, 7, temperature === null ? 1 : 2, 9]);
        const B = 48;
        let checked = 0;
        let differ = 0;
        let worst = 0;
        let worstTol = Infinity;
        const distinct = new Set<number>();
        for (const limit of [V, V - 13]) {
          for (let rep = 0; rep < 4; rep++) {
            // Sharp rows (a few ids dominate) and flat ones.
            const scale = rep % 2 ? 8 : 0.5;
            const logits = new Float32Array(B * V).map(() => scale * (rng.next() * 2 - 1) ** 3);
            const refs = Array.from({ length: B }, (_, b) => reference(logits.subarray(b * V, (b + 1) * V), limit, temperature));
            const u = new Float64Array(B).map(() => rng.next());
            u[0] = 0;
            u[1] = 1 - 2 ** -53;
            // Either side of the boundary after id 255 (the second block's end): within 1e-9, where
            // either id is allowed, and just outside the row's budget, where only the reference's is.
            if (V > 256 && limit > 256) {
              for (const [row, at] of [[2, 1 + 1e-9], [3, 1 - 1e-9], [4, null], [5, null]] as const) {
                const r = refs[row];
                const edge = r.run[255] / r.total;
                u[row] = at !== null ? edge * at : edge + (row === 4 ? 1.5 : -1.5) * 2 * r.tol;
              }
            }
            const got = await draw(logits, B, limit, u);
            for (let b = 0; b < B; b++) {
              const r = refs[b];
              const id = got.ids[b];
              const want = r.draw(u[b]);
              const where = `limit ${limit}, rep ${rep}, row ${b}, u ${u[b]}, id ${id}, float64 ${want}`;
              // The graph's id is a float64 draw's for a uniform moved by at most 2·tol.
              expect(id, where).toBeGreaterThanOrEqual(0);
              expect(id, where).toBeLessThan(limit);
              expect(id === 0 ? 0 : r.run[id - 1] / r.total, where).toBeLessThanOrEqual(u[b] + 2 * r.tol);
              expect(id === limit - 1 || r.run[id] / r.total > u[b] - 2 * r.tol, where).toBe(true);
              if (id !== want) {
                differ++;
                expect([2, 3], `${where}: ids differ away from the boundary rows`).toContain(b);
              }
              const d = Math.abs(got.logps[b] - r.logp(id));
              expect(d, `log-probability, ${where}`).toBeLessThanOrEqual(r.tol);
              distinct.add(want);
              worst = Math.min(worst, r.logp(id));
              worstTol = Math.min(worstTol, r.tol);
              checked++;
            }
          }
        }
        expect(checked).toBe(2 * 4 * B);
        expect(differ).toBeLessThanOrEqual(2 * 4 * 2);
        // The budget is tight enough to mean something: under 1e-5 on every row.
        expect(worstTol).toBeLessThan(1e-5);
        // The draws spread over the vocabulary (the test is not all one id).
        expect(distinct.size).toBeGreaterThan(Math.min(40, V / 4));
        // Unlikely draws too (the u near 1 on sharp rows): the log-probabilities span a wide range.
        expect(worst).toBeLessThan(-10);
      });
    }
  }
});
