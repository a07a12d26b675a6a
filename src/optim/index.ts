/** Optimizers as ONNX graphs (AdamW, SGD with momentum), gradient clipping, LR schedules. */
export * from './config.ts';
export * from './graph.ts';
export * from './schedule.ts';
