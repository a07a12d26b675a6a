/** Views of a listwise batch ([B, K] columns, `mask` optional: 1 = real entry, 0 = padding). */
import type { Graph, Tensor } from '../../src/onnx/graph.ts';
import { col } from './batch.ts';
import type { BatchTensors, HostBatch } from './types.ts';

export class ListHost {
  readonly B: number;
  readonly K: number;
  readonly mask: Float64Array;
  constructor(readonly batch: HostBatch) {
    const d = batch.policy_logps.dims;
    this.B = d[0];
    this.K = d[1];
    this.mask = batch.mask ? batch.mask.data : new Float64Array(this.B * this.K).fill(1);
  }
  key(k: string): Float64Array { return col(this.batch, k); }
  /** Indices (within row b) of the real entries. */
  valid(b: number): number[] {
    const out: number[] = [];
    for (let j = 0; j < this.K; j++) if (this.mask[b * this.K + j] > 0.5) out.push(j);
    return out;
  }
  /** ℓ = logp − ref, flat [B·K]. */
  logRatios(): Float64Array {
    const r = this.key('ref_logps');
    return this.key('policy_logps').map((x, i) => x - r[i]);
  }
}

/** The mask tensor of a listwise batch (all ones when the batch has none). */
export function listMask(g: Graph, inputs: BatchTensors): Tensor {
  if (inputs.mask) return inputs.mask;
  const p = inputs.policy_logps;
  return g.constantOfShape(g.shapeOf(p), 1, p.dtype);
}
