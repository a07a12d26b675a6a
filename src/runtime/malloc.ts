/**
 * glibc's malloc and the large models' steps.
 *
 * With ONNX Runtime's arena off (LOW_MEMORY_RUNTIME; `RuntimeOptions.arena: false`)
 * every intermediate tensor is a malloc and a free. glibc serves blocks above its mmap threshold with their own mappings, but by
 * default it raises that threshold to the size of each mapped block freed, up to 32 MiB. A 0.5B
 * step's tensors of 20–30 MB then come from the heap, which fragments and keeps what it took: two
 * steps at 1,024 tokens with recomputation peaked at 13.1 GiB, 9.7 GiB resident after them. With the
 * threshold fixed at 64 KiB every such block is mapped and unmapped on its own: 11.0 GiB peak, 6.7
 * resident, and no slower (505–509 s a step against 518–529). docs/performance.md, "Real sizes".
 *
 * At the bench's default batch (2,048 tokens, no recomputation) the same setting cost speed: 86.2 s a
 * step against 78.7 (14.6 GiB peak against 16.9). So it is not set for every run: glibc reads it only
 * when a process starts, and the choice between the two belongs to the user. Under recomputation,
 * the setting for memory, `train` and `bench` advise it in one line when it is absent. Issue 46 found
 * the other side of it: past 256 tokens at the 0.5B shape the tensors pass 32 MiB, so even glibc's
 * default maps each afresh, zero-filled page by page on every run (a 3–10× cost per token). Forward-only
 * sessions (eval, scoring) now keep the arena (session.ts `forwardRuntime`); for the step the arena
 * raised the 1,024-token peak past issue 15's bar, its shrinkage and extension strategy are not
 * reachable from onnxruntime-node, and `GLIBC_TUNABLES=glibc.malloc.hugetlb=1` kept the speed but
 * peaked at 12.9–14.4 GB, so the step still goes without both (docs/performance.md, "Real sequence
 * lengths") — except a step whose forward was built in pieces under the bound (artifacts.json's
 * `inPieces`): there every tensor's block is reused by the arena, and its gradient sessions keep it.
 */

/** The value advised. */
export const MMAP_THRESHOLD = 65536;

/** This process's fixed mmap threshold in bytes, or null when glibc's adaptive default is in force. */
export function mmapThreshold(): number | null {
  const v = process.env.MALLOC_MMAP_THRESHOLD_;
  if (v === undefined || !/^\d+$/.test(v.trim())) return null;
  return Number(v);
}

/**
 * A line for the log advising the fixed threshold for a CPU run with recomputation (the memory
 * setting) on Linux, when it is absent; otherwise null.
 */
export function mallocAdvice(gradientCheckpointing: boolean, device: string): string | null {
  if (!gradientCheckpointing || device !== 'cpu' || process.platform !== 'linux' || mmapThreshold() !== null) return null;
  return `memory: glibc's adaptive mmap threshold is in force; starting with MALLOC_MMAP_THRESHOLD_=${MMAP_THRESHOLD} in the environment lowers a 0.5B step's peak by about 2 GiB (docs/performance.md)`;
}
