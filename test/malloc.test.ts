import { describe, it, expect } from 'vitest';
import { spawnSync } from 'node:child_process';
import { resolve } from 'node:path';
import { MMAP_THRESHOLD, mallocAdvice, mmapThreshold } from '../src/runtime/malloc.ts';

const bin = resolve(__dirname, '..', 'bin', 'prefzoo.mjs');
const benchArgs = ['bench', '--preset', 'tiny', '--steps', '1', '--warmup', '0', '--no-peak', '--gradient-checkpointing', '--json'];
// The environment of a shell that has not set the variable.
const plainEnv = () => {
  const env = { ...process.env };
  delete env.MALLOC_MMAP_THRESHOLD_;
  return env;
};

describe("glibc's mmap threshold (src/runtime/malloc.ts)", () => {
  it('reads MALLOC_MMAP_THRESHOLD_ and advises only when it is absent', () => {
    const saved = process.env.MALLOC_MMAP_THRESHOLD_;
    try {
      process.env.MALLOC_MMAP_THRESHOLD_ = '131072';
      expect(mmapThreshold()).toBe(131072);
      expect(mallocAdvice(true, 'cpu')).toBeNull();
      process.env.MALLOC_MMAP_THRESHOLD_ = 'lots';
      expect(mmapThreshold()).toBeNull();
      delete process.env.MALLOC_MMAP_THRESHOLD_;
      expect(mmapThreshold()).toBeNull();
      if (process.platform === 'linux') expect(mallocAdvice(true, 'cpu')).toMatch(new RegExp(`MALLOC_MMAP_THRESHOLD_=${MMAP_THRESHOLD}`));
      else expect(mallocAdvice(true, 'cpu')).toBeNull();
    } finally {
      if (saved === undefined) delete process.env.MALLOC_MMAP_THRESHOLD_;
      else process.env.MALLOC_MMAP_THRESHOLD_ = saved;
    }
  });

  it.runIf(process.platform === 'linux')('the bench reports the threshold it ran under, and advises it under recomputation when absent', () => {
    const tuned = spawnSync(process.execPath, [bin, ...benchArgs], { encoding: 'utf8', env: { ...plainEnv(), MALLOC_MMAP_THRESHOLD_: String(MMAP_THRESHOLD) } });
    expect(tuned.status, tuned.stderr).toBe(0);
    expect(JSON.parse(tuned.stdout).malloc_mmap_threshold).toBe(MMAP_THRESHOLD);
    expect(tuned.stderr).not.toMatch(/adaptive mmap threshold/);

    const plain = spawnSync(process.execPath, [bin, ...benchArgs], { encoding: 'utf8', env: plainEnv() });
    expect(plain.status, plain.stderr).toBe(0);
    expect(JSON.parse(plain.stdout).malloc_mmap_threshold).toBeNull();
    expect(plain.stderr).toMatch(/bench: memory: glibc's adaptive mmap threshold is in force; starting with MALLOC_MMAP_THRESHOLD_=65536/);
  });
});
