import type { Command } from 'commander';
import { UserError } from '../../errors.ts';
import { GGUF_DTYPES, type GgufDtype, exportGguf } from '../../export/gguf.ts';
import { ONNX_DTYPES, type OnnxDtype, exportOnnx } from '../../export/onnx.ts';
import { readExportSource } from '../../export/source.ts';

const ONNX_NAMES = Object.keys(ONNX_DTYPES) as OnnxDtype[];

export function register(program: Command): void {
  program
    .command('export')
    .description(
      'write a model for the apps: --format onnx, a folder transformers.js loads (onnx/model.onnx with Optimum\'s input and output names, tokenizer, chat template); --format gguf, one GGUF v3 file llama.cpp loads (node-llama-cpp, Ollama, LM Studio). A LoRA adapter is merged first',
    )
    .requiredOption('--model <dir>', 'Hugging Face model folder (a training run\'s final/ included), or a PEFT adapter folder whose adapter_config.json names its base')
    .requiredOption('--format <format>', 'onnx or gguf')
    .requiredOption('-o, --out <path>', 'onnx: the folder to write (replaced when complete); gguf: the .gguf file')
    .option('--adapter <dir>', 'a PEFT LoRA adapter folder to merge into --model before exporting')
    .option('--dtype <list>', `onnx: one or more of ${ONNX_NAMES.join(', ')} (comma-separated; fp16 → onnx/model_fp16.onnx, q8 → onnx/model_quantized.onnx), default fp32; gguf: one of ${GGUF_DTYPES.join(', ')}, default f32 (q8_0, q4_0: matrices in blocks of 32 values, norms and biases f32, a matrix whose rows are not whole blocks f16; q4_k_m: llama.cpp's Q4_K_M mix of Q4_K and Q6_K; see docs/export.md)`)
    .option('--json', 'print one JSON line: format, out, files or bytes')
    .action((o: { model: string; format: string; out: string; adapter?: string; dtype?: string; json?: boolean }) => {
      if (o.format !== 'onnx' && o.format !== 'gguf') throw new UserError(`--format: "${o.format}" is not one of onnx, gguf`);
      const dtypes = o.dtype === undefined ? undefined : o.dtype.split(',').map((s) => s.trim());
      if (o.format === 'onnx') {
        const bad = dtypes?.find((d) => !(ONNX_NAMES as string[]).includes(d));
        if (bad !== undefined) throw new UserError(`--dtype: "${bad}" is not one of ${ONNX_NAMES.join(', ')} for --format onnx`);
        const src = readExportSource(o.model, o.adapter);
        const files = exportOnnx(src, o.out, { dtypes: dtypes as OnnxDtype[] | undefined });
        if (o.json) process.stdout.write(JSON.stringify({ format: 'onnx', out: o.out, model_type: src.config.model_type, files }) + '\n');
        else process.stdout.write(`wrote ${src.config.model_type} for transformers.js to ${o.out} (${files.length} files: ${files.map((f) => f.slice(o.out.length + 1)).join(', ')})\n`);
        return;
      }
      if (dtypes && dtypes.length !== 1) throw new UserError(`--dtype: one of ${GGUF_DTYPES.join(', ')} for --format gguf, got "${o.dtype}"`);
      const dtype = (dtypes?.[0] ?? 'f32') as GgufDtype;
      if (!(GGUF_DTYPES as readonly string[]).includes(dtype)) throw new UserError(`--dtype: "${dtype}" is not one of ${GGUF_DTYPES.join(', ')} for --format gguf`);
      const src = readExportSource(o.model, o.adapter);
      const bytes = exportGguf(src, o.out, dtype);
      if (o.json) process.stdout.write(JSON.stringify({ format: 'gguf', out: o.out, model_type: src.config.model_type, dtype, bytes }) + '\n');
      else process.stdout.write(`wrote ${src.config.model_type} as GGUF ${dtype} to ${o.out} (${(bytes / 1e6).toFixed(1)} MB)\n`);
    });
}
