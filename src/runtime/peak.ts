/**
 * The machine's float32 MatMul throughput through ONNX Runtime: the denominator of model FLOP
 * utilisation. A square product large enough that packing and threading overheads are small;
 * operands are graph inputs (no constant folding). The peak is the fastest of the timed runs: other
 * work on the machine only ever slows a run, so the fastest is the best estimate of what the engine
 * can do (a median taken while another job ran once halved the figure and doubled every MFU).
 */
import { Graph } from '../onnx/graph.ts';
import { serializeModel } from '../onnx/proto.ts';
import { type RuntimeOptions, Session, toOrt } from './session.ts';

export interface MatmulPeak {
  /** The peak: GFLOP/s of the fastest timed run (2·n³ flops per run). */
  gflops: number;
  /** Median over the timed runs, GFLOP/s (lower when the machine is busy). */
  median: number;
  n: number;
  runs: number;
}

export async function measureMatmulPeak(runtime: RuntimeOptions = {}, o: { n?: number; runs?: number } = {}): Promise<MatmulPeak> {
  const n = o.n ?? 2048;
  const runs = o.runs ?? 10;
  const g = new Graph('matmul_peak');
  g.output(g.matmul(g.input('a', 'float32', [n, n]), g.input('b', 'float32', [n, n])), 'c');
  const session = await Session.create(serializeModel(g), runtime);
  const fill = () => Float32Array.from({ length: n * n }, (_, i) => ((i * 2654435761) % 1000) / 1000 - 0.5);
  const feeds = { a: toOrt('float32', fill(), [n, n]), b: toOrt('float32', fill(), [n, n]) };
  await session.run(feeds); // warm-up: thread pool start, packing buffers
  const rates: number[] = [];
  for (let i = 0; i < runs; i++) {
    const t0 = performance.now();
    await session.run(feeds);
    rates.push((2 * n ** 3) / ((performance.now() - t0) / 1000) / 1e9);
  }
  await session.release();
  rates.sort((a, b) => a - b);
  return { gflops: rates[runs - 1], median: rates[Math.floor(runs / 2)], n, runs };
}
