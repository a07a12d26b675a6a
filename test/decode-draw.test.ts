/**
 * The step graph's draw (`drawToken`: float64 weights, a running sum in blocks of 128 ids, then
 * within the block the draw lands in) against a plain float64 draw written here: Math.exp of the
 * shifted logits, one running sum over the whole row, the first id past uniform × total; and the
 * drawn id's log-probability against (l − max)/t − log Σ e^((l − max)/t) summed here in one float64
 * loop (within 1e-12: the graph's sum associates differently and ONNX Runtime's float64 Exp is not
 * Math.exp, both at the ~1e-16 relative level; the log-probabilities are at most ~10). Rows of
 * several vocabulary sizes (a multiple of the block, one that is not, one smaller than a block),
 * a vocabulary limit below the size, temperatures, and uniforms at 0, near 1 and on block
 * boundaries; the logits are sharp enough that a few ids carry most of the mass.
 */
import { describe, expect, it } from 'vitest';
import { Graph } from '../src/onnx/graph.ts';
import { Session, toOrt } from '../src/runtime/session.ts';
import { drawToken } from '../src/models/decode.ts';
import { SeededRandom } from '../src/random.ts';

/** The reference: the first id below `limit` whose running float64 sum exceeds u·total, and its log-probability. */
function referenceDraw(logits: Float32Array, limit: number, t: number, u: number): { id: number; logp: number } {
  let max = -Infinity;
  for (let i = 0; i < limit; i++) max = Math.max(max, logits[i]);
  const w = Array.from({ length: limit }, (_, i) => Math.exp((logits[i] - max) / t));
  const total = w.reduce((a, b) => a + b, 0);
  const logp = (id: number) => (logits[id] - max) / t - Math.log(total);
  let run = 0;
  for (let i = 0; i < limit; i++) {
    run += w[i];
    if (run > u * total) return { id: i, logp: logp(i) };
  }
  return { id: limit - 1, logp: logp(limit - 1) };
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
  for (const V of [1000, 1024, 50]) {
    for (const temperature of [null, 0.7]) {
      it(`V ${V}, ${temperature === null ? 'temperature 1 (no division)' : `temperature ${temperature}`}`, async () => {
        const draw = await graphDraw(V, temperature);
        const rng = new SeededRandom([V, 7, temperature === null ? 1 : 2, 9]);
        const B = 48;
        let checked = 0;
        let worst = 0;
        const distinct = new Set<number>();
        for (const limit of [V, V - 13]) {
          for (let rep = 0; rep < 4; rep++) {
            // Sharp rows (a few ids dominate) and flat ones.
            const scale = rep % 2 ? 8 : 0.5;
            const logits = new Float32Array(B * V).map(() => scale * (rng.next() * 2 - 1) ** 3);
            const u = new Float64Array(B).map(() => rng.next());
            u[0] = 0;
            u[1] = 1 - 2 ** -53;
            // A uniform just past the end of the second block's mass, and one just short of it.
            const row2 = logits.subarray(2 * V, 3 * V);
            if (V > 256 && limit > 256) {
              let max = -Infinity;
              for (let i = 0; i < limit; i++) max = Math.max(max, row2[i]);
              const t = temperature ?? 1;
              let total = 0;
              let upTo = 0;
              for (let i = 0; i < limit; i++) {
                total += Math.exp((row2[i] - max) / t);
                if (i === 255) upTo = total;
              }
              u[2] = (upTo / total) * (1 + 1e-9);
              u[3] = (upTo / total) * (1 - 1e-9);
            }
            const got = await draw(logits, B, limit, u);
            for (let b = 0; b < B; b++) {
              const want = referenceDraw(logits.subarray(b * V, (b + 1) * V), limit, temperature ?? 1, u[b]);
              expect(got.ids[b], `limit ${limit}, rep ${rep}, row ${b}, u ${u[b]}`).toBe(want.id);
              expect(Math.abs(got.logps[b] - want.logp), `log-probability, limit ${limit}, rep ${rep}, row ${b}`).toBeLessThan(1e-12);
              distinct.add(want.id);
              worst = Math.min(worst, want.logp);
              checked++;
            }
          }
        }
        expect(checked).toBe(2 * 4 * B);
        // The draws spread over the vocabulary (the test is not all one id).
        expect(distinct.size).toBeGreaterThan(Math.min(40, V / 4));
        // Unlikely draws too (the u near 1 on sharp rows): the log-probabilities span a wide range.
        expect(worst).toBeLessThan(-10);
      });
    }
  }
});
