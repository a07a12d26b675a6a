import { defineConfig } from 'vitest/config';

export default defineConfig({
  test: {
    include: ['test/**/*.test.ts'],
    // The CLI runs from dist/, built before the tests when a source is newer (test/global-setup.ts).
    globalSetup: ['test/global-setup.ts'],
    // Two test files run at once on CI's two cores: one intra-op thread a session (PREFZOO_THREADS), so
    // two sessions' threads do not spin against each other; test/determinism.test.ts runs the real default.
    env: { PREFZOO_DIST: '1', PREFZOO_THREADS: '1' },
    testTimeout: 120_000,
    hookTimeout: 120_000,
    // ONNX Runtime sessions are CPU-heavy: two workers match the two cores CI has.
    maxWorkers: 2,
  },
});
