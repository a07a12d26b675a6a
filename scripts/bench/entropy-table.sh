#!/usr/bin/env bash
# Entropy control on the GRPO demo's task (docs/losses.md, "Entropy collapse on the GRPO demo"):
# for seeds 0–9, `prefzoo demo --method grpo` with the default settings, with entropy_coef=0.01, and
# with use_adaptive_entropy=true (entropy_target $TARGET); per run the final held-out accuracy and the
# mean `entropy` over the last 50 steps, with its range there (metrics logged every step). Prints a
# markdown table.
#
#   scripts/bench/entropy-table.sh [OUT_DIR]      (JOBS=2 runs at a time; SEEDS="0 1 …"; TARGET=0.1)
#
# Heavy: 30 demo runs of 400 steps (about 70 CPU seconds each on a quiet machine).
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
OUT=${1:-$ROOT/tmp/entropy-table}
JOBS=${JOBS:-2}
SEEDS=${SEEDS:-"0 1 2 3 4 5 6 7 8 9"}
TARGET=${TARGET:-0.1}
mkdir -p "$OUT"

declare -A CONFIGS=(
  [default]=""
  [coef]="--param entropy_coef=0.01"
  [adaptive]="--param use_adaptive_entropy=true --param entropy_target=$TARGET"
)

run() { # config seed
  local cfg=$1 seed=$2 dir="$OUT/$1-$2"
  [ -s "$dir.json" ] && return 0
  # shellcheck disable=SC2086
  node "$ROOT/bin/prefzoo.mjs" demo --method grpo --seed "$seed" --json -o "$dir" --param logging_steps=1 ${CONFIGS[$cfg]} > "$dir.json.tmp" 2> "$dir.log"
  mv "$dir.json.tmp" "$dir.json"
}
export -f run
for seed in $SEEDS; do for cfg in default coef adaptive; do
  while [ "$(jobs -rp | wc -l)" -ge "$JOBS" ]; do wait -n; done
  run "$cfg" "$seed" &
done; done
wait

node --input-type=module - "$OUT" "$SEEDS" <<'JS'
import { readFileSync } from 'node:fs';
const [out, seeds] = process.argv.slice(2);
const cfgs = ['default', 'coef', 'adaptive'];
const cell = (cfg, seed) => {
  const r = JSON.parse(readFileSync(`${out}/${cfg}-${seed}.json`, 'utf8').trim().split('\n').pop());
  const rows = readFileSync(`${out}/${cfg}-${seed}/grpo/metrics.jsonl`, 'utf8').trim().split('\n').map((l) => JSON.parse(l)).filter((x) => x.split === undefined && typeof x.entropy === 'number');
  const last = rows.filter((x) => x.step > r.steps - 50);
  const ents = last.map((x) => x.entropy);
  const clipped = last.reduce((a, x) => a + x['completions/clipped_ratio'], 0) / last.length;
  return { acc: r.heldout_accuracy_final, start: r.heldout_accuracy_start, reward: r.reward_mean_final, ent: ents.reduce((a, x) => a + x, 0) / ents.length, lo: Math.min(...ents), hi: Math.max(...ents), clipped, coef: last.at(-1).entropy_coef };
};
console.log('| seed | ' + cfgs.map((c) => `${c}: accuracy | ${c}: entropy`).join(' | ') + ' |');
console.log('|---|' + cfgs.map(() => '---|---|').join(''));
const all = {};
for (const s of seeds.split(/\s+/).filter(Boolean)) {
  const cs = cfgs.map((c) => cell(c, s));
  cs.forEach((x, k) => ((all[cfgs[k]] ??= []).push(x)));
  console.log(`| ${s} | ` + cs.map((x) => `${x.acc.toFixed(3)} | ${x.ent.toFixed(3)} (${x.lo.toFixed(2)}–${x.hi.toFixed(2)})`).join(' | ') + ' |');
}
const mean = (xs) => xs.reduce((a, b) => a + b, 0) / xs.length;
console.log('| mean | ' + cfgs.map((c) => `${mean(all[c].map((x) => x.acc)).toFixed(3)} | ${mean(all[c].map((x) => x.ent)).toFixed(3)}`).join(' | ') + ' |');
console.log('\ndefault runs (the demo seed table): seed, heldout_accuracy_start, heldout_accuracy_final, reward_mean_final');
seeds.split(/\s+/).filter(Boolean).forEach((s, i) => console.log(`| ${s} | ${all.default[i].start.toFixed(3)} | ${all.default[i].acc.toFixed(3)} | ${all.default[i].reward.toFixed(3)} |`));
console.log('\nadaptive: entropy_coef at the last step per seed: ' + all.adaptive.map((x) => x.coef).join(', '));
console.log('completions without the end token (clipped_ratio, last 50 steps) per seed: ' + cfgs.map((c) => `${c} ${all[c].map((x) => x.clipped.toFixed(3)).join(', ')}`).join('; '));
JS
