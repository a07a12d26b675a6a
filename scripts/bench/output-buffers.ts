/**
 * Compares the two TensorStore output modes on a bandwidth-bound graph (p ← p·c, N floats):
 * 'adopt' takes ORT's returned output as the next value; 'preallocated' passes the back buffer as a
 * pre-allocated fetch and swaps. Rounds alternate between modes and the median is reported, since a
 * shared machine makes single timings noisy. Also reports whether ORT handed back the caller's buffer.
 *
 *   npx tsx scripts/bench/output-buffers.ts [N=5000000] [steps=50] [rounds=5]
 */
import { Graph } from '../../src/onnx/graph.ts';
import { serializeModel } from '../../src/onnx/proto.ts';
import { Session } from '../../src/runtime/session.ts';
import { TensorStore, type OutputMode } from '../../src/runtime/store.ts';

const n = Number(process.argv[2] ?? 5_000_000);
const steps = Number(process.argv[3] ?? 50);
const rounds = Number(process.argv[4] ?? 5);

const g = new Graph('scale');
g.output(g.mul(g.input('p', 'float32', [n]), 1.0000001), 'new.p');
const session = await Session.create(serializeModel(g), { threads: 2 });

const modes: OutputMode[] = ['adopt', 'preallocated'];
const times: Record<string, number[]> = { adopt: [], preallocated: [] };
let returnedCallersBuffer = false;
for (let r = 0; r < rounds; r++) {
  for (const mode of modes) {
    const store = new TensorStore(mode);
    store.define('p', 'float32', [n], new Float32Array(n).fill(1));
    await store.run(session, { p: store.tensor('p') }, [['new.p', 'p']], []); // warm-up
    const t0 = performance.now();
    for (let i = 0; i < steps; i++) {
      const out = await store.run(session, { p: store.tensor('p') }, [['new.p', 'p']], []);
      // In 'preallocated' mode the entry now holds the buffer ORT was asked to fill.
      if (mode === 'preallocated' && (out['new.p'].data as Float32Array).buffer === store.data('p').buffer) returnedCallersBuffer = true;
    }
    times[mode].push((performance.now() - t0) / steps);
  }
}
const median = (xs: number[]) => [...xs].sort((a, b) => a - b)[Math.floor(xs.length / 2)];
console.log(
  JSON.stringify({
    n,
    steps,
    rounds,
    msPerStep: { adopt: +median(times.adopt).toFixed(2), preallocated: +median(times.preallocated).toFixed(2) },
    preallocatedOutputReturnedAsCallersBuffer: returnedCallersBuffer,
  }),
);
await session.release();
