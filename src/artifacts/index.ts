/** Training artifacts: emit (build.ts), describe (manifest.ts), run (training.ts), checkpoint. */
export * from './build.ts';
export * from './manifest.ts';
export * from './checkpoint.ts';
export * from './training.ts';
export { pruneGraph } from './prune.ts';
