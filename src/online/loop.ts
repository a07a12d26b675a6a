/** The online methods' entry to the training loop, which lives in src/train (the offline trainer runs on it too). */
export * from '../train/loop.ts';
