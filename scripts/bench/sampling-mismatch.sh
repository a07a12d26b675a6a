#!/usr/bin/env bash
# The sampler–trainer log-prob mismatch of `prefzoo grpo` (docs/performance.md): the decoder draws each
# completion and records the tempered log-prob of every token it drew (sampling_token_logps); the
# training graph scores the same tokens (old_token_logps); TRL's metrics compare them. For each
# configuration given as "preset device compute_dtype" (default: tiny and small on the CPU, and on
# WebGPU — SwiftShader when no GPU, float32, and float16 products where the adapter has shader-f16),
# a 3-step run (STEPS=…) on 8 GSM8K prompts × 4 completions of 32 tokens; prints the mean over the steps of
# sampling/sampling_logp_difference/mean|max and sampling/importance_sampling_ratio/min|mean|max.
#
#   scripts/bench/sampling-mismatch.sh [OUT_DIR] ["preset device dtype" …]
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
OUT=${1:-$ROOT/tmp/sampling-mismatch}
shift || true
CONFIGS=("$@")
[ ${#CONFIGS[@]} -gt 0 ] || CONFIGS=("tiny cpu float32" "small cpu float32" "tiny webgpu float32" "small webgpu float32" "tiny webgpu float16" "small webgpu float16")
PZ="node $ROOT/bin/prefzoo.mjs"
SHARED=${SHARED:-$ROOT/../shared/data}
mkdir -p "$OUT"
if [ -z "${VK_ICD_FILENAMES:-}" ] && [ -f /usr/lib/chromium/vk_swiftshader_icd.json ] && ! command -v nvidia-smi >/dev/null; then
  export VK_ICD_FILENAMES=/usr/lib/chromium/vk_swiftshader_icd.json # WebGPU on the CPU (as .ci/run)
fi
head -n 8 "$SHARED/gsm8k_test.jsonl" > "$OUT/prompts.jsonl"
echo 'export function short(completions) { return completions.map((c) => -c.length / 100); }' > "$OUT/rewards.mjs"
printf '| preset | device | products | logp difference mean | max | IS ratio min | mean | max |\n|---|---|---|---|---|---|---|---|\n'
for c in "${CONFIGS[@]}"; do
  read -r preset device dtype <<< "$c"
  model="$OUT/model-$preset"
  [ -d "$model" ] || $PZ init-model --preset "$preset" --seed 3 -o "$model" > /dev/null
  run="$OUT/run-$preset-$device-$dtype"
  if ! $PZ grpo --model "$model" --prompts "$OUT/prompts.jsonl" --reward "$OUT/rewards.mjs:short" -o "$run" --overwrite --quiet \
      --param device="$device" --param compute_dtype="$dtype" --param max_steps="${STEPS:-3}" --param batch_size=32 --param num_generations=4 \
      --param max_completion_length=32 --param learning_rate=1e-5 --param logging_steps=1 > /dev/null 2> "$run.err"; then
    echo "| $preset | $device | $dtype | $(head -c 160 "$run.err" | tr '\n|' '  ') | | | | |"
    continue
  fi
  node --input-type=module -e '
    import { readFileSync } from "node:fs";
    const rows = readFileSync(process.argv[1], "utf8").trim().split("\n").map((l) => JSON.parse(l));
    const m = (k) => rows.reduce((a, r) => a + r[k], 0) / rows.length;
    const f = (x) => x.toExponential(2);
    const p = "sampling/";
    console.log(`| ${process.argv.slice(2).join(" | ")} | ${f(m(p + "sampling_logp_difference/mean"))} | ${f(m(p + "sampling_logp_difference/max"))} | ${m(p + "importance_sampling_ratio/min").toFixed(7)} | ${m(p + "importance_sampling_ratio/mean").toFixed(7)} | ${m(p + "importance_sampling_ratio/max").toFixed(7)} |`);
  ' "$run/metrics.jsonl" "$preset" "$device" "$dtype"
done
