#!/usr/bin/env bash
# The agent demos' seed tables: `prefzoo demo --method tools` and `--method env` over seeds 0–9, each
# run's JSON kept in OUT/ and a markdown table printed per demo (held-out accuracy of the starting and
# the trained policy, the ceiling without the tool or the feedback, tool calls per rollout, CPU
# seconds from /usr/bin/time: user + system), then the spread (min, median, max of the final accuracy).
#
#   scripts/bench/agent-demos.sh [OUT] [METHODS] [SEEDS]      defaults: tmp/agent-demos "tools env" "0 1 2 3 4 5 6 7 8 9"
#   nice -n 10 scripts/bench/agent-demos.sh > tmp/agent-demos.md 2>&1 &
set -euo pipefail
cd "$(dirname "$0")/../.."
out=${1:-tmp/agent-demos}
methods=${2:-tools env}
seeds=${3:-0 1 2 3 4 5 6 7 8 9}
mkdir -p "$out"
for m in $methods; do
  for s in $seeds; do
    f="$out/$m-$s.json"
    [ -s "$f" ] && continue
    /usr/bin/time -f '%U %S %e' -o "$out/$m-$s.time" node bin/prefzoo.mjs demo --method "$m" --seed "$s" --json -o "$out/$m-$s" > "$f.tmp"
    mv "$f.tmp" "$f"
  done
done
node - "$out" $methods <<'JS'
const fs = require('node:fs');
const [out, ...methods] = process.argv.slice(2);
const f3 = (x) => x.toFixed(3);
for (const m of methods) {
  const rows = fs.readdirSync(out).filter((f) => f.startsWith(`${m}-`) && f.endsWith('.json')).map((f) => {
    const r = JSON.parse(fs.readFileSync(`${out}/${f}`, 'utf8'));
    const [u, s, e] = fs.readFileSync(`${out}/${f.replace(/\.json$/, '.time')}`, 'utf8').trim().split(/\s+/).map(Number);
    return { seed: Number(f.slice(m.length + 1, -5)), r, cpu: u + s, wall: e };
  }).sort((a, b) => a.seed - b.seed);
  if (!rows.length) continue;
  console.log(`\n### prefzoo demo --method ${m}\n`);
  console.log('| seed | heldout_accuracy_start | heldout_accuracy_final | ceiling_without_tools | tool_call_frequency_final | num_turns_final | CPU s | wall s |');
  console.log('|---|---|---|---|---|---|---|---|');
  for (const { seed, r, cpu, wall } of rows) {
    console.log(`| ${seed} | ${f3(r.heldout_accuracy_start)} | ${f3(r.heldout_accuracy_final)} | ${f3(r.ceiling_without_tools)} | ${f3(r.tool_call_frequency_final)} | ${f3(r.num_turns_final)} | ${cpu.toFixed(0)} | ${wall.toFixed(0)} |`);
  }
  const fin = rows.map((x) => x.r.heldout_accuracy_final).sort((a, b) => a - b);
  const ceil = rows.map((x) => x.r.ceiling_without_tools);
  const med = fin.length % 2 ? fin[(fin.length - 1) / 2] : (fin[fin.length / 2 - 1] + fin[fin.length / 2]) / 2;
  console.log(`\nfinal accuracy over ${rows.length} seeds: min ${f3(fin[0])}, median ${f3(med)}, max ${f3(fin[fin.length - 1])}; ceiling: max ${f3(Math.max(...ceil))}`);
}
JS
