#!/usr/bin/env bash
# The distill demo's seed table: `prefzoo demo --method distill` over seeds 0–9, each run's JSON kept
# in OUT/ and a markdown table printed (held-out accuracy of the teacher, of the student's start and of
# the distilled student; the optimizer steps on-policy distillation and GRPO took from the same start to
# 0.9 × the teacher's accuracy; whether distillation took at most a quarter of GRPO's; the demo's own
# seconds and the CPU and wall seconds from /usr/bin/time), then the spread. EXTRA is passed to every
# run (e.g. "--param beta=1").
#
#   scripts/bench/distill-demo.sh [OUT] [SEEDS] [EXTRA]      defaults: tmp/distill-demo "0 1 2 3 4 5 6 7 8 9" ""
#   nice -n 10 scripts/bench/distill-demo.sh > tmp/distill-demo.md 2>&1 &
set -euo pipefail
cd "$(dirname "$0")/../.."
out=${1:-tmp/distill-demo}
seeds=${2:-0 1 2 3 4 5 6 7 8 9}
extra=${3:-}
mkdir -p "$out"
for s in $seeds; do
  f="$out/distill-$s.json"
  [ -s "$f" ] && continue
  # shellcheck disable=SC2086
  /usr/bin/time -f '%U %S %e' -o "$out/distill-$s.time" node bin/prefzoo.mjs demo --method distill --seed "$s" --json -o "$out/distill-$s" $extra > "$f.tmp"
  mv "$f.tmp" "$f"
done
node - "$out" <<'JS'
const fs = require('node:fs');
const [out] = process.argv.slice(2);
const f3 = (x) => x.toFixed(3);
const rows = fs.readdirSync(out).filter((f) => /^distill-\d+\.json$/.test(f)).map((f) => {
  const r = JSON.parse(fs.readFileSync(`${out}/${f}`, 'utf8'));
  const [u, s, e] = fs.readFileSync(`${out}/${f.replace(/\.json$/, '.time')}`, 'utf8').trim().split(/\s+/).map(Number);
  return { seed: r.seed, r, cpu: u + s, wall: e };
}).sort((a, b) => a.seed - b.seed);
const steps = (n, budget) => (n === null ? `> ${budget}` : String(n));
/** Met: the student reached the target, within a quarter of GRPO's steps (GRPO not reaching it within its budget counts as its budget). */
const met = (r) => r.distill_steps !== null && r.distill_steps * 4 <= (r.grpo_steps ?? r.grpo_budget);
console.log(`\n### prefzoo demo --method distill (beta ${rows[0]?.r.beta})\n`);
console.log('| seed | teacher_accuracy | student_accuracy_start | student_accuracy_final | distill_steps | grpo_steps | grpo / distill | ≤ ¼ of GRPO\'s steps | seconds | CPU s | wall s |');
console.log('|---|---|---|---|---|---|---|---|---|---|---|');
for (const { seed, r, cpu, wall } of rows) {
  const ratio = r.distill_steps !== null && r.grpo_steps !== null ? (r.grpo_steps / r.distill_steps).toFixed(1) : '–';
  console.log(`| ${seed} | ${f3(r.teacher_accuracy)} | ${f3(r.student_accuracy_start)} | ${f3(r.student_accuracy_final)} | ${steps(r.distill_steps, r.distill_budget)} | ${steps(r.grpo_steps, r.grpo_budget)} | ${ratio} | ${met(r) ? 'yes' : 'no'} | ${r.seconds.toFixed(0)} | ${cpu.toFixed(0)} | ${wall.toFixed(0)} |`);
}
const sorted = (xs) => [...xs].sort((a, b) => a - b);
const spread = (xs) => { const s = sorted(xs); const m = s.length % 2 ? s[(s.length - 1) / 2] : (s[s.length / 2 - 1] + s[s.length / 2]) / 2; return `min ${s[0]}, median ${m}, max ${s[s.length - 1]}`; };
const d = rows.filter((x) => x.r.distill_steps !== null).map((x) => x.r.distill_steps);
const g = rows.filter((x) => x.r.grpo_steps !== null).map((x) => x.r.grpo_steps);
console.log(`\n${rows.length} seeds: target met on ${rows.filter((x) => met(x.r)).length}; distill_steps ${d.length ? spread(d) : '–'} (${rows.length - d.length} not reached); grpo_steps ${g.length ? spread(g) : '–'} (${rows.length - g.length} not reached); demo seconds ${spread(rows.map((x) => x.r.seconds))}`);
JS
