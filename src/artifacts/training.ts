/**
 * Runs a training-artifacts folder: one session per graph, created once; parameters, optimizer
 * state and gradients live in a TensorStore and flow from graph to graph as ort.Tensors, so a step
 * never re-creates a session and never copies a parameter-sized array in JS.
 */
import fs from 'node:fs';
import path from 'node:path';
import { UserError } from '../errors.ts';
import { type Feeds, forwardRuntime, type RuntimeOptions, Session, ort, toOrt } from '../runtime/session.ts';
import { TensorStore, type OutputMode } from '../runtime/store.ts';
import { gradName, stateName, updatedName, OPTIM_IO } from '../optim/config.ts';
import type { RawTensor, TensorInfo } from '../models/safetensors.ts';
import { safetensorsDtype, readCheckpoint, writeCheckpoint, type CheckpointState, type CheckpointTensor } from './checkpoint.ts';
import { ARTIFACT_FILES, readManifest, type ArtifactsManifest } from './manifest.ts';
import type { TypedArray } from '../onnx/dtype.ts';
import { HostAdamW } from '../optim/host.ts';
import { WebGpuTransfer } from '../runtime/transfer.ts';
import { collectGarbage } from '../runtime/gc.ts';
import type { OutputLocation } from '../runtime/session.ts';

export interface LoadOptions {
  /** How graph outputs become the next parameter/state values (see runtime/store.ts); default 'adopt'. */
  outputMode?: OutputMode;
  /** Checkpoint folder to start from; default `<dir>/checkpoint` when it exists; false: start from zeros. */
  checkpoint?: string | false;
  /**
   * Where the optimizer update runs. 'graph': the optimizer graph (fused into the step graph when
   * nothing is accumulated). 'host': in this process, in place (src/optim/host.ts: float32 AdamW on
   * the CPU; the parameters and moments are never copied out of ONNX Runtime). 'auto' (default):
   * 'host' when it applies, else 'graph'.
   */
  update?: 'auto' | 'graph' | 'host';
}

export type Metrics = Record<string, number>;

function scalarOf(t: ort.Tensor, name: string): number {
  if (t.size !== 1) throw new Error(`output ${name} has ${t.size} elements; metrics must be scalars`);
  return Number(t.data[0]);
}

export class TrainingArtifacts {
  /** Optimizer updates applied so far. */
  step = 0;
  /** Micro-batches whose gradients are summed in the store and not yet applied. */
  private pending = 0;
  /** Sessions, created on first use: a run that only takes fused steps never loads the separate graphs. */
  private readonly sessions = new Map<string, Promise<Session>>();
  private readonly stepT = toOrt('int64', new BigInt64Array(1), []);
  private readonly lrT: ort.Tensor;
  private readonly scaleT: ort.Tensor;
  private readonly flagT = toOrt('bool', new Uint8Array(1), []);
  private readonly zeros = new Map<string, ort.Tensor>();
  private readonly trainable: string[];
  private readonly optUpdates: (readonly [string, string])[];
  private readonly gradUpdates: (readonly [string, string])[];

  private constructor(
    readonly dir: string,
    readonly manifest: ArtifactsManifest,
    readonly store: TensorStore,
    private readonly runtime: RuntimeOptions,
    /** The in-process optimizer, when updates run on the host. */
    private readonly host: HostAdamW | null,
    /** Host ↔ device copies when the store lives on the GPU (WebGPU), else null. */
    private readonly transfer: WebGpuTransfer | null,
  ) {
    const dtype = manifest.optimizer.dtype;
    const F = dtype === 'float32' ? Float32Array : Float64Array;
    this.lrT = toOrt(dtype, new F(1), []);
    this.scaleT = toOrt(dtype, new F(1), []);
    this.trainable = manifest.params.filter((p) => p.trainable).map((p) => p.name);
    const slots = manifest.optimizer.stateSlots;
    this.optUpdates = this.trainable.flatMap((p) => [
      [updatedName(p), p] as const,
      ...slots.map((s) => [updatedName(stateName(s, p)), stateName(s, p)] as const),
    ]);
    this.gradUpdates = this.trainable.map((p) => [manifest.training.grads[p], gradName(p)] as const);
  }

  /** Opens an artifacts folder and (by default) its checkpoint. */
  static async load(dir: string, given: RuntimeOptions = {}, opts: LoadOptions = {}): Promise<TrainingArtifacts> {
    // No memory pattern unless asked: ONNX Runtime plans one for each new set of input shapes on its
    // second run and holds it as one more block, and a run's batches change shape as their lengths
    // do (every GRPO round). With it, each new shape cost the `small` step about 7 s more twice
    // (10 s against 3) and 1.8 GB more RSS; without it the steady step was no slower (2.77–2.82 s
    // against 2.92–3.14 at a fixed shape) and peaked at 3.1 GB against 4.7 (docs/performance.md,
    // "The endpoint").
    const runtime: RuntimeOptions = { memPattern: false, ...given };
    const manifest = readManifest(dir);
    // On the GPU, parameters, optimizer state and gradients stay in GPU buffers from step to step.
    const transfer = runtime.ep === 'webgpu' ? new WebGpuTransfer(runtime) : null;
    const store = new TensorStore(opts.outputMode ?? 'adopt', transfer);
    const host = hostOptimizer(manifest, runtime, opts.update ?? 'auto');
    // With the host optimizer the parameters and moments live in its memory, updated in place.
    for (const p of manifest.params) store.define(p.name, p.dtype, p.shape, undefined, host && p.trainable ? host.param(p.name) : undefined);
    for (const p of manifest.params.filter((q) => q.trainable)) {
      store.define(gradName(p.name), p.dtype, p.shape);
      for (const s of manifest.optimizer.stateSlots) store.define(stateName(s, p.name), p.dtype, p.shape, undefined, host ? host.state(s, p.name) : undefined);
    }
    for (const g of [manifest.training, manifest.optimizer, manifest.eval, ...(manifest.step ? [manifest.step] : [])]) {
      if (!fs.existsSync(path.join(dir, g.file))) throw new UserError(`${path.join(dir, g.file)}: not found (the artifacts folder is incomplete; rebuild it)`);
    }
    const t = new TrainingArtifacts(dir, manifest, store, runtime, host, transfer);
    // The graph every step needs fails early here, not at the first step, if it cannot be loaded.
    await t.session(manifest.step && !host ? manifest.step.file : manifest.training.file);
    const ckpt = opts.checkpoint ?? path.join(dir, ARTIFACT_FILES.checkpoint);
    if (opts.checkpoint || (ckpt && fs.existsSync(ckpt))) t.loadCheckpoint(ckpt as string);
    return t;
  }

  private session(file: string): Promise<Session> {
    let s = this.sessions.get(file);
    if (!s) {
      // The eval graph is a forward: it keeps ONNX Runtime's arena where the step goes without it.
      // So do the gradient graphs of a forward built in pieces: each tensor under glibc's 32 MiB mmap
      // bound, the arena's regions are reused from piece to piece, where without it glibc's heap
      // kept far more than the live tensors (docs/performance.md, "The training forward in pieces").
      const arena = file === this.manifest.eval.file || (this.manifest.inPieces === true && file !== this.manifest.optimizer.file);
      const runtime = arena ? forwardRuntime(this.runtime) : this.runtime;
      s = Session.create(path.join(this.dir, file), runtime, this.outputLocations(file));
      this.sessions.set(file, s);
    }
    return s;
  }

  /**
   * Before a gradient run under a runtime without the arena (the memory-saving one): the eval
   * session, which keeps its arena, is let go, so the regions its forward grew are not resident
   * beside the step's peak. The next `evaluate` opens it again.
   */
  private async releaseEvalArena(): Promise<void> {
    if (this.runtime.arena !== false) return;
    await this.letGo(this.manifest.eval.file);
  }

  /** Closes the session of `file`, if open; the next use opens it again. */
  private async letGo(file: string): Promise<void> {
    const s = this.sessions.get(file);
    if (!s) return;
    this.sessions.delete(file);
    await (await s).release();
  }

  /**
   * After a gradient run that kept the arena under a runtime without it (a forward built in pieces):
   * the session is let go, so the regions its run grew are not resident beside the optimizer update
   * (the moments' pages, the gradients' copies); the next gradient run opens it again. Kept, they took
   * the 0.5B step at 1,024 tokens past 13.6 GB while the update ran (docs/performance.md).
   */
  private async releaseStepArena(file: string): Promise<void> {
    if (this.runtime.arena !== false || this.manifest.inPieces !== true) return;
    await this.letGo(file);
  }

  /** On the GPU: the outputs that become store entries stay on the device; loss and metrics come back. */
  private outputLocations(file: string): Record<string, OutputLocation> | undefined {
    if (!this.transfer) return undefined;
    const graph = [this.manifest.training, this.manifest.optimizer, this.manifest.eval, this.manifest.step].find((g) => g?.file === file);
    const kept = new Set([...this.optUpdates, ...this.gradUpdates].map(([out]) => out));
    return Object.fromEntries((graph?.outputs ?? []).map((o) => [o, kept.has(o) ? 'gpu-buffer' : 'cpu']));
  }

  /** Device runs: host values (just loaded or written) go to the GPU before a graph reads them. */
  private async ready(): Promise<void> {
    if (this.transfer) await this.store.toDevice();
  }

  /** Makes `param()` and `saveCheckpoint()` valid on the GPU by copying the state to the host; a no-op on the CPU. */
  async toHost(): Promise<void> {
    await this.store.toHost();
  }

  /** A read-only zero tensor shaped like parameter `name`, one per distinct dtype and shape (on the GPU there). */
  private async zerosLike(name: string): Promise<ort.Tensor> {
    const dtype = this.store.dtype(name);
    const dims = this.store.dims(name);
    const key = `${dtype}[${dims.join(',')}]`;
    let t = this.zeros.get(key);
    if (!t) {
      const n = dims.reduce((a, b) => a * b, 1);
      t = toOrt(dtype, dtype === 'float64' ? new Float64Array(n) : new Float32Array(n), dims);
      if (this.transfer) t = await this.transfer.toDevice(t);
      this.zeros.set(key, t);
    }
    return t;
  }

  /** Where optimizer updates run (see LoadOptions.update). */
  get updater(): 'graph' | 'host' {
    return this.host ? 'host' : 'graph';
  }

  get paramNames(): string[] {
    return this.manifest.params.map((p) => p.name);
  }

  get trainableNames(): string[] {
    return [...this.trainable];
  }

  /** Current values of a parameter (a live view, replaced by the next optimizer step). */
  param(name: string): TypedArray {
    if (!this.manifest.params.some((p) => p.name === name)) throw new UserError(`no parameter named ${name}`);
    return this.store.data(name);
  }

  setParam(name: string, values: ArrayLike<number> | TypedArray): void {
    if (!this.manifest.params.some((p) => p.name === name)) throw new UserError(`no parameter named ${name}`);
    this.store.write(name, values);
  }

  private feedsFor(inputs: readonly string[], batch: Feeds, extra: Feeds, graph: string): Feeds {
    const feeds: Feeds = {};
    for (const name of inputs) {
      if (extra[name]) feeds[name] = extra[name];
      else if (this.store.has(name)) feeds[name] = this.store.tensor(name);
      else if (batch[name]) feeds[name] = batch[name];
      else throw new UserError(`${graph}: batch input "${name}" is missing (expected ${this.manifest.batchInputs.map((b) => b.name).join(', ')})`);
    }
    return feeds;
  }

  /**
   * Forward + backward on one micro-batch; its gradients are added to those of earlier micro-batches
   * not yet applied. Returns the loss and metrics of this micro-batch.
   */
  async computeGradients(batch: Feeds): Promise<Metrics> {
    const m = this.manifest.training;
    const extra: Feeds = {};
    if (m.accumulation) {
      if (m.accumulation.flag) {
        (this.flagT.data as Uint8Array)[0] = this.pending > 0 ? 1 : 0;
        extra[m.accumulation.flag] = this.flagT;
      }
      // A fresh accumulation starts from zeros (the flag of older folders ignores what it is fed).
      for (const p of this.trainable) extra[m.accumulation.inputs[p]] = this.pending > 0 || m.accumulation.flag ? this.store.tensor(gradName(p)) : await this.zerosLike(p);
    } else if (this.pending > 0) {
      throw new UserError('these artifacts were built without gradient accumulation; apply an optimizer step after each batch');
    }
    await this.ready();
    await this.releaseEvalArena();
    const feeds = this.feedsFor(m.inputs, batch, extra, m.file);
    const fetch = [m.loss, ...m.metrics];
    const out = await this.store.run(await this.session(m.file), feeds, this.gradUpdates, fetch);
    await this.releaseStepArena(m.file);
    this.pending++;
    const metrics: Metrics = {};
    for (const name of fetch) metrics[name] = scalarOf(out[name], name);
    return metrics;
  }

  /**
   * Applies one optimizer update with learning rate `lr` to the summed gradients, scaled by
   * `gradScale` (default 1/number of micro-batches, i.e. their mean). Returns the pre-clip norm.
   */
  async optimizerStep(lr: number, opts: { gradScale?: number } = {}): Promise<{ gradNorm: number }> {
    if (this.pending === 0) throw new Error('optimizerStep: no gradients computed since the last update');
    if (!Number.isFinite(lr)) throw new UserError(`learning rate must be finite, got ${lr}`);
    if (this.host) {
      const grads = new Map(this.trainable.map((p) => [p, this.store.data(gradName(p)) as Float32Array]));
      const gradNorm = this.host.update(grads, this.step + 1, lr, opts.gradScale ?? 1 / this.pending);
      grads.clear();
      this.step++;
      this.pending = 0;
      this.dropGradients();
      return { gradNorm };
    }
    const o = this.manifest.optimizer;
    this.setScalars(lr, opts.gradScale ?? 1 / this.pending);
    const extra: Feeds = { [OPTIM_IO.step]: this.stepT, [OPTIM_IO.lr]: this.lrT, [OPTIM_IO.gradScale]: this.scaleT };
    await this.ready();
    const feeds = this.feedsFor(o.inputs, {}, extra, o.file);
    const out = await this.store.run(await this.session(o.file), feeds, this.optUpdates, [OPTIM_IO.gradNorm]);
    this.step++;
    this.pending = 0;
    return { gradNorm: scalarOf(out[OPTIM_IO.gradNorm], OPTIM_IO.gradNorm) };
  }

  /**
   * One training step on a batch. With `accumulate: true` the batch is a non-final micro-batch: its
   * gradients are summed and no update happens. Otherwise the summed gradients are applied with `lr`,
   * unless this batch's loss is not finite: then parameters, optimizer state and the step count stay
   * as they were and the pending gradients are dropped (the returned loss tells the caller).
   * A step with nothing pending runs the fused graph (forward, backward and update in one run).
   */
  async trainStep(batch: Feeds, opts: { lr: number; accumulate?: boolean }): Promise<Metrics> {
    if (!opts.accumulate && this.pending === 0 && this.manifest.step && !this.host) return this.fusedStep(batch, opts.lr);
    const metrics = await this.computeGradients(batch);
    if (opts.accumulate) return metrics;
    if (!Number.isFinite(metrics[this.manifest.training.loss])) {
      this.pending = 0;
      return metrics;
    }
    metrics[OPTIM_IO.gradNorm] = (await this.optimizerStep(opts.lr)).gradNorm;
    return metrics;
  }

  /**
   * After a host update the gradients are spent: the next run returns new ones. Letting go of them
   * now, and collecting them once they are large, keeps two generations (2 GB each for a 0.5B model)
   * from being alive at once: onnxruntime-node hands outputs back as JavaScript copies, which V8
   * frees only when it next collects.
   */
  private dropGradients(): void {
    let bytes = 0;
    for (const p of this.trainable) {
      bytes += this.store.data(gradName(p)).byteLength;
      this.store.drop(gradName(p));
    }
    if (bytes >= GC_AFTER_BYTES) collectGarbage();
  }

  private setScalars(lr: number, gradScale: number): void {
    if (!Number.isFinite(lr)) throw new UserError(`learning rate must be finite, got ${lr}`);
    (this.stepT.data as BigInt64Array)[0] = BigInt(this.step + 1);
    (this.lrT.data as Float32Array)[0] = lr;
    (this.scaleT.data as Float32Array)[0] = gradScale;
  }

  /** Forward, backward and update of one batch in the fused graph; the update is kept only for a finite loss. */
  private async fusedStep(batch: Feeds, lr: number): Promise<Metrics> {
    const m = this.manifest.step!;
    const t = this.manifest.training;
    this.setScalars(lr, 1);
    const extra: Feeds = { [OPTIM_IO.step]: this.stepT, [OPTIM_IO.lr]: this.lrT, [OPTIM_IO.gradScale]: this.scaleT };
    await this.ready();
    await this.releaseEvalArena();
    const feeds = this.feedsFor(m.inputs, batch, extra, m.file);
    const fetch = [t.loss, ...t.metrics, OPTIM_IO.gradNorm];
    const out = await this.store.run(await this.session(m.file), feeds, this.optUpdates, fetch, (r) => Number.isFinite(scalarOf(r[t.loss], t.loss)));
    await this.releaseStepArena(m.file);
    const metrics: Metrics = {};
    for (const name of fetch) metrics[name] = scalarOf(out[name], name);
    if (Number.isFinite(metrics[t.loss])) this.step++;
    return metrics;
  }

  /** Runs the eval graph on a batch with the current parameters; returns every eval output. */
  async evaluate(batch: Feeds): Promise<Record<string, ort.Tensor>> {
    await this.ready();
    const feeds = this.feedsFor(this.manifest.eval.inputs, batch, {}, this.manifest.eval.file);
    return (await this.session(this.manifest.eval.file)).run(feeds);
  }

  /**
   * Writes params, optimizer state and `state` (step is filled in) to `dir` atomically (on the GPU:
   * after `await toHost()`); `files` adds more safetensors files to the same folder.
   */
  saveCheckpoint(dir: string, extra: Omit<CheckpointState, 'step'> = {}, files: Record<string, Map<string, CheckpointTensor>> = {}): void {
    if (this.pending > 0) throw new Error('saveCheckpoint: gradients of an unfinished accumulation would be lost; save after optimizerStep');
    const tensor = (name: string): CheckpointTensor => ({ dtype: this.store.dtype(name), shape: this.store.dims(name), data: this.store.data(name) });
    const params = new Map(this.manifest.params.map((p) => [p.name, tensor(p.name)]));
    const optimizer = new Map<string, CheckpointTensor>();
    for (const p of this.trainable) for (const s of this.manifest.optimizer.stateSlots) optimizer.set(stateName(s, p), tensor(stateName(s, p)));
    writeCheckpoint(dir, params, optimizer, { ...extra, step: this.step }, files);
  }

  /** Restores params, optimizer state and the step counter; returns the saved state. */
  loadCheckpoint(dir: string): CheckpointState {
    // Each tensor is checked against the artifacts, then read straight into the store's memory: a
    // 0.5B model's checkpoint (2 GB of parameters, 4 GB of moments) is not held a second time.
    const into = (name: string, t: TensorInfo, file: string): Uint8Array | undefined => {
      if (!this.store.has(name)) return undefined;
      const want = { dtype: safetensorsDtype(this.store.dtype(name)), shape: this.store.dims(name) };
      if (t.dtype !== want.dtype || t.shape.length !== want.shape.length || t.shape.some((d, i) => d !== want.shape[i])) {
        throw new UserError(`${file}: tensor "${name}" is ${t.dtype}[${t.shape}], the artifacts expect ${want.dtype}[${want.shape}]`);
      }
      if (this.store.onDevice(name)) return undefined;
      const dst = this.store.data(name);
      return new Uint8Array(dst.buffer, dst.byteOffset, dst.byteLength);
    };
    const c = readCheckpoint(dir, into);
    const copyIn = (file: string, tensors: Map<string, RawTensor>, name: string) => {
      const t = tensors.get(name);
      if (!t) throw new UserError(`${path.join(c.dir, file)}: tensor "${name}" is missing`);
      // Read into a fresh buffer (offset 0, aligned) when the value lives on the device.
      if (this.store.onDevice(name)) this.store.write(name, new (this.store.dtype(name) === 'float64' ? Float64Array : Float32Array)(t.data.buffer as ArrayBuffer));
    };
    for (const p of this.manifest.params) copyIn('params.safetensors', c.params, p.name);
    for (const p of this.trainable) for (const s of this.manifest.optimizer.stateSlots) copyIn('optimizer.safetensors', c.optimizer, stateName(s, p));
    this.step = c.state.step;
    this.pending = 0;
    return c.state;
  }

  async release(): Promise<void> {
    const open = [...this.sessions.values()];
    this.sessions.clear();
    for (const s of open) await (await s).release();
    await this.transfer?.release();
  }
}

/** Gradients at least this large are collected as soon as the host optimizer has used them. */
const GC_AFTER_BYTES = 256 * 2 ** 20;

/** The host optimizer for `update` (see LoadOptions), or null for the graph. */
function hostOptimizer(manifest: ArtifactsManifest, runtime: RuntimeOptions, update: 'auto' | 'graph' | 'host'): HostAdamW | null {
  if (update === 'graph') return null;
  const params = manifest.params.filter((p) => p.trainable).map((p) => ({ name: p.name, numel: p.shape.reduce((a, b) => a * b, 1), decay: p.decay }));
  const why =
    runtime.ep === 'cuda' || runtime.ep === 'webgpu'
      ? `the ${runtime.ep === 'cuda' ? 'CUDA' : 'WebGPU'} provider keeps parameters and moments on the GPU`
      : manifest.optimizer.dtype !== 'float32' || manifest.params.some((p) => p.trainable && p.dtype !== 'float32')
        ? 'the parameters are not float32'
        : HostAdamW.unsupported(params, manifest.optimizer.config);
  if (why !== null) {
    if (update === 'host') throw new UserError(`the in-process optimizer update cannot run here: ${why}`);
    return null;
  }
  return HostAdamW.create(params, manifest.optimizer.config);
}
