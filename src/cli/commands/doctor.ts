import type { Command } from 'commander';
import os from 'node:os';
import { createRequire } from 'node:module';
import { checkDevice, cudaAvailable, type ExecutionProvider } from '../../runtime/session.ts';

interface DeviceReport {
  device: ExecutionProvider;
  ok: boolean;
  /** What was found, or what is missing and how to get it. */
  detail: string;
}

/** Opens a one-node session on each execution provider and says which ones work here. */
async function diagnose(): Promise<{ onnxruntime: string; node: string; cores: number; devices: DeviceReport[] }> {
  const version = (createRequire(import.meta.url)('onnxruntime-node/package.json') as { version: string }).version;
  const devices: DeviceReport[] = [{ device: 'cpu', ok: true, detail: `${os.cpus().length} cores` }];
  try {
    await checkDevice({ ep: 'webgpu' });
    const icd = process.env.VK_ICD_FILENAMES ?? process.env.VK_DRIVER_FILES;
    const soft = icd?.includes('swiftshader') ? ' (SwiftShader: a Vulkan on the CPU, for tests, not for speed)' : '';
    devices.push({ device: 'webgpu', ok: true, detail: `a Vulkan adapter answered${icd ? ` through ${icd}` : ''}${soft}` });
  } catch (e) {
    devices.push({ device: 'webgpu', ok: false, detail: (e as Error).message });
  }
  devices.push(
    cudaAvailable()
      ? { device: 'cuda', ok: true, detail: "onnxruntime-node's CUDA provider library is installed" }
      : { device: 'cuda', ok: false, detail: 'not installed: ONNXRUNTIME_NODE_INSTALL=cuda12 npm install onnxruntime-node (needs CUDA 12 and cuDNN 9)' },
  );
  return { onnxruntime: version, node: process.version, cores: os.cpus().length, devices };
}

export function register(program: Command): void {
  program
    .command('doctor')
    .description('which devices can run models here: cpu, webgpu (any Vulkan GPU, bundled with onnxruntime-node) and cuda; what is missing and how to get it')
    .option('--json', 'print one JSON line')
    .action(async (o: { json?: boolean }) => {
      const r = await diagnose();
      if (o.json) {
        process.stdout.write(JSON.stringify(r) + '\n');
        return;
      }
      const lines = [`onnxruntime-node ${r.onnxruntime}, Node ${r.node}`, ...r.devices.map((d) => `${d.device.padEnd(7)}${d.ok ? 'ok    ' : 'absent'}  ${d.detail}`)];
      process.stdout.write(lines.join('\n') + '\n');
    });
}
