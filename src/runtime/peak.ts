/**
 * The machine's float32 MatMul throughput through ONNX Runtime: the denominator of model FLOP
 * utilisation. A square product large enough that packing and threading overheads are small;
 * operands are graph inputs (no constant folding). The peak is the fastest of the timed runs: other
 * work on the machine only ever slows a run, so the fastest is the best estimate of what the engine
 * can do (a median taken while another job ran once halved the figure and doubled every MFU).
 */
import { Graph } from '../onnx/graph.ts';
import { type RuntimeOptions, Session, toOrt } from './session.ts';
import { WebGpuTransfer } from './transfer.ts';

export interface MatmulPeak {
  /** The peak: GFLOP/s of the fastest timed run (2·n³ flops per run). */
  gflops: number;
  /** Median over the timed runs, GFLOP/s (lower when the machine is busy). */
  median: number;
  n: number;
  runs: number;
}

export async function measureMatmulPeak(runtime: RuntimeOptions = {}, o: { n?: number; runs?: number } = {}): Promise<MatmulPeak> {
  const device = (runtime.ep ?? 'cpu') !== 'cpu';
  // On a GPU: a larger square, a chain of products per run (one launch's overhead is nothing to time),
  // operands uploaded once, and only a scalar read back, which also waits for the GPU to finish.
  const n = o.n ?? (device ? 4096 : 2048);
  const chain = device ? 8 : 1;
  const runs = o.runs ?? 10;
  const g = new Graph('matmul_peak');
  const a = g.input('a', 'float32', [n, n]);
  const b = g.input('b', 'float32', [n, n]);
  let c = g.matmul(a, b);
  for (let i = 1; i < chain; i++) c = g.matmul(c, b);
  g.output(device ? g.reduceSum(c, undefined, false) : c, 'c');
  const session = await Session.fromGraph(g, runtime);
  const fill = () => Float32Array.from({ length: n * n }, (_, i) => ((i * 2654435761) % 1000) / 1000 - 0.5);
  let feeds = { a: toOrt('float32', fill(), [n, n]), b: toOrt('float32', fill(), [n, n]) };
  const transfer = runtime.ep === 'webgpu' ? new WebGpuTransfer(runtime) : null;
  if (transfer) feeds = { a: await transfer.toDevice(feeds.a), b: await transfer.toDevice(feeds.b) };
  await session.run(feeds); // warm-up: thread pool start, packing buffers, shader compilation
  const rates: number[] = [];
  for (let i = 0; i < runs; i++) {
    const t0 = performance.now();
    await session.run(feeds);
    rates.push((chain * 2 * n ** 3) / ((performance.now() - t0) / 1000) / 1e9);
  }
  await session.release();
  await transfer?.release();
  rates.sort((x, y) => x - y);
  return { gflops: rates[runs - 1], median: rates[Math.floor(runs / 2)], n, runs };
}
