import { defineConfig } from 'vitest/config';

export default defineConfig({
  test: {
    include: ['test/**/*.test.ts'],
    testTimeout: 120_000,
    hookTimeout: 120_000,
    // ONNX Runtime sessions are CPU-heavy: two workers match the two cores CI has.
    maxWorkers: 2,
  },
});
