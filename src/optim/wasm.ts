/**
 * The WebAssembly kernels of the in-process AdamW update (src/optim/host.ts), assembled here from
 * readable instruction lists — a module is a few hundred bytes, so no toolchain or binary file is
 * involved. Both kernels use 128-bit SIMD (four float32 lanes; two float64 lanes for sums) and read
 * one imported memory that holds every parameter, gradient and moment.
 *
 *   adamw(p, g, m, v, bytes, β1, β2, k1, k2, s, ε̂, d)   for each float32 x (4 at a time), in this order:
 *     m ← m·β1 + g·k1;  v ← v·β2 + (g·g)·k2;  p ← p·d − (m·s) / (√v + ε̂)
 *   sumsq(g, bytes) → Σ g² accumulated in float64
 *
 * Offsets and `bytes` are byte counts, multiples of 16 (callers do any remainder themselves). The
 * operation order is the optimizer graph's (src/optim/graph.ts), each a correctly rounded IEEE
 * float32 operation (WebAssembly SIMD has no fused multiply-add), so the results are those of the
 * graph given the same scalars.
 */

const I32 = 0x7f;
const F32 = 0x7d;
const F64 = 0x7c;
const V128 = 0x7b;

/** Unsigned LEB128. */
function uleb(n: number): number[] {
  const out: number[] = [];
  do {
    let b = n & 0x7f;
    n >>>= 7;
    if (n) b |= 0x80;
    out.push(b);
  } while (n);
  return out;
}

/** Signed LEB128 (i32.const immediates). */
function sleb(n: number): number[] {
  const out: number[] = [];
  for (;;) {
    const b = n & 0x7f;
    n >>= 7;
    if ((n === 0 && !(b & 0x40)) || (n === -1 && b & 0x40)) {
      out.push(b);
      return out;
    }
    out.push(b | 0x80);
  }
}

const name = (s: string) => [...uleb(s.length), ...Buffer.from(s, 'utf8')];
const vec = (items: number[][]) => [...uleb(items.length), ...items.flat()];
const section = (id: number, body: number[]) => [id, ...uleb(body.length), ...body];

// Instructions used by the kernels.
const get = (i: number) => [0x20, ...uleb(i)];
const set = (i: number) => [0x21, ...uleb(i)];
const tee = (i: number) => [0x22, ...uleb(i)];
const i32Const = (n: number) => [0x41, ...sleb(n)];
const i32Add = [0x6a];
const i32GeU = [0x4f];
const f64Const0 = [0x44, 0, 0, 0, 0, 0, 0, 0, 0];
const f64Add = [0xa0];
const simd = (op: number, ...imm: number[]) => [0xfd, ...uleb(op), ...imm];
const MEMARG = [4, 0]; // alignment 2^4, offset 0
const v128Load = simd(0x00, ...MEMARG);
const v128Store = simd(0x0b, ...MEMARG);
const v128Load64Zero = simd(0x5d, 3, 0); // alignment 2^3
const f32x4Splat = simd(0x13);
const f64x2Splat = simd(0x14);
const f64x2ExtractLane = (lane: number) => simd(0x21, lane);
const f64x2PromoteLow = simd(0x5f);
const f32x4 = { sqrt: simd(0xe3), add: simd(0xe4), sub: simd(0xe5), mul: simd(0xe6), div: simd(0xe7) };
const f64x2 = { add: simd(0xf0), mul: simd(0xf2) };

/** `for (i = 0; i < bytes; i += step) body` with i in local `i`; `bytes` is local `n`. */
function loop(i: number, n: number, step: number, body: number[]): number[] {
  return [0x02, 0x40, 0x03, 0x40, ...get(i), ...get(n), ...i32GeU, 0x0d, 1, ...body, ...get(i), ...i32Const(step), ...i32Add, ...set(i), 0x0c, 0, 0x0b, 0x0b];
}

/** Address `base + i` then the v128 at it. */
const at = (base: number, i: number) => [...get(base), ...get(i), ...i32Add];
const load = (base: number, i: number) => [...at(base, i), ...v128Load];

function adamwBody(): { params: number[]; locals: number[][]; code: number[] } {
  // params 0 p, 1 g, 2 m, 3 v, 4 bytes; 5 β1, 6 β2, 7 k1, 8 k2, 9 s, 10 ε̂, 11 d
  // locals 12 i; 13–19 splats of params 5–11; 20 g, 21 m', 22 v'
  const params = [I32, I32, I32, I32, I32, F32, F32, F32, F32, F32, F32, F32];
  const I = 12;
  const [B1, B2, K1, K2, S, E, D] = [13, 14, 15, 16, 17, 18, 19];
  const [G, M, V] = [20, 21, 22];
  const code: number[] = [];
  for (let k = 0; k < 7; k++) code.push(...get(5 + k), ...f32x4Splat, ...set(13 + k));
  const step = [
    ...load(1, I), ...set(G),
    // m' = m·β1 + g·k1
    ...at(2, I), ...load(2, I), ...get(B1), ...f32x4.mul, ...get(G), ...get(K1), ...f32x4.mul, ...f32x4.add, ...tee(M), ...v128Store,
    // v' = v·β2 + (g·g)·k2
    ...at(3, I), ...load(3, I), ...get(B2), ...f32x4.mul, ...get(G), ...get(G), ...f32x4.mul, ...get(K2), ...f32x4.mul, ...f32x4.add, ...tee(V), ...v128Store,
    // p' = p·d − (m'·s) / (√v' + ε̂)
    ...at(0, I), ...load(0, I), ...get(D), ...f32x4.mul,
    ...get(M), ...get(S), ...f32x4.mul, ...get(V), ...f32x4.sqrt, ...get(E), ...f32x4.add, ...f32x4.div,
    ...f32x4.sub, ...v128Store,
  ];
  code.push(...loop(I, 4, 16, step), 0x0b);
  return { params, locals: [[...uleb(1), I32], [...uleb(10), V128]], code };
}

function sumsqBody(): { params: number[]; locals: number[][]; code: number[] } {
  // params 0 g, 1 bytes; locals 2 i, 3 acc0, 4 acc1, 5 x
  const [I, A0, A1, X] = [2, 3, 4, 5];
  const half = (offset: number, acc: number) => [
    ...get(0), ...get(I), ...i32Add, ...(offset ? [...i32Const(offset), ...i32Add] : []), ...v128Load64Zero, ...f64x2PromoteLow, ...tee(X),
    ...get(X), ...f64x2.mul, ...get(acc), ...f64x2.add, ...set(acc),
  ];
  const code = [
    ...f64Const0, ...f64x2Splat, ...set(A0), ...f64Const0, ...f64x2Splat, ...set(A1),
    ...loop(I, 1, 16, [...half(0, A0), ...half(8, A1)]),
    ...get(A0), ...get(A1), ...f64x2.add, ...tee(A0), ...f64x2ExtractLane(0), ...get(A0), ...f64x2ExtractLane(1), ...f64Add,
    0x0b,
  ];
  return { params: [I32, I32], locals: [[...uleb(1), I32], [...uleb(3), V128]], code };
}

/** The module's bytes: imports env.memory, exports adamw and sumsq. */
export function kernelModule(): Uint8Array<ArrayBuffer> {
  const fns = [adamwBody(), sumsqBody()];
  const types = [
    [0x60, ...vec(fns[0].params.map((t) => [t])), ...vec([])],
    [0x60, ...vec(fns[1].params.map((t) => [t])), ...vec([[F64]])],
  ];
  const bodies = fns.map((f) => {
    const body = [...vec(f.locals), ...f.code];
    return [...uleb(body.length), ...body];
  });
  return Uint8Array.from([
    0x00, 0x61, 0x73, 0x6d, 0x01, 0x00, 0x00, 0x00,
    ...section(1, vec(types)),
    ...section(2, vec([[...name('env'), ...name('memory'), 0x02, 0x00, ...uleb(1)]])),
    ...section(3, vec([uleb(0), uleb(1)])),
    ...section(7, vec([[...name('adamw'), 0x00, ...uleb(0)], [...name('sumsq'), 0x00, ...uleb(1)]])),
    ...section(10, vec(bodies)),
  ]);
}

export interface Kernels {
  adamw(p: number, g: number, m: number, v: number, bytes: number, b1: number, b2: number, k1: number, k2: number, s: number, eps: number, d: number): void;
  sumsq(g: number, bytes: number): number;
}

/** Whether this runtime can compile the kernels (WebAssembly with SIMD). */
export function kernelsSupported(): boolean {
  try {
    return typeof WebAssembly === 'object' && WebAssembly.validate(kernelModule());
  } catch {
    return false;
  }
}

/** Instantiates the kernels over `memory`. */
export function instantiateKernels(memory: WebAssembly.Memory): Kernels {
  const module = new WebAssembly.Module(kernelModule());
  return new WebAssembly.Instance(module, { env: { memory } }).exports as unknown as Kernels;
}
