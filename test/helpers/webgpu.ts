/**
 * Whether the WebGPU tests can run here: an adapter (a GPU, or SwiftShader in CI), checked once.
 * With PREFZOO_REQUIRE_WEBGPU=1 (CI) a missing adapter fails the tests instead of skipping them;
 * otherwise the reason is printed and they are reported as skipped.
 */
import { checkDevice } from '../../src/runtime/session.ts';

export const webgpuRequired = process.env.PREFZOO_REQUIRE_WEBGPU === '1';

/** Null when an adapter was found, else why not (printed once for `file` unless required). */
export async function webgpuMissing(file: string): Promise<string | null> {
  try {
    await checkDevice({ ep: 'webgpu' });
    return null;
  } catch (e) {
    const reason = (e as Error).message;
    if (!webgpuRequired) process.stderr.write(`${file}: device tests not run: ${reason}\n`);
    return reason;
  }
}
