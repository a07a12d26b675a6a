// Child process of src/runtime/placement.ts: opens one model with ONNX Runtime's verbose log on, so
// that the runtime prints where it placed each node (stderr), then exits; also the device check of
// src/runtime/session.ts ('open'). Plain JavaScript: no loader.
import ort from 'onnxruntime-node';

const [file, optionsJson, mode] = process.argv.slice(2);
const options = JSON.parse(optionsJson);
// 'open' and 'run': only whether the session opens / runs (src/runtime/session.ts checkDevice).
const verbose = mode === 'open' || mode === 'run' ? {} : { logSeverityLevel: 0, logVerbosityLevel: 0 };
try {
  const session = await ort.InferenceSession.create(file, { ...options, ...verbose });
  // 'run': also run it once on a one-element float32 input x (a feature is only tried when a shader runs).
  if (mode === 'run') await session.run({ x: new ort.Tensor('float32', new Float32Array(1), [1]) });
  await session.release();
} catch (e) {
  process.stderr.write(`placement-probe-error: ${String(e?.message ?? e).split('\n')[0]}\n`);
  process.exitCode = 3;
}
