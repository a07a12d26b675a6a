/**
 * Host ↔ device copies for the WebGPU provider. onnxruntime-node hands GPU-buffer outputs to JS as
 * opaque handles it cannot read back itself (`Tensor.getData` is unimplemented for them), so copies
 * go through ONNX Runtime: an Identity graph whose output is left on the device (upload) or in host
 * memory (download). Used when a run starts and when a checkpoint is written, never per step.
 */
import { Graph } from '../onnx/graph.ts';
import { serializeModel } from '../onnx/proto.ts';
import type { DType } from '../onnx/dtype.ts';
import { Session, ort, type RuntimeOptions } from './session.ts';
import type { DeviceTransfer } from './store.ts';

function identityModel(dtype: DType): Uint8Array {
  const g = new Graph('copy');
  g.output(g.identity(g.input('x', dtype, null)), 'y');
  return serializeModel(g);
}

export class WebGpuTransfer implements DeviceTransfer {
  private readonly sessions = new Map<string, Promise<Session>>();

  constructor(private readonly runtime: RuntimeOptions) {}

  private session(dtype: DType, where: 'up' | 'down'): Promise<Session> {
    const key = `${dtype}:${where}`;
    let s = this.sessions.get(key);
    if (!s) {
      s = Session.create(identityModel(dtype), this.runtime, where === 'up' ? { y: 'gpu-buffer' } : { y: 'cpu' });
      this.sessions.set(key, s);
    }
    return s;
  }

  async toDevice(t: ort.Tensor): Promise<ort.Tensor> {
    return (await (await this.session(t.type as DType, 'up')).run({ x: t })).y;
  }

  async toHost(t: ort.Tensor): Promise<ort.Tensor> {
    return (await (await this.session(t.type as DType, 'down')).run({ x: t })).y;
  }

  async release(): Promise<void> {
    for (const s of this.sessions.values()) await (await s).release();
    this.sessions.clear();
  }
}
