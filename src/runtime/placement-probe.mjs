// Child process of src/runtime/placement.ts: opens one model with ONNX Runtime's verbose log on, so
// that the runtime prints where it placed each node (stderr), then exits. Plain JavaScript: no loader.
import ort from 'onnxruntime-node';

const [file, optionsJson] = process.argv.slice(2);
const options = JSON.parse(optionsJson);
try {
  const session = await ort.InferenceSession.create(file, { ...options, logSeverityLevel: 0, logVerbosityLevel: 0 });
  await session.release();
} catch (e) {
  process.stderr.write(`placement-probe-error: ${String(e?.message ?? e).split('\n')[0]}\n`);
  process.exitCode = 3;
}
